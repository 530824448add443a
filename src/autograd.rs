//! Autograd on lazy tensors: gradients are more lazy tensors, built by `lower::autodiff` on the
//! air graph of the forward computation.
//!
//! [`grad`] traces the DAG behind `output` into an air graph (every tensor that holds data, and
//! every tensor cut off by [`Tensor::stop_gradient`], becomes an `input`), asks
//! [`lower::autodiff::grad`] for the gradient nodes, and turns those nodes back into facade tensors
//! whose inputs are the *original* forward tensors. Nothing runs: realizing the loss and its
//! gradients together (`kiln::realize(&[&loss, &g0, &g1])`) traces one graph in which forward and
//! backward share their nodes, so the forward pass is computed once.
//!
//! On top of that sits PyTorch's stateful surface: [`Tensor::requires_grad_`] marks a tensor,
//! [`Tensor::backward`] differentiates a one-element tensor with respect to every marked tensor it
//! depends on and accumulates into [`Tensor::grad`], and [`no_grad`] runs a closure with gradients
//! disabled. The marks and the accumulated gradients live in a side table keyed by node (the
//! tensor handle itself has no room for them); an entry holds a `Weak` to its node, so a dropped
//! tensor's entry is recognised as stale and swept, and its address can never be reused by another
//! node while the entry exists.
//!
//! `realize` drops a computed tensor's inputs (so a loop does not keep every old value alive),
//! except what autodiff needs later: a float tensor realized with gradients enabled that depends
//! on a tensor marked [`Tensor::requires_grad_`] keeps them ([`keeps_graphs`]), as PyTorch keeps
//! the graph of every tensor that requires grad, so `print(loss.item()); loss.backward()` works,
//! through intermediates realized on their own too. Differentiating traces through the kept
//! graph, and realizing the gradients recomputes what they need of the forward pass. Any other
//! realized tensor is a constant to autodiff, and a realized output whose graph was dropped is an
//! error of [`grad`] and `backward`, never zero gradients.

use rustc_hash::FxBuildHasher;
use std::cell::Cell;

/// Maps and sets keyed by tensor addresses and node ids: FxHash (one multiply) where SipHash was
/// a twentieth of a Transformer's facade forward (`keeps_walked`'s lookups per node). Addresses
/// are not attacker-chosen.
type HashMap<K, V> = std::collections::HashMap<K, V, FxBuildHasher>;
type HashSet<K> = std::collections::HashSet<K, FxBuildHasher>;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use air::op::Input;
use air::{Graph, NodeId, Op};
use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::realize::Walk;
use crate::tensor::{Inner, Site, Tensor};

/// One tensor's autograd state.
struct Entry {
    node: Weak<Inner>,
    requires_grad: bool,
    stop: bool,
    grad: Option<Tensor>,
}

/// The side table: node address -> state. Entries whose node is gone are swept when the table
/// has doubled since the last sweep.
struct Registry {
    entries: HashMap<usize, Entry>,
    sweep_at: usize,
}

/// Whether any tensor was ever marked `requires_grad`: until one is, [`marked_for`] knows its
/// answer without taking the registry's lock (every realize asks).
static EVER_MARKED: AtomicBool = AtomicBool::new(false);

static REGISTRY: LazyLock<Mutex<Registry>> =
    LazyLock::new(|| Mutex::new(Registry { entries: HashMap::default(), sweep_at: 64 }));

thread_local! {
    static NO_GRAD_DEPTH: Cell<usize> = const { Cell::new(0) };
}

fn addr(t: &Tensor) -> usize {
    Arc::as_ptr(&t.inner) as usize
}

fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut registry)
}

impl Registry {
    /// The live entry of `t`, if any.
    fn get(&self, t: &Tensor) -> Option<&Entry> {
        self.entries.get(&addr(t)).filter(|e| e.node.strong_count() > 0)
    }

    /// The entry of `t`, created (or reset, if stale) as needed.
    fn entry(&mut self, t: &Tensor) -> &mut Entry {
        if self.entries.len() >= self.sweep_at {
            self.entries.retain(|_, e| e.node.strong_count() > 0);
            self.sweep_at = (2 * self.entries.len()).max(64);
        }
        let e = self.entries.entry(addr(t)).or_insert_with(|| Entry {
            node: Arc::downgrade(&t.inner),
            requires_grad: false,
            stop: false,
            grad: None,
        });
        if e.node.strong_count() == 0 {
            *e = Entry { node: Arc::downgrade(&t.inner), requires_grad: false, stop: false, grad: None };
        }
        e
    }
}

/// Whether gradients are enabled on this thread (false inside [`no_grad`]).
pub fn is_grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(Cell::get) == 0
}

/// Runs `f` with gradients disabled on this thread, like `with torch.no_grad():`. Inside,
/// [`Tensor::requires_grad_`] marks nothing and [`Tensor::backward`] and [`grad`] return an error.
/// Lazy tensors record no tape, so inference needs no `no_grad` to be cheap; the scope is for code
/// that must not build gradients (optimizer updates, evaluation).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_GRAD_DEPTH.with(|d| d.set(d.get() - 1));
        }
    }
    NO_GRAD_DEPTH.with(|d| d.set(d.get() + 1));
    let _restore = Restore;
    f()
}

/// What to differentiate with respect to.
enum Wrt<'a> {
    /// These tensors, in order.
    Given(&'a [&'a Tensor]),
    /// Every tensor marked `requires_grad` that the output depends on.
    Marked,
}

/// The gradients of `output` with respect to each tensor of `wrt`, as lazy tensors of the same
/// types, in order. For an `output` with more than one element this is the gradient of its sum. A
/// tensor `output` does not depend on gets zeros, but an `output` that depends on none of a
/// non-empty `wrt` is an error, as in PyTorch (an empty `wrt` gives no gradients). Gradients flow through every op except into
/// tensors cut off by [`Tensor::stop_gradient`] and through tensors that already hold data (a
/// realized tensor is a constant of the graph).
#[track_caller]
pub fn grad(output: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
    let loc = Location::caller();
    if !is_grad_enabled() {
        return Err(Error::op("grad", "gradients are disabled inside no_grad", loc));
    }
    Ok(differentiate(output, Wrt::Given(wrt), loc)?.into_iter().map(|(_, g)| g).collect())
}

/// For each of `roots` (realized together), whether `realize` keeps its inputs after computing
/// it: gradients are enabled, the root is a computed float tensor, and it depends on a live tensor
/// marked `requires_grad_` (through kept graphs). One walk serves all the roots (each node is
/// decided once), and nothing is walked when no tensor is marked.
pub(crate) fn keeps_graphs(roots: &[Tensor]) -> SmallVec<[bool; 4]> {
    let mut keep: SmallVec<[bool; 4]> = smallvec::smallvec![false; roots.len()];
    let Some(marked) = marked_for(roots.iter()) else { return keep };
    let mut reaches: HashMap<usize, bool> = marked.iter().map(|&a| (a, true)).collect();
    for (root, keep) in roots.iter().zip(&mut keep) {
        *keep = keeps_inputs(root) && reaches_marked(root, &mut reaches);
    }
    keep
}

/// [`keeps_graphs`] for the outputs of `walk`, in order. The walk lists every tensor after its
/// inputs, with their positions, so each is decided in one pass over a `Vec` instead of a walk
/// that hashes every node (a fifth of a Transformer's facade forward); a tensor that holds data
/// and kept its graph is looked through as `keeps_graphs` does.
pub(crate) fn keeps_walked(walk: &Walk) -> SmallVec<[bool; 4]> {
    let roots = walk.outputs.iter().map(|&o| walk.steps[o as usize].tensor());
    let mut keep: SmallVec<[bool; 4]> = smallvec::smallvec![false; walk.outputs.len()];
    let Some(marked) = marked_for(roots) else { return keep };
    // Memo of the walks below kept graphs, made on first need.
    let mut below: Option<HashMap<usize, bool>> = None;
    let mut reaches: Vec<bool> = Vec::with_capacity(walk.steps.len());
    for step in &walk.steps {
        let t = step.tensor();
        let hit = if step.slot.is_some() || step.inputs.is_empty() {
            marked.contains(&addr(t)) || {
                let kept = !t.inner.inputs.lock().unwrap_or_else(PoisonError::into_inner).is_empty();
                kept && {
                    let memo = below.get_or_insert_with(|| marked.iter().map(|&a| (a, true)).collect());
                    reaches_marked(t, memo)
                }
            }
        } else {
            // The inputs first: a step below a marked weight (most of a model's) needs no lookup.
            step.inputs.iter().any(|&p| reaches[p as usize]) || marked.contains(&addr(t))
        };
        reaches.push(hit);
    }
    for (keep, &o) in keep.iter_mut().zip(&walk.outputs) {
        *keep = keeps_inputs(walk.steps[o as usize].tensor()) && reaches[o as usize];
    }
    keep
}

/// The live tensors marked `requires_grad_`, or `None` when no root can keep its inputs
/// (gradients off, nothing ever marked, no computed float root, or nothing marked now).
fn marked_for<'a>(mut roots: impl Iterator<Item = &'a Tensor>) -> Option<HashSet<usize>> {
    if !EVER_MARKED.load(Ordering::Relaxed) || !is_grad_enabled() || !roots.any(keeps_inputs) {
        return None;
    }
    let marked: HashSet<usize> = with_registry(|r| {
        r.entries.iter().filter(|(_, e)| e.requires_grad && e.node.strong_count() > 0).map(|(&k, _)| k).collect()
    });
    (!marked.is_empty()).then_some(marked)
}

/// Whether `t` has an autodiff entry of its own (marked, cut off or holding a gradient): a node
/// that must not be shared as an interned constant ([`Tensor::const_operand`]).
pub(crate) fn has_entry(t: &Tensor) -> bool {
    EVER_MARKED.load(Ordering::Relaxed) && with_registry(|r| r.get(t).is_some())
}

/// Whether `t` is a tensor whose inputs autodiff may need: a computed float tensor.
fn keeps_inputs(t: &Tensor) -> bool {
    t.dtype().is_float() && !t.op().is_leaf()
}

/// Whether `root` reaches a marked tensor through the graph its tensors still hold, each visited
/// node decided after its inputs (post-order) and remembered in `reaches` (which starts with the
/// marked tensors, `true`).
fn reaches_marked(root: &Tensor, reaches: &mut HashMap<usize, bool>) -> bool {
    let mut stack = vec![(root.clone(), false)];
    while let Some((n, inputs_done)) = stack.pop() {
        let a = addr(&n);
        if inputs_done {
            let hit = n.inputs().iter().any(|c| reaches.get(&addr(c)) == Some(&true));
            reaches.insert(a, hit);
        } else if !reaches.contains_key(&a) {
            stack.push((n.clone(), true));
            stack.extend(n.inputs().into_iter().filter(|c| !reaches.contains_key(&addr(c))).map(|c| (c, false)));
        }
    }
    reaches.get(&addr(root)) == Some(&true)
}

/// The traced forward graph: node of each tensor and tensor of each node.
struct Traced {
    graph: Graph,
    ids: HashMap<usize, NodeId>,
    tensors: HashMap<NodeId, Tensor>,
}

/// Traces `output`, differentiates, and returns `(wrt tensor, gradient)` pairs.
fn differentiate(output: &Tensor, wrt: Wrt<'_>, loc: &'static Location<'static>) -> Result<Vec<(Tensor, Tensor)>> {
    output.check()?;
    if !output.dtype().is_float() {
        return Err(Error::op(
            "grad",
            format!("the output has dtype {}; only float outputs have gradients", output.dtype()),
            loc,
        ));
    }
    if let Wrt::Given(list) = wrt {
        for t in list {
            t.check()?;
            if !t.dtype().is_float() {
                let message = format!("cannot differentiate with respect to a tensor of dtype {}", t.dtype());
                return Err(Error::op("grad", message, loc));
            }
        }
    }
    // Snapshot the marks once: one lock for the whole walk.
    let (marked, stops): (HashSet<usize>, HashSet<usize>) = with_registry(|r| {
        let live = r.entries.iter().filter(|(_, e)| e.node.strong_count() > 0);
        let marked = live.clone().filter(|(_, e)| e.requires_grad).map(|(&k, _)| k).collect();
        let stops = live.filter(|(_, e)| e.stop).map(|(&k, _)| k).collect();
        (marked, stops)
    });
    let given: HashSet<usize> = match wrt {
        Wrt::Given(list) => list.iter().map(|t| addr(t)).collect(),
        Wrt::Marked => HashSet::default(),
    };
    let output_is_wrt = given.contains(&addr(output)) || marked.contains(&addr(output));
    if output.is_realized() && !output_is_wrt && !output.op().is_leaf() && output.inputs().is_empty() {
        let message = "the output was realized on its own, which dropped its graph; \
                       differentiate before realizing it (realize it together with its gradients)";
        return Err(Error::op("grad", message, loc));
    }
    let traced = trace(output, &stops)?;
    let wrt_tensors: Vec<Tensor> = match wrt {
        Wrt::Given(list) => list.iter().map(|t| (*t).clone()).collect(),
        Wrt::Marked => {
            let mut found: Vec<(NodeId, Tensor)> = traced
                .tensors
                .iter()
                .filter(|(_, t)| marked.contains(&addr(t)) && t.dtype().is_float())
                .map(|(&id, t)| (id, t.clone()))
                .collect();
            found.sort_by_key(|(id, _)| id.index());
            found.into_iter().map(|(_, t)| t).collect()
        }
    };
    let nothing_asked = matches!(wrt, Wrt::Given(list) if list.is_empty());
    if !nothing_asked && !wrt_tensors.iter().any(|t| traced.ids.contains_key(&addr(t))) {
        // PyTorch refuses this too: nothing to differentiate would silently give no gradient.
        let message = match wrt {
            Wrt::Marked => "element 0 of tensors does not require grad and does not have a grad_fn: the output \
                            depends on no tensor marked requires_grad_() (marks made inside no_grad are ignored)"
                .to_string(),
            Wrt::Given(list) => format!(
                "the output depends on none of the {} tensors to differentiate with respect to, so every \
                 gradient would be zero",
                list.len()
            ),
        };
        return Err(Error::op(if matches!(wrt, Wrt::Marked) { "backward" } else { "grad" }, message, loc));
    }
    let mut traced = traced;
    let out_id = traced.ids[&addr(output)];
    // A `wrt` tensor the output does not reach gets a fresh (unconnected) input node: zeros.
    let mut wrt_ids = Vec::with_capacity(wrt_tensors.len());
    for t in &wrt_tensors {
        let id = match traced.ids.get(&addr(t)) {
            Some(&id) => id,
            None => {
                let slot = traced.tensors.len() as u32;
                let id = traced.graph.add_leaf(Op::Input(Input { slot }), t.ty().clone())?;
                traced.ids.insert(addr(t), id);
                traced.tensors.insert(id, t.clone());
                id
            }
        };
        wrt_ids.push(id);
    }
    let grad_ids = lower::autodiff::grad(&mut traced.graph, out_id, &wrt_ids)
        .map_err(|e| Error::op("grad", e.to_string(), loc))?;
    let site = Site { name: "grad", loc };
    let mut built = traced.tensors;
    let mut out = Vec::with_capacity(grad_ids.len());
    for (t, id) in wrt_tensors.into_iter().zip(grad_ids) {
        let g = rebuild(&traced.graph, id, &mut built, site, output.device());
        g.check()?;
        out.push((t, g));
    }
    Ok(out)
}

/// Traces the DAG behind `output` into an air graph for autodiff only: tensors that hold data and
/// stopped tensors become `input` leaves (their slots only need to be distinct).
fn trace(output: &Tensor, stops: &HashSet<usize>) -> Result<Traced> {
    let mut traced = Traced { graph: Graph::new(), ids: HashMap::default(), tensors: HashMap::default() };
    let mut stack: Vec<(Tensor, Option<crate::tensor::Inputs>)> = vec![(output.clone(), None)];
    while let Some((t, children)) = stack.pop() {
        if traced.ids.contains_key(&addr(&t)) {
            continue;
        }
        t.check()?;
        let id = match children {
            Some(children) if t.inner.call.is_some() => {
                // An output of a recorded function's call stands for its replay's output.
                let id = traced.ids[&addr(&children[0])];
                traced.ids.insert(addr(&t), id);
                continue;
            }
            Some(children) => {
                let inputs: Vec<NodeId> = children.iter().map(|c| traced.ids[&addr(c)]).collect();
                traced.graph.add(t.op().clone(), &inputs)?
            }
            None => {
                // A realized tensor that kept its graph (see `keeps_graphs`) is traced through.
                let kept = t.is_realized() && !t.op().is_leaf() && !t.inputs().is_empty();
                let opaque = (t.is_realized() && !kept) || t.is_placeholder() || stops.contains(&addr(&t));
                if opaque {
                    let slot = traced.tensors.len() as u32;
                    traced.graph.add_leaf(Op::Input(Input { slot }), t.ty().clone())?
                } else if t.op().is_leaf() {
                    traced.graph.add_leaf(t.op().clone(), t.ty().clone())?
                } else if let Some(call) = &t.inner.call {
                    // Autodiff needs real nodes: the recording replayed onto the call's arguments
                    // (kept in the call, so that realizing the output walks them too).
                    let Some(replayed) = crate::record::replayed_output(call, &t.inputs()) else {
                        // Realized by another thread since the checks above: walked as data.
                        stack.push((t, None));
                        continue;
                    };
                    let pending = !traced.ids.contains_key(&addr(&replayed));
                    stack.push((t, Some(smallvec::smallvec![replayed.clone()])));
                    if pending {
                        stack.push((replayed, None));
                    }
                    continue;
                } else {
                    let children = t.inputs();
                    if children.is_empty() {
                        // Realized by another thread between the checks above.
                        stack.push((t, None));
                        continue;
                    }
                    let pending: Vec<Tensor> =
                        children.iter().filter(|c| !traced.ids.contains_key(&addr(c))).cloned().collect();
                    stack.push((t, Some(children)));
                    for c in pending.into_iter().rev() {
                        stack.push((c, None));
                    }
                    continue;
                }
            }
        };
        traced.ids.insert(addr(&t), id);
        traced.tensors.insert(id, t);
    }
    Ok(traced)
}

/// The facade tensor of node `root` of `graph`: a forward tensor from `built`, or a new lazy
/// tensor applying the node's op to the tensors of its inputs. Iterative, memoized in `built`.
fn rebuild(
    graph: &Graph,
    root: NodeId,
    built: &mut HashMap<NodeId, Tensor>,
    site: Site,
    device: crate::Device,
) -> Tensor {
    let mut stack: Vec<(NodeId, bool)> = vec![(root, false)];
    while let Some((id, expanded)) = stack.pop() {
        if built.contains_key(&id) {
            continue;
        }
        let node = graph.node(id);
        let t = if node.op.is_leaf() {
            Tensor::leaf(site, node.op.clone(), node.ty.clone(), device)
        } else if expanded {
            let inputs: Vec<&Tensor> = node.inputs.iter().map(|i| &built[i]).collect();
            Tensor::apply(site, node.op.clone(), &inputs)
        } else {
            stack.push((id, true));
            for &i in node.inputs.iter().rev() {
                if !built.contains_key(&i) {
                    stack.push((i, false));
                }
            }
            continue;
        };
        built.insert(id, t);
    }
    built[&root].clone()
}

impl Tensor {
    /// Marks this tensor as a leaf whose gradient [`Tensor::backward`] computes (PyTorch's
    /// `requires_grad_()`), and returns it. Does nothing inside [`no_grad`], so a `backward`
    /// that then finds no marked tensor is an error rather than a silent no-op.
    pub fn requires_grad_(&self) -> Tensor {
        self.set_requires_grad(true);
        self.clone()
    }

    /// Sets or clears the `requires_grad` mark. Setting it does nothing inside [`no_grad`].
    pub fn set_requires_grad(&self, requires_grad: bool) {
        if self.error().is_some() || (requires_grad && !is_grad_enabled()) {
            return;
        }
        with_registry(|r| {
            if requires_grad || r.get(self).is_some() {
                r.entry(self).requires_grad = requires_grad;
            }
        });
        if requires_grad {
            EVER_MARKED.store(true, Ordering::Relaxed);
        }
    }

    /// Whether this tensor is marked `requires_grad`.
    pub fn requires_grad(&self) -> bool {
        with_registry(|r| r.get(self).is_some_and(|e| e.requires_grad))
    }

    /// The same values, with the gradient stopped: [`grad`] and [`Tensor::backward`] treat the
    /// result as a constant (JAX's `stop_gradient`; PyTorch's `detach`).
    #[track_caller]
    pub fn stop_gradient(&self) -> Tensor {
        if self.error().is_some() {
            return self.clone();
        }
        let site = Site::here("stop_gradient");
        let t = self.p_reshape(site, self.shape().clone());
        with_registry(|r| r.entry(&t).stop = true);
        t
    }

    /// Computes the gradient of this one-element tensor with respect to every tensor marked
    /// [`Tensor::requires_grad_`] that it depends on, and adds it to that tensor's
    /// [`Tensor::grad`] (lazily: realize the gradients, ideally together with the loss). An output
    /// that depends on no marked tensor is an error, as in PyTorch ("element 0 of tensors does
    /// not require grad").
    #[track_caller]
    pub fn backward(&self) -> Result<()> {
        let loc = Location::caller();
        if !is_grad_enabled() {
            return Err(Error::op("backward", "gradients are disabled inside no_grad", loc));
        }
        self.check()?;
        let n = self.numel()?;
        if n.as_const() != Some(1) {
            let message =
                format!("needs a one-element output (a loss), got shape {}", crate::shape::show(self.shape()));
            return Err(Error::op("backward", message, loc));
        }
        let pairs = differentiate(self, Wrt::Marked, loc)?;
        with_registry(|r| {
            for (t, g) in pairs {
                let e = r.entry(&t);
                e.grad = Some(match e.grad.take() {
                    Some(previous) => previous.add(&g),
                    None => g,
                });
            }
        });
        Ok(())
    }

    /// The gradient accumulated by [`Tensor::backward`], if any (a lazy tensor).
    pub fn grad(&self) -> Option<Tensor> {
        with_registry(|r| r.get(self).and_then(|e| e.grad.clone()))
    }

    /// Clears the accumulated gradient (PyTorch's `x.grad = None`).
    pub fn zero_grad(&self) {
        with_registry(|r| {
            if let Some(e) = r.entries.get_mut(&addr(self)) {
                e.grad = None;
            }
        });
    }
}

//! Realizing lazy tensors: trace the DAG into an air graph, run it on the device, keep the results.
//!
//! The walk ([`walk`]) starts at the requested tensors and stops at tensors that already hold
//! data; those become `Input` nodes (slot = discovery order) and their host data, shared not
//! copied, becomes the graph's inputs. A table keyed by node pointer makes shared subexpressions
//! one air node and keeps the walk O(nodes); its tables are reused per thread. The walk is
//! iterative, so graph depth is bounded only by memory, and it hashes the structure as it goes:
//! a structure realized before runs its kept program through the realize cache
//! ([`crate::trace_cache`]) without an air graph being built ([`Walk::build`] builds one on a
//! miss, and for `trace` and `kiln::jit`). Graph types keep their symbolic dims; the symbol
//! values come from the source tensors and are passed to the backend as bindings, so one program
//! realized with `seq = 3` and with `seq = 7` gives structurally identical graphs.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::panic::Location;
use std::ptr::NonNull;
use std::sync::{Arc, PoisonError};

use air::graph::Node;
use air::op::Input;
use air::{Bindings, Element, Graph, HostTensor, NodeId, Op};
use rustc_hash::FxHasher;
use smallvec::SmallVec;

use crate::backend;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::record::{Call, Instance, Kind, Recording};
use crate::shape::show;
use crate::tensor::{Inner, Realized, Site, Tensor};

/// A traced tensor program: what `realize` hands to a backend.
#[derive(Clone)]
pub struct Program {
    /// The air graph; its outputs are the requested tensors, in request order (deduplicated).
    pub graph: Graph,
    /// Host data for `Input { slot }`, indexed by slot.
    pub inputs: Vec<HostTensor>,
    /// The value of every symbol the source tensors bind.
    pub bindings: Bindings,
    /// The device every tensor of the program lives on.
    pub device: Device,
    /// Where each node was built (by `NodeId::index`): what a shape condition that fails at run
    /// time is reported against.
    pub(crate) sites: Sites,
}

/// The op the user called and the source line of each node of a traced graph, by
/// `NodeId::index` (`None`: a source tensor).
#[derive(Clone, Default)]
pub(crate) struct Sites(Vec<Option<Site>>);

impl Sites {
    fn set(&mut self, id: NodeId, site: Option<Site>) {
        let i = id.index() as usize;
        if self.0.len() <= i {
            self.0.resize(i + 1, None);
        }
        self.0[i] = site;
    }
}

/// Where the nodes of a traced graph were built: what a failed shape condition is reported
/// against.
pub(crate) trait SiteOf {
    /// Where node `id` was built, if the user built it.
    fn site(&self, id: NodeId) -> Option<Site>;
}

impl SiteOf for Sites {
    fn site(&self, id: NodeId) -> Option<Site> {
        self.0.get(id.index() as usize).copied().flatten()
    }
}

/// Adds `new` to `into`; a symbol bound to two different values is an error naming it.
pub(crate) fn merge_bindings(into: &mut Bindings, new: &Bindings) -> Result<()> {
    new.iter().try_for_each(|(symbol, &value)| bind(into, symbol, value))
}

/// Binds the floor-division symbols ([`air::dim::close_derived`]) that follow from `bindings`;
/// one bound to another value than its definition gives is an error naming it.
pub(crate) fn close_derived(bindings: &mut Bindings) -> Result<()> {
    air::dim::close_derived(bindings).map_err(|(symbol, first, second)| Error::Binding { symbol, first, second })
}

/// Binds `symbol` to `value` in `into`, an error if it is bound to another value there.
pub(crate) fn bind(into: &mut Bindings, symbol: &air::Symbol, value: i64) -> Result<()> {
    match into.get(symbol) {
        Some(&first) if first != value => Err(Error::Binding { symbol: symbol.clone(), first, second: value }),
        Some(_) => Ok(()),
        None => {
            into.insert(symbol.clone(), value);
            Ok(())
        }
    }
}

fn key(t: &Tensor) -> *const Inner {
    Arc::as_ptr(&t.inner)
}

/// Hashes a node pointer (the only key `trace_roots` hashes): one multiply, where SipHash was a
/// visible part of a cached realize of a 473-node graph. Pointers are not attacker-chosen.
#[derive(Default)]
struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_usize(&mut self, i: usize) {
        // Allocations are 16-byte aligned: fold the high bits down so the table's low bits vary.
        let x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type PtrMap<V> = HashMap<*const Inner, V, BuildHasherDefault<PtrHasher>>;
type PtrSet = std::collections::HashSet<*const Inner, BuildHasherDefault<PtrHasher>>;

/// One tensor of a trace, in trace order (every tensor after its inputs).
pub(crate) struct Step {
    node: StepNode,
    /// `Some(slot)`: the tensor enters the program as `Input { slot }` (a `kiln::jit` argument,
    /// or a tensor that holds data).
    pub(crate) slot: Option<u32>,
    /// The positions in trace order of a computed tensor's inputs (empty for inputs and leaves).
    pub(crate) inputs: SmallVec<[u32; 3]>,
}

/// The tensor of a step: one the walk holds, or a node of a recording the walk keeps alive.
enum StepNode {
    Walked(Tensor),
    /// A computed node of a recorded function's recording ([`crate::record::Step::tensor`]):
    /// named by address, since cloning a handle per node (an atomic increment of a cold counter,
    /// and the decrement when the walk is dropped) was half the cost of walking a call.
    Recorded(NonNull<Tensor>),
}

impl Step {
    fn walked(tensor: Tensor, slot: Option<u32>, inputs: SmallVec<[u32; 3]>) -> Step {
        Step { node: StepNode::Walked(tensor), slot, inputs }
    }

    /// The recording's tensor this step is, by address, if it is a node of a recorded call.
    pub(crate) fn recorded(&self) -> Option<NonNull<Tensor>> {
        match self.node {
            StepNode::Walked(_) => None,
            StepNode::Recorded(p) => Some(p),
        }
    }

    /// The tensor this step is.
    pub(crate) fn tensor(&self) -> &Tensor {
        match &self.node {
            StepNode::Walked(t) => t,
            // SAFETY: the pointer is into the steps of a recording, which never change, and the
            // walk this step belongs to holds the recording (`Walk::_instances`).
            StepNode::Recorded(p) => unsafe { p.as_ref() },
        }
    }

    /// The air op of this step: `Input { slot }` for an input, else the tensor's own op.
    pub(crate) fn same_op(&self, op: &Op) -> bool {
        match self.slot {
            Some(slot) => *op == Op::Input(Input { slot }),
            None => *op == self.tensor().inner.op,
        }
    }
}

/// The tensors a program would be traced from, walked once: what [`Walk::build`] turns into an
/// air graph, and what the realize cache ([`crate::trace_cache`]) compares with a graph traced
/// before, without building one.
pub(crate) struct Walk {
    /// Every tensor of the program, in trace order: the graph's nodes in insertion order.
    pub(crate) steps: Vec<Step>,
    /// The position of each root.
    pub(crate) outputs: SmallVec<[u32; 2]>,
    /// Host data of the tensors that hold data, in slot order after the arguments.
    pub(crate) inputs: Vec<HostTensor>,
    /// The value of every symbol the data-holding tensors bind.
    pub(crate) bindings: Bindings,
    /// The structural hash of the steps (ops, types, input positions) and outputs.
    pub(crate) hash: u64,
    /// The calls of recorded functions walked: what keeps the recordings of their steps alive.
    _instances: SmallVec<[Arc<Instance>; 1]>,
    /// The outputs of those calls (no step holds them, and `walk` names every tensor it walked
    /// by address while it runs: a freed one's address could come back as another tensor's).
    _calls: SmallVec<[Tensor; 1]>,
}

/// Feeds one step to the structural hash.
fn hash_step(h: &mut FxHasher, op: &Op, ty: &air::TensorType, inputs: &[u32]) {
    hash_node(h, node_hash(op, ty), inputs);
}

/// The hash of a node's op and type: what a recording keeps per node ([`crate::record`]), so that
/// walking a call of it hashes no op or type.
pub(crate) fn node_hash(op: &Op, ty: &air::TensorType) -> u64 {
    let mut h = FxHasher::default();
    op.hash(&mut h);
    ty.hash(&mut h);
    h.finish()
}

/// Feeds one step to the structural hash, its op and type as [`node_hash`] gave them.
fn hash_node(h: &mut FxHasher, node: u64, inputs: &[u32]) {
    h.write_u64(node);
    h.write_usize(inputs.len());
    inputs.iter().for_each(|&i| h.write_u32(i));
}

/// Walks `roots` (error-free, one device, distinct) in trace order.
///
/// `args` are the placeholders of a `kiln::jit` trace ([`Tensor::placeholder`]): `args[i]`
/// becomes `Input { slot: i }`, tensors that hold data take the slots after them, and
/// `Walk::inputs` holds only theirs (`inputs[k]` feeds slot `args.len() + k`). A placeholder
/// not in `args` is an error: it escaped the trace it belongs to.
pub(crate) fn walk(roots: &[Tensor], device: Device, args: &[Tensor]) -> Result<Walk> {
    walk_placed(roots, device, args, false)
}

/// [`walk`], with each argument's step where the walk first reaches it rather than first (an
/// argument never reached has none): the order a walk of the same graph without arguments has,
/// which a recording keeps ([`crate::record`]) so that a call of it walks into the very steps
/// the function's own graph gives.
pub(crate) fn walk_args_in_place(roots: &[Tensor], device: Device, args: &[Tensor]) -> Result<Walk> {
    walk_placed(roots, device, args, true)
}

fn walk_placed(roots: &[Tensor], device: Device, args: &[Tensor], in_place: bool) -> Result<Walk> {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut scratch) => {
            let scratch = &mut *scratch;
            let steps = std::mem::take(&mut scratch.steps);
            let args = Args { tensors: args, in_place };
            let walk = walk_with(roots, device, args, &mut scratch.position, &mut scratch.stack, steps);
            scratch.tidy();
            walk
        }
        // Not reached (a walk runs no user code), but a fresh table is always right.
        Err(_) => {
            let args = Args { tensors: args, in_place };
            walk_with(roots, device, args, &mut PtrMap::default(), &mut Vec::new(), Vec::new())
        }
    })
}

/// The arguments of a walk: `Input { slot: i }` for `tensors[i]`, stepped first or where first
/// reached (`in_place`).
struct Args<'a> {
    tensors: &'a [Tensor],
    in_place: bool,
}

/// Tensors waiting on the walk's stack, each with its inputs (by address, only ever compared: each
/// is visited, and held by the walk's steps, before its user completes) once expanded.
type Pending = Vec<(Tensor, Option<SmallVec<[*const Inner; 3]>>)>;

/// The tables of a [`walk`], kept per thread between walks: for a small graph, allocating and
/// freeing them was a visible part of a realize.
#[derive(Default)]
struct Scratch {
    position: PtrMap<u32>,
    stack: Pending,
    /// The step list of the last walk, given back empty by [`Walk::recycle`].
    steps: Vec<Step>,
}

/// Tables larger than this are not kept: one huge graph should not pin its tables to a thread.
const SCRATCH_KEPT: usize = 1 << 12;

impl Scratch {
    /// Empties the tables (dropping the tensor handles they hold) for the next walk.
    fn tidy(&mut self) {
        if self.position.capacity() > SCRATCH_KEPT {
            self.position = PtrMap::default();
        } else {
            self.position.clear();
        }
        if self.stack.capacity() > SCRATCH_KEPT {
            self.stack = Vec::new();
        } else {
            self.stack.clear();
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn walk_with(
    roots: &[Tensor],
    device: Device,
    args: Args<'_>,
    position: &mut PtrMap<u32>,
    stack: &mut Pending,
    mut steps: Vec<Step>,
) -> Result<Walk> {
    let mut inputs: Vec<HostTensor> = Vec::new();
    let mut bindings = Bindings::new();
    let mut h = FxHasher::default();
    let push = |steps: &mut Vec<Step>, step: Step, position: &mut PtrMap<u32>, h: &mut FxHasher| {
        match step.slot {
            Some(slot) => hash_step(h, &Op::Input(Input { slot }), &step.tensor().inner.ty, &[]),
            None => hash_step(h, &step.tensor().inner.op, &step.tensor().inner.ty, &step.inputs),
        }
        position.insert(key(step.tensor()), steps.len() as u32);
        steps.push(step);
    };
    // Arguments placed where first reached, by address.
    let mut arg_slots: PtrMap<u32> = PtrMap::default();
    for (slot, arg) in args.tensors.iter().enumerate() {
        if args.in_place {
            arg_slots.insert(key(arg), slot as u32);
        } else {
            let step = Step::walked(arg.clone(), Some(slot as u32), SmallVec::new());
            push(&mut steps, step, position, &mut h);
        }
    }
    let first_slot = args.tensors.len();
    // The calls of recorded functions walked so far: the position of each output.
    let mut expanded: SmallVec<[Expanded; 1]> = SmallVec::new();
    // Their outputs, which no step holds.
    let mut held: SmallVec<[Tensor; 1]> = SmallVec::new();
    // An entry is expanded first, then completed once every input has a position.
    for root in roots {
        stack.push((root.clone(), None));
        while let Some((t, children)) = stack.pop() {
            if position.contains_key(&key(&t)) {
                continue;
            }
            if let Some(e) = t.error() {
                return Err(e.clone());
            }
            if t.device() != device {
                return Err(Error::Device(format!("one program mixes devices {device} and {}", t.device())));
            }
            let step = match children {
                Some(children) => {
                    if let Some(call) = &t.inner.call {
                        let mut cx = Cx {
                            position,
                            arg_slots: &arg_slots,
                            first_slot,
                            steps: &mut steps,
                            inputs: &mut inputs,
                            bindings: &mut bindings,
                            h: &mut h,
                        };
                        match call_position(&t, call, &children, &mut expanded, &mut cx)? {
                            Some(at) => {
                                position.insert(key(&t), at);
                                // Held, as every walked tensor is: its address names it in
                                // `position`.
                                held.push(t);
                            }
                            // Realized by another thread since it was expanded: walked again.
                            None => stack.push((t, None)),
                        }
                        continue;
                    }
                    let inputs = children.iter().map(|c| position[c]).collect();
                    Step::walked(t, None, inputs)
                }
                None => {
                    if let Some(&slot) = arg_slots.get(&key(&t)) {
                        Step::walked(t, Some(slot), SmallVec::new())
                    } else if let Some(r) = t.inner.data.get() {
                        let slot = (first_slot + inputs.len()) as u32;
                        merge_bindings(&mut bindings, &r.bindings)?;
                        inputs.push(r.host.clone());
                        Step::walked(t, Some(slot), SmallVec::new())
                    } else if t.is_placeholder() {
                        let message = if crate::jit::is_tracing() {
                            "a kiln::jit function realized a value computed from its arguments while it was \
                             traced (item, to_vec, realize): the value is not known until the compiled \
                             function runs; return the tensor instead"
                        } else {
                            "an argument of a kiln::jit function was used outside its trace (a tensor built \
                             from it was kept and realized later)"
                        };
                        return Err(Error::Jit(message.into()));
                    } else if t.inner.op.is_leaf() {
                        Step::walked(t, None, SmallVec::new())
                    } else if let Some(r) = t.inner.call.as_ref().and_then(Call::replayed) {
                        let r = r.clone();
                        let keys = smallvec::smallvec![key(&r)];
                        let at = stack.len();
                        if !position.contains_key(&key(&r)) {
                            stack.push((r, None));
                        }
                        stack.insert(at, (t, Some(keys)));
                        continue;
                    } else {
                        // Read in place under the node's lock: only the inputs not yet walked
                        // are cloned (onto the stack), the others are named by address.
                        let children = t.inner.inputs.lock().unwrap_or_else(PoisonError::into_inner);
                        if children.is_empty() {
                            // Realized by another thread between the two checks above.
                            drop(children);
                            stack.push((t, None));
                            continue;
                        }
                        let keys = children.iter().map(key).collect();
                        let at = stack.len();
                        // The arguments of a recorded call that hold data are stepped where the
                        // recording reaches them (`expand`), the others are walked first.
                        let call = t.inner.call.is_some();
                        // Reversed, so inputs are discovered (and slots numbered) left to right.
                        for c in children.iter().rev() {
                            let later = call && c.inner.data.get().is_some();
                            if !later && !position.contains_key(&key(c)) {
                                stack.push((c.clone(), None));
                            }
                        }
                        drop(children);
                        stack.insert(at, (t, Some(keys)));
                        continue;
                    }
                }
            };
            push(&mut steps, step, position, &mut h);
        }
    }
    let outputs: SmallVec<[u32; 2]> = roots.iter().map(|r| position[&key(r)]).collect();
    h.write_usize(outputs.len());
    outputs.iter().for_each(|&o| h.write_u32(o));
    // Floor-division symbols (a strided window over a symbolic size) follow from the others.
    close_derived(&mut bindings)?;
    let instances = expanded.into_iter().map(|(instance, _)| instance).collect();
    Ok(Walk { steps, outputs, inputs, bindings, hash: h.finish(), _instances: instances, _calls: held })
}

/// A recorded call walked, with the position of each of its outputs.
type Expanded = (Arc<Instance>, SmallVec<[u32; 2]>);

/// The parts of a walk in progress that [`expand`] adds to.
struct Cx<'a> {
    position: &'a mut PtrMap<u32>,
    arg_slots: &'a PtrMap<u32>,
    first_slot: usize,
    steps: &'a mut Vec<Step>,
    inputs: &'a mut Vec<HostTensor>,
    bindings: &'a mut Bindings,
    h: &'a mut FxHasher,
}

impl Cx<'_> {
    /// The position of `t`, a tensor without inputs to walk (an argument, data, a leaf), stepped
    /// as the walk steps such a tensor if it has no position yet.
    fn source(&mut self, t: &Tensor) -> Result<u32> {
        if let Some(&p) = self.position.get(&key(t)) {
            return Ok(p);
        }
        let slot = if let Some(&slot) = self.arg_slots.get(&key(t)) {
            Some(slot)
        } else if let Some(r) = t.inner.data.get() {
            let slot = (self.first_slot + self.inputs.len()) as u32;
            merge_bindings(self.bindings, &r.bindings)?;
            self.inputs.push(r.host.clone());
            Some(slot)
        } else if t.inner.op.is_leaf() {
            None
        } else {
            return Err(Error::internal("a recorded call's argument was neither walked nor data".into()));
        };
        match slot {
            Some(slot) => hash_step(self.h, &Op::Input(Input { slot }), &t.inner.ty, &[]),
            None => hash_step(self.h, &t.inner.op, &t.inner.ty, &[]),
        }
        let p = self.steps.len() as u32;
        self.position.insert(key(t), p);
        self.steps.push(Step::walked(t.clone(), slot, SmallVec::new()));
        Ok(p)
    }
}

/// The position of `t`, an output of `call` whose inputs' addresses are `children`: its replay's
/// output once autodiff made one, else the recording's output, the recording walked once per
/// call (`expanded`). `None` when another thread realized `t` since its inputs were read.
fn call_position(
    t: &Tensor,
    call: &Call,
    children: &[*const Inner],
    expanded: &mut SmallVec<[Expanded; 1]>,
    cx: &mut Cx<'_>,
) -> Result<Option<u32>> {
    if let Some(r) = call.replayed()
        && children.len() == 1
        && children[0] == key(r)
    {
        return Ok(Some(cx.position[&children[0]]));
    }
    if let Some((_, at)) = expanded.iter().find(|(i, _)| Arc::ptr_eq(i, &call.instance)) {
        return Ok(Some(at[call.output as usize]));
    }
    let args = t.inner.inputs.lock().unwrap_or_else(PoisonError::into_inner);
    if args.len() != children.len() {
        return Ok(None);
    }
    let at = expand(&call.instance.recording, &args, cx)?;
    drop(args);
    let position = at[call.output as usize];
    expanded.push((call.instance.clone(), at));
    Ok(Some(position))
}

/// Walks the nodes of `recording` for a call on `args`: each computed node is a step of its own
/// (the recorded tensor, with the positions of this call's inputs); arguments and shared tensors
/// are stepped where the recording first reaches them, as a walk of the function's own graph
/// would (the arguments that hold no data were walked before). Returns the position of each
/// output.
fn expand(recording: &Recording, args: &[Tensor], cx: &mut Cx<'_>) -> Result<SmallVec<[u32; 2]>> {
    let mut at: Vec<u32> = Vec::with_capacity(recording.steps.len());
    for rs in &recording.steps {
        let p = match &rs.kind {
            Kind::Arg(i) => cx.source(&args[*i as usize])?,
            Kind::Shared => cx.source(&rs.tensor)?,
            Kind::Computed(from, hash) => {
                let step_inputs: SmallVec<[u32; 3]> = from.iter().map(|&i| at[i as usize]).collect();
                hash_node(cx.h, *hash, &step_inputs);
                let node = StepNode::Recorded(NonNull::from(&rs.tensor));
                cx.steps.push(Step { node, slot: None, inputs: step_inputs });
                cx.steps.len() as u32 - 1
            }
        };
        at.push(p);
    }
    Ok(recording.outputs.iter().map(|&o| at[o as usize]).collect())
}

impl Walk {
    /// The recordings the walk's recorded steps are nodes of.
    pub(crate) fn recordings(&self) -> Vec<Arc<Recording>> {
        self._instances.iter().map(|i| i.recording.clone()).collect()
    }

    /// Gives the step list back to this thread's [`walk`] tables, emptied, for the next walk.
    pub(crate) fn recycle(self) {
        let mut steps = self.steps;
        if steps.capacity() > SCRATCH_KEPT {
            return;
        }
        steps.clear();
        SCRATCH.with(|scratch| {
            if let Ok(mut scratch) = scratch.try_borrow_mut() {
                scratch.steps = steps;
            }
        });
    }

    /// The air graph of the walk (node `i` inserted `i`-th: `ids[i]`), with where each node was
    /// built.
    pub(crate) fn build(&self) -> Result<(Graph, Vec<NodeId>, Sites)> {
        let mut graph = Graph::for_compile(self.steps.len());
        let mut ids = Vec::with_capacity(self.steps.len());
        let mut sites = Sites::default();
        for step in &self.steps {
            let (op, ty) = (&step.tensor().inner.op, &step.tensor().inner.ty);
            let id = match step.slot {
                Some(slot) => graph.add_leaf(Op::Input(Input { slot }), ty.clone())?,
                None if step.inputs.is_empty() => graph.add_leaf(op.clone(), ty.clone())?,
                None => {
                    let inputs = step.inputs.iter().map(|&i| ids[i as usize]).collect();
                    // SAFETY: `Tensor::apply` recorded this node with the type `Op::infer`
                    // gave for its inputs' types and checked its size (an error tensor is never
                    // walked); its inputs are the nodes of those inputs, which carry their
                    // recorded types (a realized input its own, as an `Input` leaf).
                    unsafe { graph.add_inferred(Node { op: op.clone(), inputs, ty: ty.clone() }) }
                }
            };
            if step.slot.is_none() {
                sites.set(id, step.tensor().inner.site);
            }
            ids.push(id);
        }
        for &o in &self.outputs {
            graph.add_output(ids[o as usize]);
        }
        Ok((graph, ids, sites))
    }
}

/// Traces `roots` (error-free, one device, distinct) into a program whose outputs are `roots`;
/// `args` as in [`walk`].
pub(crate) fn trace_roots(roots: &[Tensor], device: Device, args: &[Tensor]) -> Result<Program> {
    let walk = walk(roots, device, args)?;
    let (graph, _, sites) = walk.build()?;
    Ok(Program { graph, inputs: walk.inputs, bindings: walk.bindings, device, sites })
}

/// The requested tensors that still need computing, deduplicated, or the first error.
fn pending(tensors: &[&Tensor]) -> Result<SmallVec<[Tensor; 2]>> {
    let mut out: SmallVec<[Tensor; 2]> = SmallVec::new();
    // A few tensors are deduplicated by comparing handles; a table pays beyond that.
    let mut seen = (tensors.len() > 8).then(PtrSet::default);
    for t in tensors {
        t.check()?;
        if t.is_realized() {
            continue;
        }
        let new = match &mut seen {
            Some(seen) => seen.insert(key(t)),
            None => !out.iter().any(|o| Tensor::ptr_eq(o, t)),
        };
        if new {
            out.push((*t).clone());
        }
    }
    Ok(out)
}

/// Traces `tensors` into the air program `realize` would run (requested tensors that already
/// hold data become plain `Input` outputs). All tensors must be on one device.
pub fn trace(tensors: &[&Tensor]) -> Result<Program> {
    let mut seen = PtrSet::default();
    let mut roots = Vec::new();
    for t in tensors {
        t.check()?;
        if seen.insert(key(t)) {
            roots.push((*t).clone());
        }
    }
    let device = roots.first().map_or_else(Device::default, Tensor::device);
    trace_roots(&roots, device, &[])
}

/// Computes every tensor in `tensors` that does not hold data yet, with one graph per device, and
/// stores each result in its tensor. Later realizes reuse the stored data.
pub fn realize(tensors: &[&Tensor]) -> Result<()> {
    let todo = pending(tensors)?;
    if !todo.is_empty() {
        crate::record::impure();
    }
    let mut devices: SmallVec<[Device; 1]> = SmallVec::new();
    for t in &todo {
        if !devices.contains(&t.device()) {
            devices.push(t.device());
        }
    }
    for device in devices {
        let mine;
        let roots: &[Tensor] = if todo.iter().all(|t| t.device() == device) {
            &todo
        } else {
            mine = todo.iter().filter(|t| t.device() == device).cloned().collect::<Vec<Tensor>>();
            &mine
        };
        // Inside a profile every step of a realize is reported (trace, the device's cache lookup
        // or compile, run); outside, the realize cache skips the steps a structure seen before
        // does not need.
        let (outputs, bindings, keep) = if crate::profile::is_active() {
            // As a realize outside a profile does once it missed its cache.
            backend::expect_compile(device);
            crate::profile::begin(crate::profile::Step::Trace, None);
            let program = trace_roots(roots, device, &[]);
            crate::profile::end(program.as_ref().ok().map(|p| p.graph.len()));
            let program = program?;
            let outputs =
                backend::execute_traced(device, &program.graph, program.inputs, &program.bindings, &program.sites)?;
            (outputs, program.bindings, crate::autograd::keeps_graphs(roots))
        } else {
            crate::trace_cache::realize_roots(roots, device)?
        };
        if outputs.len() != roots.len() {
            return Err(Error::internal(format!("{} outputs for {} requested tensors", outputs.len(), roots.len())));
        }
        for ((t, host), keep) in roots.iter().zip(outputs).zip(keep) {
            // The output of a recorded call that autodiff replayed stands for the replay's: both
            // hold the value, so a gradient built on the replay reads it as a direct graph's
            // gradient reads its realized forward (rather than computing it again).
            if let Some(r) = t.inner.call.as_ref().and_then(Call::replayed)
                && !r.is_realized()
            {
                store(r, host.clone(), &bindings, keep)?;
            }
            store(t, host, &bindings, keep)?;
        }
    }
    Ok(())
}

/// Checks a backend result against the tensor's type and stores it; drops the tensor's inputs
/// unless autodiff needs them later (`keep`, from `autograd::keeps_graphs`).
fn store(t: &Tensor, host: HostTensor, bindings: &Bindings, keep: bool) -> Result<()> {
    let ty = &t.inner.ty;
    // Compared dim by dim, so that a small result allocates nothing here.
    let same_dims = host.shape.len() == ty.shape.len()
        && ty.shape.iter().zip(&host.shape).all(|(d, &n)| d.eval(bindings).is_ok_and(|v| v.max(0) as usize == n));
    if host.dtype() != ty.dtype || !same_dims {
        let dims = air::dim::eval_shape(&ty.shape, bindings).map_err(air::AirError::from)?;
        return Err(Error::internal(format!(
            "result {}{:?} does not match the tensor's type {} (dims {:?})",
            host.dtype(),
            host.shape,
            ty,
            dims
        )));
    }
    let _ = t.inner.data.set(Realized { host, bindings: own_bindings(&ty.shape, bindings) });
    if keep {
        return Ok(());
    }
    let inputs = std::mem::take(&mut *t.inner.inputs.lock().unwrap_or_else(PoisonError::into_inner));
    drop(inputs);
    Ok(())
}

/// The values in `bindings` of the symbols of `shape`: what a realized tensor keeps.
pub(crate) fn own_bindings(shape: &air::Shape, bindings: &Bindings) -> Bindings {
    let mut own = Bindings::new();
    if bindings.is_empty() {
        return own;
    }
    for d in shape {
        d.for_each_symbol(|s| {
            if !own.contains_key(s)
                && let Some(&v) = bindings.get(s)
            {
                own.insert(s.clone(), v);
            }
        });
    }
    own
}

impl Tensor {
    /// Computes this tensor (if it holds no data yet) and keeps the result. See [`realize`].
    pub fn realize(&self) -> Result<&Self> {
        realize(&[self])?;
        Ok(self)
    }

    /// The realized data as a host tensor (shares the buffer, no copy).
    pub fn to_host(&self) -> Result<HostTensor> {
        crate::record::impure();
        self.realize()?;
        match self.inner.data.get() {
            Some(r) => Ok(r.host.clone()),
            None => Err(Error::internal("realize stored no data".into())),
        }
    }

    /// The elements in row-major order, copied out. `T` must match the dtype exactly.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let loc = Location::caller();
        let host = self.to_host()?;
        match host.as_slice::<T>() {
            Some(s) => Ok(s.to_vec()),
            None => Err(dtype_error("to_vec", T::DTYPE, &host, loc)),
        }
    }

    /// The elements in row-major order without a copy when this handle is the only owner of the
    /// data (a source tensor built by `from_vec` gives back the very same `Vec`); copied otherwise.
    #[track_caller]
    pub fn into_vec<T: Element>(mut self) -> Result<Vec<T>> {
        let loc = Location::caller();
        crate::record::impure();
        self.realize()?;
        let host = match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.data.take().map(|r| r.host),
            None => self.inner.data.get().map(|r| r.host.clone()),
        }
        .ok_or_else(|| Error::internal("realize stored no data".into()))?;
        if host.dtype() != T::DTYPE {
            return Err(dtype_error("into_vec", T::DTYPE, &host, loc));
        }
        host.into_vec::<T>().ok_or_else(|| Error::internal("host data changed dtype".into()))
    }

    /// The single element of a one-element tensor (any shape with one element).
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        let loc = Location::caller();
        let host = self.to_host()?;
        if host.numel() != 1 {
            return Err(Error::op(
                "item",
                format!("a tensor of shape {} has {} elements, not 1", show(self.shape()), host.numel()),
                loc,
            ));
        }
        match host.as_slice::<T>() {
            Some(s) => Ok(s[0]),
            None => Err(dtype_error("item", T::DTYPE, &host, loc)),
        }
    }

    /// The air text of the program `realize` would run for this tensor, nodes numbered in order.
    /// Two programs with equal text are structurally identical.
    pub fn graph_text(&self) -> Result<String> {
        Ok(air::print_renumbered(&trace(&[self])?.graph))
    }

    /// A source tensor on `device` holding this tensor's data (realizing it first; the data is
    /// shared, not copied).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let host = self.to_host()?;
        Ok(Tensor::source(host, self.shape().clone(), self.bindings(), device))
    }
}

fn dtype_error(op: &'static str, want: air::DType, host: &HostTensor, loc: &'static Location<'static>) -> Error {
    Error::op(op, format!("asked for {want} elements of a tensor of dtype {}", host.dtype()), loc)
}

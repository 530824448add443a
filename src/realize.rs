//! Realizing lazy tensors: trace the DAG into an air graph, run it on the device, keep the results.
//!
//! The walk starts at the requested tensors and stops at tensors that already hold data; those
//! become `Input` nodes (slot = discovery order) and their host data, shared not copied, becomes
//! the graph's inputs. A `HashMap` keyed by node pointer makes shared subexpressions one air node
//! and keeps the walk O(nodes). The walk is iterative, so graph depth is bounded only by memory.
//! Graph types keep their symbolic dims; the symbol values come from the source tensors and are
//! passed to the backend as bindings, so one program realized with `seq = 3` and with `seq = 7`
//! gives structurally identical graphs.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::Location;
use std::sync::{Arc, PoisonError};

use air::graph::Node;
use air::op::Input;
use air::{Bindings, Element, Graph, HostTensor, NodeId, Op};

use crate::backend;
use crate::device::Device;
use crate::error::{Error, Result};
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

    /// Where node `id` was built, if the user built it.
    pub(crate) fn get(&self, id: NodeId) -> Option<Site> {
        self.0.get(id.index() as usize).copied().flatten()
    }
}

/// Adds `new` to `into`; a symbol bound to two different values is an error naming it.
pub(crate) fn merge_bindings(into: &mut Bindings, new: &Bindings) -> Result<()> {
    for (symbol, &value) in new {
        match into.get(symbol) {
            Some(&first) if first != value => {
                return Err(Error::Binding { symbol: symbol.clone(), first, second: value });
            }
            Some(_) => {}
            None => {
                into.insert(symbol.clone(), value);
            }
        }
    }
    Ok(())
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

/// Traces `roots` (error-free, one device, distinct) into a program whose outputs are `roots`.
///
/// `args` are the placeholders of a `kiln::jit` trace ([`Tensor::placeholder`]): `args[i]`
/// becomes `Input { slot: i }`, tensors that hold data take the slots after them, and
/// `Program::inputs` holds only theirs (`inputs[k]` feeds slot `args.len() + k`). A placeholder
/// not in `args` is an error: it escaped the trace it belongs to.
pub(crate) fn trace_roots(roots: &[Tensor], device: Device, args: &[Tensor]) -> Result<Program> {
    let mut ids: PtrMap<NodeId> = PtrMap::default();
    let mut graph = Graph::new();
    let mut inputs: Vec<HostTensor> = Vec::new();
    let mut bindings = Bindings::new();
    let mut sites = Sites::default();
    for (slot, arg) in args.iter().enumerate() {
        let id = graph.add_leaf(Op::Input(Input { slot: slot as u32 }), arg.inner.ty.clone())?;
        ids.insert(key(arg), id);
    }
    let first_slot = args.len();
    // (tensor, its inputs once expanded): an entry is expanded first, then completed once every
    // input has an id.
    let mut stack: Vec<(Tensor, Option<Vec<Tensor>>)> = Vec::new();

    for root in roots {
        stack.push((root.clone(), None));
        while let Some((t, children)) = stack.pop() {
            if ids.contains_key(&key(&t)) {
                continue;
            }
            if let Some(e) = t.error() {
                return Err(e.clone());
            }
            if t.device() != device {
                return Err(Error::Device(format!("one program mixes devices {device} and {}", t.device())));
            }
            let id = match children {
                Some(children) => {
                    let mut input_ids = air::graph::Inputs::new();
                    for c in &children {
                        input_ids.push(ids[&key(c)]);
                    }
                    let id =
                        graph.add_unchecked(Node { op: t.inner.op.clone(), inputs: input_ids, ty: t.inner.ty.clone() });
                    sites.set(id, t.inner.site);
                    id
                }
                None => {
                    if let Some(r) = t.inner.data.get() {
                        let slot = (first_slot + inputs.len()) as u32;
                        merge_bindings(&mut bindings, &r.bindings)?;
                        inputs.push(r.host.clone());
                        graph.add_leaf(Op::Input(Input { slot }), t.inner.ty.clone())?
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
                        let id = graph.add_leaf(t.inner.op.clone(), t.inner.ty.clone())?;
                        sites.set(id, t.inner.site);
                        id
                    } else {
                        let children = t.inputs();
                        if children.is_empty() {
                            // Realized by another thread between the two checks above.
                            stack.push((t, None));
                            continue;
                        }
                        let at = stack.len();
                        stack.push((t, None));
                        // Reversed, so inputs are discovered (and slots numbered) left to right.
                        for c in children.iter().rev() {
                            if !ids.contains_key(&key(c)) {
                                stack.push((c.clone(), None));
                            }
                        }
                        stack[at].1 = Some(children);
                        continue;
                    }
                }
            };
            ids.insert(key(&t), id);
        }
    }
    for root in roots {
        graph.add_output(ids[&key(root)]);
    }
    Ok(Program { graph, inputs, bindings, device, sites })
}

/// The requested tensors that still need computing, deduplicated, or the first error.
fn pending(tensors: &[&Tensor]) -> Result<Vec<Tensor>> {
    let mut seen = PtrSet::default();
    let mut out = Vec::new();
    for t in tensors {
        t.check()?;
        if !t.is_realized() && seen.insert(key(t)) {
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
    let mut devices: Vec<Device> = Vec::new();
    for t in &todo {
        if !devices.contains(&t.device()) {
            devices.push(t.device());
        }
    }
    for device in devices {
        let roots: Vec<Tensor> = todo.iter().filter(|t| t.device() == device).cloned().collect();
        let program = if crate::profile::is_active() {
            crate::profile::begin(crate::profile::Step::Trace, None);
            let program = trace_roots(&roots, device, &[]);
            crate::profile::end(program.as_ref().ok().map(|p| p.graph.len()));
            program?
        } else {
            trace_roots(&roots, device, &[])?
        };
        let outputs =
            backend::execute_traced(device, &program.graph, program.inputs, &program.bindings, &program.sites)?;
        if outputs.len() != roots.len() {
            return Err(Error::internal(format!("{} outputs for {} requested tensors", outputs.len(), roots.len())));
        }
        let keep = crate::autograd::keeps_graphs(&roots);
        for ((t, host), keep) in roots.iter().zip(outputs).zip(keep) {
            store(t, host, &program.bindings, keep)?;
        }
    }
    Ok(())
}

/// Checks a backend result against the tensor's type and stores it; drops the tensor's inputs
/// unless autodiff needs them later (`keep`, from `autograd::keeps_graphs`).
fn store(t: &Tensor, host: HostTensor, bindings: &Bindings, keep: bool) -> Result<()> {
    let ty = &t.inner.ty;
    let dims = air::dim::eval_shape(&ty.shape, bindings).map_err(air::AirError::from)?;
    if host.dtype() != ty.dtype || host.shape != dims {
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
        for s in d.symbols() {
            if let Some(&v) = bindings.get(&s) {
                own.insert(s, v);
            }
        }
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

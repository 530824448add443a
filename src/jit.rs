//! Compiled functions: [`jit`] traces a closure once per argument signature and then runs the
//! cached executable on each call's arguments, without recording, tracing or hashing a graph.
//!
//! The first call with a given *signature* (each argument's device, dtype and shape, symbolic
//! dims kept as symbols) calls the closure on placeholders of those types, traces what it returns
//! into one air graph (arguments become `Input { slot: i }`), compiles it and keeps it. Every later
//! call with that signature binds the arguments' data (and their symbol values: `[seq, 64]` with
//! `seq = 3` and `seq = 7` share one trace) to the kept executable and runs it: the cost of a call
//! is the run plus a few microseconds, whatever the size of the graph. A new signature traces again.
//!
//! What the closure captures instead of taking as an argument is a constant of the trace, as in
//! `jax.jit`: tensors that hold data are read as they were when the signature was traced. Pass
//! anything that changes between calls (weights being trained, optimizer state, a learning rate)
//! as an argument. Two things are handled for the caller:
//! - random tensors the closure draws from the thread's generator (`Tensor::rand`, `randn`, dropout)
//!   are drawn again on every call, in the same order, as running the closure would (a seeded
//!   draw is a constant);
//! - a closure that realizes a tensor built from an argument (`item`, `to_vec`) cannot be traced:
//!   its value is not known until the call runs. That is an [`Error::Jit`].
//!
//! Outputs are realized source tensors; they carry no gradient history (differentiate inside the
//! closure: `kiln::grad` on placeholders works). A [`jit`] call made while another function is
//! being traced runs its closure inline, so compiled functions compose.
//!
//! Output storage is reused (PyTorch's `out=`, done for the caller): a [`JitCache`] keeps the
//! outputs of its last two calls, and an output array nobody else holds any more (the caller
//! dropped the tensor, or replaced the weight it was) is handed to the next run as the storage
//! of an output of the same dtype and length, so a training loop that replaces its parameters
//! every step allocates no output arrays in the steady state. [`JitCache::call_into`] offers the
//! storage of given tensors explicitly.
//!
//! Arguments given again are cheap: a shared argument without symbol bindings (a weight) stays
//! bound to its slot after the call, and the next call that passes the same tensor there
//! (`Tensor::ptr_eq`; tensors never change) neither checks its type nor reads it again. With
//! [`JitCache::call_with_state`] the weights are lent by reference, so not even a handle is
//! cloned, and arrays the call updates in place (a key/value cache) are passed as *state*: host
//! arrays given to the program and put back, with no tensor made for them. A GPT-2 decoding step
//! passes ~175 arguments, and after its kernels have streamed ~500 MB every object the call
//! touches is a cache miss.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use air::{Bindings, DType, HostData, HostTensor, Shape, Symbol, TensorType};

use crate::backend::{self, Loaded};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::realize::{Sites, bind, close_derived, merge_bindings, own_bindings, trace_roots};
use crate::tensor::Tensor;

/// A random input drawn from the calling thread's generator on every call.
pub(crate) type Draw = Box<dyn Fn() -> std::result::Result<HostTensor, String>>;

/// What a trace in progress collects besides the closure's outputs.
#[derive(Default)]
struct TraceState {
    /// Placeholders for random tensors drawn during the trace, and how to draw each again.
    random: Vec<(Tensor, Draw)>,
}

thread_local! {
    static TRACING: RefCell<Vec<TraceState>> = const { RefCell::new(Vec::new()) };
}

/// Whether a [`jit`] function is being traced on this thread.
pub(crate) fn is_tracing() -> bool {
    TRACING.with(|t| !t.borrow().is_empty())
}

/// Inside a trace: a placeholder of `ty` on `device` for a random tensor that `draw` makes on
/// every call. `None` when no trace is in progress.
pub(crate) fn random_input(ty: TensorType, device: Device, draw: Draw) -> Option<Tensor> {
    TRACING.with(|t| {
        let mut stack = t.borrow_mut();
        let state = stack.last_mut()?;
        let placeholder = Tensor::placeholder(ty, device);
        state.random.push((placeholder.clone(), draw));
        Some(placeholder)
    })
}

/// What a closure traced by [`jit`] may return: one tensor or several, possibly as a `Result`
/// whose error type (a library's own, such as `nn`'s) is then the error type of the call.
pub trait JitOutput {
    /// The error a call returns: Kiln's errors convert into it.
    type Error: From<Error>;
    /// The output tensors, in order.
    fn into_outputs(self) -> std::result::Result<Vec<Tensor>, Self::Error>;
}

impl JitOutput for Tensor {
    type Error = Error;
    fn into_outputs(self) -> Result<Vec<Tensor>> {
        Ok(vec![self])
    }
}

impl JitOutput for Vec<Tensor> {
    type Error = Error;
    fn into_outputs(self) -> Result<Vec<Tensor>> {
        Ok(self)
    }
}

impl<T, E> JitOutput for std::result::Result<T, E>
where
    T: JitOutput,
    E: From<Error> + From<T::Error>,
{
    type Error = E;
    fn into_outputs(self) -> std::result::Result<Vec<Tensor>, E> {
        Ok(self?.into_outputs()?)
    }
}

/// One traced signature.
struct Entry {
    device: Device,
    signature: Vec<TensorType>,
    sites: Sites,
    loaded: Loaded,
    captured_bindings: Bindings,
    random: Vec<Draw>,
    /// The shape of each graph output (symbolic dims as traced).
    outputs: Vec<Shape>,
    /// The graph output each of the closure's outputs is (a tensor returned twice is one graph
    /// output).
    which: Vec<usize>,
    /// The graph outputs written in place over an argument's array (`backend::in_place`).
    in_place: Vec<usize>,
    /// The input slots those outputs are written over: a run takes their arrays out of `bound`,
    /// so they are never kept.
    taken_slots: Vec<usize>,
    /// The program's inputs as the last call bound them: arguments, random draws, captured data.
    /// A kept argument's slot is left as it is from call to call (no handle cloned, no tensor
    /// touched); the others are rebound per call and emptied after it, so that no array of
    /// theirs is held past the call.
    bound: Vec<HostTensor>,
    /// How many of the arguments, after the owned ones, are state arrays
    /// ([`JitCache::call_with_state`]); the closure's last as many outputs are their new values.
    n_state: usize,
    /// Per graph output, whether exactly one of the closure's outputs is it (its array can be
    /// moved out rather than shared).
    sole: Vec<bool>,
    /// Per argument, the last call's argument when it was a shared tensor without bindings (a
    /// weight): the same tensor given again has the same type and data, so the next call skips
    /// its signature check and leaves its host tensor in `bound`. Decoding passes ~200 weights
    /// per token, each read from memory that the step's kernels evicted; these reads were most
    /// of the host time per token.
    kept: Vec<Option<Kept>>,
}

/// An argument of the last call, kept for the next (see `Entry::kept`; its host tensor stays in
/// `Entry::bound`).
struct Kept {
    tensor: Tensor,
}

/// The traces of one compiled function, by signature: what [`Jit`] holds, usable on its own
/// when the closure cannot be stored with the cache (it borrows the owner of the cache, as
/// `nn::Trainer`'s step does). Calls pass the closure each time; it runs only on a miss.
#[derive(Default)]
pub struct JitCache {
    entries: Vec<Entry>,
    traces: usize,
    /// The entry the last call ran.
    last: Option<usize>,
    /// The output arrays of the last two calls (newest last), offered for reuse once nobody else
    /// holds them.
    held: [Vec<Arc<HostData>>; 2],
}

impl JitCache {
    /// An empty cache.
    pub fn new() -> JitCache {
        JitCache::default()
    }

    /// How many times a closure was traced (one per signature seen, unless [`JitCache::clear`]).
    pub fn traces(&self) -> usize {
        self.traces
    }

    /// The number of nodes of the graph the last call ran (0 before the first call).
    pub fn last_graph_nodes(&self) -> usize {
        self.last.map_or(0, |i| self.entries[i].loaded.len())
    }

    /// Forgets every trace (the next call traces again: after a captured value changed).
    pub fn clear(&mut self) {
        self.last = None;
        self.entries.clear();
        self.held = Default::default();
    }

    /// Calls the compiled function on `args`: traces `f` first if no call had this signature.
    /// Lazy arguments are realized first. Returns the outputs, realized.
    pub fn call<R: JitOutput>(
        &mut self,
        args: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> R,
    ) -> std::result::Result<Vec<Tensor>, R::Error> {
        self.call_into(args, Vec::new(), f)
    }

    /// [`JitCache::call`], also offering the storage of `out` for the outputs (PyTorch's
    /// `out=`): a tensor of `out` whose data nobody else holds is consumed and its array written
    /// with an output of the same dtype and length. Tensors still shared are left alone.
    pub fn call_into<R: JitOutput>(
        &mut self,
        args: &[&Tensor],
        out: Vec<Tensor>,
        f: impl FnOnce(&[Tensor]) -> R,
    ) -> std::result::Result<Vec<Tensor>, R::Error> {
        self.run(args.iter().map(|t| (*t).clone()).collect(), out, f)
    }

    /// [`JitCache::call`] on arguments the caller gives up (JAX's donated arguments): when an
    /// output is the argument updated in place (a concatenation over it that nothing else reads,
    /// as a KV cache update `cache.slice_scatter(..)` is) and this call held the argument's only
    /// handle and array, the output *is* that array, and only the new part is written. An
    /// argument still shared elsewhere is copied instead; the results are the same either way.
    pub fn call_owned<R: JitOutput>(
        &mut self,
        args: Vec<Tensor>,
        f: impl FnOnce(&[Tensor]) -> R,
    ) -> std::result::Result<Vec<Tensor>, R::Error> {
        self.run(args, Vec::new(), f)
    }

    /// [`JitCache::call_owned`] on `owned`, then `state`, then `borrowed`, with `symbols` bound
    /// besides what the arguments bind: the call a decoding step makes.
    ///
    /// - `state` holds arrays the call updates (a key/value cache), kept by the caller as host
    ///   arrays rather than tensors: the closure sees each as an argument and returns its new
    ///   value among its *last* `state.len()` outputs (in order, each of the argument's type), and
    ///   the call puts those new arrays back into `state` instead of returning them. An array
    ///   written in place over its argument (`slice_scatter` into a cache nothing else reads)
    ///   comes back as the very array given; nothing else holding it, it is not copied. No tensor
    ///   is made, checked or refilled for them per call: after a GPT-2 step's kernels have
    ///   streamed ~500 MB, each such tensor was a handful of cache misses. If the call fails, the
    ///   state's arrays may have been given to it already: they are left empty.
    /// - `borrowed` are arguments the caller keeps (a model's weights), read where they are,
    ///   without a handle cloned per call; a weight given again in its slot is bound without its
    ///   tensor being touched at all (see [`jit`](crate::jit)'s module docs).
    /// - `symbols` gives the values of symbols the closure names itself (`Dim::sym`) instead of
    ///   reading them from an argument's shape (a decoding step's position): no tensor is made,
    ///   bound and dropped for them per call. A value contradicting one an argument binds is an
    ///   error.
    ///
    /// Returns the closure's outputs before the state's.
    pub fn call_with_state<R: JitOutput>(
        &mut self,
        owned: Vec<Tensor>,
        state: &mut [HostTensor],
        borrowed: &[Tensor],
        symbols: &[(Symbol, i64)],
        f: impl FnOnce(&[Tensor]) -> R,
    ) -> std::result::Result<Vec<Tensor>, R::Error> {
        self.run_parts(owned, state, borrowed, symbols, Vec::new(), f)
    }

    fn run<R: JitOutput>(
        &mut self,
        args: Vec<Tensor>,
        out: Vec<Tensor>,
        f: impl FnOnce(&[Tensor]) -> R,
    ) -> std::result::Result<Vec<Tensor>, R::Error> {
        self.run_parts(args, &mut [], &[], &[], out, f)
    }

    /// A call on the arguments `owned`, `state` and `borrowed`, in that order, with `symbols`
    /// bound besides theirs (see [`JitCache::call_with_state`]).
    fn run_parts<R: JitOutput>(
        &mut self,
        mut owned: Vec<Tensor>,
        state: &mut [HostTensor],
        borrowed: &[Tensor],
        symbols: &[(Symbol, i64)],
        out: Vec<Tensor>,
        f: impl FnOnce(&[Tensor]) -> R,
    ) -> std::result::Result<Vec<Tensor>, R::Error> {
        // A call computes: a recorded function that makes one is never recorded.
        crate::record::impure();
        if is_tracing() {
            if !state.is_empty() {
                return Err(Error::Jit("a call with state arrays cannot run inside another trace".into()).into());
            }
            // Inside another trace: the arguments may be placeholders; run the closure inline.
            owned.extend(borrowed.iter().cloned());
            return f(&owned).into_outputs();
        }
        let (n_owned, n_state) = (owned.len(), state.len());
        let n = n_owned + n_state + borrowed.len();
        // The tensor argument `i` (`None` for a state array).
        let arg = |i: usize| match i.checked_sub(n_owned) {
            None => Some(&owned[i]),
            Some(j) => j.checked_sub(n_state).map(|j| &borrowed[j]),
        };
        let device = owned.first().or(borrowed.first()).map_or_else(Device::default, Tensor::device);
        let found = self.entries.iter().position(|e| {
            e.device == device
                && e.signature.len() == n
                && e.n_state == n_state
                && (0..n).all(|i| match arg(i) {
                    Some(a) => e.kept[i].as_ref().is_some_and(|k| k.is(a)) || e.signature[i] == *a.ty(),
                    None => holds(&e.signature[i], &state[i - n_owned]),
                })
        });
        let index = match found {
            Some(i) => i,
            None => {
                // The state arrays as tensors, for the trace only (they share the arrays).
                let arrays: Vec<Tensor> = state.iter().map(|h| Tensor::from_host_on(h.clone(), device)).collect();
                let refs: Vec<&Tensor> = (0..n).map(|i| arg(i).unwrap_or_else(|| &arrays[i - n_owned])).collect();
                crate::realize(&refs)?;
                let entry = trace(device, &refs, n_owned..n_owned + n_state, f)?;
                drop(arrays);
                self.traces += 1;
                self.entries.push(entry);
                self.entries.len() - 1
            }
        };
        // Kept arguments not given again are let go before the spare arrays are collected (a
        // training step's old parameters become spare storage for the new ones), and so is one
        // whose caller gave up every other handle (so that the call may take its array).
        for (i, e) in self.entries.iter_mut().enumerate() {
            for (j, k) in e.kept.iter_mut().enumerate() {
                let given = if i == index { arg(j) } else { None };
                let drop = k.as_ref().is_some_and(|k| match given {
                    Some(a) => !k.is(a) || (j < n_owned && k.only_other_handle(a)),
                    None => true,
                });
                if drop {
                    *k = None;
                    unbind(&mut e.bound[j]);
                }
            }
        }
        {
            // A kept argument is realized (it was when it was kept, and a tensor's data stays).
            let kept = &self.entries[index].kept;
            let refs: Vec<&Tensor> = (0..n).filter(|&i| kept[i].is_none()).filter_map(arg).collect();
            crate::realize(&refs)?;
        }
        let spare = self.spare(out);
        self.last = Some(index);
        let entry = &mut self.entries[index];
        let mut bindings = entry.captured_bindings.clone();
        for (symbol, value) in symbols {
            bind(&mut bindings, symbol, *value)?;
        }
        let (owned_kept, rest_kept) = entry.kept.split_at_mut(n_owned);
        let borrowed_kept = &mut rest_kept[n_state..];
        let (owned_bound, rest) = entry.bound.split_at_mut(n_owned);
        let (state_bound, rest) = rest.split_at_mut(n_state);
        let (borrowed_bound, drawn) = rest.split_at_mut(borrowed.len());
        let taken_slots = &entry.taken_slots;
        // The arguments whose arrays the call took, by array: an output written in place over
        // one of them comes back in its handle (`Tensor::refill`).
        let mut shells: Vec<(*const HostData, Option<Tensor>)> = Vec::with_capacity(n_owned);
        for (j, ((mut a, kept), slot)) in owned.into_iter().zip(owned_kept).zip(owned_bound).enumerate() {
            if kept.is_some() {
                continue;
            }
            // The argument's own array when this was its last handle, else a shared reference.
            let taken = Arc::get_mut(&mut a.inner).and_then(|inner| inner.data.take());
            *slot = match taken {
                Some(r) => {
                    if !r.bindings.is_empty() {
                        merge_bindings(&mut bindings, &r.bindings)?;
                    }
                    shells.push((Arc::as_ptr(&r.host.data), Some(a)));
                    r.host
                }
                None => bind_shared(&a, kept, !taken_slots.contains(&j), &mut bindings)?,
            };
        }
        for (array, slot) in state.iter_mut().zip(state_bound) {
            let empty = HostTensor { data: HostData::empty_shared(array.dtype()), shape: Vec::new() };
            *slot = std::mem::replace(array, empty);
        }
        // The borrowed slots bound for this call only (not kept: emptied after it). A weight given
        // again is kept and in none of these loops' work.
        let first_borrowed = n_owned + n_state;
        let mut rebound = Vec::new();
        for (j, ((a, kept), slot)) in borrowed.iter().zip(borrowed_kept).zip(borrowed_bound).enumerate() {
            if kept.is_none() {
                *slot = bind_shared(a, kept, !taken_slots.contains(&(first_borrowed + j)), &mut bindings)?;
                if kept.is_none() {
                    rebound.push(first_borrowed + j);
                }
            }
        }
        for (draw, slot) in entry.random.iter().zip(drawn) {
            *slot = draw().map_err(Error::Jit)?;
        }
        close_derived(&mut bindings)?;
        let ran = backend::run_loaded(&entry.loaded, &mut entry.bound, &bindings, &entry.sites, spare);
        // Only kept arguments and captured data stay bound between calls: the owned arguments'
        // and the state's slots, the borrowed ones bound for this call and the random draws are
        // emptied.
        for j in (0..first_borrowed).chain(rebound).chain(n..n + entry.random.len()) {
            if entry.kept.get(j).is_none_or(Option::is_none) {
                unbind(&mut entry.bound[j]);
            }
        }
        let hosts = ran?;
        if hosts.len() != entry.outputs.len() {
            return Err(Error::internal(format!("{} outputs for {} traced", hosts.len(), entry.outputs.len())).into());
        }
        let mut hosts: Vec<Option<HostTensor>> = hosts.into_iter().map(Some).collect();
        // The state's new arrays: the closure's last outputs, moved out unless another output is
        // the same tensor.
        let n_results = entry.which.len() - n_state;
        for (array, &g) in state.iter_mut().zip(&entry.which[n_results..]) {
            let host = if entry.sole[g] { hosts[g].take() } else { hosts[g].clone() };
            *array = host.ok_or_else(|| Error::internal("a state output taken twice".into()))?;
        }
        let mut held: Vec<Arc<HostData>> = Vec::with_capacity(n_results);
        let mut tensors = Vec::with_capacity(hosts.len());
        for (i, (host, shape)) in hosts.into_iter().zip(&entry.outputs).enumerate() {
            let Some(host) = host else {
                tensors.push(None);
                continue;
            };
            // An output written in place is not held for reuse: the next call may be given it
            // back as an argument, to be updated in place again.
            if !entry.in_place.contains(&i) && !held.iter().any(|h| Arc::ptr_eq(h, &host.data)) {
                held.push(host.data.clone());
            }
            let own = own_bindings(shape, &bindings);
            let shell = shells.iter_mut().find(|(p, _)| *p == Arc::as_ptr(&host.data)).and_then(|(_, t)| t.take());
            tensors.push(Some(match shell {
                Some(shell) => Tensor::refill(shell, host, shape.clone(), own, device),
                None => Tensor::source(host, shape.clone(), own, device),
            }));
        }
        // Each output its own tensor (the usual case) is returned as made, no handle cloned.
        let results = entry.which[..n_results]
            .iter()
            .map(|&g| if entry.sole[g] { tensors[g].take() } else { tensors[g].clone() })
            .collect::<Option<Vec<Tensor>>>()
            .ok_or_else(|| Error::internal("an output taken twice".into()))?;
        self.held.rotate_left(1);
        self.held[1] = held;
        Ok(results)
    }

    /// The arrays of `out` and of earlier outputs that nobody else holds any more.
    fn spare(&mut self, out: Vec<Tensor>) -> Vec<HostData> {
        let mut spare = Vec::new();
        for t in out {
            if let Ok(mut inner) = Arc::try_unwrap(t.inner)
                && let Some(r) = inner.data.take()
                && let Ok(data) = Arc::try_unwrap(r.host.data)
            {
                spare.push(data);
            }
        }
        let older = std::mem::take(&mut self.held[0]);
        for data in older {
            if let Ok(data) = Arc::try_unwrap(data) {
                spare.push(data);
            }
        }
        let newer = std::mem::take(&mut self.held[1]);
        let mut kept = Vec::with_capacity(newer.len());
        for data in newer {
            match Arc::try_unwrap(data) {
                Ok(data) => spare.push(data),
                Err(data) => kept.push(data),
            }
        }
        // Still held by the caller after the last call: it may be dropped before the next one.
        self.held[1] = kept;
        spare
    }
}

/// Empties an argument's slot of `Entry::bound` between calls: no array of the call's is held
/// past it. The slot keeps its shape's allocation (a call per decoding step empties ~30 slots,
/// each an allocation and a free when it was a fresh empty tensor).
fn unbind(slot: &mut HostTensor) {
    if HostData::is_empty_shared(&slot.data) {
        // An array the run took (updated in place): the runtime left the placeholder already,
        // and the slot is rebound before it is read again, so its shape is left as it is.
        return;
    }
    slot.data = HostData::empty_shared(slot.data.dtype());
    slot.shape.clear();
    slot.shape.push(0);
}

/// The data of a realized argument the call does not own: merges its bindings, or, when it has
/// none and the run does not take its array (`keepable`), keeps it for the next call
/// (`Entry::kept`).
fn bind_shared(a: &Tensor, kept: &mut Option<Kept>, keepable: bool, bindings: &mut Bindings) -> Result<HostTensor> {
    let data = a.inner.data.get().ok_or_else(|| Error::internal("a realized argument holds no data".into()))?;
    if data.bindings.is_empty() && keepable {
        *kept = Some(Kept { tensor: a.clone() });
    } else {
        merge_bindings(bindings, &data.bindings)?;
    }
    Ok(data.host.clone())
}

impl Kept {
    /// Whether `a` is the kept tensor.
    fn is(&self, a: &Tensor) -> bool {
        Tensor::ptr_eq(&self.tensor, a)
    }

    /// Whether the kept handle is the only one besides `a` (the caller gives the tensor up: the
    /// call may take its array, to update it in place).
    fn only_other_handle(&self, a: &Tensor) -> bool {
        self.is(a) && Arc::strong_count(&a.inner) == 2
    }
}

/// Whether `host` is an array of type `ty` (a state array given again: a trace's signature).
fn holds(ty: &TensorType, host: &HostTensor) -> bool {
    ty.dtype == host.dtype()
        && ty.shape.len() == host.shape.len()
        && ty.shape.iter().zip(&host.shape).all(|(d, &s)| d.as_const() == Some(s as i64))
}

/// Traces `f` on placeholders typed like `args` and loads the result on `device`. The arguments
/// at `state_args` are state arrays: the closure's last outputs must be their new values, each
/// of its argument's type.
fn trace<R: JitOutput>(
    device: Device,
    args: &[&Tensor],
    state_args: std::ops::Range<usize>,
    f: impl FnOnce(&[Tensor]) -> R,
) -> std::result::Result<Entry, R::Error> {
    let placeholders: Vec<Tensor> = args.iter().map(|a| Tensor::placeholder(a.ty().clone(), a.device())).collect();
    backend::expect_compile(device);
    TRACING.with(|t| t.borrow_mut().push(TraceState::default()));
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            TRACING.with(|t| t.borrow_mut().pop());
        }
    }
    let (outputs, state) = {
        let pop = Pop;
        let outputs = f(&placeholders).into_outputs();
        let state = TRACING.with(|t| std::mem::take(t.borrow_mut().last_mut().expect("trace state pushed above")));
        drop(pop);
        (outputs?, state)
    };
    for o in &outputs {
        o.check()?;
    }
    if outputs.len() < state_args.len() {
        return Err(Error::Jit(format!(
            "the function returned {} outputs for {} state arrays (their new values come last)",
            outputs.len(),
            state_args.len()
        ))
        .into());
    }
    let first_state = outputs.len() - state_args.len();
    for (o, i) in outputs[first_state..].iter().zip(state_args.clone()) {
        if o.ty() != args[i].ty() {
            return Err(Error::Jit(format!(
                "state array {} is {} but the function's new value for it is {}",
                i - state_args.start,
                args[i].ty(),
                o.ty()
            ))
            .into());
        }
    }
    let mut all_args = placeholders;
    let mut random = Vec::with_capacity(state.random.len());
    for (placeholder, draw) in state.random {
        all_args.push(placeholder);
        random.push(draw);
    }
    // Outputs may repeat (the same tensor returned twice): the graph lists each once.
    let mut roots: Vec<Tensor> = Vec::with_capacity(outputs.len());
    let mut which = Vec::with_capacity(outputs.len());
    for o in &outputs {
        match roots.iter().position(|r| Tensor::ptr_eq(r, o)) {
            Some(i) => which.push(i),
            None => {
                which.push(roots.len());
                roots.push(o.clone());
            }
        }
    }
    let program = trace_roots(&roots, device, &all_args)?;
    let empty = HostTensor::from_arc(HostData::empty_shared(DType::F32), vec![0]).map_err(Error::internal)?;
    // The graph is the device's now (see `backend::Loaded`).
    let loaded = backend::load(device, Cow::Owned(program.graph), &program.sites)?;
    let (in_place, taken_slots) = backend::in_place(&loaded);
    Ok(Entry {
        device,
        signature: args.iter().map(|a| a.ty().clone()).collect(),
        outputs: roots.iter().map(|o| o.shape().clone()).collect(),
        sole: (0..roots.len()).map(|g| which.iter().filter(|&&w| w == g).count() == 1).collect(),
        which,
        n_state: state_args.len(),
        in_place,
        taken_slots,
        kept: args.iter().map(|_| None).collect(),
        // Data the closure captured goes after the arguments and the random inputs.
        bound: std::iter::repeat_n(empty, args.len() + random.len()).chain(program.inputs).collect(),
        sites: program.sites,
        loaded,
        captured_bindings: program.bindings,
        random,
    })
}

/// A function compiled with [`jit`]: the closure and its traces.
pub struct Jit<F> {
    f: F,
    cache: JitCache,
}

/// Compiles `f`, a function of tensors, in the spirit of `jax.jit` and `torch.compile`: the first
/// call with each argument signature traces `f` and compiles the graph; later calls run the
/// compiled program on the new arguments directly (see the [module docs](crate::jit) for what is
/// traced, what is a constant, and how output storage is reused).
///
/// ```
/// use kiln::Tensor;
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
/// let mut f = kiln::jit(|a: &[Tensor]| a[0].matmul(&a[1]).relu());
/// let x = Tensor::from_vec(vec![1.0f32, -1.0], &[1, 2]);
/// let y = f.call(&[&x, &w])?;
/// assert_eq!(y[0].to_vec::<f32>()?, vec![0.0, 0.0]);
/// let y = f.call(&[&Tensor::from_vec(vec![1.0f32, 1.0], &[1, 2]), &w])?; // no trace, no compile
/// assert_eq!(y[0].to_vec::<f32>()?, vec![4.0, 6.0]);
/// assert_eq!(f.traces(), 1);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn jit<F, R>(f: F) -> Jit<F>
where
    F: FnMut(&[Tensor]) -> R,
    R: JitOutput,
{
    Jit { f, cache: JitCache::new() }
}

impl<F, R> Jit<F>
where
    F: FnMut(&[Tensor]) -> R,
    R: JitOutput,
{
    /// Runs the function on `args` (tracing it first for a new signature); the outputs are
    /// realized.
    pub fn call(&mut self, args: &[&Tensor]) -> std::result::Result<Vec<Tensor>, R::Error> {
        let f = &mut self.f;
        self.cache.call(args, |a| f(a))
    }

    /// [`Jit::call`] writing the outputs into the storage of `out` where it can (see
    /// [`JitCache::call_into`]).
    pub fn call_into(&mut self, args: &[&Tensor], out: Vec<Tensor>) -> std::result::Result<Vec<Tensor>, R::Error> {
        let f = &mut self.f;
        self.cache.call_into(args, out, |a| f(a))
    }

    /// [`Jit::call`] on arguments the caller gives up: an output updated in place over an
    /// argument takes its array (see [`JitCache::call_owned`]).
    pub fn call_owned(&mut self, args: Vec<Tensor>) -> std::result::Result<Vec<Tensor>, R::Error> {
        let f = &mut self.f;
        self.cache.call_owned(args, |a| f(a))
    }

    /// How many times the function was traced.
    pub fn traces(&self) -> usize {
        self.cache.traces()
    }

    /// The number of nodes of the graph the last call ran.
    pub fn last_graph_nodes(&self) -> usize {
        self.cache.last_graph_nodes()
    }

    /// Forgets every trace.
    pub fn clear(&mut self) {
        self.cache.clear();
    }
}

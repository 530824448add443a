//! Recorded functions: a lazy function of tensors whose graph is recorded once per argument
//! signature, after which each call adds one node per output instead of recording the function's
//! graph again.
//!
//! Recording a model's forward pass op by op costs more than running it once it is compiled (a
//! 2-layer Transformer's 389 nodes: ~70 us to record, ~50 us more to trace and hash, against a ~90
//! us run). A [`Recorder`] keeps what a function recorded for a signature (each argument's device
//! and type, which arguments are the same tensor, whether gradients are enabled, and a key the
//! caller gives) as a `Recording`: its nodes in trace order, each one an argument, a tensor every
//! call shares (data the function captured, a constant), or a node computed from earlier ones. A
//! later call with that signature makes only its outputs: *call* nodes whose inputs are the call's
//! arguments. Nothing else changes: the result is as lazy as the function's own, and realizing it
//! walks the recording's nodes in place of each call node (`realize::walk`), so the air graph, the
//! realize cache's key and the program are those of the recorded graph, and everything around the
//! call still fuses with it. Differentiating through a call replays the recording onto the call's
//! arguments as ordinary tensors (`replay`); a realize after that walks the replay, so forward and
//! backward share it.
//!
//! As with `kiln::jit`, a function is recorded as it ran: what it captures instead of taking as
//! an argument is a constant of the recording. The recorder records a signature the *second*
//! time it is called with it (a forward pass called once costs nothing extra), and never records
//! a call that drew random numbers (dropout must draw again on every call), read data out of a
//! tensor or ran a computation (its choices could depend on the values: see `impure`), marked
//! or cut a gradient inside (`requires_grad_`, `stop_gradient`), or whose graph could not be
//! walked (an error tensor, mixed devices): such a signature runs the function every time, as
//! does a function of no tensors.

use std::cell::Cell;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use air::TensorType;
use smallvec::SmallVec;

use crate::device::Device;
use crate::jit::JitOutput;
use crate::realize::walk_args_in_place;
use crate::tensor::{Inner, Inputs, Tensor};

/// How a node of a recording is made for a call.
pub(crate) enum Kind {
    /// Argument `i` of the call.
    Arg(u32),
    /// The recorded tensor itself, shared by every call: data the function captured, or a leaf
    /// (a constant, an iota).
    Shared,
    /// A node computed from the nodes at these positions of the recording, with the hash of its
    /// op and type (`realize::node_hash`).
    Computed(SmallVec<[u32; 3]>, u64),
}

/// One node of a recording: a tensor holding the recorded op, type and call site, and how a call
/// makes it.
pub(crate) struct Step {
    pub(crate) tensor: Tensor,
    pub(crate) kind: Kind,
}

/// What a function recorded for one signature, in trace order (every node after its inputs).
pub(crate) struct Recording {
    /// How many arguments a call passes.
    pub(crate) args: usize,
    pub(crate) steps: Vec<Step>,
    /// The position of each output.
    pub(crate) outputs: SmallVec<[u32; 2]>,
}

/// One call of a recorded function: what its outputs share.
pub(crate) struct Instance {
    pub(crate) recording: Arc<Recording>,
    /// The recording replayed onto the call's arguments, once autodiff needed real nodes
    /// (`replay`): from then on the outputs stand for these.
    pub(crate) replayed: OnceLock<Vec<Tensor>>,
}

/// What an output of a call of a recorded function holds (`Inner::call`).
#[derive(Clone)]
pub(crate) struct Call {
    pub(crate) instance: Arc<Instance>,
    /// Which of the recording's outputs.
    pub(crate) output: u32,
}

impl Call {
    /// This output of the replay, once autodiff made one.
    pub(crate) fn replayed(&self) -> Option<&Tensor> {
        self.instance.replayed.get().map(|r| &r[self.output as usize])
    }
}

/// This call's output replayed as an ordinary tensor (see [`replay`]), made by the first caller
/// that needs it; `args` are the call's arguments as its output holds them. `None` when they are
/// gone (another thread realized the output and dropped them).
pub(crate) fn replayed_output(call: &Call, args: &[Tensor]) -> Option<Tensor> {
    if call.replayed().is_none() {
        if args.len() < call.instance.recording.args {
            return None;
        }
        // Another thread may replay at the same time: one replay is kept, and both are the same.
        let _ = call.instance.replayed.set(replay(&call.instance.recording, args));
    }
    call.replayed().cloned()
}

/// A new node with `t`'s op, type, device and site, computed from `inputs` (a call's output
/// when `call` is given).
fn copy(t: &Tensor, inputs: Inputs, call: Option<Call>) -> Tensor {
    let inner = &t.inner;
    Tensor::new_node(Inner {
        op: inner.op.clone(),
        inputs: Mutex::new(inputs),
        ty: inner.ty.clone(),
        device: inner.device,
        data: OnceLock::new(),
        error: None,
        site: inner.site,
        call,
    })
}

/// The recording's nodes made for a call on `args` (the call's arguments, in order) as ordinary
/// tensors: every computed node new, with the recorded op, type and site. Returns the outputs.
pub(crate) fn replay(recording: &Recording, args: &[Tensor]) -> Vec<Tensor> {
    let mut made: Vec<Tensor> = Vec::with_capacity(recording.steps.len());
    for step in &recording.steps {
        let t = match &step.kind {
            Kind::Arg(i) => args[*i as usize].clone(),
            Kind::Shared => step.tensor.clone(),
            Kind::Computed(inputs, _) => {
                copy(&step.tensor, inputs.iter().map(|&i| made[i as usize].clone()).collect(), None)
            }
        };
        made.push(t);
    }
    recording.outputs.iter().map(|&o| made[o as usize].clone()).collect()
}

thread_local! {
    /// What code on this thread could have learned or drawn beyond its tensors' types: unseeded
    /// random draws, data read out of tensors (`to_host`, `to_vec`, `item`, `into_vec`, a
    /// symbolic shape's values, `bindings`) and computations run (`realize`, a compiled call). A
    /// call during which this changed is never recorded: a recording would keep one call's
    /// draws, or the branch one call's values chose, for every later call.
    static IMPURE: Cell<u64> = const { Cell::new(0) };
}

/// Counts something a recording could not repeat (see [`IMPURE`]).
pub(crate) fn impure() {
    IMPURE.with(|d| d.set(d.get() + 1));
}

/// The most signatures a [`Recorder`] keeps (the oldest goes first).
const SIGNATURES: usize = 16;

/// What a recorder knows of one signature.
enum State {
    /// Called once: the next call records.
    Seen,
    /// Recorded: calls make call nodes.
    Recorded(Arc<Recording>),
    /// Not recordable (see the module docs): calls run the function.
    Direct,
}

struct Entry {
    /// The caller's key, and whether gradients were enabled.
    key: (u64, bool),
    device: Device,
    /// Which arguments are the same tensor (see [`distinct`]).
    aliases: Vec<u32>,
    signature: Vec<TensorType>,
    state: State,
}

impl Entry {
    /// Whether this is the entry of a call with these key, device, aliases and argument types.
    fn is<'a>(
        &self,
        key: (u64, bool),
        device: Device,
        aliases: &[u32],
        types: impl Iterator<Item = &'a TensorType>,
    ) -> bool {
        self.key == key && self.device == device && self.aliases == aliases && self.signature.iter().eq(types)
    }
}

/// The recordings of one lazy function, by argument signature (see the [module
/// docs](crate::record)): what a model keeps to make its forward pass cheap to call again.
///
/// ```
/// use kiln::{Recorder, Tensor};
/// let recorder = Recorder::new();
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
/// let f = |x: &Tensor| recorder.call(&[x, &w], |a| a[0].matmul(&a[1]).relu());
/// for i in 0..3 {
///     let x = Tensor::from_vec(vec![1.0f32, i as f32 - 1.0], &[1, 2]);
///     let y = f(&x)?; // lazy, as `x.matmul(&w).relu()` is
///     assert_eq!(y[0].to_vec::<f32>()?, x.matmul(&w).relu().to_vec::<f32>()?);
/// }
/// assert_eq!(recorder.recordings(), 1);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Default)]
pub struct Recorder {
    entries: Mutex<Vec<Entry>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recorder({} recordings)", self.recordings())
    }
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// How many signatures are recorded.
    pub fn recordings(&self) -> usize {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.iter().filter(|e| matches!(e.state, State::Recorded(_))).count()
    }

    /// Forgets every recording (after a value the function captured changed).
    pub fn clear(&self) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// `f(args)`: the function's lazy outputs, made from the recording of this signature when
    /// there is one, else by calling `f` (which the recorder then records, the second time).
    /// `f` must compute its outputs from `args` and from values that do not change between calls.
    pub fn call<R: JitOutput>(
        &self,
        args: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> R,
    ) -> std::result::Result<Vec<Tensor>, R::Error> {
        self.call_keyed(0, args, f)
    }

    /// [`Recorder::call`] for a function that also depends on values other than tensors (a
    /// layer's activation, a norm's epsilon): `key` stands for them, and a call with another key
    /// is another signature.
    pub fn call_keyed<R: JitOutput>(
        &self,
        key: u64,
        args: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> R,
    ) -> std::result::Result<Vec<Tensor>, R::Error> {
        let owned = || args.iter().map(|t| (*t).clone()).collect::<Vec<Tensor>>();
        let Some(device) = recordable(args) else { return f(&owned()).into_outputs() };
        // A tensor passed twice (a tied weight) is one argument of the recording; which
        // arguments are the same is part of the signature.
        let (unique, aliases) = distinct(args);
        let unique = unique.unwrap_or_else(|| args.to_vec());
        // A function may build another graph with gradients off (`no_grad`).
        let key = (key, crate::autograd::is_grad_enabled());
        let found = {
            let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            match entries.iter().position(|e| e.is(key, device, &aliases, unique.iter().map(|t| t.ty()))) {
                Some(i) => match &entries[i].state {
                    State::Recorded(r) => Some(Some(r.clone())),
                    State::Direct => None,
                    State::Seen => Some(None),
                },
                None => {
                    if entries.len() >= SIGNATURES {
                        entries.remove(0);
                    }
                    let signature = unique.iter().map(|t| t.ty().clone()).collect();
                    entries.push(Entry { key, device, aliases: aliases.clone(), signature, state: State::Seen });
                    None
                }
            }
        };
        match found {
            Some(Some(recording)) => Ok(instantiate(&recording, &unique)),
            None => f(&owned()).into_outputs(),
            Some(None) => {
                let before = IMPURE.with(Cell::get);
                let outputs = f(&owned()).into_outputs()?;
                let impure = IMPURE.with(Cell::get) != before;
                let unique: Vec<Tensor> = unique.iter().map(|t| (*t).clone()).collect();
                let state = match (impure, record(&outputs, &unique, device)) {
                    (false, Some(r)) => State::Recorded(Arc::new(r)),
                    _ => State::Direct,
                };
                let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
                // Looked up again: `f` may have called this recorder itself.
                if let Some(e) = entries.iter_mut().find(|e| e.is(key, device, &aliases, unique.iter().map(Tensor::ty)))
                {
                    e.state = state;
                }
                Ok(outputs)
            }
        }
    }
}

/// The device of a call that may use a recording: at least one argument (a call's outputs are
/// nodes whose inputs are its arguments), all error-free and on one device. `None`: the call runs
/// the function.
fn recordable(args: &[&Tensor]) -> Option<Device> {
    let device = args.first()?.device();
    args.iter().all(|a| a.error().is_none() && a.device() == device).then_some(device)
}

/// The distinct tensors of `args` in order of first appearance (`None` when all are distinct),
/// and for each argument the index of its tensor among them (empty when all are distinct).
fn distinct<'a>(args: &[&'a Tensor]) -> (Option<Vec<&'a Tensor>>, Vec<u32>) {
    let addr = |t: &Tensor| Arc::as_ptr(&t.inner) as usize;
    let mut index: rustc_hash::FxHashMap<usize, u32> = rustc_hash::FxHashMap::default();
    index.reserve(args.len());
    let mut aliases = Vec::new();
    let mut unique: Vec<&Tensor> = Vec::new();
    for (i, &a) in args.iter().enumerate() {
        let next = index.len() as u32;
        let at = *index.entry(addr(a)).or_insert(next);
        if at != next && aliases.is_empty() {
            // The first repeat: every argument so far was distinct.
            aliases = (0..i as u32).collect();
            unique = args[..i].to_vec();
        }
        if !aliases.is_empty() {
            aliases.push(at);
            if at == next {
                unique.push(a);
            }
        }
    }
    if aliases.is_empty() { (None, aliases) } else { (Some(unique), aliases) }
}

/// The outputs of a call of `recording` on `args`.
fn instantiate(recording: &Arc<Recording>, args: &[&Tensor]) -> Vec<Tensor> {
    let instance = Arc::new(Instance { recording: recording.clone(), replayed: OnceLock::new() });
    let computed = |o: &u32| matches!(recording.steps[*o as usize].kind, Kind::Computed(..));
    // The arguments are the inputs of every computed output; the last one takes the list itself.
    let last = recording.outputs.iter().rposition(computed);
    let mut list: Option<Inputs> = last.map(|_| args.iter().map(|t| (*t).clone()).collect());
    let mut outputs = Vec::with_capacity(recording.outputs.len());
    for (k, &o) in recording.outputs.iter().enumerate() {
        let step = &recording.steps[o as usize];
        outputs.push(match step.kind {
            Kind::Arg(i) => (*args[i as usize]).clone(),
            Kind::Shared => step.tensor.clone(),
            Kind::Computed(..) => {
                let inputs = if Some(k) == last { list.take() } else { list.clone() }.unwrap_or_default();
                copy(&step.tensor, inputs, Some(Call { instance: instance.clone(), output: k as u32 }))
            }
        });
    }
    outputs
}

/// The recording of `outputs`, computed from `args` (distinct, error-free, on `device`), or
/// `None` when it cannot be replayed (see the module docs). Its computed nodes are copies, so
/// that it holds none of the caller's tensors but the data it captured.
fn record(outputs: &[Tensor], args: &[Tensor], device: Device) -> Option<Recording> {
    if outputs.is_empty() || outputs.iter().any(|o| o.error().is_some() || o.device() != device) {
        return None;
    }
    let walk = walk_args_in_place(outputs, device, args).ok()?;
    let n_args = args.len() as u32;
    let mut steps: Vec<Step> = Vec::with_capacity(walk.steps.len());
    for s in &walk.steps {
        let (tensor, kind) = match s.slot {
            Some(slot) if slot < n_args => (Tensor::placeholder(s.tensor().ty().clone(), device), Kind::Arg(slot)),
            Some(_) => (s.tensor().clone(), Kind::Shared),
            None if s.inputs.is_empty() => (s.tensor().clone(), Kind::Shared),
            None => {
                if crate::autograd::has_entry(s.tensor()) {
                    return None;
                }
                let inner = &s.tensor().inner;
                // The recorded op with no inputs of its own: the recording holds the positions.
                let hash = crate::realize::node_hash(&inner.op, &inner.ty);
                (copy(s.tensor(), Inputs::new(), None), Kind::Computed(s.inputs.clone(), hash))
            }
        };
        steps.push(Step { tensor, kind });
    }
    let outputs = walk.outputs.clone();
    walk.recycle();
    Some(Recording { args: args.len(), steps, outputs })
}

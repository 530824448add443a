//! The device-independent half of a compiled program: what every backend needs before it runs
//! anything, computed here once so that no backend keeps its own copy.
//!
//! - once per program ([`Prepared::new`]): the program is validated (every kernel reads only the
//!   symbols, loop variables and parameters it has; every step launches an existing kernel with
//!   one buffer of the right dtype per parameter and writes no input; every input buffer has an
//!   input slot of its dtype; every output reads an existing buffer of its type), and the symbols
//!   the sizes depend on are listed (the binding-set key);
//! - once per binding set ([`Prepared::sizes`], cached by the backend runner in a
//!   [`SizedCache`]): `Program::checks` through `air::constraints::check` (a failed shape
//!   condition is `RuntimeError::Bounds` before anything is sized), symbol values, element counts
//!   of every buffer, input and output shapes, and the memory plan ([`Prepared::plan`]: one call
//!   into `lower::memplan` with the device's buffer sizes, in program order or with the time
//!   slots of steps that run at the same time);
//! - every run ([`Prepared::check_inputs`]): input count, dtypes and shapes.
//!
//! The launch list is the program's `steps`, in order; a backend turns each into a launch of its
//! own kernel (see [`crate::backend`]).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use air::{Bindings, HostData, HostTensor, Symbol, TensorType};
use lower::kir::{Access, IExpr, Kernel, Stmt};
use lower::{BufferKind, MemoryPlan, Program};
use smallvec::SmallVec;

use crate::error::{InputSpec, Result, RuntimeError};

/// The values of a program's size symbols, in order: the key of its binding-set cache.
pub type SizeKey = SmallVec<[i64; 4]>;

/// How many binding sets a program remembers.
pub const SIZED_CACHE: usize = 16;

/// A validated program with the graph's input slots, ready for any backend.
#[derive(Debug)]
pub struct Prepared {
    program: Program,
    input_types: Vec<Option<TensorType>>,
    /// Every symbol a size or check depends on, sorted: the binding-set key.
    size_symbols: Vec<Symbol>,
    /// The symbols of `size_symbols` that decide sizes, loop extents and matmul launches
    /// (`Program::structure_symbols`): binding sets equal in these share everything but the
    /// symbol values kernels read.
    structure_symbols: Vec<Symbol>,
    /// Input slots whose shape has a symbol outside `structure_symbols` (inputs with no
    /// elements, such as `Tensor::symbol`'s position carriers): [`Prepared::resized`] evaluates
    /// their shapes again.
    offset_inputs: Vec<usize>,
    /// `Program::inits` as (output buffer, input slot), validated.
    init_slots: Vec<(usize, usize)>,
}

/// Everything about one binding set that does not depend on the device.
#[derive(Debug)]
pub struct Sizes {
    /// The values of the program's size symbols (the cache key).
    pub key: SizeKey,
    /// The value of every symbol of `Program::symbols`, in order (what kernels read).
    pub syms: Vec<i64>,
    /// Elements of every buffer.
    pub buf_numel: Arc<Vec<usize>>,
    /// The shape of every input slot (`None` for a slot no input node uses), shared by the
    /// binding sets of one structure (see [`Prepared::resized`]) except where `offset_shapes`
    /// overrides it.
    input_shapes: Arc<Vec<Option<Vec<usize>>>>,
    /// The input slots whose shapes depend on offset symbols, with their shapes here.
    offset_shapes: Vec<(usize, Vec<usize>)>,
    /// The shape of every graph output.
    pub output_shapes: Arc<Vec<Vec<usize>>>,
}

impl Sizes {
    /// The shape of input `slot` (`None` for a slot no input node uses).
    pub fn input_shape(&self, slot: usize) -> Option<&[usize]> {
        match self.offset_shapes.iter().find(|(s, _)| *s == slot) {
            Some((_, shape)) => Some(shape),
            None => self.input_shapes.get(slot)?.as_deref(),
        }
    }
}

/// The largest loop variable id used in `stmts` plus one (the size of a `vars` array).
pub(crate) fn var_count(stmts: &[Stmt]) -> usize {
    stmts
        .iter()
        .map(|s| match s {
            Stmt::Loop { var, body, .. } => (var.0 as usize + 1).max(var_count(body)),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

/// Whether `e` only reads symbols below `n_syms` and variables below `n_vars` (so `eval` cannot
/// index out of bounds).
pub(crate) fn expr_ok(e: &IExpr, n_syms: usize, n_vars: usize) -> bool {
    e.all_leaves(&|l| match l {
        IExpr::Var(v) => (v.0 as usize) < n_vars,
        IExpr::Sym(s) => (*s as usize) < n_syms,
        _ => true,
    })
}

fn loop_extents_ok(stmts: &[Stmt], n_syms: usize, n_vars: usize) -> bool {
    stmts.iter().all(|s| match s {
        Stmt::Loop { extent, body, .. } => expr_ok(extent, n_syms, n_vars) && loop_extents_ok(body, n_syms, n_vars),
        _ => true,
    })
}

fn key_of(symbols: &[Symbol], bindings: &Bindings) -> Result<SizeKey> {
    let mut key: SizeKey = SmallVec::with_capacity(symbols.len());
    for s in symbols {
        key.push(*bindings.get(s).ok_or_else(|| RuntimeError::Unbound(s.clone()))?);
    }
    Ok(key)
}

/// The value of `d` under `bindings` as a size (`what` names it in an error).
fn eval_dim(d: &air::Dim, bindings: &Bindings, what: &dyn Fn() -> String) -> Result<usize> {
    let v = d.eval(bindings).map_err(|e| match e {
        air::dim::DimError::Unbound(s) => RuntimeError::Unbound(s),
        other => RuntimeError::BadSize(format!("{}: {other}", what())),
    })?;
    usize::try_from(v).map_err(|_| RuntimeError::BadSize(format!("{} is {v}", what())))
}

/// The shape of `t` under `bindings`.
fn eval_shape(t: &TensorType, bindings: &Bindings, what: &dyn Fn() -> String) -> Result<Vec<usize>> {
    t.shape.iter().map(|d| eval_dim(d, bindings, what)).collect()
}

fn invalid<T>(msg: String) -> Result<T> {
    Err(RuntimeError::InvalidProgram(msg))
}

/// The initial contents of an output written in place over an input (`Program::inits`).
pub struct Preset {
    /// The output's buffer.
    pub out: usize,
    /// The input's array.
    pub data: Arc<HostData>,
    /// The input's shape allocation: the output's shape is the input's, so a backend may hand
    /// it out again rather than allocate one per output per run (a decoding step's 24 key and
    /// value arrays).
    pub shape: Vec<usize>,
}

impl Prepared {
    /// Validates `program` for the graph whose input slots have `input_types`.
    pub fn new(program: Program, input_types: Vec<Option<TensorType>>) -> Result<Prepared> {
        let n_syms = program.symbols.len();
        for (i, k) in program.kernels.iter().enumerate() {
            let ok = match k {
                Kernel::Loops(l) => l.n_syms as usize <= n_syms && loop_extents_ok(&l.body, n_syms, var_count(&l.body)),
                Kernel::Matmul(m) => {
                    let ops = [&m.a, &m.b, &m.c];
                    let exprs = [&m.batch, &m.m, &m.n, &m.k]
                        .into_iter()
                        .chain(ops.iter().flat_map(|o| [&o.offset, &o.batch_stride, &o.row_stride, &o.col_stride]));
                    m.n_syms as usize <= n_syms
                        && exprs.into_iter().all(|e| expr_ok(e, n_syms, 0))
                        && ops.iter().all(|o| (o.buf as usize) < m.params.len())
                }
            };
            if !ok {
                return invalid(format!("kernel k{i} reads symbols, loop variables or parameters it does not have"));
            }
        }
        for (i, step) in program.steps.iter().enumerate() {
            air::work::add(1 + step.args.len() as u64);
            let Some(kernel) = program.kernels.get(step.kernel as usize) else {
                return invalid(format!("step {i} launches missing kernel k{}", step.kernel));
            };
            let params = kernel.params();
            if step.args.len() != params.len() {
                return invalid(format!(
                    "step {i}: k{} takes {} buffers, given {}",
                    step.kernel,
                    params.len(),
                    step.args.len()
                ));
            }
            for (p, (arg, param)) in step.args.iter().zip(params).enumerate() {
                let Some(buf) = program.buffers.get(arg.0 as usize) else {
                    return invalid(format!("step {i}: argument {p} is missing buffer {arg}"));
                };
                if buf.dtype != param.dtype {
                    return invalid(format!("step {i}: {arg} is {} but parameter b{p} is {}", buf.dtype, param.dtype));
                }
                if param.access == Access::Write && matches!(buf.kind, BufferKind::Input(_)) {
                    return invalid(format!("step {i}: writes input buffer {arg}"));
                }
            }
        }
        for (i, b) in program.buffers.iter().enumerate() {
            if let BufferKind::Input(slot) = b.kind {
                match input_types.get(slot as usize) {
                    Some(Some(t)) if t.dtype == b.dtype => {}
                    _ => {
                        return invalid(format!(
                            "buf{i} reads input slot {slot}, which the graph has no {} input for",
                            b.dtype
                        ));
                    }
                }
            }
        }
        for (buf, ty) in &program.outputs {
            let Some(info) = program.buffers.get(buf.0 as usize) else {
                return invalid(format!("output reads missing buffer {buf}"));
            };
            if info.dtype != ty.dtype {
                return invalid(format!("output {buf} is {} but its type is {ty}", info.dtype));
            }
            if info.kind == BufferKind::Status {
                return invalid(format!("output {buf} is the status buffer"));
            }
        }
        // Each init fills a distinct output from a distinct input of the same dtype and size,
        // and no step reads that input (its storage may become the output's).
        let mut init_slots = Vec::with_capacity(program.inits.len());
        for (k, &(out, input)) in program.inits.iter().enumerate() {
            let (Some(o), Some(i)) = (program.buffers.get(out.0 as usize), program.buffers.get(input.0 as usize))
            else {
                return invalid(format!("init {k} names a missing buffer"));
            };
            let (BufferKind::Output(_), BufferKind::Input(slot)) = (o.kind, i.kind) else {
                return invalid(format!("init {k}: {out} is not an output or {input} not an input"));
            };
            if o.dtype != i.dtype || o.numel != i.numel {
                return invalid(format!("init {k}: {out} and {input} differ in dtype or size"));
            }
            if program.inits[..k].iter().any(|&(o2, i2)| o2 == out || i2 == input)
                || program.steps.iter().any(|s| s.args.contains(&input))
                || program.outputs.iter().any(|(b, _)| *b == input)
            {
                return invalid(format!("init {k}: {input} is read or initializes another output"));
            }
            init_slots.push((out.0 as usize, slot as usize));
        }
        let size_symbols = program.size_symbols(&input_types);
        let structure_symbols = program.structure_symbols(&input_types);
        let offset_inputs = input_types
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                let offset = |d: &air::Dim| d.symbols().iter().any(|s| !structure_symbols.contains(s));
                t.as_ref().is_some_and(|t| t.shape.iter().any(offset))
            })
            .map(|(slot, _)| slot)
            .collect();
        Ok(Prepared { program, input_types, size_symbols, structure_symbols, offset_inputs, init_slots })
    }

    /// The lowered program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Takes the storage of each input that initializes an output (`Program::inits`) out of
    /// `inputs`: no kernel reads those inputs, so their slots are left empty. A backend gives
    /// each output that data before the run; when nobody else holds it (`Arc::try_unwrap`
    /// succeeds) it is the output's storage, written in place.
    pub fn take_inits(&self, inputs: &mut [HostTensor]) -> Vec<Preset> {
        self.init_slots
            .iter()
            .map(|&(out, slot)| {
                let input = &mut inputs[slot];
                let empty = HostData::empty_shared(input.data.dtype());
                Preset { out, data: std::mem::replace(&mut input.data, empty), shape: std::mem::take(&mut input.shape) }
            })
            .collect()
    }

    /// The graph's input slots and their types (`None` for a slot no input node uses).
    pub fn input_types(&self) -> &[Option<TensorType>] {
        &self.input_types
    }

    /// The key of `bindings` in a binding-set cache: the values of the size symbols.
    pub fn key(&self, bindings: &Bindings) -> Result<SizeKey> {
        key_of(&self.size_symbols, bindings)
    }

    /// The key of `bindings` among binding sets of one structure: the values of the symbols
    /// that decide sizes, extents and matmul launches (see [`Prepared::resized`]).
    pub fn structure_key(&self, bindings: &Bindings) -> Result<SizeKey> {
        key_of(&self.structure_symbols, bindings)
    }

    /// Whether some symbol of the program is only an index offset (not in the structure key).
    pub fn has_offset_symbols(&self) -> bool {
        self.structure_symbols.len() < self.size_symbols.len()
    }

    /// [`Prepared::sizes`] for `bindings` when `like` was computed for bindings with the same
    /// structure key: the shape conditions are checked and the kernels' symbol values taken
    /// from `bindings`; buffer, input and output sizes are `like`'s (they depend only on the
    /// structure symbols).
    pub fn resized(&self, like: &Sizes, key: SizeKey, bindings: &Bindings) -> Result<Sizes> {
        self.program.check_bindings(bindings)?;
        let syms = self.syms(bindings)?;
        let mut offset_shapes = Vec::with_capacity(self.offset_inputs.len());
        for &slot in &self.offset_inputs {
            if let Some(t) = &self.input_types[slot] {
                offset_shapes.push((slot, eval_shape(t, bindings, &|| format!("input slot {slot} ({t})"))?));
            }
        }
        Ok(Sizes {
            key,
            syms,
            buf_numel: like.buf_numel.clone(),
            input_shapes: like.input_shapes.clone(),
            offset_shapes,
            output_shapes: like.output_shapes.clone(),
        })
    }

    /// The shape of every input slot under `bindings` (`None` for a slot no input node uses).
    fn input_shapes(&self, bindings: &Bindings) -> Result<Vec<Option<Vec<usize>>>> {
        self.input_types
            .iter()
            .enumerate()
            .map(|(slot, t)| {
                t.as_ref().map(|t| eval_shape(t, bindings, &|| format!("input slot {slot} ({t})"))).transpose()
            })
            .collect()
    }

    fn syms(&self, bindings: &Bindings) -> Result<Vec<i64>> {
        self.program
            .symbols
            .iter()
            .map(|s| bindings.get(s).copied().ok_or_else(|| RuntimeError::Unbound(s.clone())))
            .collect()
    }

    /// Everything device-independent about `bindings` (whose key is `key`). The graph's shape
    /// conditions are checked first: no size is computed from bindings that break them.
    pub fn sizes(&self, key: SizeKey, bindings: &Bindings) -> Result<Sizes> {
        let p = &self.program;
        p.check_bindings(bindings)?;
        let eval = |d: &air::Dim, what: &dyn Fn() -> String| eval_dim(d, bindings, what);
        let numel = |shape: &[usize], what: &dyn Fn() -> String| -> Result<usize> {
            shape
                .iter()
                .try_fold(1usize, |a, &b| a.checked_mul(b))
                .ok_or_else(|| RuntimeError::BadSize(format!("{} overflows", what())))
        };

        let syms = self.syms(bindings)?;
        let mut buf_numel = Vec::with_capacity(p.buffers.len());
        for (i, b) in p.buffers.iter().enumerate() {
            let n = eval(&b.numel, &|| format!("the size of buf{i}"))?;
            n.checked_mul(b.dtype.size_bytes())
                .filter(|&bytes| bytes <= isize::MAX as usize)
                .ok_or_else(|| RuntimeError::BadSize(format!("buf{i} of {n} elements is too large")))?;
            buf_numel.push(n);
        }
        let input_shapes = self.input_shapes(bindings)?;
        for (i, b) in p.buffers.iter().enumerate() {
            if let BufferKind::Input(slot) = b.kind {
                let shape = input_shapes[slot as usize].as_deref().unwrap_or_default();
                if numel(shape, &|| format!("input slot {slot}"))? != buf_numel[i] {
                    return invalid(format!(
                        "buf{i} holds {} elements but input slot {slot} has shape {shape:?}",
                        buf_numel[i]
                    ));
                }
            }
        }
        let mut output_shapes = Vec::with_capacity(p.outputs.len());
        for (i, (buf, t)) in p.outputs.iter().enumerate() {
            let shape = eval_shape(t, bindings, &|| format!("output {i} ({t})"))?;
            if numel(&shape, &|| format!("output {i}"))? != buf_numel[buf.0 as usize] {
                return invalid(format!(
                    "output {i} of shape {shape:?} is read from {buf} of {} elements",
                    buf_numel[buf.0 as usize]
                ));
            }
            output_shapes.push(shape);
        }
        Ok(Sizes {
            key,
            syms,
            buf_numel: Arc::new(buf_numel),
            input_shapes: Arc::new(input_shapes),
            offset_shapes: Vec::new(),
            output_shapes: Arc::new(output_shapes),
        })
    }

    /// The memory plan for one binding set: `bytes[b]` is what buffer `b` takes on the device (a
    /// temp's slot in the arena, padded as the device needs); `slots` are the time slots of
    /// steps that run at the same time (`None`: one step per slot, in program order). Checks that
    /// the plan covers every buffer and places every temp inside the arena.
    pub fn plan(&self, bytes: Vec<usize>, slots: Option<&[Vec<usize>]>) -> Result<MemoryPlan> {
        let p = &self.program;
        let plan = match slots {
            Some(slots) => lower::memplan::plan_sizes(p, bytes, slots)?,
            None => lower::memplan::plan_sizes(p, bytes, &lower::memplan::in_order(p))?,
        };
        if plan.offsets.len() != p.buffers.len() {
            return invalid("the memory plan does not cover every buffer".into());
        }
        for (i, b) in p.buffers.iter().enumerate() {
            if b.kind != BufferKind::Temp {
                continue;
            }
            let fits = match plan.offsets[i] {
                Some(o) => o.checked_add(plan.sizes[i]).is_some_and(|end| end <= plan.stats.arena_bytes),
                None => plan.sizes[i] == 0,
            };
            if !fits {
                return invalid(format!("buf{i} is placed outside the arena"));
            }
        }
        Ok(plan)
    }

    /// Checks `inputs` against the graph's input slots for one binding set: one input per slot,
    /// each of the slot's dtype and shape, holding as many elements as its shape says.
    pub fn check_inputs(&self, inputs: &[HostTensor], sizes: &Sizes) -> Result<()> {
        if inputs.len() != self.input_types.len() {
            return Err(RuntimeError::InputCount { expected: self.input_types.len(), got: inputs.len() });
        }
        for (slot, (given, ty)) in inputs.iter().zip(&self.input_types).enumerate() {
            let (Some(ty), Some(shape)) = (ty, sizes.input_shape(slot)) else { continue };
            let numel: usize = shape.iter().product();
            if given.dtype() != ty.dtype || given.shape != *shape || given.numel() != numel {
                return Err(RuntimeError::InputMismatch {
                    slot: slot as u32,
                    declared: Box::new(ty.clone()),
                    expected: InputSpec { dtype: ty.dtype, shape: shape.to_vec(), numel },
                    got: InputSpec { dtype: given.dtype(), shape: given.shape.clone(), numel: given.numel() },
                });
            }
        }
        Ok(())
    }

    /// The run's error when a kernel recorded a data-dependent failure in the status words.
    pub fn check_status(&self, words: &[i32]) -> Result<()> {
        match lower::DataCheck::from_status(&self.program.data_checks, words) {
            Some(message) => Err(lower::LowerError::Data(message).into()),
            None => Ok(()),
        }
    }
}

/// The most recently used binding sets of one program, most recent first, each with what was
/// computed for it (at most [`SIZED_CACHE`]).
pub struct SizedCache<T> {
    entries: Mutex<Vec<(SizeKey, Arc<T>)>>,
}

impl<T> Default for SizedCache<T> {
    fn default() -> Self {
        SizedCache { entries: Mutex::new(Vec::new()) }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T> SizedCache<T> {
    /// The entry for `key`, computed by `make` on a miss (outside the lock).
    pub fn get_or_insert(&self, key: SizeKey, make: impl FnOnce(SizeKey) -> Result<T>) -> Result<Arc<T>> {
        {
            let mut cache = lock(&self.entries);
            if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
                if i != 0 {
                    let hit = cache.remove(i);
                    cache.insert(0, hit);
                }
                return Ok(cache[0].1.clone());
            }
        }
        let made = Arc::new(make(key.clone())?);
        let mut cache = lock(&self.entries);
        cache.insert(0, (key, made.clone()));
        cache.truncate(SIZED_CACHE);
        Ok(made)
    }

    /// Forgets every binding set.
    pub fn clear(&self) {
        lock(&self.entries).clear();
    }
}

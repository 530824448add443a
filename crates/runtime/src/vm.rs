//! The VM: runs a lowered `Program` whose loop kernels are native functions.
//!
//! Everything that does not depend on the inputs' data is prepared ahead of the hot loop:
//! - once per `Executable`: the launch list (function pointer or GEMM, and where each step's
//!   arguments sit in one flat pointer table), the input and output layout;
//! - once per binding set (cached): symbol values, buffer sizes, the memory plan, each loop's
//!   range and how many threads split it, each matmul's sizes and strides (bounds-checked).
//!
//! A run then only validates the inputs, makes sure the arena is big enough, allocates the outputs,
//! fills the pointer table (one store per step argument) and walks the launch list: no hashing and
//! no allocation per step.
//!
//! Memory: inputs are read in place from the caller's `Vec`s (their `Arc`s are borrowed for the
//! run, never cloned, except when a graph output *is* an input); each output buffer is a fresh
//! `Vec` of its dtype that becomes the returned `HostTensor` as is; temporaries live in one
//! 64-byte-aligned arena owned by the executable, reused by every run and grown only when a
//! binding set needs more.
//!
//! Outputs are not zeroed: the first step touching an output buffer writes every element of it
//! when it is a loop kernel (its loop space is the shape of the node it materializes, which the
//! output buffer holds exactly: `lower::schedule`) or a non-accumulating matmul whose `c` is the
//! whole buffer in row-major order (checked per binding set, `MatmulLaunch::writes_all_of_c`); an
//! accumulating matmul reads `c`, so the bias kernel before it is the first toucher. Any other
//! output (first touched by a read, or by a matmul that does not cover it) is zeroed as before.
//! Debug builds fill unzeroed outputs with NaN/`MIN`/`true`, so a kernel that skipped elements
//! fails the interpreter comparisons instead of passing on a lucky zero page. Freed outputs are
//! recycled warm by the C allocator (`memory::tune_host_allocator`).
//!
//! Threads: a loop kernel splits over rayon's pool when its work estimate reaches
//! [`PARALLEL_MIN_WORK`], or when calibration ([`CALIBRATION_RUNS`]) measured it slow enough and
//! faster split. [`Executable::launch_times`] reports where a run's time goes, launch by launch.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use air::{Bindings, HostData, HostTensor, Symbol, TensorType};
use lower::kir::{IExpr, Kernel, LoopKernel, Stmt};
use lower::{BufferKind, Program};
use smallvec::SmallVec;

use crate::error::{Result, RuntimeError};
use crate::levels::{self, LevelSchedule, Phase, StepCost};
use crate::matmul::MatmulLaunch;
use crate::memory::{self, Arena};
use crate::parallel::{self, SendPtr};

/// The native entry point of a loop kernel (`codegen`'s ABI): buffer pointers, symbol values, and
/// the `[start, end)` range of its top-level parallel loop.
pub type KernelFn = unsafe extern "C" fn(bufs: *const *mut u8, syms: *const i64, start: i64, end: i64);

/// Loop kernels with fewer elements than this (summed over the loop nest) run on the calling
/// thread; larger ones split their parallel loop over rayon's pool.
///
/// Measured on the 2-core development machine (busy with other builds at the time, so these are
/// pessimistic): handing one chunk to a pool thread and waiting for it costs about 11 us
/// (`for_chunks` with no work, 10th percentile), while one core negates f32 at about 12 elements
/// per ns (2.2 us for 32k, 21 us for 256k). A split saves half the kernel's time, so it pays off
/// past about 20 us of single-core work: ~256k elements for the cheapest element-wise kernels,
/// far fewer for transcendental ones. 128k elements is the compromise.
pub const PARALLEL_MIN_WORK: u128 = 1 << 17;

/// A loop kernel below [`PARALLEL_MIN_WORK`] but with at least this much work is timed during the
/// calibration runs of a binding set (see [`CALIBRATION_RUNS`]): elements alone do not say what
/// a kernel costs (a strided, unvectorized reduce can take 0.8 ns per element where `neg` takes
/// 0.08 ns), so the work estimate misses slow kernels.
pub const CALIBRATE_MIN_WORK: u128 = 1 << 13;

/// A calibrated loop kernel whose shortest single-thread time reaches this many nanoseconds is
/// tried split over the threads: about twice the fork-join cost measured on the 2-core
/// development machine (11 us, see [`PARALLEL_MIN_WORK`]), where a split saves half the time.
pub const SPLIT_MIN_NS: u64 = 25_000;

/// Calibration of a binding set: runs `1..=CALIBRATION_RUNS` (the first run is left out: it pays
/// for cold caches and fresh pages) time each candidate loop kernel on the calling thread; a
/// candidate that took at least [`SPLIT_MIN_NS`] then runs split for the next `CALIBRATION_RUNS`
/// runs, and stays split only if that was at least 15% faster (the other cores may be busy with
/// other work: a split then only adds the fork-join). Splitting a parallel loop never changes
/// results (its iterations write disjoint elements and compute them the same way).
pub const CALIBRATION_RUNS: u32 = 2;

/// Sizes of the memory the program uses for one binding set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes of the arena that holds every temporary (after the planner's reuse).
    pub arena_bytes: usize,
    /// Bytes the temporaries would take with one allocation each.
    pub naive_bytes: usize,
    /// The most temporary bytes live at one point of the program.
    pub peak_live_bytes: usize,
}

/// Where a temporary lives: the output of the memory planner for one binding set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Byte offset of each buffer in the arena (`Some` for temporaries).
    pub offsets: Vec<Option<usize>>,
    pub stats: MemoryStats,
}

/// Places the temporaries of `program` for one binding set (`lower::memplan::plan` on the CPU).
pub type Planner = fn(&Program, &Bindings) -> Result<Placement>;

/// Places the temporaries of `program` when steps run together: `slots[t]` are the steps of time
/// slot `t`, in run order (`lower::memplan::plan_with_groups`).
pub type GroupPlanner = fn(&Program, &Bindings, &[Vec<usize>]) -> Result<Placement>;

/// Running independent steps at the same time (see [`crate::levels`]).
struct Concurrency {
    planner: GroupPlanner,
    /// The dependency levels of the program (`lower::batch`), computed once.
    levels: Vec<Vec<usize>>,
    /// A level with less work runs one step after another.
    min_work: u128,
}

/// How one step runs, fixed per executable.
#[derive(Clone, Copy)]
enum Code {
    Loop { func: KernelFn, parallel: bool },
    Matmul,
}

struct StepCode {
    code: Code,
    kernel: u32,
    /// Where this step's arguments start in the pointer table.
    arg_start: u32,
}

/// One step, ready to launch for one binding set.
enum Launch {
    /// `chunks`: how many parts the parallel loop is cut into (1: the calling thread alone); it
    /// starts from the work estimate and calibration may raise it to `split` (0: not a candidate).
    /// `calib_ns`: the shortest time seen in a calibration run on one thread; `split_ns`: split.
    Loop {
        func: KernelFn,
        arg_start: u32,
        end: i64,
        chunks: AtomicU32,
        split: u32,
        calib_ns: AtomicU64,
        split_ns: AtomicU64,
    },
    Matmul {
        arg_start: u32,
        mm: Box<MatmulLaunch>,
    },
}

/// Where a graph output's data comes from.
#[derive(Clone, Copy, Debug)]
enum OutputSource {
    /// A fresh output buffer: index into `Executable::output_bufs`.
    Fresh(usize),
    /// A graph output that is an input, returned by sharing the input's `Arc`.
    Input(u32),
    /// A temporary (not expected from the lowering): copied out of the arena.
    Temp(u32),
}

/// Everything that depends on the symbol values, computed once per binding set.
struct Sized {
    syms: Vec<i64>,
    input_shapes: Vec<Option<Vec<usize>>>,
    buf_numel: Vec<usize>,
    offsets: Vec<Option<usize>>,
    stats: MemoryStats,
    output_shapes: Vec<Vec<usize>>,
    /// Per entry of `Executable::output_bufs`: whether the first step touching the buffer writes
    /// every element of it, so that it is allocated without zeroing (see `first_writes_all`).
    unwritten_ok: Vec<bool>,
    launches: Vec<Launch>,
    /// `Some` when some dependency level runs concurrently: the program then runs by levels.
    schedule: Option<LevelSchedule>,
    /// Runs started with this binding set (saturates at `CALIBRATION_RUNS + 1`).
    runs: AtomicU32,
}

/// Per-run scratch, reused across runs.
#[derive(Default)]
struct RunState {
    arena: Arena,
    buf_ptrs: Vec<*mut u8>,
    table: Vec<*mut u8>,
    fresh: Vec<HostData>,
    /// The run's status words (`lower::kir::STATUS_WORDS`), zeroed before each run; kernels
    /// record data-dependent failures here.
    status: Vec<i32>,
}

// SAFETY: the raw pointers in a `RunState` are only dereferenced during a run, by the thread
// holding the state's lock (and the pool threads it waits for); between runs they are stale values
// that nobody reads, so moving the state to another thread is sound.
unsafe impl Send for RunState {}

/// The values of an executable's size symbols, in order: the key of its binding-set cache.
type SizeKey = SmallVec<[i64; 4]>;

/// Recently used binding sets, most recent first.
type SizedCache = Vec<(SizeKey, Arc<Sized>)>;

/// How many binding sets an executable remembers.
const SIZED_CACHE: usize = 16;

/// A compiled program, ready to run on the CPU for any symbol values.
pub struct Executable {
    program: Program,
    planner: Planner,
    input_types: Vec<Option<TensorType>>,
    /// Every symbol a size depends on, sorted: the binding-set cache is keyed by their values.
    size_symbols: Vec<Symbol>,
    steps: Vec<StepCode>,
    /// The buffer of each step argument, flat, in step order.
    table_bufs: Vec<u32>,
    /// The buffers of kind `Output`, in the order fresh outputs are allocated.
    output_bufs: Vec<u32>,
    /// Per entry of `output_bufs`: the first step whose arguments include the buffer, if every
    /// such argument of that step is written (not read) by the kernel.
    output_writer: Vec<Option<u32>>,
    outputs: Vec<OutputSource>,
    sized: Mutex<SizedCache>,
    state: Mutex<RunState>,
    /// Keeps the native code of the loop kernels alive.
    _code: Arc<dyn Send + Sync>,
    /// `None`: steps always run one after another, in program order.
    concurrency: Option<Concurrency>,
    /// Kernel launches made by every run so far (see [`Executable::launches_run`]).
    launched: AtomicU64,
    /// Loop launches whose parallel loop ran split over several threads, over every run.
    split_launches: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The largest loop variable id used in `stmts` plus one (the size of a `vars` array).
fn var_count(stmts: &[Stmt]) -> usize {
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
fn expr_ok(e: &IExpr, n_syms: usize, n_vars: usize) -> bool {
    match e {
        IExpr::Const(_) => true,
        IExpr::Var(v) => (v.0 as usize) < n_vars,
        IExpr::Sym(s) => (*s as usize) < n_syms,
        IExpr::Add(a, b)
        | IExpr::Mul(a, b)
        | IExpr::Div(a, b)
        | IExpr::Mod(a, b)
        | IExpr::Lt(a, b)
        | IExpr::And(a, b) => expr_ok(a, n_syms, n_vars) && expr_ok(b, n_syms, n_vars),
    }
}

fn loop_extents_ok(stmts: &[Stmt], n_syms: usize, n_vars: usize) -> bool {
    stmts.iter().all(|s| match s {
        Stmt::Loop { extent, body, .. } => expr_ok(extent, n_syms, n_vars) && loop_extents_ok(body, n_syms, n_vars),
        _ => true,
    })
}

/// Elements the loop nest visits (inner extents evaluated with outer variables at 0).
fn nest_work(stmts: &[Stmt], vars: &[i64], syms: &[i64]) -> u128 {
    let mut total: u128 = 0;
    for s in stmts {
        if let Stmt::Loop { extent, body, .. } = s {
            let e = extent.eval(vars, syms).max(0) as u128;
            total = total.saturating_add(e.saturating_mul(nest_work(body, vars, syms).max(1)));
        }
    }
    total
}

/// The extent of the kernel's top-level parallel loop, if it has one.
fn parallel_loop(k: &LoopKernel) -> Option<&IExpr> {
    match k.body.as_slice() {
        [Stmt::Loop { extent, parallel: true, .. }] => Some(extent),
        _ => None,
    }
}

impl Executable {
    /// Prepares `program` to run. `loop_fns[k]` is the native code of kernel `k` (`None` for
    /// matmul kernels); `code` keeps that code alive; `input_types` are the graph's input slots.
    pub fn new(
        program: Program,
        input_types: Vec<Option<TensorType>>,
        loop_fns: Vec<Option<KernelFn>>,
        code: Arc<dyn Send + Sync>,
        planner: Planner,
    ) -> Result<Executable> {
        let invalid = |msg: String| Err(RuntimeError::InvalidProgram(msg));
        let n_syms = program.symbols.len();
        if loop_fns.len() != program.kernels.len() {
            return invalid(format!("{} kernels but {} compiled functions", program.kernels.len(), loop_fns.len()));
        }
        for (i, k) in program.kernels.iter().enumerate() {
            let ok = match k {
                Kernel::Loops(l) => {
                    l.n_syms as usize <= n_syms
                        && loop_fns[i].is_some()
                        && loop_extents_ok(&l.body, n_syms, var_count(&l.body))
                }
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

        let mut steps = Vec::with_capacity(program.steps.len());
        let mut table_bufs = Vec::new();
        for (i, step) in program.steps.iter().enumerate() {
            // This loop and the output scan below each visit every step and argument.
            air::work::add(1 + 2 * step.args.len() as u64);
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
                if param.access == lower::kir::Access::Write && matches!(buf.kind, BufferKind::Input(_)) {
                    return invalid(format!("step {i}: writes input buffer {arg}"));
                }
            }
            let code = match (kernel, loop_fns[step.kernel as usize]) {
                (Kernel::Loops(l), Some(func)) => Code::Loop { func, parallel: parallel_loop(l).is_some() },
                _ => Code::Matmul,
            };
            steps.push(StepCode { code, kernel: step.kernel, arg_start: table_bufs.len() as u32 });
            table_bufs.extend(step.args.iter().map(|b| b.0));
        }

        let mut output_bufs = Vec::new();
        for (i, b) in program.buffers.iter().enumerate() {
            match b.kind {
                BufferKind::Output(_) => output_bufs.push(i as u32),
                BufferKind::Input(slot) => match input_types.get(slot as usize) {
                    Some(Some(t)) if t.dtype == b.dtype => {}
                    _ => {
                        return invalid(format!(
                            "buf{i} reads input slot {slot}, which the graph has no {} input for",
                            b.dtype
                        ));
                    }
                },
                BufferKind::Temp | BufferKind::Status => {}
            }
        }
        // The first step touching each output buffer, and whether it only writes it there.
        let mut output_index = vec![usize::MAX; program.buffers.len()];
        for (j, &b) in output_bufs.iter().enumerate() {
            output_index[b as usize] = j;
        }
        let mut first_touch: Vec<Option<(u32, bool)>> = vec![None; output_bufs.len()];
        for (i, step) in program.steps.iter().enumerate() {
            let params = program.kernels[step.kernel as usize].params();
            for (arg, param) in step.args.iter().zip(params) {
                let Some(touch) = first_touch.get_mut(output_index[arg.0 as usize]) else { continue };
                let writes = param.access == lower::kir::Access::Write;
                match touch {
                    None => *touch = Some((i as u32, writes)),
                    Some((first, only_writes)) if *first == i as u32 => *only_writes &= writes,
                    Some(_) => {}
                }
            }
        }
        let output_writer = first_touch.iter().map(|t| t.and_then(|(s, w)| w.then_some(s))).collect();
        let mut outputs = Vec::with_capacity(program.outputs.len());
        for (buf, ty) in &program.outputs {
            let Some(info) = program.buffers.get(buf.0 as usize) else {
                return invalid(format!("output reads missing buffer {buf}"));
            };
            if info.dtype != ty.dtype {
                return invalid(format!("output {buf} is {} but its type is {ty}", info.dtype));
            }
            outputs.push(match info.kind {
                BufferKind::Output(_) => {
                    OutputSource::Fresh(output_bufs.iter().position(|&b| b == buf.0).unwrap_or_default())
                }
                BufferKind::Input(slot) => OutputSource::Input(slot),
                BufferKind::Temp => OutputSource::Temp(buf.0),
                BufferKind::Status => return invalid(format!("output {buf} is the status buffer")),
            });
        }

        let size_symbols = program.size_symbols(&input_types);

        Ok(Executable {
            program,
            planner,
            input_types,
            size_symbols,
            steps,
            table_bufs,
            output_bufs,
            output_writer,
            outputs,
            sized: Mutex::new(Vec::new()),
            state: Mutex::new(RunState::default()),
            _code: code,
            concurrency: None,
            launched: AtomicU64::new(0),
            split_launches: AtomicU64::new(0),
        })
    }

    /// Lets the executable run the steps of a dependency level at the same time when the level
    /// has enough work (see [`crate::levels`]; `min_work` is the level threshold, normally
    /// [`levels::LEVEL_PARALLEL_MIN_WORK`]), placing temporaries with `planner` for those runs.
    pub fn with_concurrency(mut self, planner: GroupPlanner, min_work: u128) -> Result<Executable> {
        let levels = lower::batch::levels(&self.program)?;
        self.concurrency = Some(Concurrency { planner, levels, min_work });
        self.sized = Mutex::new(Vec::new());
        Ok(self)
    }

    /// How the program runs for `bindings`: `None` when every step runs in program order, else
    /// the level-by-level schedule (which steps run together, on which thread).
    pub fn level_schedule(&self, bindings: &Bindings) -> Result<Option<LevelSchedule>> {
        Ok(self.sized(bindings)?.schedule.clone())
    }

    /// The lowered program this executable runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The graph's input slots and their types (`None` for a slot no input node uses).
    pub fn input_types(&self) -> &[Option<TensorType>] {
        &self.input_types
    }

    /// Kernel launches this executable has made over all its runs (its own counter: tests read it
    /// to prove that native code ran, whatever other executables do meanwhile).
    pub fn launches_run(&self) -> u64 {
        self.launched.load(Ordering::Relaxed)
    }

    /// How many loop launches of this executable's runs so far split their parallel loop over
    /// several threads (for tests that must reach the split path).
    pub fn split_launches(&self) -> u64 {
        self.split_launches.load(Ordering::Relaxed)
    }

    /// Number of kernel launches per run.
    pub fn launches(&self) -> usize {
        self.steps.len()
    }

    /// Memory sizes for one binding set (from the memory planner).
    pub fn memory(&self, bindings: &Bindings) -> Result<MemoryStats> {
        Ok(self.sized(bindings)?.stats)
    }

    /// Bytes of arena this executable holds now (its largest binding set so far).
    pub fn arena_capacity(&self) -> usize {
        lock(&self.state).arena.capacity_bytes()
    }

    /// The address of every buffer in the last run (index = `BufId`), for tests that check that
    /// inputs were read in place and outputs handed back without a copy.
    pub fn last_buffer_addresses(&self) -> Vec<usize> {
        lock(&self.state).buf_ptrs.iter().map(|&p| p as usize).collect()
    }

    /// The cached sizes for `bindings`, computing them on first use.
    fn sized(&self, bindings: &Bindings) -> Result<Arc<Sized>> {
        let mut key: SizeKey = SmallVec::with_capacity(self.size_symbols.len());
        for s in &self.size_symbols {
            key.push(*bindings.get(s).ok_or_else(|| RuntimeError::Unbound(s.clone()))?);
        }
        {
            let mut cache = lock(&self.sized);
            if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
                if i != 0 {
                    let hit = cache.remove(i);
                    cache.insert(0, hit);
                }
                return Ok(cache[0].1.clone());
            }
        }
        let sized = Arc::new(self.size_for(bindings)?);
        let mut cache = lock(&self.sized);
        cache.insert(0, (key, sized.clone()));
        cache.truncate(SIZED_CACHE);
        Ok(sized)
    }

    /// Everything for one binding set, computed on a cache miss only. The graph's shape
    /// conditions are checked first: no size is computed from bindings that break them.
    fn size_for(&self, bindings: &Bindings) -> Result<Sized> {
        let p = &self.program;
        p.check_bindings(bindings)?;
        let eval = |d: &air::Dim, what: &dyn Fn() -> String| -> Result<usize> {
            let v = d.eval(bindings).map_err(|e| match e {
                air::dim::DimError::Unbound(s) => RuntimeError::Unbound(s),
                other => RuntimeError::BadSize(format!("{}: {other}", what())),
            })?;
            usize::try_from(v).map_err(|_| RuntimeError::BadSize(format!("{} is {v}", what())))
        };
        let eval_shape = |t: &TensorType, what: &dyn Fn() -> String| -> Result<Vec<usize>> {
            t.shape.iter().map(|d| eval(d, what)).collect()
        };
        let numel = |shape: &[usize], what: &dyn Fn() -> String| -> Result<usize> {
            shape
                .iter()
                .try_fold(1usize, |a, &b| a.checked_mul(b))
                .ok_or_else(|| RuntimeError::BadSize(format!("{} overflows", what())))
        };

        let syms = p
            .symbols
            .iter()
            .map(|s| bindings.get(s).copied().ok_or_else(|| RuntimeError::Unbound(s.clone())))
            .collect::<Result<Vec<i64>>>()?;
        let mut buf_numel = Vec::with_capacity(p.buffers.len());
        for (i, b) in p.buffers.iter().enumerate() {
            let n = eval(&b.numel, &|| format!("the size of buf{i}"))?;
            n.checked_mul(b.dtype.size_bytes())
                .filter(|&bytes| bytes <= isize::MAX as usize)
                .ok_or_else(|| RuntimeError::BadSize(format!("buf{i} of {n} elements is too large")))?;
            buf_numel.push(n);
        }
        let mut input_shapes = Vec::with_capacity(self.input_types.len());
        for (slot, t) in self.input_types.iter().enumerate() {
            input_shapes.push(match t {
                Some(t) => Some(eval_shape(t, &|| format!("input slot {slot} ({t})"))?),
                None => None,
            });
        }
        for (i, b) in p.buffers.iter().enumerate() {
            if let BufferKind::Input(slot) = b.kind {
                let shape = input_shapes[slot as usize].as_deref().unwrap_or_default();
                if numel(shape, &|| format!("input slot {slot}"))? != buf_numel[i] {
                    return Err(RuntimeError::InvalidProgram(format!(
                        "buf{i} holds {} elements but input slot {slot} has shape {shape:?}",
                        buf_numel[i]
                    )));
                }
            }
        }
        let mut output_shapes = Vec::with_capacity(p.outputs.len());
        for (i, (buf, t)) in p.outputs.iter().enumerate() {
            let shape = eval_shape(t, &|| format!("output {i} ({t})"))?;
            if numel(&shape, &|| format!("output {i}"))? != buf_numel[buf.0 as usize] {
                return Err(RuntimeError::InvalidProgram(format!(
                    "output {i} of shape {shape:?} is read from {buf} of {} elements",
                    buf_numel[buf.0 as usize]
                )));
            }
            output_shapes.push(shape);
        }

        let threads = parallel::threads();
        let mut launches = Vec::with_capacity(self.steps.len());
        for (step, code) in p.steps.iter().zip(&self.steps) {
            let kernel = &p.kernels[code.kernel as usize];
            launches.push(match (code.code, kernel) {
                (Code::Loop { func, parallel }, Kernel::Loops(k)) => {
                    let (end, chunks, split) = if parallel {
                        let extent = parallel_loop(k).map_or(0, |e| e.eval(&[], &syms));
                        if extent < 0 {
                            return Err(RuntimeError::BadSize(format!("kernel k{} loops {extent} times", code.kernel)));
                        }
                        let vars = vec![0i64; var_count(&k.body)];
                        let work = nest_work(&k.body, &vars, &syms);
                        let most = threads.min(extent as usize).max(1) as u32;
                        if work >= PARALLEL_MIN_WORK {
                            (extent, most, 0)
                        } else if work >= CALIBRATE_MIN_WORK && most > 1 {
                            (extent, 1, most)
                        } else {
                            (extent, 1, 0)
                        }
                    } else {
                        (1, 1, 0)
                    };
                    Launch::Loop {
                        func,
                        arg_start: code.arg_start,
                        end,
                        chunks: AtomicU32::new(chunks),
                        split,
                        calib_ns: AtomicU64::new(u64::MAX),
                        split_ns: AtomicU64::new(u64::MAX),
                    }
                }
                (_, Kernel::Matmul(m)) => {
                    let numel: Vec<usize> = step.args.iter().map(|b| buf_numel[b.0 as usize]).collect();
                    Launch::Matmul { arg_start: code.arg_start, mm: Box::new(MatmulLaunch::new(m, &syms, &numel)?) }
                }
                (Code::Matmul, Kernel::Loops(_)) => {
                    return Err(RuntimeError::InvalidProgram(format!("loop kernel k{} has no code", code.kernel)));
                }
            });
        }
        let unwritten_ok = self
            .output_bufs
            .iter()
            .zip(&self.output_writer)
            .map(|(&b, writer)| match writer.map(|s| &launches[s as usize]) {
                // A loop kernel's loop space is the shape of the node it materializes, and an
                // output buffer holds exactly that node (`lower::schedule`): it stores every element.
                Some(Launch::Loop { .. }) => true,
                Some(Launch::Matmul { mm, .. }) => mm.writes_all_of_c(buf_numel[b as usize]),
                None => false,
            })
            .collect();
        let schedule = match &self.concurrency {
            Some(c) => {
                let costs = launch_costs(p, &launches, &syms);
                levels::schedule(&c.levels, &costs, threads, c.min_work)
            }
            None => None,
        };
        let placement = match (&schedule, &self.concurrency) {
            (Some(sch), Some(c)) => (c.planner)(p, bindings, &sch.slots)?,
            _ => (self.planner)(p, bindings)?,
        };
        if placement.offsets.len() != p.buffers.len() {
            return Err(RuntimeError::InvalidProgram("the memory plan does not cover every buffer".into()));
        }
        for (i, b) in p.buffers.iter().enumerate() {
            if b.kind != BufferKind::Temp {
                continue;
            }
            let bytes = buf_numel[i] * b.dtype.size_bytes();
            let fits = match placement.offsets[i] {
                Some(o) => o.checked_add(bytes).is_some_and(|end| end <= placement.stats.arena_bytes),
                None => bytes == 0,
            };
            if !fits {
                return Err(RuntimeError::InvalidProgram(format!("buf{i} is placed outside the arena")));
            }
        }

        Ok(Sized {
            syms,
            input_shapes,
            buf_numel,
            offsets: placement.offsets,
            stats: placement.stats,
            output_shapes,
            unwritten_ok,
            launches,
            schedule,
            runs: AtomicU32::new(0),
        })
    }

    fn check_inputs(&self, inputs: &[HostTensor], sized: &Sized) -> Result<()> {
        if inputs.len() != self.input_types.len() {
            return Err(RuntimeError::InputCount { expected: self.input_types.len(), got: inputs.len() });
        }
        for (slot, (given, ty)) in inputs.iter().zip(&self.input_types).enumerate() {
            let (Some(ty), Some(shape)) = (ty, &sized.input_shapes[slot]) else { continue };
            let numel: usize = shape.iter().product();
            if given.dtype() != ty.dtype || given.shape != *shape || given.numel() != numel {
                return Err(RuntimeError::InputMismatch {
                    slot: slot as u32,
                    expected: format!("{ty} (= {}{shape:?})", ty.dtype),
                    got: format!("{}{:?} with {} elements", given.dtype(), given.shape, given.numel()),
                });
            }
        }
        Ok(())
    }

    /// Runs the program on `inputs` (one per input slot, read in place) with the symbol values in
    /// `bindings`, returning the graph's outputs in order.
    pub fn run(&self, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>> {
        let sized = self.sized(bindings)?;
        self.check_inputs(inputs, &sized)?;
        // Concurrent runs of one executable each get scratch space: the first takes the shared
        // state, the others make their own for the run.
        let mut own;
        let mut guard;
        let state: &mut RunState = match self.state.try_lock() {
            Ok(g) => {
                guard = g;
                &mut guard
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                guard = p.into_inner();
                &mut guard
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                own = RunState::default();
                &mut own
            }
        };
        self.run_with(state, inputs, &sized)
    }

    fn run_with(&self, state: &mut RunState, inputs: &[HostTensor], sized: &Sized) -> Result<Vec<HostTensor>> {
        self.prepare(state, inputs, sized)?;
        let table = state.table.as_ptr();
        let syms = sized.syms.as_ptr();
        let run = sized.runs.load(Ordering::Relaxed);
        let calibrating = (1..=2 * CALIBRATION_RUNS).contains(&run);
        if run <= 2 * CALIBRATION_RUNS {
            sized.runs.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY (both closures): the table holds every step's buffers (see `run_launch`).
        let in_order = |launch: &Launch| {
            let split = unsafe {
                if calibrating { run_calibrating(launch, table, syms) } else { run_launch(launch, table, syms, false) }
            };
            if split {
                self.split_launches.fetch_add(1, Ordering::Relaxed);
            }
        };
        match &sized.schedule {
            None => sized.launches.iter().for_each(in_order),
            Some(schedule) => {
                for phase in &schedule.phases {
                    match phase {
                        Phase::Step(s) => in_order(&sized.launches[*s as usize]),
                        Phase::Concurrent { bins } => {
                            let (table, syms) = (SendPtr(table as *mut u8), SendPtr(syms as *mut u8));
                            parallel::for_chunks(bins.len(), bins.len(), &|lo, hi| {
                                for bin in &bins[lo..hi] {
                                    for &s in bin {
                                        // SAFETY: as above; the steps of one level touch no
                                        // common bytes where one of them writes (`lower::batch`
                                        // levels, planned with the level as one time slot), so
                                        // they may run at the same time, each on one thread.
                                        unsafe {
                                            run_launch(
                                                &sized.launches[s as usize],
                                                table.get() as *const *mut u8,
                                                syms.get() as *const i64,
                                                true,
                                            )
                                        };
                                    }
                                }
                            });
                        }
                    }
                }
            }
        }
        if calibrating && (run == CALIBRATION_RUNS || run == 2 * CALIBRATION_RUNS) {
            for launch in &sized.launches {
                if let Launch::Loop { chunks, split, calib_ns, split_ns, .. } = launch
                    && *split > 1
                {
                    let one = calib_ns.load(Ordering::Relaxed);
                    let decided = if run == CALIBRATION_RUNS {
                        if one >= SPLIT_MIN_NS { *split } else { 1 }
                    } else if split_ns.load(Ordering::Relaxed) < one / 20 * 17 {
                        *split
                    } else {
                        1
                    };
                    chunks.store(decided, Ordering::Relaxed);
                }
            }
        }
        self.launched.fetch_add(sized.launches.len() as u64, Ordering::Relaxed);
        // SAFETY: every launch ran.
        unsafe { self.finish(state, inputs, sized) }
    }

    /// Makes the arena big enough, allocates the fresh outputs and fills the pointer table.
    fn prepare(&self, state: &mut RunState, inputs: &[HostTensor], sized: &Sized) -> Result<()> {
        state.arena.ensure(sized.stats.arena_bytes)?;
        let base = state.arena.base();

        state.fresh.clear();
        for (j, &b) in self.output_bufs.iter().enumerate() {
            let b = b as usize;
            let (dtype, n) = (self.program.buffers[b].dtype, sized.buf_numel[b]);
            state.fresh.push(if sized.unwritten_ok[j] {
                memory::unwritten_host_data(dtype, n)?
            } else {
                memory::zeroed_host_data(dtype, n)?
            });
        }

        state.status.clear();
        state.status.resize(lower::kir::STATUS_WORDS, 0);
        state.buf_ptrs.clear();
        let mut next_fresh = 0;
        for (i, b) in self.program.buffers.iter().enumerate() {
            let ptr = match b.kind {
                BufferKind::Input(slot) => memory::data_ptr(&inputs[slot as usize].data),
                BufferKind::Output(_) => {
                    next_fresh += 1;
                    memory::data_ptr_mut(&mut state.fresh[next_fresh - 1])
                }
                // SAFETY: the offset lies inside the arena (checked against the plan in `size_for`,
                // and the arena holds `arena_bytes`).
                BufferKind::Temp => unsafe { base.add(sized.offsets[i].unwrap_or(0)) },
                BufferKind::Status => state.status.as_mut_ptr() as *mut u8,
            };
            state.buf_ptrs.push(ptr);
        }
        state.table.clear();
        state.table.extend(self.table_bufs.iter().map(|&b| state.buf_ptrs[b as usize]));
        Ok(())
    }

    /// Hands the fresh outputs out as the graph's outputs.
    ///
    /// # Safety
    /// Every launch of `sized` ran on the pointers `prepare` set up, so every fresh output whose
    /// `unwritten_ok` flag is set has had every element written.
    unsafe fn finish(&self, state: &mut RunState, inputs: &[HostTensor], sized: &Sized) -> Result<Vec<HostTensor>> {
        // One check per run: a data-dependent failure recorded by any kernel becomes the error.
        if let Some(message) = lower::DataCheck::from_status(&self.program.data_checks, &state.status) {
            state.fresh.clear();
            return Err(lower::LowerError::Data(message).into());
        }
        let mut fresh: SmallVec<[Arc<HostData>; 4]> = SmallVec::with_capacity(state.fresh.len());
        for (&b, mut data) in self.output_bufs.iter().zip(state.fresh.drain(..)) {
            // SAFETY: the buffer's first writer stored every element (`unwritten_ok`), or it was
            // zeroed; it has room for exactly `buf_numel` elements.
            unsafe { memory::mark_written(&mut data, sized.buf_numel[b as usize]) };
            fresh.push(Arc::new(data));
        }
        let mut results = Vec::with_capacity(self.outputs.len());
        for (i, source) in self.outputs.iter().enumerate() {
            let shape = sized.output_shapes[i].clone();
            let data = match *source {
                OutputSource::Fresh(j) => fresh[j].clone(),
                OutputSource::Input(slot) => inputs[slot as usize].data.clone(),
                OutputSource::Temp(b) => {
                    let info = &self.program.buffers[b as usize];
                    let n = sized.buf_numel[b as usize];
                    let mut data = memory::unwritten_host_data(info.dtype, n)?;
                    // SAFETY: the temporary holds `n` elements of its dtype inside the arena, and
                    // `data` is a fresh array of the same dtype with room for `n`: both ranges are
                    // in bounds and do not overlap. Kernels store only valid values (bools as 0/1),
                    // so after the copy all `n` elements are initialized.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            state.buf_ptrs[b as usize],
                            memory::data_ptr_mut(&mut data),
                            n * info.dtype.size_bytes(),
                        );
                        memory::mark_written(&mut data, n);
                    }
                    Arc::new(data)
                }
            };
            results.push(HostTensor { data, shape });
        }
        Ok(results)
    }

    /// Runs the program `repeats` times (at least once) one launch at a time, in program order on
    /// the calling thread's schedule (each launch split over the threads as in a normal run, levels
    /// not run concurrently), and returns the median time of every launch: where a run's time
    /// goes. The outputs are dropped.
    pub fn launch_times(&self, inputs: &[HostTensor], bindings: &Bindings, repeats: usize) -> Result<Vec<LaunchTime>> {
        let sized = self.sized(bindings)?;
        self.check_inputs(inputs, &sized)?;
        let mut state = RunState::default();
        let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(repeats.max(1)); sized.launches.len()];
        for _ in 0..repeats.max(1) {
            self.prepare(&mut state, inputs, &sized)?;
            let table = state.table.as_ptr();
            for (launch, times) in sized.launches.iter().zip(&mut samples) {
                let t0 = std::time::Instant::now();
                // SAFETY: as in `run_with`; running a level's steps one after another is valid.
                unsafe { run_launch(launch, table, sized.syms.as_ptr(), false) };
                times.push(t0.elapsed().as_nanos() as u64);
            }
            // SAFETY: every launch ran.
            drop(unsafe { self.finish(&mut state, inputs, &sized) }?);
        }
        Ok(sized
            .launches
            .iter()
            .zip(&self.steps)
            .zip(&mut samples)
            .enumerate()
            .map(|(step, ((launch, code), times))| {
                times.sort_unstable();
                let (matmul, threads) = match launch {
                    Launch::Loop { chunks, .. } => (None, chunks.load(Ordering::Relaxed)),
                    Launch::Matmul { mm, .. } => (
                        Some((mm.batch, mm.m, mm.n, mm.k)),
                        if mm.threads_itself() { parallel::threads() as u32 } else { 1 },
                    ),
                };
                LaunchTime { step, kernel: code.kernel, matmul, threads, median_ns: times[times.len() / 2] }
            })
            .collect())
    }
}

/// The time of one launch (see [`Executable::launch_times`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchTime {
    /// The step's index in the program.
    pub step: usize,
    /// The kernel it launches.
    pub kernel: u32,
    /// `(batch, m, n, k)` for a matmul, `None` for a loop kernel.
    pub matmul: Option<(usize, usize, usize, usize)>,
    /// Threads the launch may use (1: the calling thread only).
    pub threads: u32,
    /// Median wall time, nanoseconds.
    pub median_ns: u64,
}

/// The work estimate of every launch, for the level schedule.
fn launch_costs(p: &Program, launches: &[Launch], syms: &[i64]) -> Vec<StepCost> {
    launches
        .iter()
        .zip(&p.steps)
        .map(|(launch, step)| match (launch, &p.kernels[step.kernel as usize]) {
            (Launch::Loop { chunks, .. }, Kernel::Loops(k)) => {
                let vars = vec![0i64; var_count(&k.body)];
                StepCost { work: nest_work(&k.body, &vars, syms).max(1), splits: chunks.load(Ordering::Relaxed) > 1 }
            }
            (Launch::Matmul { mm, .. }, _) => {
                StepCost { work: (mm.macs() / levels::MACS_PER_WORK).max(1), splits: mm.threads_itself() }
            }
            _ => StepCost { work: 1, splits: false },
        })
        .collect()
}

/// Runs one launch as [`run_launch`] does, timing it when it is a calibration candidate.
///
/// # Safety
/// As for [`run_launch`].
unsafe fn run_calibrating(launch: &Launch, table: *const *mut u8, syms: *const i64) -> bool {
    match launch {
        Launch::Loop { split, chunks, calib_ns, split_ns, .. } if *split > 1 => {
            let was_split = chunks.load(Ordering::Relaxed) > 1;
            let t0 = std::time::Instant::now();
            // SAFETY: the caller keeps `run_launch`'s contract.
            let split = unsafe { run_launch(launch, table, syms, false) };
            let ns = t0.elapsed().as_nanos() as u64;
            if was_split {
                split_ns.fetch_min(ns, Ordering::Relaxed)
            } else {
                calib_ns.fetch_min(ns, Ordering::Relaxed)
            };
            split
        }
        // SAFETY: as above.
        _ => unsafe { run_launch(launch, table, syms, false) },
    }
}

/// Runs one launch; `alone` runs it on the calling thread only (a step of a concurrent level).
/// Returns whether it was a loop launch split over several threads.
///
/// # Safety
/// `table` holds one valid pointer per argument of every step, each buffer as large as the
/// program says; `syms` holds every symbol value; no other thread writes what this step touches.
unsafe fn run_launch(launch: &Launch, table: *const *mut u8, syms: *const i64, alone: bool) -> bool {
    match *launch {
        Launch::Loop { func, arg_start, end, ref chunks, .. } => {
            let chunks = chunks.load(Ordering::Relaxed);
            // SAFETY: `arg_start` indexes this step's arguments in the table, one valid
            // buffer pointer per kernel parameter, each buffer as large as the program
            // says (inputs checked, outputs and arena allocated to size); `syms` holds
            // every symbol the kernel reads (checked in `new`).
            let args = unsafe { table.add(arg_start as usize) };
            if chunks <= 1 || alone {
                // SAFETY: see above; the kernel's contract is to touch only its buffers.
                unsafe { func(args, syms, 0, end) };
                false
            } else {
                let (args, syms) = (SendPtr(args as *mut u8), SendPtr(syms as *mut u8));
                parallel::for_chunks(end as usize, chunks as usize, &|lo, hi| {
                    // SAFETY: as above; disjoint ranges of the parallel loop write
                    // disjoint elements (the kir contract for `parallel` loops).
                    unsafe { func(args.get() as *const *mut u8, syms.get() as *const i64, lo as i64, hi as i64) }
                });
                true
            }
        }
        Launch::Matmul { arg_start, ref mm } => {
            // SAFETY: as above; `mm` was bounds-checked against these buffers' sizes.
            unsafe { mm.run_threads(table.add(arg_start as usize), !alone) };
            false
        }
    }
}

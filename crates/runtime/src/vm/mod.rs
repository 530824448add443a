//! The VM: the CPU backend ([`CpuCode`]), which runs a lowered `Program` whose loop kernels are
//! native functions. An [`Executable`] is a [`Runner`] over it: the device-independent half
//! (validation, sizes per binding set, shape checks, input checks, the memory plan) is
//! `crate::prepared`'s.
//!
//! Everything that does not depend on the inputs' data is prepared ahead of the hot loop:
//! - once per `Executable`: the launch list (function pointer or GEMM, and where each step's
//!   arguments sit in one flat pointer table), the input and output layout;
//! - once per binding set (cached by the runner): each loop's range and how many threads split
//!   it, each matmul's sizes and strides (bounds-checked), the level schedule (`launch.rs`).
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

mod launch;
mod run;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use air::{Bindings, HostData, TensorType};
use lower::kir::{Access, IExpr, Kernel};
use lower::{BufferKind, Program};

use crate::backend::{Runner, lock};
use crate::error::{Result, RuntimeError};
use crate::levels::LevelSchedule;
use crate::memory::Arena;
use crate::parallel;
use crate::prepared::{self, Prepared, Preset};

use launch::{Code, Launch, StepCode};

/// The native entry point of a loop kernel (`codegen`'s ABI): buffer pointers, symbol values, and
/// the `[start, end)` range of its top-level parallel loop; and the cell a launch reads it from.
pub use codegen::{KernelEntry, KernelFn};

/// The native code of one loop kernel of a program: `entry`, compiled from the kernel with each
/// parameter's base offset taken out of its accesses (`lower::offsets::split_offsets`), and those
/// offsets in elements, one per parameter (empty: none). The VM starts each buffer argument at
/// its offset, so one function serves every kernel that differs from it only there.
#[derive(Clone, Debug)]
pub struct LoopCode {
    /// The compiled function, read at each launch (the tiered JIT swaps in faster code there).
    pub entry: Arc<KernelEntry>,
    /// Element offset of each parameter (over the program's symbols), or empty for none.
    pub offsets: Vec<IExpr>,
}

impl From<KernelFn> for LoopCode {
    fn from(func: KernelFn) -> LoopCode {
        LoopCode { entry: Arc::new(KernelEntry::new(func)), offsets: Vec::new() }
    }
}

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
/// tried split over the threads: where a split saves half the time, it pays past about twice
/// the fork-join cost, and a split that does not gain 15% is undone by the calibration anyway.
/// With the hot team (`parallel`) spinning, a split costs 0.3-0.4 us back to back: 2 us of work
/// took 1.51 us split in two, 4 us 2.45 (`examples/split_cost`, 3 us between splits); this was
/// 12 us when a split cost 4.5, which left every kernel of the suite's convolutions and
/// attention on one core (`kiln bench models`, alternating binaries: attention's predict
/// 0.103-0.126 -> 0.082-0.113 ms). Measured (`kiln bench unary`): a sigmoid over 59,049
/// elements takes 19 us on one core, and split 12.8 us.
pub const SPLIT_MIN_NS: u64 = 3_000;

/// A matmul launch with at least this many multiply-adds always spreads over the threads when
/// `gemm` would (`MatmulLaunch::threads_itself`); a smaller one that would is a calibration
/// candidate like a loop kernel: a wake-up of the pool costs 4.5 us back to back but 17 us after
/// 50 us idle and 77 us after 200 us idle (#18), while `gemm` does about 2^24 multiply-adds in
/// 0.3 ms on one core of the development machine, where even the slowest wake-up is paid back.
pub const MATMUL_ALWAYS_SPLIT_MACS: u128 = 1 << 24;

/// Calibration of a binding set: runs `1..=CALIBRATION_RUNS` (the first run is left out: it pays
/// for cold caches and fresh pages) time each candidate loop kernel on the calling thread; a
/// candidate that took at least [`SPLIT_MIN_NS`] then runs split for the next `CALIBRATION_RUNS`
/// runs (the first of them wakes the pool and is not timed: with it, a sigmoid over 59,049
/// elements measured 24-39 us split against 19 us on one thread, and 11 us once the helpers
/// were awake), and stays split only if that was at least 15% faster (the other cores may be busy with
/// other work: a split then only adds the fork-join). Matmul launches below
/// [`MATMUL_ALWAYS_SPLIT_MACS`] that would thread are calibrated the same way (threaded GEMM or
/// batch split against one thread). Splitting a parallel loop never changes
/// results (its iterations write disjoint elements and compute them the same way).
pub const CALIBRATION_RUNS: u32 = 5;

/// Runs after which a binding set is calibrated again, from one thread as the first time: a
/// calibration that met a busy spell keeps its one-thread decision otherwise for as long as
/// the program runs (a bench run's compiled `neg` over 1,594,323 elements ran at one core's
/// 0.146 ms where it takes 0.071 split; a lazy sigmoid chain 12.2 against 7.0-8.0 us per op).
/// Each window costs ten runs in order, the splits retried.
pub const CALIBRATE_AGAIN: [u32; 3] = [64, 1024, 16384];

/// Running independent steps at the same time (see [`crate::levels`]).
struct Concurrency {
    /// The dependency levels of the program (`lower::batch`), computed once.
    levels: Vec<Vec<usize>>,
    /// A level with less work runs one step after another.
    min_work: u128,
}

/// Where a graph output's data comes from.
#[derive(Clone, Copy, Debug)]
enum OutputSource {
    /// A fresh output buffer: index into `CpuCode::output_bufs`.
    Fresh(usize),
    /// A graph output that is an input, returned by sharing the input's `Arc`.
    Input(u32),
    /// A temporary (not expected from the lowering): copied out of the arena.
    Temp(u32),
}

/// A program's native code and launch tables: the CPU [`Backend`](crate::backend::Backend).
pub struct CpuCode {
    steps: Vec<StepCode>,
    /// The buffer of each step argument, flat, in step order.
    table_bufs: Vec<u32>,
    /// The step arguments that start at an offset into their buffer: position in the table,
    /// offset in elements, element size in bytes.
    table_offsets: Vec<(u32, IExpr, usize)>,
    /// The buffers of kind `Output`, in the order fresh outputs are allocated.
    output_bufs: Vec<u32>,
    /// Per entry of `output_bufs`: the first step whose arguments include the buffer, if every
    /// such argument of that step is written (not read) by the kernel.
    output_writer: Vec<Option<u32>>,
    outputs: Vec<OutputSource>,
    /// Keeps the native code of the loop kernels alive.
    _code: Arc<dyn Send + Sync>,
    /// `None`: steps always run one after another, in program order.
    concurrency: Option<Concurrency>,
    /// Kernel launches made by every run so far (see [`Executable::launches_run`]).
    launched: AtomicU64,
    /// Loop launches whose parallel loop ran split over several threads, over every run.
    split_launches: AtomicU64,
    /// Calibrated thread decisions, for later binding sets with the same launches.
    decisions: launch::Decisions,
    /// Nanoseconds of each launch of the first binding set's first run made while
    /// [`time_first_runs`] was on (see [`Executable::first_run_times`]).
    first_run_ns: Mutex<Vec<u64>>,
}

/// Whether runs from now on time each launch of a binding set's first run: one clock read per
/// launch, off unless a profile asks (`kiln profile --launches`).
static TIME_FIRST_RUNS: AtomicBool = AtomicBool::new(false);

/// Turns the timing of first runs' launches on or off for every executable (see
/// [`Executable::first_run_times`]).
pub fn time_first_runs(on: bool) {
    TIME_FIRST_RUNS.store(on, Ordering::Relaxed);
}

/// What the VM derives from one binding set.
pub struct CpuLaunches {
    /// Per entry of `CpuCode::output_bufs`: whether the first step touching the buffer writes
    /// every element of it, so that it is allocated without zeroing.
    unwritten_ok: Vec<bool>,
    launches: Vec<Launch>,
    /// The steps whose matmul reads its weight from a copy (`Launch::Matmul::copied`), for
    /// `bind` to refresh without walking every launch.
    copy_steps: Vec<u32>,
    /// `Some` when some dependency level runs concurrently: the program then runs by levels.
    schedule: Option<LevelSchedule>,
    /// Runs started with this binding set (saturates at `2 * CALIBRATION_RUNS + 1`).
    runs: AtomicU32,
    /// The process's count of tier-ups (`codegen::cpu::tier_ups_so_far`) when this binding set
    /// last looked, and how many of the program's loop steps had been swapped to optimised code
    /// then: when that number changes, the calibration (timed on the old code) starts again.
    code_seen: AtomicU64,
    code_swapped: AtomicUsize,
}

/// Per-run scratch, reused across runs.
#[derive(Default)]
pub struct RunState {
    arena: Arena,
    buf_ptrs: Vec<*mut u8>,
    table: Vec<*mut u8>,
    fresh: Vec<Arc<HostData>>,
    /// Per fresh output, the shape allocation of the input it is written in place over.
    fresh_shapes: Vec<Option<Vec<usize>>>,
    /// Arrays offered by the caller for this run's outputs ([`Backend::recycle`]), emptied by
    /// `bind`.
    spare: Vec<HostData>,
    /// The initial contents of outputs written in place ([`Backend::preset`]), by buffer,
    /// emptied by `bind`.
    presets: Vec<Preset>,
    /// The run's status words (`lower::kir::STATUS_WORDS`), zeroed before each run; kernels
    /// record data-dependent failures here.
    status: Vec<i32>,
    /// Per step: the packed copy of its weight, for a matmul launch that reads one.
    weight_copies: Vec<Option<crate::matmul::PackedWeight>>,
}

// SAFETY: the raw pointers in a `RunState` are only dereferenced during a run, by the thread
// holding the state (and the pool threads it waits for); between runs they are stale values that
// nobody reads, so moving the state to another thread is sound.
unsafe impl Send for RunState {}

/// A compiled program, ready to run on the CPU for any symbol values.
pub type Executable = Runner<CpuCode>;

impl CpuCode {
    /// The launch tables of `prepared` with `loop_fns[k]` the native code of kernel `k` (`None`
    /// for matmul kernels); `code` keeps that code alive.
    fn new(prepared: &Prepared, loop_fns: Vec<Option<LoopCode>>, code: Arc<dyn Send + Sync>) -> Result<CpuCode> {
        let program = prepared.program();
        let invalid = |msg: String| Err(RuntimeError::InvalidProgram(msg));
        if loop_fns.len() != program.kernels.len() {
            return invalid(format!("{} kernels but {} compiled functions", program.kernels.len(), loop_fns.len()));
        }
        for (k, (kernel, func)) in program.kernels.iter().zip(&loop_fns).enumerate() {
            match (kernel, func) {
                (Kernel::Loops(_), None) => return invalid(format!("loop kernel k{k} has no compiled function")),
                (Kernel::Loops(l), Some(f)) if !f.offsets.is_empty() => {
                    if f.offsets.len() != l.params.len() {
                        return invalid(format!("k{k} has {} params but {} offsets", l.params.len(), f.offsets.len()));
                    }
                    if !f.offsets.iter().all(|e| prepared::expr_ok(e, program.symbols.len(), 0)) {
                        return invalid(format!("an offset of k{k} reads a variable or an unknown symbol"));
                    }
                }
                _ => {}
            }
        }
        let mut steps = Vec::with_capacity(program.steps.len());
        let mut table_bufs = Vec::new();
        let mut table_offsets = Vec::new();
        for step in &program.steps {
            // This loop and the output scan below each visit every step and argument once more
            // than `Prepared::new`.
            air::work::add(step.args.len() as u64);
            let kernel = &program.kernels[step.kernel as usize];
            let code = match (kernel, &loop_fns[step.kernel as usize]) {
                (Kernel::Loops(l), Some(f)) => {
                    for (i, (e, param)) in f.offsets.iter().zip(&l.params).enumerate() {
                        if e.as_const() != Some(0) {
                            let at = (table_bufs.len() + i) as u32;
                            table_offsets.push((at, e.clone(), param.dtype.size_bytes()));
                        }
                    }
                    Code::Loop { entry: f.entry.clone(), parallel: launch::parallel_loop(l).is_some() }
                }
                // Checked above: every loop kernel has its function.
                (Kernel::Loops(_), None) | (Kernel::Matmul(_), _) => Code::Matmul,
            };
            steps.push(StepCode { code, kernel: step.kernel, arg_start: table_bufs.len() as u32 });
            table_bufs.extend(step.args.iter().map(|b| b.0));
        }
        let output_bufs: Vec<u32> = (0..program.buffers.len() as u32)
            .filter(|&i| matches!(program.buffers[i as usize].kind, BufferKind::Output(_)))
            .collect();
        // The first step touching each output buffer, and whether it only writes it there.
        let mut output_index = vec![usize::MAX; program.buffers.len()];
        for (j, &b) in output_bufs.iter().enumerate() {
            output_index[b as usize] = j;
        }
        let mut first_touch: Vec<Option<(u32, bool)>> = vec![None; output_bufs.len()];
        for (i, step) in program.steps.iter().enumerate() {
            air::work::add(step.args.len() as u64);
            let params = program.kernels[step.kernel as usize].params();
            for (arg, param) in step.args.iter().zip(params) {
                let Some(touch) = first_touch.get_mut(output_index[arg.0 as usize]) else { continue };
                let writes = param.access == Access::Write;
                match touch {
                    None => *touch = Some((i as u32, writes)),
                    Some((first, only_writes)) if *first == i as u32 => *only_writes &= writes,
                    Some(_) => {}
                }
            }
        }
        let output_writer = first_touch.iter().map(|t| t.and_then(|(s, w)| w.then_some(s))).collect();
        let outputs = program
            .outputs
            .iter()
            .map(|(buf, _)| match program.buffers[buf.0 as usize].kind {
                BufferKind::Input(slot) => OutputSource::Input(slot),
                BufferKind::Temp | BufferKind::Status => OutputSource::Temp(buf.0),
                BufferKind::Output(_) => {
                    OutputSource::Fresh(output_bufs.iter().position(|&b| b == buf.0).unwrap_or_default())
                }
            })
            .collect();
        Ok(CpuCode {
            steps,
            table_bufs,
            table_offsets,
            output_bufs,
            output_writer,
            outputs,
            _code: code,
            concurrency: None,
            launched: AtomicU64::new(0),
            split_launches: AtomicU64::new(0),
            decisions: launch::Decisions::default(),
            first_run_ns: Mutex::new(Vec::new()),
        })
    }
}

impl Runner<CpuCode> {
    /// Prepares `program` to run. `loop_fns[k]` is the native code of kernel `k` (`None` for
    /// matmul kernels); `code` keeps that code alive; `input_types` are the graph's input slots.
    pub fn new(
        program: Program,
        input_types: Vec<Option<TensorType>>,
        loop_fns: Vec<Option<LoopCode>>,
        code: Arc<dyn Send + Sync>,
    ) -> Result<Executable> {
        let prepared = Prepared::new(program, input_types)?;
        let backend = CpuCode::new(&prepared, loop_fns, code)?;
        Ok(Runner::with_backend(prepared, backend))
    }

    /// Lets the executable run the steps of a dependency level at the same time when the level
    /// has enough work (see [`crate::levels`]; `min_work` is the level threshold, normally
    /// [`crate::levels::LEVEL_PARALLEL_MIN_WORK`]); such runs are planned with the level as one
    /// time slot of the memory plan.
    pub fn with_concurrency(mut self, min_work: u128) -> Result<Executable> {
        let levels = lower::batch::levels(self.program())?;
        self.backend.concurrency = Some(Concurrency { levels, min_work });
        self.clear_sized();
        Ok(self)
    }

    /// How the program runs for `bindings`: `None` when every step runs in program order, else
    /// the level-by-level schedule (which steps run together, on which thread).
    pub fn level_schedule(&self, bindings: &Bindings) -> Result<Option<LevelSchedule>> {
        Ok(self.sized(bindings)?.launches.schedule.clone())
    }

    /// Kernel launches this executable has made over all its runs (its own counter: tests read it
    /// to prove that native code ran, whatever other executables do meanwhile).
    pub fn launches_run(&self) -> u64 {
        self.backend.launched.load(Ordering::Relaxed)
    }

    /// Nanoseconds of each launch (in program order) of the first binding set's first run made
    /// while [`time_first_runs`] was on; empty when there was none. A first run meets cold caches,
    /// fresh pages and weights not yet copied (`matmul::PackedWeight`): beside
    /// [`Executable::launch_times`]' steady medians it shows what a program called once pays.
    pub fn first_run_times(&self) -> Vec<u64> {
        lock(&self.backend.first_run_ns).clone()
    }

    /// How many loop launches of this executable's runs so far split their parallel loop over
    /// several threads (for tests that must reach the split path).
    pub fn split_launches(&self) -> u64 {
        self.backend.split_launches.load(Ordering::Relaxed)
    }

    /// Bytes of arena this executable holds now (its largest binding set so far).
    pub fn arena_capacity(&self) -> usize {
        lock(&self.buffers).arena.capacity_bytes()
    }

    /// The address of every buffer in the last run (index = `BufId`), for tests that check that
    /// inputs were read in place and outputs handed back without a copy.
    pub fn last_buffer_addresses(&self) -> Vec<usize> {
        lock(&self.buffers).buf_ptrs.iter().map(|&p| p as usize).collect()
    }

    /// Runs the program `repeats` times (at least once) one launch at a time, in program order on
    /// the calling thread's schedule (each launch split over the threads as in a normal run, levels
    /// not run concurrently), and returns the median time of every launch: where a run's time
    /// goes. The outputs are dropped.
    pub fn launch_times(
        &self,
        inputs: &[air::HostTensor],
        bindings: &Bindings,
        repeats: usize,
    ) -> Result<Vec<LaunchTime>> {
        use crate::backend::Backend;
        let sized = self.sized(bindings)?;
        self.prepared.check_inputs(inputs, &sized.sizes)?;
        let mut state = RunState::default();
        let launches = &sized.launches.launches;
        let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(repeats.max(1)); launches.len()];
        for _ in 0..repeats.max(1) {
            self.backend.bind(&mut state, &self.prepared, &sized, inputs)?;
            let table = state.table.as_ptr();
            for (l, times) in launches.iter().zip(&mut samples) {
                let t0 = std::time::Instant::now();
                // SAFETY: bound just now; running a level's steps one after another is valid.
                unsafe { launch::run_launch(l, table, sized.sizes.syms.as_ptr(), false) };
                times.push(t0.elapsed().as_nanos() as u64);
            }
            // SAFETY: every launch ran.
            drop(unsafe { self.backend.finish(&mut state, &self.prepared, &sized, inputs) }?);
        }
        Ok(launches
            .iter()
            .zip(&self.backend.steps)
            .zip(&mut samples)
            .enumerate()
            .map(|(step, ((l, code), times))| {
                times.sort_unstable();
                let (matmul, threads, in_place) = match l {
                    Launch::Loop { chunks, skipped, .. } => {
                        (None, chunks.load(Ordering::Relaxed), skipped.then_some(InPlace::Skipped))
                    }
                    Launch::Matmul { mm, threads, window, .. } => (
                        Some((mm.batch, mm.m, mm.n, mm.k)),
                        if threads.load(Ordering::Relaxed) { parallel::threads() as u32 } else { 1 },
                        window.is_some().then_some(InPlace::Window),
                    ),
                };
                let median_ns = times[times.len() / 2];
                LaunchTime { step, kernel: code.kernel, matmul, threads, median_ns, in_place }
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
    /// Whether the step is one of a copy and its product that read the copy's source in place
    /// ([`crate::window`]), and which.
    pub in_place: Option<InPlace>,
}

/// A step's part in a product that reads its `b` from a copy's source in place
/// ([`crate::window`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InPlace {
    /// The copy: it does not run.
    Skipped,
    /// The product: its `b` read through the windows of the copy's source.
    Window,
}

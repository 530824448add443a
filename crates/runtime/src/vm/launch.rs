//! The VM's launches: each step of a program, ready to run for one binding set (its loop range and
//! thread split, or its GEMM sizes), and the functions that run one launch, time it for
//! calibration, and estimate its work for the level schedule.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lower::kir::{Access, IExpr, Kernel, LoopKernel, Stmt};
use lower::{BufferKind, Program};

use super::{CALIBRATE_MIN_WORK, KernelEntry, MATMUL_ALWAYS_SPLIT_MACS, PARALLEL_MIN_WORK};
use crate::error::{Result, RuntimeError};
use crate::levels::{self, StepCost};
use crate::matmul::MatmulLaunch;
use crate::parallel::{self, SendPtr};
use crate::prepared::{Sizes, var_count};
use crate::window::Window;

/// How one step runs, fixed per executable.
#[derive(Clone)]
pub(super) enum Code {
    /// `entry`: the kernel's current code (the tiered JIT may swap it for faster code).
    Loop {
        entry: Arc<KernelEntry>,
        parallel: bool,
    },
    Matmul,
}

pub(super) struct StepCode {
    pub(super) code: Code,
    pub(super) kernel: u32,
    /// Where this step's arguments start in the pointer table.
    pub(super) arg_start: u32,
}

/// One step, ready to launch for one binding set.
pub(super) enum Launch {
    /// `chunks`: how many parts the parallel loop is cut into (1: the calling thread alone); it
    /// starts from the work estimate and calibration may raise it to `split` (0: not a candidate).
    /// `calib_ns`: the shortest time seen in a calibration run on one thread; `split_ns`: split.
    /// `skipped`: a copy whose product reads its source in place (`window` below) does not run.
    Loop {
        entry: Arc<KernelEntry>,
        arg_start: u32,
        end: i64,
        chunks: AtomicU32,
        split: u32,
        calib_ns: AtomicU64,
        split_ns: AtomicU64,
        skipped: bool,
    },
    /// `threads`: whether the GEMM spreads over the pool (it starts from the work estimate;
    /// calibration may turn it off); `calibrate`: whether it is timed in the calibration runs
    /// (a launch that threads itself with little enough work that a wake-up of the pool may cost
    /// more than the split saves), with `calib_ns` (one thread) and `split_ns` (threaded).
    /// `copied`: `mm` with its `b` (an input of the program, never written in place) read from a
    /// packed copy that `bind` keeps across runs ([`crate::matmul::PackedWeight`]) and puts in
    /// the table at `copy_at`, past every step's arguments (null where the run reads `b` in place).
    /// `window`: `mm` with its `b` read in place from the source of the copy that wrote it (a
    /// skipped step), whose pointer is at that index of the table ([`crate::window`]).
    Matmul {
        arg_start: u32,
        mm: Box<MatmulLaunch>,
        copied: Option<Box<MatmulLaunch>>,
        copy_at: u32,
        threads: AtomicBool,
        calibrate: bool,
        calib_ns: AtomicU64,
        split_ns: AtomicU64,
        window: Option<(Box<Window>, u32)>,
    },
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
pub(super) fn parallel_loop(k: &LoopKernel) -> Option<&IExpr> {
    match k.body.as_slice() {
        [Stmt::Loop { extent, parallel: true, .. }] => Some(extent),
        _ => None,
    }
}

/// The most elements of packed weight copies ([`crate::matmul::PackedWeight`]) one binding set keeps
/// (64 MiB); launches past it read their weights as they are.
const WEIGHT_COPIES_MAX: usize = 1 << 24;

/// The launch of every step for one binding set: loop ranges split by their work estimate
/// (calibration candidates marked), matmul sizes and strides bounds-checked.
/// `table_len`: the table's slots for the steps' arguments; a weight's copy goes past them.
pub(super) fn launches(
    p: &Program,
    steps: &[StepCode],
    sizes: &Sizes,
    threads: usize,
    table_len: usize,
) -> Result<Vec<Launch>> {
    let syms = &sizes.syms;
    let mut launches = Vec::with_capacity(steps.len());
    let (mut copied, mut copies) = (0, 0);
    // Inputs some output is written over in place (`Program::inits`): not weights.
    let mut written = vec![false; p.buffers.len()];
    for &(_, input) in &p.inits {
        written[input.0 as usize] = true;
    }
    for (step, code) in p.steps.iter().zip(steps) {
        let kernel = &p.kernels[code.kernel as usize];
        launches.push(match (&code.code, kernel) {
            (&Code::Loop { ref entry, parallel }, Kernel::Loops(k)) => {
                let (end, chunks, split) = if parallel {
                    let extent = parallel_loop(k).map_or(0, |e| e.eval(&[], syms));
                    if extent < 0 {
                        return Err(RuntimeError::BadSize(format!("kernel k{} loops {extent} times", code.kernel)));
                    }
                    let vars = vec![0i64; var_count(&k.body)];
                    let work = nest_work(&k.body, &vars, syms);
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
                    entry: entry.clone(),
                    arg_start: code.arg_start,
                    end,
                    chunks: AtomicU32::new(chunks),
                    split,
                    calib_ns: AtomicU64::new(u64::MAX),
                    split_ns: AtomicU64::new(u64::MAX),
                    skipped: false,
                }
            }
            (_, Kernel::Matmul(m)) => {
                let numel: Vec<usize> = step.args.iter().map(|b| sizes.buf_numel[b.0 as usize]).collect();
                let mm = MatmulLaunch::new(m, syms, &numel)?;
                // A candidate for calibration starts on one thread, as a loop candidate does.
                let calibrate =
                    mm.threads_itself() && mm.macs() < MATMUL_ALWAYS_SPLIT_MACS && !mm.streams_large_weight();
                // A weight: an input the program never writes in place.
                let b = step.args[mm.b.param];
                let weight = matches!(p.buffers[b.0 as usize].kind, BufferKind::Input(_)) && !written[b.0 as usize];
                let copy = mm.with_packed_b().filter(|c| weight && copied + c.copy_len() <= WEIGHT_COPIES_MAX);
                copied += copy.as_ref().map_or(0, |c| c.copy_len());
                let copy_at = (table_len + copies) as u32;
                copies += usize::from(copy.is_some());
                Launch::Matmul {
                    copied: copy.map(Box::new),
                    copy_at,
                    arg_start: code.arg_start,
                    threads: AtomicBool::new(mm.threads_itself() && !calibrate),
                    calibrate,
                    mm: Box::new(mm),
                    calib_ns: AtomicU64::new(u64::MAX),
                    split_ns: AtomicU64::new(u64::MAX),
                    window: None,
                }
            }
            (Code::Matmul, Kernel::Loops(_)) => {
                return Err(RuntimeError::InvalidProgram(format!("loop kernel k{} has no code", code.kernel)));
            }
        });
    }
    read_windows(p, steps, sizes, &mut launches);
    Ok(launches)
}

/// Makes each product that can read its `b` from the source of the copy that wrote it do so,
/// and skips the copy ([`crate::window`]): the pairs the program allows
/// (`Program::skippable_copies`, for which the memory plan keeps the copy's source alive until
/// the product), where the copy runs as a copy nest, every store of it is `b` exactly
/// ([`Window::of`]), and no step after the copy writes the source.
fn read_windows(p: &Program, steps: &[StepCode], sizes: &Sizes, launches: &mut [Launch]) {
    let pairs = p.skippable_copies();
    if pairs.is_empty() {
        return;
    }
    // The last step that writes each buffer.
    let mut last_write = vec![0usize; p.buffers.len()];
    for (s, (step, code)) in p.steps.iter().zip(steps).enumerate() {
        for (q, &b) in p.kernels[code.kernel as usize].params().iter().zip(&step.args) {
            if q.access == Access::Write {
                last_write[b.0 as usize] = s;
            }
        }
    }
    for (i, j) in pairs {
        let Launch::Loop { entry, arg_start, .. } = &launches[i] else { continue };
        let Some(nest) = entry.copy_nest(&sizes.syms) else { continue };
        let Some(src) = nest.moves.first().map(|m| m.src.param) else { continue };
        let Some(&source) = p.steps[i].args.get(src) else { continue };
        let source_at = *arg_start + src as u32;
        // No later step writes the source (not only none before the product: with the level
        // schedule, a step after it may run beside it).
        let Launch::Matmul { mm, copied: None, .. } = &launches[j] else { continue };
        if last_write[source.0 as usize] > i {
            continue;
        }
        let Some(w) = Window::of(mm, &nest, sizes.buf_numel[source.0 as usize]) else { continue };
        // A product the window would split is calibrated as any other (it starts on one thread):
        // waking the pool for a split of a few tens of microseconds may cost more than it saves.
        let (splits, macs) = (Window::splits(mm), mm.macs());
        if let Launch::Matmul { window, calibrate, threads, .. } = &mut launches[j] {
            *window = Some((Box::new(w), source_at));
            *calibrate = splits && macs < MATMUL_ALWAYS_SPLIT_MACS;
            *threads.get_mut() = splits && !*calibrate;
        }
        if let Launch::Loop { skipped, split, chunks, .. } = &mut launches[i] {
            // Neither run nor timed for the thread split.
            (*skipped, *split) = (true, 0);
            *chunks.get_mut() = 1;
        }
    }
}

/// The work estimate of every launch, for the level schedule.
pub(super) fn launch_costs(p: &Program, launches: &[Launch], syms: &[i64]) -> Vec<StepCost> {
    launches
        .iter()
        .zip(&p.steps)
        .map(|(launch, step)| match (launch, &p.kernels[step.kernel as usize]) {
            (Launch::Loop { skipped: true, .. }, _) => StepCost { work: 1, splits: false },
            (Launch::Loop { chunks, .. }, Kernel::Loops(k)) => {
                let vars = vec![0i64; var_count(&k.body)];
                StepCost { work: nest_work(&k.body, &vars, syms).max(1), splits: chunks.load(Ordering::Relaxed) > 1 }
            }
            // `splits` is what the GEMM does uncalibrated: the level schedule is fixed before the
            // calibration runs, with the cost model of `crate::levels`.
            (Launch::Matmul { mm, .. }, _) => {
                StepCost { work: (mm.macs() / levels::MACS_PER_WORK).max(1), splits: mm.threads_itself() }
            }
            _ => StepCost { work: 1, splits: false },
        })
        .collect()
}

/// The calibrated thread decisions of an executable's launches, for binding sets that launch a
/// step exactly as one calibrated before: a decoding step's weight products are the same
/// launches at every cached length, while each new length (`Transformer::attended_len`) is a
/// binding set of its own, whose calibration ran its weight products on one thread for five
/// runs (a GPT-2 token at past 8 crossed three lengths in 32 steps).
#[derive(Default)]
pub(super) struct Decisions(Mutex<Vec<Decision>>);

/// One launch's decision: a loop's chunks, or whether a matmul threads.
struct Decision {
    step: usize,
    key: DecisionKey,
    chunks: u32,
    threads: bool,
}

/// What makes two launches of one step the same for calibration.
#[derive(PartialEq)]
enum DecisionKey {
    /// The parallel loop's extent and the nest's work estimate.
    Loop {
        end: i64,
        work: u128,
    },
    Matmul(MatmulLaunch),
}

/// The most decisions an executable keeps (the oldest are dropped).
const DECISIONS_MAX: usize = 1024;

/// The key of `launch` if it is a calibration candidate (`cost` its work estimate).
fn decision_key(launch: &Launch, cost: &StepCost) -> Option<DecisionKey> {
    match launch {
        Launch::Loop { end, split, .. } if *split > 1 => Some(DecisionKey::Loop { end: *end, work: cost.work }),
        Launch::Matmul { mm, calibrate: true, .. } => Some(DecisionKey::Matmul((**mm).clone())),
        _ => None,
    }
}

impl Decisions {
    /// Keeps the decisions of the calibration candidates among `launches` (calibrated: the end
    /// of a calibration window).
    pub(super) fn remember(&self, launches: &[Launch], costs: &[StepCost]) {
        let mut kept = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (step, (launch, cost)) in launches.iter().zip(costs).enumerate() {
            let Some(key) = decision_key(launch, cost) else { continue };
            let (chunks, threads) = match launch {
                Launch::Loop { chunks, .. } => (chunks.load(Ordering::Relaxed), false),
                Launch::Matmul { threads, .. } => (1, threads.load(Ordering::Relaxed)),
            };
            if let Some(d) = kept.iter_mut().find(|d| d.step == step && d.key == key) {
                (d.chunks, d.threads) = (chunks, threads);
                continue;
            }
            if kept.len() >= DECISIONS_MAX {
                kept.remove(0);
            }
            kept.push(Decision { step, key, chunks, threads });
        }
    }

    /// Gives the calibration candidates among `launches` the decisions kept for the same
    /// launches. Returns whether there was a candidate and every one took a decision (the
    /// binding set then skips its first calibration window; the later ones still run).
    pub(super) fn apply(&self, launches: &[Launch], costs: &[StepCost]) -> bool {
        let kept = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut candidates, mut decided) = (0, 0);
        for (step, (launch, cost)) in launches.iter().zip(costs).enumerate() {
            let Some(key) = decision_key(launch, cost) else { continue };
            candidates += 1;
            let Some(d) = kept.iter().find(|d| d.step == step && d.key == key) else { continue };
            decided += 1;
            match launch {
                Launch::Loop { chunks, .. } => chunks.store(d.chunks, Ordering::Relaxed),
                Launch::Matmul { threads, .. } => threads.store(d.threads, Ordering::Relaxed),
            }
        }
        candidates > 0 && decided == candidates
    }
}

/// Makes a calibration candidate run on one thread again with no times recorded, for a later
/// calibration window (see `CALIBRATE_AGAIN`).
pub(super) fn restart_calibration(launch: &Launch) {
    match launch {
        Launch::Loop { split, chunks, calib_ns, split_ns, .. } if *split > 1 => {
            chunks.store(1, Ordering::Relaxed);
            calib_ns.store(u64::MAX, Ordering::Relaxed);
            split_ns.store(u64::MAX, Ordering::Relaxed);
        }
        Launch::Matmul { calibrate: true, threads, calib_ns, split_ns, .. } => {
            threads.store(false, Ordering::Relaxed);
            calib_ns.store(u64::MAX, Ordering::Relaxed);
            split_ns.store(u64::MAX, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// Runs one launch as [`run_launch`] does, timing it when it is a calibration candidate.
///
/// # Safety
/// As for [`run_launch`].
pub(super) unsafe fn run_calibrating(launch: &Launch, table: *const *mut u8, syms: *const i64, record: bool) -> bool {
    let (was_split, calib_ns, split_ns) = match launch {
        Launch::Loop { split, chunks, calib_ns, split_ns, .. } if *split > 1 => {
            (chunks.load(Ordering::Relaxed) > 1, calib_ns, split_ns)
        }
        Launch::Matmul { calibrate: true, threads, calib_ns, split_ns, .. } => {
            (threads.load(Ordering::Relaxed), calib_ns, split_ns)
        }
        // SAFETY: the caller keeps `run_launch`'s contract.
        _ => return unsafe { run_launch(launch, table, syms, false) },
    };
    let t0 = std::time::Instant::now();
    // SAFETY: as above.
    let split = unsafe { run_launch(launch, table, syms, false) };
    let ns = t0.elapsed().as_nanos() as u64;
    if record {
        if was_split { split_ns } else { calib_ns }.fetch_min(ns, Ordering::Relaxed);
    }
    split
}

/// Runs one launch; `alone` runs it on the calling thread only (a step of a concurrent level).
/// Returns whether it was a loop launch split over several threads.
///
/// # Safety
/// `table` holds one valid pointer per argument of every step, each buffer as large as the
/// program says; `syms` holds every symbol value; no other thread writes what this step touches.
pub(super) unsafe fn run_launch(launch: &Launch, table: *const *mut u8, syms: *const i64, alone: bool) -> bool {
    match *launch {
        Launch::Loop { skipped: true, .. } => false,
        Launch::Loop { ref entry, arg_start, end, ref chunks, .. } => {
            let chunks = chunks.load(Ordering::Relaxed);
            // SAFETY: `arg_start` indexes this step's arguments in the table, one valid
            // buffer pointer per kernel parameter, each buffer as large as the program
            // says (inputs checked, outputs and arena allocated to size); `syms` holds
            // every symbol the kernel reads (checked in `Prepared::new`).
            // SAFETY: `arg_start` indexes this step's arguments in the table (as above).
            let args = unsafe { table.add(arg_start as usize) };
            if chunks <= 1 || alone {
                // SAFETY: see above; the kernel's contract is to touch only its buffers.
                unsafe { entry.invoke(args, syms, 0, end) };
                false
            } else {
                let (args, syms) = (SendPtr(args as *mut u8), SendPtr(syms as *mut u8));
                parallel::for_chunks(end as usize, chunks as usize, &|lo, hi| {
                    // SAFETY: as above; disjoint ranges of the parallel loop write
                    // disjoint elements (the kir contract for `parallel` loops).
                    unsafe {
                        entry.invoke(args.get() as *const *mut u8, syms.get() as *const i64, lo as i64, hi as i64)
                    }
                });
                true
            }
        }
        Launch::Matmul { arg_start, ref mm, ref copied, copy_at, ref threads, ref window, .. } => {
            let threads = !alone && threads.load(Ordering::Relaxed);
            // SAFETY: `arg_start` indexes this step's arguments in the table (as above).
            let args = unsafe { table.add(arg_start as usize) };
            if let Some((w, source_at)) = window {
                // SAFETY: as above; the table holds the copy's source at `source_at`, with the
                // elements `Window::of` checked, unchanged since the copy's step would have run
                // (`read_windows`) and alive (the memory plan, `Program::skippable_copies`).
                unsafe { w.run(mm, args, *table.add(*source_at as usize), threads) };
                return false;
            }
            // `bind` put the copy of `b` in the table where this run has one.
            let copy = copied.as_deref().map(|r| (r, unsafe { *table.add(copy_at as usize) }));
            match copy {
                // SAFETY: as above; `mm` was bounds-checked against these buffers' sizes, and
                // the copy holds its `b` (`PackedWeight::refresh`).
                Some((r, b)) if !b.is_null() => unsafe { mm.run_with_copy(r, args, b, threads) },
                // SAFETY: as above.
                _ => unsafe { mm.run_threads(args, threads) },
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use air::DType;

    use super::*;
    use crate::matmul::Strides;

    unsafe extern "C" fn nothing(_: *const *mut u8, _: *const i64, _: i64, _: i64) {}

    fn product(n: usize) -> MatmulLaunch {
        let s = |param, row| Strides { param, offset: 0, batch: 0, row, col: 1 };
        MatmulLaunch {
            dtype: DType::F32,
            batch: 1,
            m: 1,
            n,
            k: 768,
            a: s(0, 768),
            b: s(1, n as isize),
            c: s(2, n as isize),
            accumulate: false,
            packed: false,
        }
    }

    /// A fresh launch list as `launches` makes it: a loop candidate on one thread, a matmul
    /// candidate unthreaded, and a loop that is no candidate.
    fn fresh(n: usize) -> Vec<Launch> {
        let loop_ = |split| Launch::Loop {
            entry: Arc::new(KernelEntry::new(nothing)),
            arg_start: 0,
            end: 8,
            chunks: AtomicU32::new(1),
            split,
            calib_ns: AtomicU64::new(u64::MAX),
            split_ns: AtomicU64::new(u64::MAX),
            skipped: false,
        };
        let matmul = Launch::Matmul {
            arg_start: 0,
            mm: Box::new(product(n)),
            copied: None,
            copy_at: 0,
            threads: AtomicBool::new(false),
            calibrate: true,
            calib_ns: AtomicU64::new(u64::MAX),
            split_ns: AtomicU64::new(u64::MAX),
            window: None,
        };
        vec![loop_(2), matmul, loop_(0)]
    }

    fn decided(launches: &[Launch]) -> (u32, bool) {
        match (&launches[0], &launches[1]) {
            (Launch::Loop { chunks, .. }, Launch::Matmul { threads, .. }) => {
                (chunks.load(Ordering::Relaxed), threads.load(Ordering::Relaxed))
            }
            _ => unreachable!("built by `fresh`"),
        }
    }

    #[test]
    fn a_binding_set_with_the_same_launches_takes_the_calibrated_decisions() {
        let costs = |work| vec![StepCost { work, splits: false }; 3];
        let decisions = Decisions::default();
        let calibrated = fresh(2304);
        assert!(!decisions.apply(&calibrated, &costs(10_000)), "nothing is remembered yet");
        if let (Launch::Loop { chunks, .. }, Launch::Matmul { threads, .. }) = (&calibrated[0], &calibrated[1]) {
            chunks.store(2, Ordering::Relaxed);
            threads.store(true, Ordering::Relaxed);
        }
        decisions.remember(&calibrated, &costs(10_000));
        // The same launches (another binding set of the same structure of work): every
        // candidate decided, the first window skipped.
        let same = fresh(2304);
        assert!(decisions.apply(&same, &costs(10_000)));
        assert_eq!(decided(&same), (2, true));
        // Another matmul: the loop takes its decision, the matmul calibrates from one thread.
        let other = fresh(3072);
        assert!(!decisions.apply(&other, &costs(10_000)));
        assert_eq!(decided(&other), (2, false));
        // More work in the loop: not the same launch.
        let more = fresh(2304);
        assert!(!decisions.apply(&more, &costs(20_000)));
        assert_eq!(decided(&more), (1, true));
    }
}

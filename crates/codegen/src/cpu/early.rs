//! Kernels compiled while the program that launches them is still being lowered: an
//! [`EarlyCompile`] takes each loop kernel as `lower`'s emission makes it and compiles it to
//! machine code on one task of rayon's pool, so that the code generator's cost (most of a small
//! program's compile) overlaps the rest of the lowering on a second core.
//!
//! Only the first of [`CpuCompiler`](super::CpuCompiler)'s two steps (emit and compile to bytes,
//! see the module docs above) runs early; linking, the cache and the counters stay with
//! [`CpuCompiler::compile_many_early`](super::CpuCompiler::compile_many_early), which takes the
//! finished codes, compiles what is left (kernels still queued: it takes them from the back of
//! the queue while the task goes on from the front) and waits for the task to stop (only for a
//! task that started, compiling or waiting for kernels: a task still queued behind other work on
//! the pool is not waited for). The task never takes the compiler's lock (the caller holds it while
//! it waits), and a kernel sent twice, or already cached when sent, is compiled at most once
//! (early: a kernel whose hash was sent before is left to the batch, which compares kernels in
//! full).
//!
//! The task starts when the early compile is made, at the start of the lowering, not at the
//! first kernel, and waits for kernels spinning, up to [`IDLE_SPIN`] without one: a pool thread
//! that sleeps takes long to wake on this virtual machine (the task of the LSTM import's first
//! kernel started 0.06 to 2.2 ms after it was sent, so that most imports compiled every kernel
//! on the lowering's thread after it), and the rewrite and fusion passes before emission hide
//! the wake-up. A caller that knows a compile may come ([`wake`]: `kiln`'s `jit` before it runs
//! the closure it traces, a realize that missed its cache) wakes a pool thread earlier still:
//! the wake-up then overlaps the tracing too.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cranelift_codegen::isa::OwnedTargetIsa;
use lower::kir::LoopKernel;
use rustc_hash::FxHashSet;

use super::native::NativeKinds;
use super::{Made, Tiling, Worker};
use crate::error::Result;

/// How long the task waits for the next kernel, spinning, before it stops (a kernel sent later
/// starts a new task): longer than a mid-sized model's lowering (LSTM's import lowers in about
/// 1 ms), so that a second core is kept busy at most that long for nothing.
pub(super) const IDLE_SPIN: Duration = Duration::from_millis(3);

/// How long [`wake`]'s task keeps a pool thread awake at most: longer than a mid-sized model's
/// tracing, rewriting and fusion before its first kernel (GRU's import: about 0.5 ms).
pub(super) const WAKE_SPIN: Duration = Duration::from_millis(2);

/// Bumped when an early compile's task is queued to the pool, or by [`settle`]: what a waker
/// spins on.
static ARRIVALS: AtomicU64 = AtomicU64::new(0);

/// Whether a waker is spinning (one at a time).
static WAKING: AtomicBool = AtomicBool::new(false);

/// Keeps one thread of rayon's pool awake, spinning, until the next early compile's task is
/// queued (which the thread then takes at once), [`settle`] says none is coming, or
/// [`WAKE_SPIN`] passes. A pool thread asleep for a while took 0.06 to 2.2 ms to start the task
/// on this virtual machine: an import after 2 ms of idling took 1.31-1.43 ms (GRU), 1.23-1.62
/// (LSTM) and 0.78-0.84 (conv-32) against 1.08-1.16, 1.15-1.21 and 0.61-0.68 with a pool thread
/// woken as its trace began (`examples/onnx_first_calls MODEL 40 idle_us=2000`, medians, three
/// alternations).
pub fn wake() {
    if WAKING.swap(true, Ordering::AcqRel) {
        return;
    }
    let seen = ARRIVALS.load(Ordering::Acquire);
    rayon::spawn(move || {
        let t0 = Instant::now();
        while ARRIVALS.load(Ordering::Acquire) == seen && t0.elapsed() < WAKE_SPIN {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
        }
        WAKING.store(false, Ordering::Release);
    });
}

/// Ends a [`wake`]: no early compile is coming (the program was found in a cache), so the pool
/// thread is free for the run.
pub fn settle() {
    ARRIVALS.fetch_add(1, Ordering::Release);
}

/// A kernel sent, with its structural hash.
pub(super) type Sent = (u64, Arc<LoopKernel>);

/// A kernel made early, with its structural hash and its code or native run (or error).
pub(super) type Compiled = (u64, Arc<LoopKernel>, Result<Made>);

/// Kernels sent for compiling ahead of the batch that needs them (see the module docs). Made by
/// [`CpuCompiler::early`](super::CpuCompiler::early); dropping it stops the task after the kernel
/// it is compiling.
pub struct EarlyCompile {
    shared: Arc<Shared>,
    /// The settings its codes are compiled with.
    tiling: Tiling,
    disasm: bool,
    native: NativeKinds,
}

/// What compiling takes, as the compiler had it when the [`EarlyCompile`] was made.
struct Setup {
    isa: OwnedTargetIsa,
    tiling: Tiling,
    disasm: bool,
    /// The kernels that run natively (no code to compile).
    native: NativeKinds,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when the task finishes a kernel or stops.
    stopped: Condvar,
    /// Bumped when a kernel is queued or the compile closes: what a waiting task polls, without
    /// taking the lock that `send` takes.
    news: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Kernels waiting for the task, with their structural hashes.
    queue: VecDeque<Sent>,
    /// The hash of every kernel sent: a kernel of a hash sent before is not queued (a repeat; a
    /// distinct kernel of the same hash, rare, is left to the batch, which tells kernels apart
    /// in full), so a repeat costs neither a copy nor a comparison.
    sent: FxHashSet<u64>,
    /// The kernel the task is compiling now.
    current: Option<Sent>,
    /// Kernels compiled, with their codes (or errors).
    done: Vec<Compiled>,
    /// Whether the task is running (queued to rayon's pool, compiling or waiting for a kernel).
    running: bool,
    /// No more kernels: the task stops after the one it is compiling.
    closed: bool,
    /// The task's worker and setup while it is not running (taken back by `finish`: a task
    /// that starts after that stops at once).
    parked: Option<(Worker, Setup)>,
    /// Wall time the task spent compiling.
    time: Duration,
}

/// What [`EarlyCompile::finish`] hands back: the codes of the kernels compiled early, the
/// worker, and the task's compile time.
pub(super) struct Finished {
    pub(super) done: Vec<Compiled>,
    pub(super) worker: Option<Worker>,
    pub(super) time: Duration,
}

impl EarlyCompile {
    /// An early compile that compiles with `worker` and these settings. Its task starts now,
    /// to be awake when the first kernel comes (see the module docs).
    pub(super) fn new(worker: Worker, isa: OwnedTargetIsa, tiling: Tiling, disasm: bool, native: NativeKinds) -> Self {
        let setup = Setup { isa, tiling, disasm, native };
        let shared = Arc::new(Shared::default());
        let mut state = lock(&shared.state);
        state.parked = Some((worker, setup));
        start(&shared, state);
        EarlyCompile { shared, tiling, disasm, native }
    }

    /// Distinct kernels sent so far (a cached one is not sent).
    pub fn sent(&self) -> usize {
        lock(&self.shared.state).sent.len()
    }

    /// Kernels compiled so far, whether to code or to an error (a copy nest or a tiled kernel,
    /// which runs natively, is not compiled).
    pub fn compiled(&self) -> usize {
        lock(&self.shared.state).done.iter().filter(|d| !matches!(d.2, Ok(Made::Native(_)))).count()
    }

    /// Whether what it makes is what a batch compiling with `tiling`, `disasm` and native `kinds`
    /// would make.
    pub(super) fn compiles_like(&self, tiling: Tiling, disasm: bool, kinds: NativeKinds) -> bool {
        self.tiling == tiling && self.disasm == disasm && self.native == kinds
    }

    /// Whether a kernel of structural hash `hash` was sent.
    pub(super) fn knows(&self, hash: u64) -> bool {
        lock(&self.shared.state).sent.contains(&hash)
    }

    /// Queues `kernel` (of structural hash `hash`) unless a kernel of its hash was sent before,
    /// starting the task if it is not running.
    pub(super) fn send(&mut self, hash: u64, kernel: &Arc<LoopKernel>) {
        let mut state = lock(&self.shared.state);
        if !state.sent.insert(hash) {
            return;
        }
        state.queue.push_back((hash, kernel.clone()));
        self.shared.news.fetch_add(1, Ordering::Release);
        if !state.running && !state.closed {
            start(&self.shared, state);
        }
    }

    /// Takes the last kernel still queued, for the caller to compile on its own thread while
    /// the task goes on from the front of the queue: what the lowering left queued is shared
    /// between both cores (LSTM's import left its three gate kernels, 660 us of compiling, to
    /// the lowering's thread alone).
    pub(super) fn steal(&mut self) -> Option<Sent> {
        let mut state = lock(&self.shared.state);
        if state.closed { None } else { state.queue.pop_back() }
    }

    /// Stops the task, which takes no more kernels (those still queued are the caller's to
    /// compile), and returns the codes compiled so far and the kernel in flight, if any, whose
    /// code [`EarlyCompile::finish`] then brings.
    pub(super) fn close(&mut self) -> (Vec<Compiled>, Option<Sent>) {
        let mut state = lock(&self.shared.state);
        close(&self.shared, &mut state);
        (std::mem::take(&mut state.done), state.current.clone())
    }

    /// Waits until a task that started has stopped (after the kernel in flight, if any; a task
    /// waiting for kernels sees the close within a spin) and parked its worker, and takes what
    /// it compiled and the worker. A task still queued to rayon's pool is not waited for (it
    /// finds the compile closed and stops at once): the caller holds the compiler's lock, which
    /// the pool's threads may be waiting for.
    pub(super) fn finish(self) -> Finished {
        let mut state = lock(&self.shared.state);
        close(&self.shared, &mut state);
        // A started task holds the worker until it stops.
        while state.running && state.parked.is_none() {
            state = self.shared.stopped.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        Finished {
            done: std::mem::take(&mut state.done),
            worker: state.parked.take().map(|(w, _)| w),
            time: state.time,
        }
    }
}

impl Drop for EarlyCompile {
    fn drop(&mut self) {
        close(&self.shared, &mut lock(&self.shared.state));
    }
}

/// Closes the compile: the task takes no more kernels, and a waiting one stops.
fn close(shared: &Shared, state: &mut State) {
    state.closed = true;
    state.queue.clear();
    shared.news.fetch_add(1, Ordering::Release);
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Marks the task running in `state` and queues it to rayon's pool.
fn start(shared: &Arc<Shared>, mut state: MutexGuard<'_, State>) {
    state.running = true;
    drop(state);
    let task = shared.clone();
    rayon::spawn(move || run(&task));
    // Queued: a waker's thread leaves its spin and takes the task.
    ARRIVALS.fetch_add(1, Ordering::Release);
}

/// Marks the task stopped in `state` and wakes [`EarlyCompile::finish`].
fn stop(shared: &Shared, mut state: MutexGuard<'_, State>) {
    state.running = false;
    state.current = None;
    drop(state);
    shared.stopped.notify_all();
}

/// The task: compiles queued kernels, waiting for the next one up to [`IDLE_SPIN`], until the
/// compile is closed or that wait runs out, then parks its worker and stops in the same critical
/// section (a kernel sent after that starts a new task). A panic outside the worker's own
/// `catch_unwind` is not expected; should one happen, the guard still marks the task stopped (no
/// kernel in flight), and the caller compiles that kernel.
fn run(shared: &Shared) {
    struct Unwinding<'a>(Option<&'a Shared>);
    impl Drop for Unwinding<'_> {
        fn drop(&mut self) {
            if let Some(shared) = self.0 {
                stop(shared, lock(&shared.state));
            }
        }
    }
    let mut guard = Unwinding(Some(shared));
    let Some((mut worker, setup)) = lock(&shared.state).parked.take() else {
        return;
    };
    let mut idle_since = Instant::now();
    loop {
        let (hash, kernel) = {
            let mut state = lock(&shared.state);
            let next = if state.closed { None } else { state.queue.pop_front() };
            match next {
                Some(job) => {
                    state.current = Some(job.clone());
                    job
                }
                None if state.closed || idle_since.elapsed() >= IDLE_SPIN => {
                    state.parked = Some((worker, setup));
                    guard.0 = None;
                    stop(shared, state);
                    return;
                }
                None => {
                    // Nothing queued: wait for news spinning, awake (see the module docs). A
                    // kernel queued or a close after this point changes `news`.
                    let seen = shared.news.load(Ordering::Acquire);
                    drop(state);
                    while shared.news.load(Ordering::Acquire) == seen && idle_since.elapsed() < IDLE_SPIN {
                        for _ in 0..64 {
                            std::hint::spin_loop();
                        }
                    }
                    continue;
                }
            }
        };
        let t0 = Instant::now();
        // A copy nest or a tiled kernel runs natively: its plan, and nothing to compile.
        let made = worker.make(&*setup.isa, &kernel, setup.disasm, setup.tiling, setup.native);
        let mut state = lock(&shared.state);
        state.time += t0.elapsed();
        state.current = None;
        state.done.push((hash, kernel, made));
        drop(state);
        shared.stopped.notify_all();
        idle_since = Instant::now();
    }
}

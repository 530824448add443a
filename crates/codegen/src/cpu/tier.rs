//! The tiered JIT: kernels first compile quickly, and a background thread recompiles them with
//! Cranelift's optimisations and swaps the faster code in, behind each kernel's [`KernelEntry`].
//!
//! Why: Cranelift's optimising compile is most of a small program's compile time (26 kernels of a
//! 2-layer Transformer: 5-6.5 ms of codegen on two threads, 180-520 us each), but a program
//! that runs once, or runs on tiny shapes, never earns it back. [`jit::Tier::Quick`] compiles
//! about 40% faster; its code runs up to 2x slower on index-heavy kernels (pools, stencils) and
//! the same on plain element-wise ones. Under [`JitMode::Tiered`] (the default) a program starts
//! on quick code; when it runs a second time (the runtime calls [`KernelEntry::request_tier_up`])
//! its kernels go to the background thread, and it reaches optimised code a few milliseconds of
//! idle CPU later, never waiting for it. A program that runs once never pays for optimised code.
//!
//! The background thread runs at the lowest scheduling priority (`SCHED_IDLE` on Linux), so it takes
//! the CPU that runs and compiles leave idle rather than competing with them; it links into its
//! own arenas (no lock shared with the foreground compiler but the job queue), holds each job's
//! kernel only weakly (a kernel dropped before its turn is skipped), and leaves the quick code in
//! place when the optimising compile fails. A swap is one atomic store: a call already running
//! finishes on the quick code, which stays alive as long as the kernel does; the two tiers compute
//! the same results (Cranelift never reassociates floating-point arithmetic).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, LazyLock, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use lower::kir::LoopKernel;

use super::copy::CopyNest;
use super::jit::{self, Linker, Tier};
use super::native::Native;
use super::{CompiledKernel, KernelFn, Tiling, Worker};

/// Environment variable that picks the [`JitMode`]: `tiered`, `quick` or `optimized`.
pub const JIT_ENV: &str = "KILN_JIT";

/// Which code a [`CpuCompiler`](super::CpuCompiler) produces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum JitMode {
    /// Quick code now, optimised code swapped in by a background thread (the default).
    #[default]
    Tiered,
    /// Quick code only: the least compile time, for programs that run once.
    Quick,
    /// Optimised code only, compiled before the kernel is returned: what every kernel ran before
    /// the JIT had tiers, and the steady-state code to measure without waiting for a tier-up.
    Optimized,
}

impl JitMode {
    /// The mode `KILN_JIT` names, else [`JitMode::Tiered`] (an unknown value included).
    pub fn from_env() -> JitMode {
        match std::env::var(JIT_ENV).as_deref().map(str::trim) {
            Ok("quick") => JitMode::Quick,
            Ok("optimized") => JitMode::Optimized,
            _ => JitMode::Tiered,
        }
    }

    /// The tier a kernel is first compiled at.
    pub(crate) fn first_tier(self) -> Tier {
        match self {
            JitMode::Tiered | JitMode::Quick => Tier::Quick,
            JitMode::Optimized => Tier::Optimized,
        }
    }
}

/// The current entry point of a kernel: read at every launch, replaced once when the optimised
/// code is linked. Runners keep an `Arc` of it rather than a copy of the pointer, so a swap
/// reaches every program that uses the kernel.
pub struct KernelEntry {
    /// The code's entry point; null while a native copy (`native`) has no code yet.
    func: AtomicPtr<u8>,
    /// A copy nest or a tiled kernel run natively until optimised code is swapped in (see
    /// `native`): the quick tier of such a kernel, with no compile at all.
    native: Option<Box<Native>>,
    swapped: AtomicBool,
    /// The job [`KernelEntry::request_tier_up`] sends, until it does.
    pending: Mutex<Option<Job>>,
}

impl std::fmt::Debug for KernelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelEntry").field("swapped", &self.is_swapped()).finish_non_exhaustive()
    }
}

/// Entries swapped so far in the process, any kernel's.
static SWAPS: AtomicU64 = AtomicU64::new(0);

/// Jobs sent to the background thread and not finished yet (see [`tier_up_pending`]).
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Whether the background thread has kernels to compile: one relaxed load, for the runtime's
/// spinning helpers to leave the core to it. The thread runs at idle priority, so a helper that
/// spins between the splits of a loop of runs (each spin outlasting the gap to the next run)
/// kept it off the second of two cores for good: a predict loop of MobileNet never reached
/// optimised code (0.099 against 0.081 ms per predict after 40,000 predicts, `perf`).
pub fn tier_up_pending() -> bool {
    PENDING.load(Ordering::Relaxed) > 0
}

/// How many kernel entries the process has swapped to optimised code so far: one relaxed load,
/// for a runner to notice cheaply that some code changed (then [`KernelEntry::is_swapped`] says
/// whether its own did) and time its launches again.
pub fn tier_ups_so_far() -> u64 {
    SWAPS.load(Ordering::Relaxed)
}

impl KernelEntry {
    /// An entry that starts at `func`.
    pub fn new(func: KernelFn) -> KernelEntry {
        KernelEntry {
            func: AtomicPtr::new(func as *mut u8),
            native: None,
            swapped: AtomicBool::new(false),
            pending: Mutex::new(None),
        }
    }

    /// An entry that runs `plan` natively.
    pub(crate) fn native(plan: Box<Native>) -> KernelEntry {
        KernelEntry {
            func: AtomicPtr::new(std::ptr::null_mut()),
            native: Some(plan),
            swapped: AtomicBool::new(false),
            pending: Mutex::new(None),
        }
    }

    /// The function to call now; `None` for a copy run natively until its optimised code is
    /// swapped in (call [`invoke`](Self::invoke), which runs either).
    #[inline]
    pub fn get(&self) -> Option<KernelFn> {
        let ptr = self.func.load(Ordering::Acquire);
        // SAFETY: only `new` and `swap_in` store here, each a `KernelFn` (as a pointer); the
        // acquire load pairs with their release, so the code bytes are visible. `native` stores
        // null, which is never transmuted.
        (!ptr.is_null()).then(|| unsafe { std::mem::transmute::<*mut u8, KernelFn>(ptr) })
    }

    /// The kernel's copy nest for the symbols `syms`, where it is an unmasked copy nest
    /// (`copy::CopyPlan`), whichever tier runs it: what the runtime needs to read the copy's
    /// source in place, skipping the copy (an im2col read by a product).
    pub fn copy_nest(&self, syms: &[i64]) -> Option<CopyNest> {
        match self.native.as_deref() {
            Some(Native::Copy(p)) => p.nest(syms),
            _ => None,
        }
    }

    /// Whether the kernel runs natively for good: its native run beats optimised code, so it is
    /// never tiered up (`Native::stays`).
    pub(crate) fn stays_native(&self) -> bool {
        self.native.as_ref().is_some_and(|n| n.stays())
    }

    /// Whether the kernel runs natively now (a copy nest, see `copy`), with no code of its own
    /// (yet: under [`JitMode::Tiered`] its optimised code replaces it once the program runs
    /// again).
    pub fn is_native(&self) -> bool {
        self.native.is_some() && self.func.load(Ordering::Acquire).is_null()
    }

    /// Runs the kernel: its current code, or its native copy.
    ///
    /// # Safety
    /// As for calling the kernel's code: `bufs` holds one pointer per parameter, each buffer
    /// large enough for every index the kernel touches for these symbols and this range; `syms`
    /// holds every symbol it reads; nothing else touches what it writes meanwhile.
    #[inline]
    pub unsafe fn invoke(&self, bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
        let ptr = self.func.load(Ordering::Acquire);
        match &self.native {
            // SAFETY: forwarded to the caller.
            Some(plan) if ptr.is_null() => unsafe { plan.run(bufs, syms, start, end) },
            // SAFETY: as in `get` (an entry without a native plan always has code); the call's
            // contract is the caller's.
            _ => unsafe { std::mem::transmute::<*mut u8, KernelFn>(ptr)(bufs, syms, start, end) },
        }
    }

    /// Whether the entry has moved to other (optimised) code since it was made.
    pub fn is_swapped(&self) -> bool {
        self.swapped.load(Ordering::Relaxed)
    }

    /// Sends the kernel to the background thread for optimised code, if its compiler armed it
    /// ([`JitMode::Tiered`]) and no one asked before; a no-op otherwise. Runners call it when a
    /// program runs a second time: a program that runs once never pays for optimised code, and
    /// the thread stays off the cores while programs are being compiled.
    pub fn request_tier_up(&self) {
        let job = self.pending.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(job) = job {
            dispatch(job);
        }
    }

    /// Keeps `job` for [`KernelEntry::request_tier_up`].
    pub(crate) fn arm(&self, job: Job) {
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(job);
    }

    /// Points the entry at `func`.
    pub(crate) fn swap_in(&self, func: KernelFn) {
        self.func.store(func as *mut u8, Ordering::Release);
        self.swapped.store(true, Ordering::Relaxed);
        SWAPS.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the background thread has done for one compiler (or for all: [`wait_tier_up_all`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Progress {
    /// Jobs sent.
    pub(crate) queued: u64,
    /// Jobs finished, whatever their outcome.
    pub(crate) finished: u64,
    /// Kernels now running optimised code.
    pub(crate) optimized: u64,
    /// Optimising compiles that failed (the kernel keeps its quick code).
    pub(crate) failed: u64,
    /// Wall-clock time the thread spent compiling and linking.
    pub(crate) time: Duration,
}

#[derive(Default)]
struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
}

impl Shared {
    /// Applies `f` to this record.
    fn apply(&self, f: impl Fn(&mut Progress)) {
        f(&mut self.progress.lock().unwrap_or_else(|p| p.into_inner()));
        self.changed.notify_all();
    }

    /// Applies `f` to this record and to the process's.
    fn update(&self, f: impl Fn(&mut Progress)) {
        self.apply(&f);
        ALL.apply(f);
    }

    /// Blocks until every job counted here has finished (a job lost with the thread counts as
    /// finished when it drops: see `Job`'s `Drop`).
    fn wait(&self) {
        let mut p = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        while p.finished < p.queued {
            p = self.changed.wait(p).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Every job of the process.
static ALL: LazyLock<Shared> = LazyLock::new(Shared::default);

/// Blocks until every kernel that any compiler of the process sent to the background thread so
/// far runs optimised code, or its optimising compile failed. For measuring steady-state speed:
/// programs never need to wait.
pub fn wait_tier_up_all() {
    ALL.wait();
}

/// One kernel to recompile, and the progress of the compiler that sent it. A job once sent
/// counts as finished when it drops, whatever became of it (done, skipped, or lost with a
/// thread that panicked or could not start), with the outcome the thread recorded.
pub(crate) struct Job {
    pub(crate) kernel: Arc<LoopKernel>,
    pub(crate) target: Weak<CompiledKernel>,
    pub(crate) tiling: Tiling,
    pub(crate) disasm: bool,
    progress: Arc<Shared>,
    sent: bool,
    /// Set by the thread: whether the optimised code was swapped in, and its share of the
    /// batch's time.
    outcome: Option<bool>,
    time: Duration,
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.sent {
            PENDING.fetch_sub(1, Ordering::Relaxed);
            let (outcome, time) = (self.outcome, self.time);
            self.progress.update(|p| {
                p.finished += 1;
                p.optimized += u64::from(outcome == Some(true));
                p.failed += u64::from(outcome == Some(false));
                p.time += time;
            });
        }
    }
}

/// The process's one background thread, started with the first job: its queue, or why it
/// could not start.
static QUEUE: OnceLock<std::result::Result<Sender<Job>, String>> = OnceLock::new();

/// A compiler's handle on the background thread: its own progress (the thread itself is shared
/// by every compiler of the process, so that a compiler costs no thread start). Clones share
/// the progress, so one can wait without the compiler's lock.
#[derive(Clone, Default)]
pub(crate) struct TierUp {
    shared: Arc<Shared>,
}

impl TierUp {
    /// Blocks until every job the compiler sent has finished.
    pub(crate) fn wait(&self) {
        self.shared.wait();
    }

    /// Arms `target`'s entry with the job of recompiling `kernel`, sent when a runner asks
    /// ([`KernelEntry::request_tier_up`]).
    pub(crate) fn arm(&self, kernel: &Arc<LoopKernel>, target: &Arc<CompiledKernel>, tiling: Tiling, disasm: bool) {
        target.entry().arm(Job {
            kernel: kernel.clone(),
            target: Arc::downgrade(target),
            tiling,
            disasm,
            progress: self.shared.clone(),
            sent: false,
            outcome: None,
            time: Duration::ZERO,
        });
    }

    pub(crate) fn progress(&self) -> Progress {
        *self.shared.progress.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Queues `job` for the background thread (starting it if this is the process's first job).
/// Where the thread cannot start or has stopped, the job drops here and the kernel keeps its
/// quick code.
fn dispatch(mut job: Job) {
    let queue = QUEUE.get_or_init(|| {
        let (jobs, queue) = channel();
        std::thread::Builder::new()
            .name("kiln-tier-up".into())
            .spawn(move || run(queue))
            .map(|_| jobs)
            .map_err(|e| format!("starting the tier-up thread: {e}"))
    });
    job.progress.update(|p| p.queued += 1);
    PENDING.fetch_add(1, Ordering::Relaxed);
    job.sent = true;
    match queue {
        // A failed send hands the job back, and it drops (finished) with the error.
        Ok(jobs) => drop(jobs.send(job)),
        Err(e) => log::debug!("kernels keep their quick code: {e}"),
    }
}

/// Gives the calling thread the lowest scheduling priority, where the OS has one per thread:
/// on Linux `SCHED_IDLE`, under which it runs only on a core nothing else wants and gives the core
/// up as soon as another thread wakes there (a `nice` 19 thread still takes its slices).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a plain system call on the calling thread (pid 0), with a valid parameter.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if rc != 0 {
            log::debug!("tier-up thread keeps its priority: {}", std::io::Error::last_os_error());
        }
    }
}

/// The thread: takes every job queued, compiles and links them as one batch, swaps each kernel's
/// entry, and repeats.
fn run(queue: Receiver<Job>) {
    lower_priority();
    let isa = match jit::host_isa(Tier::Optimized) {
        Ok(isa) => isa,
        Err(e) => {
            log::warn!("no optimised tier: {e}");
            return;
        }
    };
    let mut worker = Worker::new();
    let mut linker = Linker::new(isa.clone());
    while let Ok(first) = queue.recv() {
        let t0 = Instant::now();
        let mut jobs: Vec<(Job, Option<Arc<CompiledKernel>>)> = std::iter::once(first)
            .chain(queue.try_iter())
            .map(|j| {
                let k = j.target.upgrade();
                (j, k)
            })
            .collect();
        let codes = jobs
            .iter()
            .filter_map(|(j, k)| k.as_ref().map(|_| worker.compile(&*isa, &j.kernel, j.disasm, j.tiling)))
            .collect();
        let mut linked = linker.link(codes).into_iter();
        let time = t0.elapsed() / jobs.len() as u32;
        for (job, kernel) in &mut jobs {
            job.time = time;
            job.outcome = kernel.as_ref().map(|k| match linked.next() {
                Some(Ok((ptr, arena))) => {
                    // SAFETY: `ptr` is the entry of a function just linked (and finalized) with
                    // `kernel_signature`, compiled from the same kernel as the quick code.
                    let func = unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) };
                    k.swap_in(func, arena);
                    true
                }
                Some(Err(e)) => {
                    log::warn!("optimising a kernel failed, it keeps its quick code: {e}");
                    false
                }
                None => false,
            });
        }
        // The jobs count as finished, and the kernels may be dropped by their last holder,
        // here: after the swap, never during.
        drop(jobs);
    }
}

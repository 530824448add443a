//! Compile-time profiling: named spans (wall time, heap allocations, graph sizes) recorded on the
//! calling thread, gathered into a [`Report`] that prints as a table and writes a Chrome trace.
//!
//! Profiling a realize: the tracer, every compiler pass, code generation, the memory plan and the
//! run report their spans, so the report covers any graph a program builds.
//!
//! ```
//! use kiln::{Tensor, profile};
//!
//! let (total, report) = profile::profile(|| {
//!     let x = profile::span("build", || Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]));
//!     (x.exp() + 1.0).softmax(1).sum_all().item::<f32>()
//! });
//! assert!((total.unwrap() - 2.0).abs() < 1e-5);
//! let passes: Vec<String> = report.passes().into_iter().map(|row| row.name).collect();
//! assert!(passes.iter().any(|p| p == "trace"));
//! assert!(passes.iter().any(|p| p == "first-run" || p == "run"));
//! // On the CPU device (the default) also: graph-key, verify, optimize, decide-fusion,
//! // emit-kernels, codegen, prepare, memory-plan; a second realize of the same structure shows
//! // cache-hit instead of the compiler's passes.
//! println!("{report}"); // one table, sorted by time, then the totals
//! let trace = report.chrome_trace(); // opens in Perfetto or chrome://tracing
//! assert!(trace.starts_with("{\"traceEvents\":["));
//! ```
//!
//! Why spans on a thread-local recorder: the code being profiled (the tracer, the compiler passes,
//! code generation, the first run) lives in several crates that know nothing of each other; each
//! marks its work with [`begin`]/[`end`] (or [`span`]) and pays one thread-local read when no
//! profile is active. The runtime does not depend on this crate: its CPU device reports its steps
//! through `runtime::CompileObserver`, which [`crate::backend::execute`] forwards here when a
//! profile is active. Spans nest; the per-pass table aggregates them by name. The pipeline's own
//! spans are typed ([`Step`], wrapping the device's `runtime::Step`), and only they count towards
//! a [`Phase`]; a span named by a string is the caller's own and counts towards none.
//!
//! Bytes allocated come from [`CountingAlloc`], a global allocator that counts every allocation.
//! A program opts in with
//! `#[global_allocator] static ALLOC: kiln::profile::CountingAlloc = kiln::profile::CountingAlloc::SYSTEM;`
//! or counts over an allocator of its own with [`CountingAlloc::over`] (the `kiln` command
//! counts over mimalloc); without it the allocation columns read `-`.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::fmt::{self, Write as _};
use std::time::{Duration, Instant};

use lower::Pass;

// ---------------------------------------------------------------------------------------------
// Counting allocator

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Process-wide counts live in per-thread slots, each written by its one thread with plain
/// (unlocked) stores and summed by readers: two shared `fetch_add`s per allocation had cost 4-7%
/// of a compilation (`kiln bench transformer-compile`, depth 2 and 8), more where two threads
/// generate code and bounce the counters' cache line between them.
const SLOTS: usize = 256;

/// One thread's counts, on a cache line of its own.
#[repr(align(64))]
struct Slot {
    allocs: AtomicU64,
    bytes: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // a template for the array below only
const EMPTY_SLOT: Slot = Slot { allocs: AtomicU64::new(0), bytes: AtomicU64::new(0) };
static SLOT_COUNTS: [Slot; SLOTS] = [EMPTY_SLOT; SLOTS];
/// Slots handed out so far (never reused: a finished thread's counts stay in its slot).
static SLOTS_TAKEN: AtomicUsize = AtomicUsize::new(0);
/// Threads past the first `SLOTS` share this slot, through atomic additions.
static SHARED: Slot = EMPTY_SLOT;

thread_local! {
    // `const`-initialised and without `Drop`: reading it never allocates or registers a
    // destructor, so the allocator may touch it.
    static THREAD_COUNTS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// This thread's slot in `SLOT_COUNTS` plus one (0: not taken yet; `SLOTS + 1`: shared).
    static THREAD_SLOT: Cell<usize> = const { Cell::new(0) };
}

/// A global allocator that counts allocations and bytes, process-wide and per thread, and
/// leaves the allocating to an inner allocator (the system's: [`CountingAlloc::SYSTEM`]). Install
/// it in a binary or test with `#[global_allocator]`.
pub struct CountingAlloc<A = System>(A);

impl CountingAlloc {
    /// Counting over the system's allocator.
    pub const SYSTEM: CountingAlloc = CountingAlloc(System);
}

impl<A: GlobalAlloc> CountingAlloc<A> {
    /// Counting over `inner`.
    pub const fn over(inner: A) -> CountingAlloc<A> {
        CountingAlloc(inner)
    }
}

#[inline]
fn count(bytes: usize) {
    let _ = THREAD_COUNTS.try_with(|c| {
        let (n, b) = c.get();
        c.set((n + 1, b + bytes as u64));
    });
    let slot = THREAD_SLOT.try_with(|s| {
        if s.get() == 0 {
            let taken = SLOTS_TAKEN.fetch_add(1, Ordering::Relaxed);
            s.set(if taken < SLOTS { taken + 1 } else { SLOTS + 1 });
        }
        s.get()
    });
    match slot {
        Ok(i @ 1..=SLOTS) => {
            // Only this thread writes its slot, so a load and a store add without a lock.
            let slot = &SLOT_COUNTS[i - 1];
            slot.allocs.store(slot.allocs.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            slot.bytes.store(slot.bytes.load(Ordering::Relaxed) + bytes as u64, Ordering::Relaxed);
        }
        _ => {
            SHARED.allocs.fetch_add(1, Ordering::Relaxed);
            SHARED.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        }
    }
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to the inner allocator unchanged; the counting touches only
// atomics and a const thread-local `Cell`, neither of which allocates.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded from the caller.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded from the caller.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Every realloc counts as one allocation, of the bytes it adds.
        count(new_size.saturating_sub(layout.size()));
        // SAFETY: forwarded from the caller.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

/// Allocations and bytes allocated so far (never decreases; frees are not subtracted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocCounts {
    pub allocs: u64,
    pub bytes: u64,
}

impl AllocCounts {
    /// The counts from `earlier` to `self`.
    pub fn since(self, earlier: AllocCounts) -> AllocCounts {
        AllocCounts { allocs: self.allocs - earlier.allocs, bytes: self.bytes - earlier.bytes }
    }
}

/// Process-wide counts (every thread) from [`CountingAlloc`]; zero when it is not installed.
pub fn alloc_counts() -> AllocCounts {
    let taken = SLOTS_TAKEN.load(Ordering::Relaxed).min(SLOTS);
    SLOT_COUNTS[..taken].iter().chain([&SHARED]).fold(AllocCounts::default(), |sum, s| AllocCounts {
        allocs: sum.allocs + s.allocs.load(Ordering::Relaxed),
        bytes: sum.bytes + s.bytes.load(Ordering::Relaxed),
    })
}

/// The calling thread's counts from [`CountingAlloc`]: deterministic for single-threaded work,
/// whatever other threads do meanwhile.
pub fn thread_alloc_counts() -> AllocCounts {
    let (allocs, bytes) = THREAD_COUNTS.with(Cell::get);
    AllocCounts { allocs, bytes }
}

/// Whether [`CountingAlloc`] is this program's global allocator (it has counted something).
pub fn counting_installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------------------------
// Spans

/// The stage of the pipeline a span belongs to, for the totals line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Recording the lazy DAG, tracing it into an air graph and hashing its structure (making
    /// the model's weights is not part of it).
    GraphBuild,
    /// Verification and graph rewrites (rules, CSE, DCE).
    Rewrite,
    /// Fusion decisions, kernel emission, ordering.
    Schedule,
    /// Buffer sizes, lifetimes and the arena layout.
    MemoryPlan,
    /// Kernel IR to native code.
    Codegen,
    /// Preparing the executable and the first run.
    FirstRun,
}

impl Phase {
    /// Every phase, in pipeline order.
    pub const ALL: [Phase; 6] =
        [Phase::GraphBuild, Phase::Rewrite, Phase::Schedule, Phase::MemoryPlan, Phase::Codegen, Phase::FirstRun];

    /// The name printed in the totals.
    pub fn name(self) -> &'static str {
        match self {
            Phase::GraphBuild => "graph build",
            Phase::Rewrite => "rewrite",
            Phase::Schedule => "schedule",
            Phase::MemoryPlan => "memory plan",
            Phase::Codegen => "codegen",
            Phase::FirstRun => "first run",
        }
    }

    /// The phase of a pipeline step. Spans named by a string (a user's own) have none.
    pub fn of(step: Step) -> Phase {
        use runtime::Step as Device;
        match step {
            Step::Forward | Step::Trace | Step::Device(Device::GraphKey | Device::CacheHit) => Phase::GraphBuild,
            Step::Device(Device::Lower(Pass::Verify | Pass::Optimize | Pass::Saturate)) => Phase::Rewrite,
            Step::Device(Device::Lower(Pass::DecideFusion | Pass::EmitKernels)) => Phase::Schedule,
            Step::Device(Device::MemoryPlan) => Phase::MemoryPlan,
            Step::DeviceInit | Step::Device(Device::Codegen) => Phase::Codegen,
            Step::Device(Device::Prepare) | Step::FirstRun | Step::Run => Phase::FirstRun,
        }
    }
}

/// A step of the pipeline that the facade, a device or the `kiln` command marks with a span:
/// typed, so that the phase a span counts towards never depends on its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Recording a model's forward pass as a lazy DAG (`forward`).
    Forward,
    /// Tracing lazy tensors into one air graph (`trace`).
    Trace,
    /// Making a fresh device and its code generator (`codegen-init`).
    DeviceInit,
    /// A step of the CPU device's compile, or the memory plan (`graph-key`, `verify`, ...).
    Device(runtime::Step),
    /// The first run of a program just compiled (`first-run`).
    FirstRun,
    /// A run of a program found in the cache, or on a device without compile steps (`run`).
    Run,
}

impl Step {
    /// The step's name, for display (the span's name).
    pub fn name(self) -> &'static str {
        match self {
            Step::Forward => "forward",
            Step::Trace => "trace",
            Step::DeviceInit => "codegen-init",
            Step::Device(step) => step.name(),
            Step::FirstRun => "first-run",
            Step::Run => "run",
        }
    }
}

impl From<runtime::Step> for Step {
    fn from(step: runtime::Step) -> Step {
        Step::Device(step)
    }
}

/// What names a span: a typed pipeline [`Step`] (whose phase [`Phase::of`] gives), or a string
/// of the caller's own, which counts towards no phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpanName {
    /// A step of the pipeline.
    Step(Step),
    /// Anything else (a user's span: `span("build", ..)`).
    Other(Cow<'static, str>),
}

impl SpanName {
    fn into_parts(self) -> (Cow<'static, str>, Option<Phase>) {
        match self {
            SpanName::Step(step) => (Cow::Borrowed(step.name()), Some(Phase::of(step))),
            SpanName::Other(name) => (name, None),
        }
    }
}

impl From<Step> for SpanName {
    fn from(step: Step) -> SpanName {
        SpanName::Step(step)
    }
}

impl From<runtime::Step> for SpanName {
    fn from(step: runtime::Step) -> SpanName {
        SpanName::Step(Step::Device(step))
    }
}

impl From<&'static str> for SpanName {
    fn from(name: &'static str) -> SpanName {
        SpanName::Other(Cow::Borrowed(name))
    }
}

impl From<String> for SpanName {
    fn from(name: String) -> SpanName {
        SpanName::Other(Cow::Owned(name))
    }
}

impl From<Cow<'static, str>> for SpanName {
    fn from(name: Cow<'static, str>) -> SpanName {
        SpanName::Other(name)
    }
}

/// One finished span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: Cow<'static, str>,
    pub phase: Option<Phase>,
    /// When it began, from the start of the profile.
    pub start: Duration,
    pub duration: Duration,
    /// Allocations made during the span by every thread (nested spans included).
    pub alloc: AllocCounts,
    /// Units of compile work counted on this thread during the span (nested spans included;
    /// see `air::work`).
    pub work: u64,
    /// Graph nodes before and after, when the span is a graph pass.
    pub nodes_in: Option<usize>,
    pub nodes_out: Option<usize>,
    /// Index of the enclosing span in [`Report::spans`], if any.
    pub parent: Option<usize>,
    /// Nesting depth (0 for a span directly under the profile).
    pub depth: u32,
}

struct Open {
    name: Cow<'static, str>,
    phase: Option<Phase>,
    start: Instant,
    alloc: AllocCounts,
    work: u64,
    nodes_in: Option<usize>,
    /// Index reserved for this span in `Recorder::spans` (filled in at `end`).
    slot: usize,
}

struct Recorder {
    t0: Instant,
    alloc0: AllocCounts,
    spans: Vec<Option<Span>>,
    open: Vec<Open>,
    memory: Option<MemoryStats>,
    counters: Vec<(Cow<'static, str>, u64)>,
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// Whether a profile is being recorded on this thread.
pub fn is_active() -> bool {
    ACTIVE.with(Cell::get)
}

fn with_recorder(f: impl FnOnce(&mut Recorder)) {
    if !is_active() {
        return;
    }
    RECORDER.with(|r| {
        if let Some(rec) = r.borrow_mut().as_mut() {
            f(rec);
        }
    });
}

/// Opens a span named `name`: a pipeline [`Step`] (its phase from [`Phase::of`]) or a string
/// (no phase); `nodes` is the graph size before it, if it is a graph pass. Spans close in LIFO
/// order with [`end`]. Does nothing outside a profile.
pub fn begin(name: impl Into<SpanName>, nodes: Option<usize>) {
    if !is_active() {
        return;
    }
    let (name, phase) = name.into().into_parts();
    begin_in(name, phase, nodes);
}

/// [`begin`] with an explicit phase (`None`: not counted in any phase total).
pub fn begin_in(name: impl Into<Cow<'static, str>>, phase: Option<Phase>, nodes: Option<usize>) {
    with_recorder(|rec| {
        let slot = rec.spans.len();
        rec.spans.push(None);
        rec.open.push(Open {
            name: name.into(),
            phase,
            start: Instant::now(),
            alloc: alloc_counts(),
            work: air::work::total(),
            nodes_in: nodes,
            slot,
        });
    });
}

/// Closes the innermost open span; `nodes` is the graph size after it.
pub fn end(nodes: Option<usize>) {
    let now = Instant::now();
    let alloc = alloc_counts();
    let work = air::work::total();
    with_recorder(|rec| {
        let Some(open) = rec.open.pop() else { return };
        let parent = rec.open.last().map(|o| o.slot);
        rec.spans[open.slot] = Some(Span {
            name: open.name,
            phase: open.phase,
            start: open.start.duration_since(rec.t0),
            duration: now.duration_since(open.start),
            alloc: alloc.since(open.alloc),
            work: work.wrapping_sub(open.work),
            nodes_in: open.nodes_in,
            nodes_out: nodes,
            parent,
            depth: rec.open.len() as u32,
        });
    });
}

/// Runs `f` inside a span named `name` (a [`Step`] or a string, as for [`begin`]).
pub fn span<T>(name: impl Into<SpanName>, f: impl FnOnce() -> T) -> T {
    begin(name, None);
    let out = f();
    end(None);
    out
}

/// Records what the memory planner decided for the profiled program (the last call wins).
pub fn set_memory(memory: MemoryStats) {
    with_recorder(|rec| rec.memory = Some(memory));
}

/// Adds `value` to a named counter of the profile (kernels compiled, rewrite visits, ...).
pub fn add_counter(name: impl Into<Cow<'static, str>>, value: u64) {
    with_recorder(|rec| {
        let name = name.into();
        match rec.counters.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v += value,
            None => rec.counters.push((name, value)),
        }
    });
}

/// Forwards the CPU device's compile steps (see [`runtime::CpuDevice::compile_observed`]) to
/// profiling spans, phases as [`Phase::of`] gives them, and its counters to
/// [`add_counter`]; notes whether the program came from the device's cache.
///
/// What [`crate::backend::execute`] uses inside a profile; a tool that drives a device itself
/// passes one to `compile_observed` to get the same spans.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProfileObserver {
    cache_hit: bool,
}

impl ProfileObserver {
    /// Whether the observed compilation was answered from the program cache (a `cache-hit` step).
    pub fn cache_hit(&self) -> bool {
        self.cache_hit
    }
}

impl runtime::CompileObserver for ProfileObserver {
    fn begin(&mut self, step: runtime::Step, nodes: Option<usize>) {
        self.cache_hit |= step == runtime::Step::CacheHit;
        begin(step, nodes);
    }

    fn end(&mut self, _step: runtime::Step, nodes: Option<usize>) {
        end(nodes);
    }

    fn counter(&mut self, name: &'static str, value: u64) {
        add_counter(name, value);
    }
}

/// Records everything [`begin`]/[`end`]/[`span`] mark while `f` runs on this thread. Spans `f`
/// leaves open are closed at its end. A profile inside a profile records on its own; the outer
/// one resumes after it.
pub fn profile<T>(f: impl FnOnce() -> T) -> (T, Report) {
    let fresh = Recorder {
        t0: Instant::now(),
        alloc0: AllocCounts::default(),
        spans: Vec::with_capacity(16),
        open: Vec::with_capacity(4),
        memory: None,
        counters: Vec::new(),
    };
    let outer = RECORDER.with(|r| r.borrow_mut().replace(fresh));
    let was_active = ACTIVE.with(|a| a.replace(true));
    // The counts and the clock start last, so that the recorder's own setup is not counted as
    // the profiled work's (a decoding step's host time is a few tens of microseconds).
    RECORDER.with(|r| {
        if let Some(rec) = r.borrow_mut().as_mut() {
            rec.alloc0 = alloc_counts();
            rec.t0 = Instant::now();
        }
    });
    let out = f();
    while RECORDER.with(|r| r.borrow().as_ref().is_some_and(|rec| !rec.open.is_empty())) {
        end(None);
    }
    let total = Instant::now();
    let rec = RECORDER.with(|r| std::mem::replace(&mut *r.borrow_mut(), outer));
    ACTIVE.with(|a| a.set(was_active));
    let report = match rec {
        Some(rec) => Report {
            total: total.duration_since(rec.t0),
            alloc: alloc_counts().since(rec.alloc0),
            spans: rec.spans.into_iter().flatten().collect(),
            memory: rec.memory,
            counters: rec.counters.into_iter().map(|(n, v)| (n.into_owned(), v)).collect(),
            alloc_counted: counting_installed(),
        },
        None => Report::default(),
    };
    (out, report)
}

// ---------------------------------------------------------------------------------------------
// The report

/// The memory the planner laid out for one run (the runtime's one memory-stats type).
pub use runtime::MemoryStats;

/// Everything one [`profile`] recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Every span in the order they began.
    pub spans: Vec<Span>,
    /// Wall time of the whole profile.
    pub total: Duration,
    /// Allocations of the whole profile (every thread).
    pub alloc: AllocCounts,
    pub memory: Option<MemoryStats>,
    /// Named counters in the order first added.
    pub counters: Vec<(String, u64)>,
    /// Whether [`CountingAlloc`] was installed (else the allocation numbers are all zero).
    pub alloc_counted: bool,
}

/// One row of the per-pass table: every span of one name.
#[derive(Clone, Debug, PartialEq)]
pub struct PassRow {
    pub name: String,
    pub phase: Option<Phase>,
    pub time: Duration,
    pub calls: u64,
    pub alloc: AllocCounts,
    /// Units of compile work (see [`Span::work`]), summed over the calls.
    pub work: u64,
    /// Graph nodes before the first call and after the last (when the span gives them).
    pub nodes_in: Option<usize>,
    pub nodes_out: Option<usize>,
}

impl Report {
    /// Spans aggregated by name, slowest first.
    pub fn passes(&self) -> Vec<PassRow> {
        let mut rows: Vec<PassRow> = Vec::new();
        for s in &self.spans {
            match rows.iter_mut().find(|r| r.name == s.name) {
                Some(r) => {
                    r.time += s.duration;
                    r.calls += 1;
                    r.alloc.allocs += s.alloc.allocs;
                    r.alloc.bytes += s.alloc.bytes;
                    r.work += s.work;
                    r.nodes_in = r.nodes_in.or(s.nodes_in);
                    r.nodes_out = s.nodes_out.or(r.nodes_out);
                }
                None => rows.push(PassRow {
                    name: s.name.to_string(),
                    phase: s.phase,
                    time: s.duration,
                    calls: 1,
                    alloc: s.alloc,
                    work: s.work,
                    nodes_in: s.nodes_in,
                    nodes_out: s.nodes_out,
                }),
            }
        }
        rows.sort_by(|a, b| b.time.cmp(&a.time).then_with(|| a.name.cmp(&b.name)));
        rows
    }

    /// Time per phase, in pipeline order (phases with no span are left out). A span counts
    /// towards its phase unless an enclosing span already does.
    pub fn phase_totals(&self) -> Vec<(Phase, Duration)> {
        let counted_above = |mut parent: Option<usize>| {
            while let Some(p) = parent {
                if self.spans[p].phase.is_some() {
                    return true;
                }
                parent = self.spans[p].parent;
            }
            false
        };
        Phase::ALL
            .iter()
            .filter_map(|&phase| {
                let mut any = false;
                let mut total = Duration::ZERO;
                for s in &self.spans {
                    if s.phase == Some(phase) && !counted_above(s.parent) {
                        any = true;
                        total += s.duration;
                    }
                }
                any.then_some((phase, total))
            })
            .collect()
    }

    /// The sum of the phase totals: graph build to first run, without spans outside every phase
    /// (such as making a model's weights).
    pub fn end_to_end(&self) -> Duration {
        self.phase_totals().iter().map(|&(_, d)| d).sum()
    }

    /// The value of a named counter.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }

    /// The spans as a Chrome trace-event file (complete events, microseconds), which Perfetto
    /// (ui.perfetto.dev) and `chrome://tracing` open.
    pub fn chrome_trace(&self) -> String {
        let mut out = String::from("{\"traceEvents\":[");
        for (i, s) in self.spans.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("\n{\"name\":");
            json_string(&mut out, &s.name);
            out.push_str(",\"cat\":");
            json_string(&mut out, s.phase.map_or("other", Phase::name));
            let _ = write!(
                out,
                ",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":1,\"tid\":1,\"args\":{{\"alloc_bytes\":{},\"allocs\":{}",
                s.start.as_secs_f64() * 1e6,
                s.duration.as_secs_f64() * 1e6,
                s.alloc.bytes,
                s.alloc.allocs
            );
            if let Some(n) = s.nodes_in {
                let _ = write!(out, ",\"nodes_in\":{n}");
            }
            if let Some(n) = s.nodes_out {
                let _ = write!(out, ",\"nodes_out\":{n}");
            }
            out.push_str("}}");
        }
        out.push_str("\n],\"displayTimeUnit\":\"ms\"}\n");
        out
    }
}

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `1234567` bytes as `1.18 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{v:.2} {}", UNITS[unit]) }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn opt(n: Option<usize>) -> String {
    n.map_or_else(|| "-".to_string(), |n| n.to_string())
}

impl fmt::Display for Report {
    /// The per-pass table (slowest first), the phase totals, the planned memory and the counters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = self.passes();
        let bytes = |a: AllocCounts| if self.alloc_counted { human_bytes(a.bytes) } else { "-".into() };
        let allocs = |a: AllocCounts| if self.alloc_counted { a.allocs.to_string() } else { "-".into() };
        let name_w = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(5);
        writeln!(
            f,
            "{:<name_w$}  {:>9}  {:>6}  {:>5}  {:>11}  {:>8}  {:>10}  {:>8}  {:>9}",
            "pass", "ms", "%", "calls", "allocated", "allocs", "work", "nodes in", "nodes out"
        )?;
        writeln!(f, "{}", "-".repeat(name_w + 88))?;
        let total = self.total.as_secs_f64().max(1e-12);
        for r in &rows {
            writeln!(
                f,
                "{:<name_w$}  {:>9}  {:>5.1}%  {:>5}  {:>11}  {:>8}  {:>10}  {:>8}  {:>9}",
                r.name,
                ms(r.time),
                100.0 * r.time.as_secs_f64() / total,
                r.calls,
                bytes(r.alloc),
                allocs(r.alloc),
                r.work,
                opt(r.nodes_in),
                opt(r.nodes_out)
            )?;
        }
        writeln!(f, "{}", "-".repeat(name_w + 88))?;
        writeln!(
            f,
            "{:<name_w$}  {:>9}  {:>6}  {:>5}  {:>11}  {:>8}",
            "total",
            ms(self.total),
            "",
            "",
            bytes(self.alloc),
            allocs(self.alloc)
        )?;
        writeln!(f)?;
        let totals = self.phase_totals();
        let parts: Vec<String> = totals.iter().map(|(p, d)| format!("{} {} ms", p.name(), ms(*d))).collect();
        writeln!(f, "totals: {}", parts.join(" | "))?;
        let compile: Duration =
            totals.iter().filter(|(p, _)| !matches!(p, Phase::GraphBuild | Phase::FirstRun)).map(|&(_, d)| d).sum();
        writeln!(
            f,
            "compile (rewrite + schedule + memory plan + codegen): {} ms; end to end (all phases): {} ms",
            ms(compile),
            ms(self.end_to_end())
        )?;
        if let Some(m) = &self.memory {
            writeln!(
                f,
                "peak memory planned: {} live, arena {} (vs {} with one allocation per buffer)",
                human_bytes(m.peak_live_bytes as u64),
                human_bytes(m.arena_bytes as u64),
                human_bytes(m.naive_bytes as u64)
            )?;
        }
        if !self.counters.is_empty() {
            let parts: Vec<String> = self.counters.iter().map(|(n, v)| format!("{n} {v}")).collect();
            writeln!(f, "counters: {}", parts.join(", "))?;
        }
        if !self.alloc_counted {
            writeln!(f, "(allocations not counted: install kiln::profile::CountingAlloc as the global allocator)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_nest_and_aggregate_by_name() {
        let ((), report) = profile(|| {
            begin(runtime::Step::Lower(Pass::Verify), Some(10));
            end(Some(10));
            span("outer", || {
                begin(runtime::Step::Codegen, None);
                end(None);
                begin(runtime::Step::Codegen, None);
                end(None);
            });
        });
        assert_eq!(report.spans.len(), 4);
        let outer = report.spans.iter().position(|s| s.name == "outer").unwrap();
        assert_eq!(report.spans[outer].parent, None);
        assert!(report.spans.iter().filter(|s| s.name == "codegen").all(|s| s.parent == Some(outer) && s.depth == 1));
        let rows = report.passes();
        let codegen = rows.iter().find(|r| r.name == "codegen").unwrap();
        assert_eq!(codegen.calls, 2);
        assert_eq!(codegen.phase, Some(Phase::Codegen));
        let verify = rows.iter().find(|r| r.name == "verify").unwrap();
        assert_eq!((verify.nodes_in, verify.nodes_out), (Some(10), Some(10)));
        let phases: Vec<Phase> = report.phase_totals().into_iter().map(|(p, _)| p).collect();
        assert_eq!(phases, vec![Phase::Rewrite, Phase::Codegen]);
        assert_eq!(rows.iter().find(|r| r.name == "outer").unwrap().phase, None);
    }

    #[test]
    fn strings_name_user_spans_without_a_phase() {
        // A user's span named like a step is still the user's: only typed steps count.
        let ((), report) = profile(|| {
            span("trace", || ());
            span(Step::Trace, || ());
        });
        let phases: Vec<Option<Phase>> = report.spans.iter().map(|s| s.phase).collect();
        assert_eq!(phases, [None, Some(Phase::GraphBuild)]);
        assert_eq!(report.spans[1].name, "trace");
    }

    #[test]
    fn nothing_is_recorded_outside_a_profile_and_open_spans_close() {
        begin("stray", None);
        end(None);
        assert!(!is_active());
        let ((), report) = profile(|| {
            begin("left-open", None);
            add_counter("kernels", 2);
            add_counter("kernels", 3);
            set_memory(MemoryStats { arena_bytes: 64, peak_live_bytes: 48, naive_bytes: 128 });
        });
        assert_eq!(report.spans.len(), 1);
        assert_eq!(report.counter("kernels"), Some(5));
        assert_eq!(report.memory.map(|m| m.peak_live_bytes), Some(48));
        assert!(!is_active());
    }

    #[test]
    fn nested_profiles_record_separately() {
        let (inner, outer) = profile(|| {
            span("a", || ());
            let ((), inner) = profile(|| span("b", || ()));
            span("c", || ());
            inner
        });
        let names = |r: &Report| r.spans.iter().map(|s| s.name.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&inner), ["b"]);
        assert_eq!(names(&outer), ["a", "c"]);
    }

    #[test]
    fn chrome_trace_escapes_names() {
        let ((), report) = profile(|| span(String::from("a \"quoted\"\\name"), || ()));
        let trace = report.chrome_trace();
        assert!(trace.contains(r#""name":"a \"quoted\"\\name""#), "{trace}");
        assert!(trace.contains("\"ph\":\"X\""));
        assert!(trace.trim_end().ends_with('}'));
    }

    #[test]
    fn human_bytes_picks_a_unit() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(3 << 20), "3.00 MiB");
    }
}

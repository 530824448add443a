//! The CPU compile pipeline, step by step, with a profiling span around each step.
//!
//! This is what `runtime`'s CPU device does on a program-cache miss (lower, codegen per loop
//! kernel, executable, memory plan), called piece by piece from the outside so that every piece
//! is timed: `lower`'s passes report through its `PassObserver`; code generation, the memory plan
//! and the first run have no hook, so their calls are wrapped here. Each call of [`compile`] uses a
//! fresh `CpuCompiler`, so nothing is cached between compilations.

use std::sync::Arc;

use air::{Bindings, Graph, HostTensor};
use codegen::{CompiledKernel, CpuCompiler};
use kiln::profile::{self, PlannedMemory};
use lower::kir::{Kernel, LoopKernel};
use lower::rewrite::RewriteStats;
use lower::{CompileOptions, PassObserver, Program};
use runtime::vm::{Executable, KernelFn, Placement};
use runtime::{GraphKey, MemoryStats, RuntimeError};

/// A traced program: the graph, its input data and its symbol values.
#[derive(Clone)]
pub struct Traced {
    pub graph: Graph,
    pub inputs: Vec<HostTensor>,
    pub bindings: Bindings,
}

impl Traced {
    /// Traces `outputs` (lazy tensors) into an air program, as `realize` would.
    pub fn of(outputs: &[&kiln::Tensor]) -> anyhow::Result<Traced> {
        let program = kiln::trace(outputs)?;
        Ok(Traced { graph: program.graph, inputs: program.inputs, bindings: program.bindings })
    }
}

/// Forwards `lower`'s pass brackets to profiling spans.
struct SpanObserver;

impl PassObserver for SpanObserver {
    fn begin(&mut self, pass: &'static str, graph_nodes: usize) {
        profile::begin(pass, Some(graph_nodes));
    }

    fn end(&mut self, _pass: &'static str, graph_nodes: usize) {
        profile::end(Some(graph_nodes));
    }
}

/// A compiled program and what compiling it produced.
pub struct Compiled {
    pub exe: Arc<Executable>,
    /// The compiler that generated the loop kernels (its cache counters).
    pub compiler: Arc<CpuCompiler>,
    /// Kernels of the program (loop and matmul) and launches per run.
    pub kernels: usize,
    pub loop_kernels: usize,
    pub launches: usize,
}

impl Compiled {
    /// The lowered program.
    pub fn program(&self) -> &Program {
        self.exe.program()
    }
}

/// The memory planner of `lower` in the runtime's terms, with a span around it.
fn plan_memory(program: &Program, bindings: &Bindings) -> runtime::Result<Placement> {
    let plan = profile::span("plan-arena", || lower::memplan::plan(program, bindings))
        .map_err(|e| RuntimeError::BadSize(e.to_string()))?;
    Ok(Placement {
        offsets: plan.offsets,
        stats: MemoryStats {
            arena_bytes: plan.arena_bytes,
            naive_bytes: plan.naive_bytes,
            peak_live_bytes: plan.peak_live_bytes,
        },
    })
}

/// Lowers `graph`, compiles its loop kernels with a fresh code generator and prepares the
/// executable; the memory plan for `bindings` is made here too (and recorded in the profile).
pub fn compile(graph: &Graph, bindings: &Bindings, options: &CompileOptions) -> anyhow::Result<Compiled> {
    let key = profile::span("graph-key", || GraphKey::of(graph));
    let program = lower::compile_observed(graph, options, &mut SpanObserver)?;
    let compiler = Arc::new(profile::span("codegen-init", CpuCompiler::new)?);
    // One batch, as `CpuDevice::compile` does: cache misses compile concurrently on all cores.
    let loops: Vec<&LoopKernel> = program
        .kernels
        .iter()
        .filter_map(|k| match k {
            Kernel::Loops(k) => Some(k),
            Kernel::Matmul(_) => None,
        })
        .collect();
    let code: Vec<Arc<CompiledKernel>> =
        profile::span("codegen", || compiler.compile_many(&loops).into_iter().collect::<Result<_, _>>())?;
    let mut fns = code.iter().map(|c| c.as_fn());
    let loop_fns: Vec<Option<KernelFn>> = program
        .kernels
        .iter()
        .map(|k| match k {
            Kernel::Loops(_) => fns.next(),
            Kernel::Matmul(_) => None,
        })
        .collect();
    let (kernels, loop_kernels) = (program.kernels.len(), code.len());
    let exe = profile::span("prepare", || {
        Executable::new(program, key.input_types(), loop_fns, Arc::new(code), plan_memory)
    })?;
    let memory = profile::span("memory-plan", || exe.memory(bindings))?;
    profile::set_memory(PlannedMemory {
        arena_bytes: memory.arena_bytes,
        peak_live_bytes: memory.peak_live_bytes,
        naive_bytes: memory.naive_bytes,
    });
    let launches = exe.launches();
    profile::add_counter("kernels", kernels as u64);
    profile::add_counter("loop kernels compiled", compiler.stats().compiled);
    profile::add_counter("launches", launches as u64);
    Ok(Compiled { exe: Arc::new(exe), compiler, kernels, loop_kernels, launches })
}

/// Runs the compiled program once (a span named `first-run`).
pub fn first_run(compiled: &Compiled, traced: &Traced) -> anyhow::Result<Vec<HostTensor>> {
    Ok(profile::span("first-run", || compiled.exe.run(&traced.inputs, &traced.bindings))?)
}

/// The rewriter's counters for `graph` (the same work `lower::compile` does in its `optimize`
/// pass, which does not hand its counters out).
pub fn rewrite_stats(graph: &Graph) -> RewriteStats {
    let mut g = graph.clone();
    lower::rewrite::optimize(&mut g)
}

/// Counts of the work a compilation does, for the compile-time regression guard: deterministic,
/// unlike times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCounts {
    /// Nodes of the traced graph.
    pub nodes: u64,
    /// Rewrite worklist visits and rule attempts.
    pub visits: u64,
    pub attempts: u64,
    /// Heap allocations (on this thread) during `lower::compile` and during code generation.
    pub lower_allocs: u64,
    pub codegen_allocs: u64,
    /// Kernels in the program, loop kernels compiled, launches per run.
    pub kernels: u64,
    pub compiled: u64,
    pub launches: u64,
}

/// Compiles `graph` once and counts the work. Allocation counts need `CountingAlloc` installed.
pub fn compile_work(graph: &Graph, options: &CompileOptions) -> anyhow::Result<WorkCounts> {
    let stats = rewrite_stats(graph);
    let before = profile::thread_alloc_counts();
    let program = lower::compile(graph, options)?;
    let lowered = profile::thread_alloc_counts();
    let compiler = CpuCompiler::new()?;
    let after_init = profile::thread_alloc_counts();
    let mut launches = 0;
    for kernel in &program.kernels {
        if let Kernel::Loops(k) = kernel {
            compiler.compile(k)?;
        }
    }
    launches += program.steps.len() as u64;
    let done = profile::thread_alloc_counts();
    Ok(WorkCounts {
        nodes: graph.len() as u64,
        visits: stats.visits,
        attempts: stats.attempts,
        lower_allocs: lowered.since(before).allocs,
        codegen_allocs: done.since(after_init).allocs,
        kernels: program.kernels.len() as u64,
        compiled: compiler.stats().compiled,
        launches,
    })
}

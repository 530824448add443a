//! The CPU compile pipeline as the `kiln` command measures it: `runtime`'s own
//! `CpuDevice::compile_taking`, whose steps (graph key, every pass of `lower`, code generation,
//! prepare) become profiling spans through `kiln::profile::ProfileObserver`, then the memory plan
//! and the first run, each a span too. What the passes produced (the rewriter's counters, and on
//! request the graph after each graph pass) comes from the same observer, so nothing is compiled
//! or rewritten twice. Each call of [`compile`] uses a fresh device, so nothing is cached between
//! compilations.

use std::borrow::Cow;
use std::sync::Arc;

use air::{Bindings, Graph, HostTensor};
use kiln::profile::{self, AllocCounts, ProfileObserver};
use lower::kir::Kernel;
use lower::rewrite::RewriteStats;
use lower::saturate::SaturateStats;
use lower::{CompileOptions, Pass, PassOutput, Program};
use runtime::vm::Executable;
use runtime::{CompileObserver, CpuDevice, Step};

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

/// A compiled program and what compiling it produced.
pub struct Compiled {
    pub exe: Arc<Executable>,
    /// Kernels of the program (loop and matmul) and launches per run.
    pub kernels: usize,
    pub loop_kernels: usize,
    pub launches: usize,
    /// The rewriter's counters from the `optimize` pass (all zero when it did not run).
    pub rewrite: RewriteStats,
    /// What the `saturate` pass did, when it ran (`OptLevel::O2` and above).
    pub saturate: Option<SaturateStats>,
    /// The graph after each graph pass that changed it (`optimize`), when [`compile`] was asked
    /// to keep it; empty otherwise.
    pub graphs: Vec<(Pass, Graph)>,
}

impl Compiled {
    /// The lowered program.
    pub fn program(&self) -> &Program {
        self.exe.program()
    }
}

/// A fresh CPU device for `options`, set up as `runtime` sets up every device (concurrent
/// dependency levels included), so that what is measured is what users get; nothing is cached.
fn fresh_device(options: &CompileOptions) -> runtime::Result<CpuDevice> {
    CpuDevice::with_options(*options)
}

/// The profiler's observer, plus what the passes produced: the rewriter's counters, and, when
/// `keep_graphs`, a copy of the graph after each pass that changed it (nothing is copied
/// otherwise).
struct PipelineObserver {
    profile: ProfileObserver,
    keep_graphs: bool,
    rewrite: RewriteStats,
    saturate: Option<SaturateStats>,
    graphs: Vec<(Pass, Graph)>,
}

impl CompileObserver for PipelineObserver {
    fn begin(&mut self, step: Step, nodes: Option<usize>) {
        self.profile.begin(step, nodes);
    }

    fn end(&mut self, step: Step, nodes: Option<usize>) {
        self.profile.end(step, nodes);
    }

    fn pass_output(&mut self, pass: Pass, output: PassOutput<'_>) {
        match output {
            PassOutput::Optimized(graph, stats) => {
                self.rewrite = stats.clone();
                if self.keep_graphs {
                    self.graphs.push((pass, graph.clone()));
                }
            }
            PassOutput::Saturated(graph, stats) => {
                self.saturate = Some(stats.clone());
                if self.keep_graphs && stats.changed {
                    self.graphs.push((pass, graph.clone()));
                }
            }
            _ => {}
        }
    }

    fn counter(&mut self, name: &'static str, value: u64) {
        self.profile.counter(name, value);
    }
}

/// Compiles `graph` on a fresh CPU device (`codegen-init`: the device and its code generator)
/// through `CpuDevice::compile_taking`, every step of which is a span, and plans its memory
/// for `bindings` (`memory-plan`, recorded in the profile). With `keep_graphs` the result also
/// holds the graph after each pass that changed it (for `--dump`).
///
/// The device is given a copy of `graph`, made before the first span: `kiln::jit` and `realize`
/// hand the graph they traced over to the device, which lowers it in place, and that is what is
/// measured; the copy is this tool's, which keeps `graph` for its checks.
pub fn compile(
    graph: &Graph,
    bindings: &Bindings,
    options: &CompileOptions,
    keep_graphs: bool,
) -> anyhow::Result<Compiled> {
    // With the room for new nodes that a traced graph has (`Graph::for_compile`): a clone is
    // sized exactly.
    let mut given = graph.clone();
    given.reserve(Graph::rewrite_room(given.len()));
    let given = Cow::Owned(given);
    let device = profile::span(profile::Step::DeviceInit, || fresh_device(options))?;
    let mut observer = PipelineObserver {
        profile: ProfileObserver::default(),
        keep_graphs,
        rewrite: RewriteStats::default(),
        saturate: None,
        graphs: Vec::new(),
    };
    let (exe, _) = device.compile_taking(given, &mut observer)?;
    let memory = profile::span(Step::MemoryPlan, || exe.memory(bindings))?;
    profile::set_memory(memory);
    profile::add_counter("loop kernels compiled", device.stats().kernels_compiled);
    profile::add_counter("loop kernels run natively", device.stats().kernels_native);
    profile::add_counter("loop kernels compiled while lowering", device.stats().kernels_compiled_early);
    let kernels = exe.program().kernels.len();
    let loop_kernels = exe.program().kernels.iter().filter(|k| matches!(k, Kernel::Loops(_))).count();
    let launches = exe.launches();
    Ok(Compiled {
        exe,
        kernels,
        loop_kernels,
        launches,
        rewrite: observer.rewrite,
        saturate: observer.saturate,
        graphs: observer.graphs,
    })
}

/// Runs the compiled program once (a span named `first-run`), as a compiled function's call
/// does: inputs the program writes in place (a key/value cache, `Program::inits`) are given up
/// to it, so the run writes only their new part. They are copies made before the clock starts
/// ([`owned_inputs`]), so `traced` keeps its own inputs for the checks and runs that follow.
pub fn first_run(compiled: &Compiled, traced: &Traced) -> anyhow::Result<Vec<HostTensor>> {
    let mut inputs = owned_inputs(compiled, traced);
    Ok(profile::span(profile::Step::FirstRun, || compiled.exe.run_taking(&mut inputs, &traced.bindings, Vec::new()))?)
}

/// `traced`'s inputs, those the program writes in place (`Program::inits`) copied into arrays
/// of their own that a run can take ([`run_in_place`]); the others shared.
pub fn owned_inputs(compiled: &Compiled, traced: &Traced) -> Vec<HostTensor> {
    let program = compiled.exe.program();
    let mut inputs = traced.inputs.clone();
    for &(_, from) in &program.inits {
        if let lower::BufferKind::Input(slot) = program.buffers[from.0 as usize].kind {
            let input = &mut inputs[slot as usize];
            input.data = Arc::new((*input.data).clone());
        }
    }
    inputs
}

/// Runs the compiled program as a decoding loop calls it: the inputs it writes in place (a
/// key/value cache) are given up to the run and their updated arrays put back into `inputs`
/// for the next run. Those are `inputs`' own again once the returned outputs are dropped, so a
/// run on [`owned_inputs`] copies no cache; `Executable::run` on shared inputs copies each one
/// into its output first (2.6 MB per run for the cached forward at depth 8).
pub fn run_in_place(
    compiled: &Compiled,
    inputs: &mut [HostTensor],
    bindings: &Bindings,
) -> anyhow::Result<Vec<HostTensor>> {
    let program = compiled.exe.program();
    let outputs = compiled.exe.run_taking(inputs, bindings, Vec::new())?;
    for &(out, from) in &program.inits {
        let (lower::BufferKind::Output(o), lower::BufferKind::Input(slot)) =
            (program.buffers[out.0 as usize].kind, program.buffers[from.0 as usize].kind)
        else {
            anyhow::bail!("buf{} starts from buf{}, which are not an output and an input", out.0, from.0);
        };
        inputs[slot as usize] = outputs[o as usize].clone();
    }
    Ok(outputs)
}

/// The compile steps whose work [`compile_work`] counts, in order: the device's steps
/// (`CpuDevice::compile_taking`) and then the memory plan of the first binding set.
pub const WORK_STEPS: [Step; 9] = Step::COMPILE;

/// Counts of the work a compilation does, for the compile-time regression guard: deterministic,
/// unlike times.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCounts {
    /// Nodes of the traced graph.
    pub nodes: u64,
    /// Units of work (`air::work`: nodes visited, edges touched, rule attempts, planner steps,
    /// tree operations, instructions emitted) of each step of [`WORK_STEPS`], in that order.
    pub steps: [u64; WORK_STEPS.len()],
    /// Work of the memory plan with every step in its own time slot (`lower::memplan::plan`),
    /// which `memory-plan` is when no dependency level of the program runs concurrently.
    pub plan_sequential: u64,
    /// Rewrite worklist visits and rule attempts.
    pub visits: u64,
    pub attempts: u64,
    /// Heap allocations (on this thread) while lowering (every pass of `lower`) and during code
    /// generation.
    pub lower_allocs: u64,
    pub codegen_allocs: u64,
    /// Kernels in the program, loop kernels compiled, launches per run.
    pub kernels: u64,
    pub compiled: u64,
    pub launches: u64,
}

impl WorkCounts {
    /// The work of `step` (one of [`WORK_STEPS`]).
    pub fn step(&self, step: Step) -> Option<u64> {
        WORK_STEPS.iter().position(|s| *s == step).map(|i| self.steps[i])
    }
}

/// Marks this thread's allocation counts at the device's step boundaries (lowering runs from the
/// end of `graph-key` to the start of `codegen`), reads the `air::work` counter at the start
/// and end of every step, and keeps the rewriter's visit and attempt counts. Records into fields
/// only, so that observing allocates nothing.
#[derive(Default)]
struct WorkObserver {
    lower_start: AllocCounts,
    codegen_start: AllocCounts,
    codegen_end: AllocCounts,
    kernels: u64,
    launches: u64,
    /// The work counter when the current step began.
    work_start: u64,
    steps: [u64; WORK_STEPS.len()],
    /// A step that is not in `WORK_STEPS` (a new step of the device must be added there).
    unknown: Option<Step>,
    /// Rewrite worklist visits and rule attempts of the `optimize` pass.
    visits: u64,
    attempts: u64,
}

impl CompileObserver for WorkObserver {
    fn begin(&mut self, step: Step, _nodes: Option<usize>) {
        if step == Step::Codegen {
            self.codegen_start = profile::thread_alloc_counts();
        }
        self.work_start = air::work::total();
    }

    fn end(&mut self, step: Step, _nodes: Option<usize>) {
        let work = air::work::total().wrapping_sub(self.work_start);
        match WORK_STEPS.iter().position(|s| *s == step) {
            Some(i) => self.steps[i] += work,
            None => self.unknown = self.unknown.or(Some(step)),
        }
        match step {
            Step::GraphKey => self.lower_start = profile::thread_alloc_counts(),
            Step::Codegen => self.codegen_end = profile::thread_alloc_counts(),
            _ => {}
        }
    }

    fn pass_output(&mut self, _pass: Pass, output: PassOutput<'_>) {
        if let PassOutput::Optimized(_, stats) = output {
            (self.visits, self.attempts) = (stats.visits, stats.attempts);
        }
    }

    fn counter(&mut self, name: &'static str, value: u64) {
        match name {
            "kernels" => self.kernels = value,
            "launches" => self.launches = value,
            _ => {}
        }
    }
}

/// Compiles `graph` once on a fresh CPU device (as [`compile`] does, without spans, a copy of
/// `graph` given to it), plans its memory for `bindings`, and counts the work. Code generation
/// runs on this thread only, so the allocation counts are deterministic; they need
/// `CountingAlloc` installed. The work counts do not.
pub fn compile_work(graph: &Graph, bindings: &Bindings, options: &CompileOptions) -> anyhow::Result<WorkCounts> {
    // With the room for new nodes that a traced graph has (`Graph::for_compile`): a clone is
    // sized exactly.
    let mut given = graph.clone();
    given.reserve(Graph::rewrite_room(given.len()));
    let given = Cow::Owned(given);
    let device = fresh_device(options)?;
    device.set_compile_threads(1);
    let mut work = WorkObserver::default();
    let (exe, _) = device.compile_taking(given, &mut work)?;
    if let Some(step) = work.unknown {
        anyhow::bail!("compile step `{step}` is not in WORK_STEPS");
    }
    let (memory, plan_work) = air::work::measure(|| exe.memory(bindings));
    memory?;
    let (plan, plan_sequential) = air::work::measure(|| lower::memplan::plan(exe.program(), bindings));
    plan?;
    let mut steps = work.steps;
    steps[WORK_STEPS.len() - 1] = plan_work;
    Ok(WorkCounts {
        nodes: graph.len() as u64,
        steps,
        plan_sequential,
        visits: work.visits,
        attempts: work.attempts,
        lower_allocs: work.codegen_start.since(work.lower_start).allocs,
        codegen_allocs: work.codegen_end.since(work.codegen_start).allocs,
        kernels: work.kernels,
        compiled: device.stats().kernels_compiled,
        launches: work.launches,
    })
}

//! Compile observers: how a profiler hears the steps of a device's compile, without the
//! runtime knowing who listens. Steps are typed ([`Step`]); their names are for display only.

use std::fmt;

use lower::{Pass, PassOutput};

/// A step of [`CpuDevice::compile_observed`](crate::CpuDevice::compile_observed), or the memory
/// plan a caller makes for a binding set ([`Executable::memory`](crate::Executable::memory)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// Checking the graph is acyclic, hashing its structure and looking it up in the cache.
    GraphKey,
    /// A marker: the program was found in the cache (nothing else follows).
    CacheHit,
    /// A pass of `lower::compile`.
    Lower(Pass),
    /// Native code for the program's loop kernels (one concurrent batch).
    Codegen,
    /// The cache key and the executable.
    Prepare,
    /// The memory plan for one binding set.
    MemoryPlan,
}

impl Step {
    /// The steps of a compile that misses the cache, in order, then the memory plan.
    pub const COMPILE: [Step; 9] = [
        Step::GraphKey,
        Step::Lower(Pass::Verify),
        Step::Lower(Pass::Optimize),
        Step::Lower(Pass::Saturate),
        Step::Lower(Pass::DecideFusion),
        Step::Lower(Pass::EmitKernels),
        Step::Codegen,
        Step::Prepare,
        Step::MemoryPlan,
    ];

    /// The step's kebab-case name, for display (`graph-key`, `emit-kernels`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Step::GraphKey => "graph-key",
            Step::CacheHit => "cache-hit",
            Step::Lower(pass) => pass.name(),
            Step::Codegen => "codegen",
            Step::Prepare => "prepare",
            Step::MemoryPlan => "memory-plan",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<Pass> for Step {
    fn from(pass: Pass) -> Step {
        Step::Lower(pass)
    }
}

/// Hears the steps of [`CpuDevice::compile_observed`](crate::CpuDevice::compile_observed), for a
/// profiler: each step is bracketed by `begin` and `end` (in LIFO order, with the graph's node
/// count where the step is a graph pass), `pass_output` lends what each pass of `lower` produced,
/// and `counter` reports sizes of the result. The runtime knows nothing of who listens.
pub trait CompileObserver {
    /// `step` starts; `nodes` is the graph's size before it, for a graph pass.
    fn begin(&mut self, step: Step, nodes: Option<usize>);
    /// The step that began last ends; `nodes` is the graph's size after it.
    fn end(&mut self, step: Step, nodes: Option<usize>);
    /// What a pass of `lower` produced (see [`lower::PassObserver::output`]). Ignored by default.
    fn pass_output(&mut self, pass: Pass, output: PassOutput<'_>) {
        let _ = (pass, output);
    }
    /// A count about the compiled program (`kernels`, `loop kernels`, `launches`).
    fn counter(&mut self, name: &'static str, value: u64) {
        let _ = (name, value);
    }
}

/// A [`CompileObserver`] that ignores everything: what
/// [`CpuDevice::compile`](crate::CpuDevice::compile) uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCompileObserver;

impl CompileObserver for NoCompileObserver {
    fn begin(&mut self, _: Step, _: Option<usize>) {}
    fn end(&mut self, _: Step, _: Option<usize>) {}
}

/// Forwards `lower`'s pass brackets and outputs to a [`CompileObserver`].
pub(crate) struct Passes<'a>(pub(crate) &'a mut dyn CompileObserver);

impl lower::PassObserver for Passes<'_> {
    fn begin(&mut self, pass: Pass, graph_nodes: usize) {
        self.0.begin(Step::Lower(pass), Some(graph_nodes));
    }

    fn end(&mut self, pass: Pass, graph_nodes: usize) {
        self.0.end(Step::Lower(pass), Some(graph_nodes));
    }

    fn output(&mut self, pass: Pass, output: PassOutput<'_>) {
        self.0.pass_output(pass, output);
    }
}

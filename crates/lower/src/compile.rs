//! The entry point of lowering: `compile` turns an `air::Graph` into a kir `Program` through the
//! passes of [`Pass`] (`verify`, which also collects the graph's run-time shape conditions into
//! `Program::checks`, `optimize`, `saturate` at [`OptLevel::O2`] and above, `decide-fusion`,
//! `emit-kernels`), each bracketed by an optional
//! [`PassObserver`] so that a profiler can time them, and a tool can see what each produced,
//! without touching the passes.
//!
//! The passes rewrite the graph in place, so a borrowed graph is copied first (inside `verify`,
//! so that a profile counts the copy: about 70-170 ns a node, 0.1-0.26 ms for the depth-8
//! decoder); a caller done with its graph hands it over ([`compile_taking`]) and nothing is
//! copied.

use std::borrow::Cow;
use std::fmt;

use air::Graph;

use crate::error::LowerError;
use crate::kir::{IExpr, Kernel};
use crate::program::Program;
use crate::rewrite::RewriteStats;
use crate::saturate::{SaturateOptions, SaturateStats};
use crate::schedule::{self, FuseOptions};

/// What `compile` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    /// Fuse element-wise chains, reductions and epilogues into shared kernels. `false` gives one
    /// kernel per element-wise or reduce op (movement ops still become index arithmetic).
    pub fuse: bool,
    /// Recognise matmuls and emit `Kernel::Matmul` (only when fusing).
    pub matmul: bool,
    /// Run the graph rewrites (`rewrite::optimize`) first.
    pub optimize: bool,
    /// How hard `optimize` works (only when `optimize` is on).
    pub level: OptLevel,
    /// The most buffers one kernel may bind (a GPU's storage buffers per shader stage: `wgpu`
    /// sets its adapter's); fusion cuts expressions that would read more. `None`: any number
    /// (the CPU).
    pub max_kernel_buffers: Option<u32>,
}

/// Buffers a kernel binds besides the ones it reads: its output and a data check's status.
pub const KERNEL_BUFFERS_RESERVED: u32 = 2;

impl Default for CompileOptions {
    /// Fusing, matmuls and rewrites on, at [`OptLevel::from_env`].
    fn default() -> CompileOptions {
        CompileOptions {
            fuse: true,
            matmul: true,
            optimize: true,
            level: OptLevel::from_env(),
            max_kernel_buffers: None,
        }
    }
}

/// Optimization levels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OptLevel {
    /// The greedy exact rules only (`rewrite::optimize`): cheap, linear in the graph. The default.
    #[default]
    O1,
    /// Greedy, then equality saturation with the exact rules (`saturate`), then greedy again to
    /// tidy what extraction built. Costs milliseconds on graphs with matmuls.
    O2,
    /// `O2` with fast-math saturation rules: float matmul reassociation and scaling through
    /// matmuls, which change rounding.
    O3,
}

impl OptLevel {
    /// The level named by the `KILN_OPT` environment variable (`1`, `2` or `3`, read once per
    /// process), [`OptLevel::O1`] when it is unset or anything else.
    pub fn from_env() -> OptLevel {
        static LEVEL: std::sync::OnceLock<OptLevel> = std::sync::OnceLock::new();
        *LEVEL.get_or_init(|| match std::env::var("KILN_OPT").as_deref() {
            Ok("2") => OptLevel::O2,
            Ok("3") => OptLevel::O3,
            _ => OptLevel::O1,
        })
    }

    /// The saturation budget of this level, `None` below `O2`.
    pub fn saturation(self) -> Option<SaturateOptions> {
        match self {
            OptLevel::O1 => None,
            OptLevel::O2 => Some(SaturateOptions::default()),
            OptLevel::O3 => Some(SaturateOptions { fast_math: true, ..SaturateOptions::default() }),
        }
    }
}

/// The passes of [`compile`], in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pass {
    /// The graph taken in (a copy of a borrowed one, see [`compile_taking`]), `air::verify`
    /// (where the graph is not `Graph::is_verified`, or in a debug build), and the collection of
    /// the graph's run-time shape conditions.
    Verify,
    /// The graph rewrites (`rewrite::optimize`) and the acyclicity check after them.
    Optimize,
    /// Equality saturation (`saturate::saturate`, at `OptLevel::O2` and above), then the greedy
    /// rewrites again when it changed the graph.
    Saturate,
    /// Kernel boundaries (`schedule::decide`); the graph is unchanged.
    DecideFusion,
    /// Kernel emission and ordering (`schedule::emit`): the program.
    EmitKernels,
}

impl Pass {
    /// Every pass, in the order `compile` runs them (`optimize` and `saturate` only when asked for).
    pub const ALL: [Pass; 5] = [Pass::Verify, Pass::Optimize, Pass::Saturate, Pass::DecideFusion, Pass::EmitKernels];

    /// The pass's kebab-case name, for display (`decide-fusion`).
    pub fn name(self) -> &'static str {
        match self {
            Pass::Verify => "verify",
            Pass::Optimize => "optimize",
            Pass::Saturate => "saturate",
            Pass::DecideFusion => "decide-fusion",
            Pass::EmitKernels => "emit-kernels",
        }
    }
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a pass that succeeded produced, lent to [`PassObserver::output`] (borrowed: observing
/// copies nothing unless the observer does).
#[derive(Clone, Copy, Debug)]
pub enum PassOutput<'a> {
    /// The graph after a graph pass (`verify` and `decide-fusion` leave it as it was).
    Graph(&'a Graph),
    /// The graph after `optimize`, with the rewriter's counters.
    Optimized(&'a Graph, &'a RewriteStats),
    /// The graph after `saturate`, with its counters.
    Saturated(&'a Graph, &'a SaturateStats),
    /// The program after `emit-kernels` (its `checks` filled in).
    Program(&'a Program),
}

/// Watches the passes of a compilation: `begin` and `end` bracket each pass, with the number of
/// graph nodes before and after it; `output` then lends what a pass that succeeded produced.
pub trait PassObserver {
    /// Called before `pass` runs, with the graph's node count at that point.
    fn begin(&mut self, pass: Pass, graph_nodes: usize);
    /// Called after `pass` returns (whether or not it failed), with the graph's node count then.
    fn end(&mut self, pass: Pass, graph_nodes: usize);
    /// Called after `end` of a pass that succeeded, with its result. Ignored by default.
    fn output(&mut self, pass: Pass, output: PassOutput<'_>) {
        let _ = (pass, output);
    }
    /// Called during `emit-kernels` with each kernel of the program as soon as it is made, in
    /// the order of `Program::kernels` (a kernel is final once made): a backend may start
    /// compiling it while the rest is lowered. Ignored by default.
    fn kernel(&mut self, kernel: &Kernel) {
        let _ = kernel;
    }
    /// [`PassObserver::kernel`] for a loop kernel that is the program's earlier kernel `from`
    /// with each parameter `p`'s accesses moved `by[p]` elements further into its buffer (an
    /// unrolled loop's later step, built from the first: `schedule::memo`), so that a backend
    /// that takes such offsets out of its kernels may reuse what it made of `from`. By
    /// default, `kernel`.
    fn shifted_kernel(&mut self, kernel: &Kernel, from: usize, by: &[IExpr]) {
        let _ = (from, by);
        self.kernel(kernel);
    }
}

/// An observer that does nothing.
pub struct NoObserver;

impl PassObserver for NoObserver {
    fn begin(&mut self, _: Pass, _: usize) {}
    fn end(&mut self, _: Pass, _: usize) {}
}

/// Compiles `graph` (which it does not change) into a program.
pub fn compile(graph: &Graph, options: &CompileOptions) -> Result<Program, LowerError> {
    compile_observed(graph, options, &mut NoObserver)
}

fn pass<T>(
    observer: &mut dyn PassObserver,
    pass: Pass,
    graph: &mut Graph,
    f: impl FnOnce(&mut Graph) -> Result<T, LowerError>,
) -> Result<T, LowerError> {
    observer.begin(pass, graph.len());
    let out = f(graph);
    observer.end(pass, graph.len());
    out
}

/// `compile`, reporting every pass to `observer`.
pub fn compile_observed(
    graph: &Graph,
    options: &CompileOptions,
    observer: &mut dyn PassObserver,
) -> Result<Program, LowerError> {
    compile_taking(Cow::Borrowed(graph), options, observer)
}

/// [`compile_observed`] on a graph lent (copied, in the `verify` pass) or given (rewritten in
/// place: a caller that keeps no use for its graph, as `kiln`'s realize and `jit` do once the
/// device has its structural key, saves the copy).
pub fn compile_taking(
    graph: Cow<'_, Graph>,
    options: &CompileOptions,
    observer: &mut dyn PassObserver,
) -> Result<Program, LowerError> {
    observer.begin(Pass::Verify, graph.len());
    let mut g = graph.into_owned();
    // The run-time conditions come from the graph as given: rewrites may drop the very nodes
    // (a shrink folded into a pad) whose conditions the caller's program needs. A graph built
    // only through checked additions passes by construction (see `Graph::is_verified`); a
    // debug build verifies it anyway.
    let verified = if !g.is_verified() || cfg!(debug_assertions) { air::verify(&g) } else { Ok(()) };
    let checks = verified.map(|()| air::constraints::collect(&g));
    observer.end(Pass::Verify, g.len());
    let checks = checks?;
    observer.output(Pass::Verify, PassOutput::Graph(&g));
    if options.optimize {
        let stats = pass(observer, Pass::Optimize, &mut g, |g| {
            let stats = crate::rewrite::optimize(g);
            // The rewriter edits without a cycle test per edit; one check here covers them all.
            g.check_acyclic()?;
            Ok(stats)
        })?;
        observer.output(Pass::Optimize, PassOutput::Optimized(&g, &stats));
        if let Some(budget) = options.level.saturation() {
            let stats = pass(observer, Pass::Saturate, &mut g, |g| {
                let stats = crate::saturate::saturate(g, &budget);
                if stats.changed {
                    crate::rewrite::optimize(g);
                    g.check_acyclic()?;
                }
                Ok(stats)
            })?;
            observer.output(Pass::Saturate, PassOutput::Saturated(&g, &stats));
        }
    }
    let fuse = FuseOptions {
        fuse: options.fuse,
        matmul: options.matmul,
        max_reads: options.max_kernel_buffers.map(|m| m.saturating_sub(KERNEL_BUFFERS_RESERVED).max(2)),
    };
    let decisions = pass(observer, Pass::DecideFusion, &mut g, |g| Ok(schedule::decide(g, fuse)))?;
    observer.output(Pass::DecideFusion, PassOutput::Graph(&g));
    // Not through `pass`: emission lends each kernel to the observer as it makes it.
    observer.begin(Pass::EmitKernels, g.len());
    let program = schedule::emit_with(&g, &decisions, &mut |k, shifted| match shifted {
        Some((from, by)) => observer.shifted_kernel(k, from, by),
        None => observer.kernel(k),
    })
    .map(|mut program| {
        program.checks = checks;
        program
    });
    observer.end(Pass::EmitKernels, g.len());
    let program = program?;
    observer.output(Pass::EmitKernels, PassOutput::Program(&program));
    Ok(program)
}

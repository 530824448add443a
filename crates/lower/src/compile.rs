//! The entry point of lowering: `compile` turns an `air::Graph` into a kir `Program` through named
//! passes (`verify`, which also collects the graph's run-time shape conditions into
//! `Program::checks`, `optimize`, `decide-fusion`, `emit-kernels`), each bracketed by an optional
//! `PassObserver` so that a profiler can time them without touching the passes.

use air::Graph;

use crate::error::LowerError;
use crate::program::Program;
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
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions { fuse: true, matmul: true, optimize: true }
    }
}

/// Watches the passes of a compilation: `begin` and `end` bracket each pass, with the number of
/// graph nodes before and after it.
pub trait PassObserver {
    /// Called before pass `pass` runs, with the graph's node count at that point.
    fn begin(&mut self, pass: &'static str, graph_nodes: usize);
    /// Called after pass `pass` returns (whether or not it failed), with the graph's node count then.
    fn end(&mut self, pass: &'static str, graph_nodes: usize);
}

/// An observer that does nothing.
pub struct NoObserver;

impl PassObserver for NoObserver {
    fn begin(&mut self, _: &'static str, _: usize) {}
    fn end(&mut self, _: &'static str, _: usize) {}
}

/// Compiles `graph` (which it does not change) into a program.
pub fn compile(graph: &Graph, options: &CompileOptions) -> Result<Program, LowerError> {
    compile_observed(graph, options, &mut NoObserver)
}

fn pass<T>(
    observer: &mut dyn PassObserver,
    name: &'static str,
    graph: &mut Graph,
    f: impl FnOnce(&mut Graph) -> Result<T, LowerError>,
) -> Result<T, LowerError> {
    observer.begin(name, graph.len());
    let out = f(graph);
    observer.end(name, graph.len());
    out
}

/// `compile`, reporting every pass to `observer`.
pub fn compile_observed(
    graph: &Graph,
    options: &CompileOptions,
    observer: &mut dyn PassObserver,
) -> Result<Program, LowerError> {
    let mut g = graph.clone();
    // The run-time conditions come from the graph as given: rewrites may drop the very nodes
    // (a shrink folded into a pad) whose conditions the caller's program needs.
    let checks = pass(observer, "verify", &mut g, |g| {
        air::verify(g)?;
        Ok(air::constraints::collect(g))
    })?;
    if options.optimize {
        pass(observer, "optimize", &mut g, |g| {
            crate::rewrite::optimize(g);
            // The rewriter edits without a cycle test per edit; one check here covers them all.
            Ok(g.check_acyclic()?)
        })?;
    }
    let fuse = FuseOptions { fuse: options.fuse, matmul: options.matmul };
    let decisions = pass(observer, "decide-fusion", &mut g, |g| Ok(schedule::decide(g, fuse)))?;
    let mut program = pass(observer, "emit-kernels", &mut g, |g| schedule::emit(g, &decisions))?;
    program.checks = checks;
    Ok(program)
}

//! Compile observers: how a profiler hears the steps of a device's compile, without the
//! runtime knowing who listens.

/// Hears the steps of [`CpuDevice::compile_observed`], for a profiler: each step is bracketed by
/// `begin` and `end` (in LIFO order, with the graph's node count where the step is a graph pass),
/// and `counter` reports sizes of the result. The runtime knows nothing of who listens.
pub trait CompileObserver {
    /// A step named `step` starts; `nodes` is the graph's size before it, for a graph pass.
    fn begin(&mut self, step: &'static str, nodes: Option<usize>);
    /// The step that began last ends; `nodes` is the graph's size after it.
    fn end(&mut self, step: &'static str, nodes: Option<usize>);
    /// A count about the compiled program (`kernels`, `loop kernels`, `launches`).
    fn counter(&mut self, name: &'static str, value: u64) {
        let _ = (name, value);
    }
}

/// A [`CompileObserver`] that ignores everything: what [`CpuDevice::compile`] uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCompileObserver;

impl CompileObserver for NoCompileObserver {
    fn begin(&mut self, _: &'static str, _: Option<usize>) {}
    fn end(&mut self, _: &'static str, _: Option<usize>) {}
}

/// Forwards `lower`'s pass brackets to a [`CompileObserver`].
pub(crate) struct Passes<'a>(pub(crate) &'a mut dyn CompileObserver);

impl lower::PassObserver for Passes<'_> {
    fn begin(&mut self, pass: &'static str, graph_nodes: usize) {
        self.0.begin(pass, Some(graph_nodes));
    }

    fn end(&mut self, pass: &'static str, graph_nodes: usize) {
        self.0.end(pass, Some(graph_nodes));
    }
}

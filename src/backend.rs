//! Running an air graph on a device: the single place that dispatches on [`Device`].

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use air::{AirError, Bindings, BoundsError, Graph, GraphKey, HostTensor, NodeId, Op, TensorType};
use runtime::RuntimeError;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::profile;
use crate::realize::{SiteOf, Sites};

/// The process-wide GPU device (first use picks the adapter and logs it).
#[cfg(feature = "wgpu")]
pub fn wgpu_device() -> Result<&'static runtime::wgpu::WgpuDevice> {
    static GPU: OnceLock<std::result::Result<runtime::wgpu::WgpuDevice, String>> = OnceLock::new();
    GPU.get_or_init(|| runtime::wgpu::WgpuDevice::new().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Device(format!("wgpu: {e}")))
}

/// The process-wide CPU device: its program and kernel caches live as long as the process, so
/// realizing the same graph again (or with other symbol values) compiles nothing.
pub fn cpu_device() -> Result<&'static runtime::CpuDevice> {
    static CPU: OnceLock<std::result::Result<runtime::CpuDevice, String>> = OnceLock::new();
    CPU.get_or_init(|| runtime::CpuDevice::new().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Device(format!("cpu: {e}")))
}

/// Runs `graph` on `device`. `inputs[slot]` feeds the `Input { slot }` node, `bindings` gives the
/// value of every symbol in the graph's shapes, and the result holds one host tensor per entry of
/// `graph.outputs()`, in order.
///
/// A condition of the graph's symbolic shapes that fails for `bindings` (a shrink past the end
/// of its input, ...) is the same [`BoundsError`] on every device, returned as
/// `Error::Air(AirError::Bounds(..))`; `realize` knows where each node was built and reports it
/// as an [`Error::Op`] at the caller's line instead.
///
/// Inside [`profile::profile`] the CPU device reports every step of compiling (see
/// [`runtime::CpuDevice::compile_observed`]), the memory plan for `bindings` and the run
/// (`first-run` when the program was compiled by this call, `run` when it came from the cache);
/// other devices report one `run` span. Outside a profile this costs one thread-local read.
pub fn execute(device: Device, graph: &Graph, inputs: Vec<HostTensor>, bindings: &Bindings) -> Result<Vec<HostTensor>> {
    execute_traced(device, graph, inputs, bindings, &Sites::default())
}

/// [`execute`] for a traced program: a failed shape condition becomes an [`Error::Op`] naming the
/// op the user called, the values and the caller's line, found through `sites`. The error names
/// its node by position in `graph.topo_order()`, which a program compiled earlier from a
/// structurally identical graph shares with `graph` (the cache keys graphs by that order).
pub(crate) fn execute_traced(
    device: Device,
    graph: &Graph,
    mut inputs: Vec<HostTensor>,
    bindings: &Bindings,
    sites: &Sites,
) -> Result<Vec<HostTensor>> {
    if profile::is_active() {
        crate::stats::record_execution(graph.len());
        return execute_profiled(device, graph, inputs, bindings, sites);
    }
    if device == Device::Interp {
        crate::stats::record_execution(graph.len());
        let located = |e: BoundsError| locate(e, graph.topo_order(), sites);
        return interp(graph, &inputs, bindings).map_err(|e| interp_error(e, located));
    }
    let loaded = load(device, Cow::Borrowed(graph), sites)?;
    run_loaded(&loaded, &mut inputs, bindings, sites, Vec::new())
}

/// A graph made ready to run on its device (compiled, or found in the device's program cache,
/// for `cpu` and `wgpu`), with what runs and `kiln`'s caches still ask of the graph: its
/// topological order (a failed shape condition names its node by position in it) and each
/// node's op and type (the realize cache compares later walks with them). The CPU device lowers
/// the graph it is given in place and hands back its structural key, which answers those; the
/// interpreter runs the graph itself and `wgpu` keeps no key, so theirs is kept. What
/// `kiln::jit` keeps per signature.
pub(crate) struct Loaded {
    code: Code,
    /// The traced graph's topological order.
    order: Vec<NodeId>,
    nodes: Nodes,
}

/// The program a [`Loaded`] runs.
enum Code {
    Interp,
    Cpu(Arc<runtime::Executable>),
    #[cfg(feature = "wgpu")]
    Wgpu(Arc<runtime::wgpu::WgpuExecutable>),
}

/// Where a [`Loaded`] finds the traced graph's ops and types.
enum Nodes {
    Graph(Graph),
    Key(Arc<GraphKey>),
}

impl Loaded {
    /// The number of nodes of the traced graph.
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// The traced graph's topological order.
    pub(crate) fn order(&self) -> &[NodeId] {
        &self.order
    }

    /// The op and type of the node at `position` of [`Loaded::order`].
    pub(crate) fn node(&self, position: usize) -> Option<(&Op, &TensorType)> {
        match &self.nodes {
            Nodes::Graph(g) => self.order.get(position).map(|&id| {
                let node = g.node(id);
                (&node.op, &node.ty)
            }),
            Nodes::Key(key) => key.node(position),
        }
    }

    /// The graph, where it is kept (the interpreter's and `wgpu`'s).
    fn graph(&self) -> Option<&Graph> {
        match &self.nodes {
            Nodes::Graph(g) => Some(g),
            Nodes::Key(_) => None,
        }
    }
}

/// Compiles `graph` for `device` (a cache hit when a structurally equal graph was compiled). A
/// given graph is the CPU device's to lower in place (see [`Loaded`]); a lent one is copied.
pub(crate) fn load(device: Device, graph: Cow<'_, Graph>, sites: &dyn SiteOf) -> Result<Loaded> {
    let order = graph.topo_order().to_vec();
    let located = |e: BoundsError| locate(e, &order, sites);
    let (code, nodes) = match device {
        Device::Interp => (Code::Interp, Nodes::Graph(graph.into_owned())),
        Device::Cpu => {
            let cpu = cpu_device()?;
            let (exe, key) = cpu
                .compile_taking(graph, &mut runtime::NoCompileObserver)
                .map_err(|e| runtime_error("cpu", e, located))?;
            (Code::Cpu(exe), Nodes::Key(key))
        }
        #[cfg(feature = "wgpu")]
        Device::Wgpu => {
            let exe = wgpu_device()?.compile(&graph).map_err(|e| runtime_error("wgpu", e, located))?;
            (Code::Wgpu(exe), Nodes::Graph(graph.into_owned()))
        }
        #[cfg(not(feature = "wgpu"))]
        Device::Wgpu => return Err(Error::Device(crate::device::WGPU_NOT_COMPILED.into())),
    };
    Ok(Loaded { code, order, nodes })
}

/// Says a program for `device` may be compiled soon (a trace begins): the CPU device wakes a
/// compile thread now (`runtime::CpuDevice::expect_compile`), so that its wake-up overlaps the
/// tracing. Nothing for other devices, or when the CPU device cannot be made (the compile
/// reports that).
pub(crate) fn expect_compile(device: Device) {
    if device == Device::Cpu
        && let Ok(cpu) = cpu_device()
    {
        cpu.expect_compile();
    }
}

/// The graph outputs of a loaded program that are written in place over an input's storage
/// (`lower::Program::inits`), and the input slots they are written over: the outputs' arrays
/// are the inputs' own, handed back, and a run takes those inputs' arrays.
pub(crate) fn in_place(loaded: &Loaded) -> (Vec<usize>, Vec<usize>) {
    let program = match &loaded.code {
        Code::Interp => return (Vec::new(), Vec::new()),
        Code::Cpu(exe) => exe.program(),
        #[cfg(feature = "wgpu")]
        Code::Wgpu(exe) => exe.program(),
    };
    let targets: Vec<_> = program.inits.iter().map(|(out, _)| *out).collect();
    let outputs =
        program.outputs.iter().enumerate().filter(|(_, (b, _))| targets.contains(b)).map(|(i, _)| i).collect();
    let inputs = program
        .inits
        .iter()
        .filter_map(|&(_, input)| match program.buffers[input.0 as usize].kind {
            lower::BufferKind::Input(slot) => Some(slot as usize),
            _ => None,
        })
        .collect();
    (outputs, inputs)
}

/// Runs a loaded `graph` once on `inputs`, which the run may take from: an output written in place
/// over an input takes its storage when nothing else holds it (the input is left empty). `spare` is storage for the
/// outputs that the caller no longer needs (see [`runtime::Runner::run_recycling`]).
pub(crate) fn run_loaded(
    loaded: &Loaded,
    inputs: &mut [HostTensor],
    bindings: &Bindings,
    sites: &dyn SiteOf,
    spare: Vec<air::HostData>,
) -> Result<Vec<HostTensor>> {
    crate::stats::record_execution(loaded.len());
    let located = |e: BoundsError| locate(e, loaded.order(), sites);
    let run = || match &loaded.code {
        Code::Interp => {
            let graph =
                loaded.graph().ok_or_else(|| Error::internal("an interpreted program keeps its graph".to_string()))?;
            interp(graph, inputs, bindings).map_err(|e| interp_error(e, located))
        }
        Code::Cpu(exe) => {
            let before = exe.launches_run();
            let out = exe.run_taking(inputs, bindings, spare).map_err(|e| runtime_error("cpu", e, located))?;
            crate::stats::record_cpu_run(exe.launches_run() - before);
            Ok(out)
        }
        #[cfg(feature = "wgpu")]
        Code::Wgpu(exe) => exe.run_taking(inputs, bindings, spare).map_err(|e| runtime_error("wgpu", e, located)),
    };
    if profile::is_active() { profile::span(profile::Step::Run, run) } else { run() }
}

/// A bounds error as an [`Error::Op`] at the line that built its node (`narrow: axis 0: range
/// end n = 1000 > size 4 at src/main.rs:7:13`); the air op is named too when the user called
/// another (`narrow` records a `shrink`). A node no user op built (a source) keeps the air error.
fn locate(e: BoundsError, order: &[NodeId], sites: &dyn SiteOf) -> Error {
    let site = order.get(e.position as usize).and_then(|&id| sites.site(id));
    match site {
        Some(site) if site.name == e.op => site.error(e.message),
        Some(site) => site.error(format!("{}: {}", e.op, e.message)),
        None => Error::Air(AirError::Bounds(e)),
    }
}

fn interp_error(e: AirError, located: impl Fn(BoundsError) -> Error) -> Error {
    match e {
        AirError::Bounds(b) => located(b),
        e => Error::Air(e),
    }
}

/// A device's error: a bounds error at the line that built its node, anything else an
/// [`Error::Runtime`] that keeps the error (and so its kind).
fn runtime_error(device: &'static str, e: RuntimeError, located: impl Fn(BoundsError) -> Error) -> Error {
    match e {
        RuntimeError::Bounds(b) => located(b),
        e => Error::runtime(device, e),
    }
}

/// The reference interpreter, counted in [`crate::stats::interp_runs`].
fn interp(graph: &Graph, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>, AirError> {
    crate::stats::record_interp_run();
    air::interp::eval(graph, inputs, bindings)
}

/// One run of a CPU executable, counted in [`crate::stats::cpu_runs`] with the launches it made.
fn run_cpu(exe: &runtime::Executable, inputs: &[HostTensor], bindings: &Bindings) -> runtime::Result<Vec<HostTensor>> {
    let before = exe.launches_run();
    let out = exe.run(inputs, bindings)?;
    crate::stats::record_cpu_run(exe.launches_run() - before);
    Ok(out)
}

/// [`execute`] inside a profile: every step a span.
fn execute_profiled(
    device: Device,
    graph: &Graph,
    inputs: Vec<HostTensor>,
    bindings: &Bindings,
    sites: &Sites,
) -> Result<Vec<HostTensor>> {
    let located = |e: BoundsError| locate(e, graph.topo_order(), sites);
    let cpu = match device {
        Device::Interp => {
            return profile::span(profile::Step::Run, || interp(graph, &inputs, bindings))
                .map_err(|e| interp_error(e, located));
        }
        #[cfg(not(feature = "wgpu"))]
        Device::Wgpu => return Err(Error::Device(crate::device::WGPU_NOT_COMPILED.into())),
        #[cfg(feature = "wgpu")]
        Device::Wgpu => {
            let gpu = wgpu_device()?;
            return profile::span(profile::Step::Run, || gpu.run(graph, &inputs, bindings))
                .map_err(|e| runtime_error("wgpu", e, located));
        }
        Device::Cpu => cpu_device()?,
    };
    let backend = |e: RuntimeError| runtime_error("cpu", e, located);
    let mut observer = profile::ProfileObserver::default();
    let exe = cpu.compile_observed(graph, &mut observer).map_err(backend)?;
    profile::begin(runtime::Step::MemoryPlan, None);
    let memory = exe.memory(bindings);
    profile::end(None);
    let memory = memory.map_err(backend)?;
    profile::set_memory(memory);
    let run = if observer.cache_hit() { profile::Step::Run } else { profile::Step::FirstRun };
    profile::span(run, || run_cpu(&exe, &inputs, bindings)).map_err(backend)
}

//! Running an air graph on a device: the single place that dispatches on [`Device`].

use std::sync::OnceLock;

use air::{Bindings, Graph, HostTensor};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::profile::{self, PlannedMemory};

/// The process-wide GPU device (first use picks the adapter and logs it).
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
/// Inside [`profile::profile`] the CPU device reports every step of compiling (see
/// [`runtime::CpuDevice::compile_observed`]), the memory plan for `bindings` and the run
/// (`first-run` when the program was compiled by this call, `run` when it came from the cache);
/// other devices report one `run` span. Outside a profile this costs one thread-local read.
pub fn execute(device: Device, graph: &Graph, inputs: Vec<HostTensor>, bindings: &Bindings) -> Result<Vec<HostTensor>> {
    crate::stats::record_execution(graph.len());
    if profile::is_active() {
        return execute_profiled(device, graph, inputs, bindings);
    }
    match device {
        Device::Interp => interp(graph, &inputs, bindings),
        Device::Cpu => {
            let backend = |e: runtime::RuntimeError| Error::Backend(format!("cpu: {e}"));
            let exe = cpu_device()?.compile(graph).map_err(backend)?;
            run_cpu(&exe, &inputs, bindings).map_err(backend)
        }
        Device::Wgpu => wgpu_device()?.run(graph, &inputs, bindings).map_err(|e| Error::Backend(format!("wgpu: {e}"))),
    }
}

/// The reference interpreter, counted in [`crate::stats::interp_runs`].
fn interp(graph: &Graph, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>> {
    crate::stats::record_interp_run();
    Ok(air::interp::eval(graph, inputs, bindings)?)
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
) -> Result<Vec<HostTensor>> {
    let cpu = match device {
        Device::Interp => return profile::span("run", || interp(graph, &inputs, bindings)),
        Device::Wgpu => {
            let gpu = wgpu_device()?;
            return profile::span("run", || gpu.run(graph, &inputs, bindings))
                .map_err(|e| Error::Backend(format!("wgpu: {e}")));
        }
        Device::Cpu => cpu_device()?,
    };
    let backend = |e: runtime::RuntimeError| Error::Backend(format!("cpu: {e}"));
    let mut observer = profile::ProfileObserver::default();
    let exe = cpu.compile_observed(graph, &mut observer).map_err(backend)?;
    profile::begin("memory-plan", None);
    let memory = exe.memory(bindings);
    profile::end(None);
    let memory = memory.map_err(backend)?;
    profile::set_memory(PlannedMemory {
        arena_bytes: memory.arena_bytes,
        peak_live_bytes: memory.peak_live_bytes,
        naive_bytes: memory.naive_bytes,
    });
    let run = if observer.cache_hit() { "run" } else { "first-run" };
    profile::span(run, || run_cpu(&exe, &inputs, bindings)).map_err(backend)
}

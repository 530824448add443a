//! Running an air graph on a device: the single place that dispatches on [`Device`].

use std::sync::OnceLock;

use air::{Bindings, Graph, HostTensor};

use crate::device::Device;
use crate::error::{Error, Result};

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
pub fn execute(device: Device, graph: &Graph, inputs: Vec<HostTensor>, bindings: &Bindings) -> Result<Vec<HostTensor>> {
    crate::stats::record_execution(graph.len());
    match device {
        Device::Interp => Ok(air::interp::eval(graph, &inputs, bindings)?),
        Device::Cpu => cpu_device()?.run(graph, &inputs, bindings).map_err(|e| Error::Backend(format!("cpu: {e}"))),
        Device::Wgpu => wgpu_device()?.run(graph, &inputs, bindings).map_err(|e| Error::Backend(format!("wgpu: {e}"))),
    }
}

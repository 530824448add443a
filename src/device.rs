//! Devices a tensor program can run on. `backend::execute` is the one place that dispatches on a
//! device; everything else only carries it around.

use std::fmt;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Where a tensor's program runs. The default is `Cpu`; `KILN_DEVICE` picks another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// `air::interp`, the reference interpreter: slow and obviously correct.
    Interp,
    /// Native kernels JIT-compiled with Cranelift (the runtime's `CpuDevice`).
    #[default]
    Cpu,
    /// WGSL compute shaders on a GPU through wgpu (the runtime's `WgpuDevice`). f32, i32 and
    /// bool only: WGSL has no 64-bit types, and f16/bf16 storage is not implemented yet.
    Wgpu,
}

impl Device {
    /// Every device this build can run on.
    pub const ALL: &'static [Device] = &[Device::Interp, Device::Cpu, Device::Wgpu];

    /// The name `KILN_DEVICE` uses for this device.
    pub fn name(self) -> &'static str {
        match self {
            Device::Interp => "interp",
            Device::Cpu => "cpu",
            Device::Wgpu => "wgpu",
        }
    }

    /// Parses a device name (`interp`, `cpu`, `wgpu`).
    pub fn parse(name: &str) -> Result<Device> {
        match name.trim().to_ascii_lowercase().as_str() {
            "interp" => Ok(Device::Interp),
            "cpu" => Ok(Device::Cpu),
            "wgpu" => Ok(Device::Wgpu),
            _ => Err(Error::Device(format!("unknown device `{name}` (expected interp, cpu or wgpu)"))),
        }
    }

    /// The device new source tensors go to: `KILN_DEVICE` if set (read once per process), else
    /// `Cpu`. An unknown name is an error, which tensors created with it carry to `realize`.
    pub fn default_device() -> Result<Device> {
        static DEFAULT: OnceLock<Result<Device>> = OnceLock::new();
        DEFAULT
            .get_or_init(|| match std::env::var("KILN_DEVICE") {
                Ok(name) if !name.trim().is_empty() => Device::parse(&name),
                _ => Ok(Device::Cpu),
            })
            .clone()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

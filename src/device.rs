//! Devices a tensor program can run on. `backend::execute` is the one place that runs a program
//! on a device (and [`Device::probe`] the one that starts one); everything else only carries it
//! around.
//!
//! Every constructor has a form that takes its device (`Tensor::zeros_on(.., Device::Interp)`);
//! the forms without one use [`Device::default_device`], which `KILN_DEVICE` sets for the whole
//! process. [`Device::wgpu_if_available`] picks the GPU when this build and machine have one.

use std::fmt;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Where a tensor's program runs. Constructors ending in `_on` take it explicitly; the others use
/// [`Device::default_device`] (`Cpu`, or what `KILN_DEVICE` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// `air::interp`, the reference interpreter: slow and obviously correct.
    Interp,
    /// Native kernels JIT-compiled with Cranelift (the runtime's `CpuDevice`).
    #[default]
    Cpu,
    /// WGSL compute shaders on a GPU through wgpu (the runtime's `WgpuDevice`). f32, i32, i64
    /// (emulated with 32-bit word pairs, exact), bool, and f64 where the adapter has 64-bit float
    /// shaders (`SHADER_F64`: lavapipe and NVIDIA do; elsewhere f64 is an `Unsupported` error);
    /// f16/bf16 storage is not implemented yet.
    ///
    /// The variant exists in every build; without kiln's `wgpu` cargo feature (on by default)
    /// realizing on it is an [`Error::Device`] saying so.
    Wgpu,
}

/// The error for `Device::Wgpu` in a build without the `wgpu` feature.
#[cfg(not(feature = "wgpu"))]
pub(crate) const WGPU_NOT_COMPILED: &str = "wgpu support not compiled in (enable the kiln feature \"wgpu\")";

impl Device {
    /// Every device this build can run on.
    #[cfg(feature = "wgpu")]
    pub const ALL: &'static [Device] = &[Device::Interp, Device::Cpu, Device::Wgpu];

    /// Every device this build can run on (built without the `wgpu` feature).
    #[cfg(not(feature = "wgpu"))]
    pub const ALL: &'static [Device] = &[Device::Interp, Device::Cpu];

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

    /// The device constructors without a device argument use: `KILN_DEVICE` if set (read once per
    /// process), else `Cpu`. An unknown name is an error, which tensors created with it carry to
    /// `realize`. Code that knows its device passes it instead (`Tensor::from_vec_on`, ...).
    pub fn default_device() -> Result<Device> {
        static DEFAULT: OnceLock<Result<Device>> = OnceLock::new();
        DEFAULT
            .get_or_init(|| match std::env::var("KILN_DEVICE") {
                Ok(name) if !name.trim().is_empty() => Device::parse(&name),
                _ => Ok(Device::Cpu),
            })
            .clone()
    }

    /// Starts this device's process-wide instance if that has not happened yet (the CPU JIT, the
    /// wgpu adapter and queue), so that realizing on it can work; the error says why it cannot
    /// (no GPU adapter, or a build without the `wgpu` feature). The interpreter is always there.
    pub fn probe(self) -> Result<()> {
        match self {
            Device::Interp => Ok(()),
            Device::Cpu => crate::backend::cpu_device().map(drop),
            #[cfg(feature = "wgpu")]
            Device::Wgpu => crate::backend::wgpu_device().map(drop),
            #[cfg(not(feature = "wgpu"))]
            Device::Wgpu => Err(Error::Device(WGPU_NOT_COMPILED.into())),
        }
    }

    /// `Wgpu` when this build has the `wgpu` feature and a GPU adapter can be created here (a
    /// software one such as lavapipe counts), else `Cpu`. The probe runs once per process.
    pub fn wgpu_if_available() -> Device {
        static PICKED: OnceLock<Device> = OnceLock::new();
        *PICKED.get_or_init(|| if Device::Wgpu.probe().is_ok() { Device::Wgpu } else { Device::Cpu })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

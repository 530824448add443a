//! runtime: devices, buffers, and the VM that runs a compiled program.
//!
//! A [`Device`] turns an `air::Graph` into something that runs: the [`CpuDevice`] (native loop
//! kernels from `codegen`, GEMM for matmuls, rayon for threads) and, with the `wgpu` cargo feature
//! (on by default), the `wgpu::WgpuDevice` (WGSL compute shaders from `codegen::wgsl`). The
//! runtime never sees rewrite rules, and user input never panics it: every failure is a
//! [`RuntimeError`]. It prints nothing: diagnostics (the wgpu adapter it picked) go through the
//! `log` facade, and it leaves the process's allocator alone unless asked
//! ([`memory::tune_host_allocator`]).
//!
//! ```text
//! CpuDevice::compile(graph)                         Executable::run(inputs, bindings)
//!   key = GraphKey::of(graph)   (structure only)      sizes for these bindings  (cached)
//!   cache hit? -> Arc<Executable>                     validate inputs (slot, dtype, shape)
//!   lower::compile -> Program                         arena (one, reused), fresh outputs
//!   codegen per unique loop kernel                    pointer table, launch steps in order
//! ```
//!
//! # Decisions (the measurements behind them are in BENCHMARKS.md)
//!
//! - **GEMM crate**: `gemm` 0.19 (with its runtime-dispatched AVX-512 kernels, feature `x86-v4`)
//!   over `matrixmultiply` 0.3.11: faster on every shape measured, with one thread and with two,
//!   and at least as fast as numpy/OpenBLAS on the same machine.
//! - **Launch overhead** is kept to a few nanoseconds per kernel launch (no allocation or hashing
//!   per step); `cargo bench --bench vm_overhead` measures it.
//! - **Parallel threshold**: see [`vm::PARALLEL_MIN_WORK`].
//! - **Independent steps at the same time**: a dependency level whose steps are worth it runs
//!   concurrently, one step per thread (N equal matmuls: a grouped GEMM); see [`levels`].

pub mod cpu;
pub mod error;
pub mod key;
pub mod levels;
pub mod matmul;
pub mod memory;
pub mod observe;
pub mod parallel;
pub mod vm;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use std::sync::Arc;

use air::{Bindings, Graph, HostTensor};

pub use cpu::{CpuDevice, CpuStats};
pub use error::{Result, RuntimeError};
pub use key::GraphKey;
pub use observe::{CompileObserver, NoCompileObserver};
pub use vm::{Executable, LaunchTime, MemoryStats};

/// A device programs run on: one variant per backend (`Wgpu` with the `wgpu` feature).
#[derive(Clone, Debug)]
pub enum Device {
    Cpu(CpuDevice),
    #[cfg(feature = "wgpu")]
    Wgpu(wgpu::WgpuDevice),
}

/// A program compiled for a [`Device`].
#[derive(Clone)]
pub enum Compiled {
    Cpu(Arc<Executable>),
    #[cfg(feature = "wgpu")]
    Wgpu(Arc<wgpu::WgpuExecutable>),
}

impl Device {
    /// The CPU device with default options.
    pub fn cpu() -> Result<Device> {
        Ok(Device::Cpu(CpuDevice::new()?))
    }

    /// The device's short name (`cpu`).
    pub fn name(&self) -> &'static str {
        match self {
            Device::Cpu(_) => "cpu",
            #[cfg(feature = "wgpu")]
            Device::Wgpu(_) => "wgpu",
        }
    }

    /// Compiles `graph` (or finds it in the device's cache).
    pub fn compile(&self, graph: &Graph) -> Result<Compiled> {
        match self {
            Device::Cpu(d) => Ok(Compiled::Cpu(d.compile(graph)?)),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(d) => Ok(Compiled::Wgpu(d.compile(graph)?)),
        }
    }

    /// Compiles (or finds) `graph` and runs it once.
    pub fn run(&self, graph: &Graph, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>> {
        self.compile(graph)?.run(inputs, bindings)
    }
}

impl Compiled {
    /// Runs the program; see [`Executable::run`].
    pub fn run(&self, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>> {
        match self {
            Compiled::Cpu(e) => e.run(inputs, bindings),
            #[cfg(feature = "wgpu")]
            Compiled::Wgpu(e) => Ok(e.run(inputs, bindings)?),
        }
    }
}

//! runtime: devices, buffers, and the VM that runs a compiled program.
//!
//! A [`Device`] turns an `air::Graph` into something that runs: today the [`CpuDevice`] (native
//! loop kernels from `codegen`, GEMM for matmuls, rayon for threads); a wgpu device joins the
//! enum later. The runtime never sees rewrite rules or egg, and user input never panics it: every
//! failure is a [`RuntimeError`].
//!
//! ```text
//! CpuDevice::compile(graph)                         Executable::run(inputs, bindings)
//!   key = GraphKey::of(graph)   (structure only)      sizes for these bindings  (cached)
//!   cache hit? -> Arc<Executable>                     validate inputs (slot, dtype, shape)
//!   lower::compile -> Program                         arena (one, reused), fresh outputs
//!   codegen per unique loop kernel                    pointer table, launch steps in order
//! ```
//!
//! # Decisions and measurements (2-core AMD EPYC, family 25, AVX-512; machine shared with builds)
//!
//! - **GEMM crate**: `gemm` 0.19 (with its runtime-dispatched AVX-512 kernels, feature `x86-v4`)
//!   over `matrixmultiply` 0.3.11. Bare calls, 2 threads, median of 15: (512x1024)@(1024x2048)
//!   205 vs 139 GFLOP/s, 1024^3 203 vs 164 GFLOP/s; 1 thread: 106 vs 97 and 108 vs 99. Through
//!   the VM (`cargo bench --bench matmul`), 1024^3 reached 192-203 GFLOP/s. Back to back under the same
//!   background load, numpy 2.4.6 / OpenBLAS 0.3.31 with 2 threads gave 41-67 GFLOP/s where the
//!   bare `gemm` gave 99-102 and the VM 99: at least numpy here. One core peaks near 118 GFLOP/s
//!   (two 256-bit FMA pipes), so 2 threads top out near 235.
//! - **Launch overhead** (`cargo bench --bench vm_overhead`): 100 one-element kernel launches run
//!   in 0.8-1.4 us (8-14 ns per launch); a cached one-kernel graph takes 0.17-0.22 us through
//!   `Executable::run` and 0.45-0.74 us through `CpuDevice::run` (which also computes the graph key).
//! - **Parallel threshold**: see [`vm::PARALLEL_MIN_WORK`].
//! - **Independent steps at the same time**: a dependency level whose steps are worth it runs
//!   concurrently, one step per thread (N equal matmuls: a grouped GEMM); see [`levels`].

pub mod cpu;
pub mod error;
pub mod levels;
pub mod matmul;
pub mod memory;
pub mod observe;
pub mod parallel;
pub mod vm;
pub mod wgpu;

use std::sync::Arc;

use air::{Bindings, Graph, HostTensor};

pub use air::GraphKey;
pub use cpu::{CpuDevice, CpuStats};
pub use error::{Result, RuntimeError};
pub use observe::{CompileObserver, NoCompileObserver, Step};
pub use vm::{Executable, LaunchTime, MemoryStats};

/// A device programs run on. One variant per backend; a `Wgpu` device joins later.
#[derive(Clone, Debug)]
pub enum Device {
    Cpu(CpuDevice),
    Wgpu(wgpu::WgpuDevice),
}

/// A program compiled for a [`Device`].
#[derive(Clone)]
pub enum Compiled {
    Cpu(Arc<Executable>),
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
            Device::Wgpu(_) => "wgpu",
        }
    }

    /// Compiles `graph` (or finds it in the device's cache).
    pub fn compile(&self, graph: &Graph) -> Result<Compiled> {
        match self {
            Device::Cpu(d) => Ok(Compiled::Cpu(d.compile(graph)?)),
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
            Compiled::Wgpu(e) => Ok(e.run(inputs, bindings)?),
        }
    }
}

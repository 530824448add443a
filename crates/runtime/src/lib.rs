//! runtime: devices, buffers, and the VM that runs a compiled program.
//!
//! A device turns an `air::Graph` into something that runs: the [`CpuDevice`] (native loop
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

pub mod backend;
pub mod cpu;
pub mod error;
pub mod levels;
pub mod matmul;
pub mod memory;
pub mod observe;
mod panel;
pub mod parallel;
pub mod prepared;
pub mod vm;
#[cfg(feature = "wgpu")]
pub mod wgpu;
pub mod window;

pub use air::GraphKey;
pub use backend::{Backend, BindingSet, Runner};
pub use codegen::lru;
pub use cpu::{CpuDevice, CpuStats, JitMode};
pub use error::{ErrorKind, InputSpec, Result, RuntimeError};
pub use lower::MemoryStats;
pub use observe::{CompileObserver, NoCompileObserver, Step};
pub use prepared::{Prepared, Sizes};
pub use vm::{CALIBRATION_RUNS, CpuCode, Executable, InPlace, LaunchTime, LoopCode, time_first_runs};

//! runtime: devices, buffers, and the VM that runs a compiled program.
//!
//! A device turns an `air::Graph` into something that runs: today the [`CpuDevice`] (native
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

pub mod backend;
pub mod cpu;
pub mod error;
pub mod levels;
pub mod matmul;
pub mod memory;
pub mod observe;
pub mod parallel;
pub mod prepared;
pub mod vm;
pub mod wgpu;

pub use air::GraphKey;
pub use backend::{Backend, BindingSet, Runner};
pub use cpu::{CpuDevice, CpuStats};
pub use error::{ErrorKind, InputSpec, Result, RuntimeError};
pub use lower::MemoryStats;
pub use observe::{CompileObserver, NoCompileObserver, Step};
pub use prepared::{Prepared, Sizes};
pub use vm::{CpuCode, Executable, LaunchTime};

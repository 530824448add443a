//! codegen: the kernel IR emitted as native CPU code (Cranelift) and as WGSL compute shaders.
//!
//! - [`cpu`]: kir loop kernels -> Cranelift IR -> machine code in memory ([`CpuCompiler`]).
//! - `wgsl` (to come): the same kernels as WGSL for wgpu.
//!
//! Matmul kernels are not compiled by either: the runtime hands them to a GEMM.
//! This crate knows nothing of graphs, devices or the runtime; it only sees `lower::kir`.

pub mod cpu;
pub mod error;
pub mod lru;
pub mod wgsl;

pub use cpu::{CacheStats, CompiledKernel, CpuCompiler, KernelFn, clif_text};
pub use error::{CodegenError, Result};

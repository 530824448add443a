//! codegen: the kernel IR emitted as native CPU code (Cranelift) and as WGSL compute shaders.
//!
//! - [`cpu`]: kir loop kernels -> Cranelift IR -> machine code in memory ([`CpuCompiler`]).
//! - [`wgsl`]: the same kernels (matmuls included, as a tiled shader) as WGSL compute shaders,
//!   which the runtime's wgpu device runs. Plain Rust text generation: this crate does not
//!   depend on wgpu or naga (its tests validate every shader with naga).
//!
//! On the CPU, matmul kernels are not compiled: the runtime hands them to a GEMM.
//! This crate knows nothing of graphs, devices or the runtime; it only sees `lower::kir`.

pub mod cpu;
pub mod error;
pub mod lru;
pub mod wgsl;

pub use cpu::{
    CacheStats, CompiledKernel, CpuCompiler, EARLY_COMPILE_ENV, EarlyCompile, JIT_ENV, JitMode, KernelEntry, KernelFn,
    TileLevel, TileMode, Tiling, clif_text, clif_text_with, wait_tier_up_all,
};
pub use error::{CodegenError, Result};

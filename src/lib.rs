//! Kiln: lazy tensors that compile to fast kernels. The user-facing facade over the air IR.
//!
//! A [`Tensor`] is a cheap handle to a node of a lazy DAG. Ops (PyTorch names and semantics)
//! only record nodes; [`realize`], [`Tensor::to_vec`] or [`Tensor::item`] trace the DAG into an
//! [`air::Graph`] and run it on the tensor's [`Device`]. Ops never return `Result`: invalid
//! inputs give an error tensor whose [`Error`] (naming the op, the shapes and your source line)
//! comes back from `realize`.
//!
//! ```
//! use kiln::prelude::*;
//!
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
//! let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2]);
//! let y = (x.matmul(&w) + 1.0).relu();          // lazy: nothing has run yet
//! assert!(!y.is_realized());
//! assert_eq!(y.to_vec::<f32>()?, vec![5.0, 6.0, 11.0, 12.0]);
//! assert_eq!(y.sum_all().item::<f32>()?, 34.0);
//!
//! // A shape error is reported when the result is asked for, with the op and the caller's line.
//! let bad = x.matmul(&x);
//! let err = bad.to_vec::<f32>().unwrap_err().to_string();
//! assert!(err.starts_with("matmul: shapes [2, 3] and [2, 3] do not match"));
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! Where things live: `tensor` (the handle and the primitives), `ops/*` (every op, as compositions
//! of air primitives; `ops/matmul.rs` holds the canonical matmul pattern), `realize` (tracing and
//! running), `record` (functions recorded once and called as one node), `backend` (the one place
//! that dispatches on a device).
//!
//! Cargo features: `wgpu` (default) builds the GPU device; without it `Device::Wgpu` still exists
//! and realizing on it is an error saying the feature is off.

mod autograd;
pub mod backend;
pub mod device;
pub mod error;
pub mod jit;
mod ops;
pub mod profile;
mod random;
mod realize;
pub mod record;
mod scalar;
mod shape;
pub mod stats;
mod tensor;
mod trace_cache;
pub mod tree;
pub use tree::Tree;

pub use air::{Bindings, DType, Dim, Element, GraphKey, HostData, HostTensor, Scalar, Shape, Symbol, TensorType};
pub use autograd::{grad, is_grad_enabled, no_grad};
pub use device::Device;
pub use error::{Error, ErrorKind, Result, RuntimeError, SharedRuntimeError};
pub use jit::{Jit, JitCache, JitOutput, jit};
#[allow(deprecated)]
pub use ops::elementwise::where_;
pub use ops::elementwise::{GeluApprox, where_cond};
pub use ops::index::{cat, stack};
pub use random::manual_seed;
pub use realize::{Program, realize, trace};
pub use record::Recorder;
pub use scalar::{Arg, IntoScalar, Operand};
pub use shape::{Axes, Axis, IntoShape};
pub use tensor::Tensor;

/// Tunes the C allocator (glibc's `malloc`) of the whole process for Kiln's CPU device, once;
/// returns whether it applied the settings. Kiln never does this on its own: call it at the start
/// of an application that realizes large tensors on the CPU repeatedly (the `kiln` command and
/// the benchmarks do), or set `KILN_MALLOC_TUNING=1`; `KILN_MALLOC_TUNING=0` turns even an explicit
/// call into a no-op.
///
/// What it changes: glibc's `M_MMAP_THRESHOLD` is raised to 32 MiB and `M_TRIM_THRESHOLD` to
/// 512 MiB (which also stops glibc adjusting them on the fly). It is process-wide: it affects
/// every allocation of the program, not only Kiln's, and cannot be undone.
///
/// Why: every realize hands back fresh output arrays that the caller owns and later frees. With
/// glibc's defaults, large freed blocks go back to the OS, so the next realize's outputs land on
/// fresh pages and pay a page fault per 4 KiB inside the kernels; with the raised thresholds they
/// stay in the heap and are reused warm. The cost: up to 512 MiB of freed memory can stay mapped
/// (and counted in the RSS) after a peak. Only Linux with glibc is affected (elsewhere this
/// returns `false`), and a program with its own `#[global_allocator]` is unaffected in practice.
/// BENCHMARKS.md has measurements.
pub fn tune_host_allocator() -> bool {
    runtime::memory::tune_host_allocator()
}

/// Blocks until every loop kernel compiled so far for the CPU runs optimised code.
///
/// The CPU's JIT has two tiers (`KILN_JIT`, ARCHITECTURE.md): a kernel is first compiled quickly
/// (about 40% less compile time, code up to 2x slower on index-heavy kernels), and once its
/// program runs a second time a background thread at idle priority recompiles it with
/// Cranelift's optimisations and swaps the faster code in. Programs never need to wait for that;
/// a benchmark of steady-state speed calls this after its warm-up so that it times the code a
/// long-running program settles on.
pub fn wait_tier_up() {
    runtime::cpu::wait_tier_up_all();
}

/// The usual imports: `use kiln::prelude::*;`.
pub mod prelude {
    pub use crate::{DType, Device, Dim, Error, GeluApprox, Tensor, cat, manual_seed, realize, stack, where_cond};
}

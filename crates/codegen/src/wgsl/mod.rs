//! kir kernels as WGSL compute shaders, for the wgpu device of the runtime.
//!
//! [`generate`] turns one [`Kernel`] into a [`WgslKernel`]: the shader text, its entry point, its
//! bind-group layout in kir terms, and how many workgroups a launch needs for given symbol values
//! ([`Dispatch::workgroups`]). The generator never talks to a GPU; the runtime compiles the text.
//!
//! # Bindings
//!
//! `@group(0) @binding(0)` is `syms: array<vec4<i32>, K>` (uniform; symbol `n` is
//! `syms[n / 4][n % 4]`, so symbol values must fit in `i32`). Buffer parameter `p` is
//! `@binding(p + 1)`, a `storage` array, `read` for `Access::Read` and `read_write` for
//! `Access::Write`. Index arithmetic is `i32` (a storage binding holds far fewer than 2^31
//! elements on every device wgpu supports).
//!
//! # Dtypes
//!
//! | kir dtype | in a buffer            | in registers | notes                                      |
//! |-----------|------------------------|--------------|--------------------------------------------|
//! | `f32`     | `f32`                  | `f32`        | native                                     |
//! | `i32`     | `i32`                  | `i32`        | native, wrapping                           |
//! | `bool`    | `u32` holding 0 or 1   | `bool`       | 4 bytes per element on the device          |
//! | `f16`     | -                      | -            | unsupported: `CodegenError::Unsupported`   |
//! | `bf16`    | -                      | -            | unsupported: `CodegenError::Unsupported`   |
//! | `i64`     | `vec2<u32>` (lo, hi)   | `vec2<u32>`  | emulated, exact, wrapping (see below)      |
//! | `f64`     | `f64`                  | `f64`        | native, needs `SHADER_F64` (see below)     |
//!
//! WGSL has no 64-bit integers, so an `i64` is a pair of 32-bit words: `x` the low word, `y` the
//! high word, two's complement. That is the byte layout of a little-endian `i64`, so the runtime
//! uploads and downloads `i64` buffers unchanged and no value is narrowed. Word-wise operations
//! (`and`, `or`, `not`, `==`, `!=`, `select`, sign extension, truncation to `i32`) are inline;
//! `add`/`sub`/`neg` propagate a carry, `mul` builds the 64-bit product of the low words from
//! 16-bit halves, signed `<`/`max`/`min` compare the high words as `i32` then the low words as
//! `u32`, `div`/`mod` divide magnitudes (one `u32` division when both fit, else 64 rounds of
//! shift-and-subtract) and fix the signs, and the float casts round and saturate as Rust's `as`
//! does (`int64.rs`). Results are exactly `air::scalar`'s. An `i64` gather or `scatter_add`
//! index is in range only when its high word is 0 and its low word is below the size; the status
//! words of a failure hold its two halves. `i64` sums and maxima reduce like `i32` ones.
//!
//! `f64` is naga's `f64` (not core WGSL): a shader that uses it validates only with naga's
//! `FLOAT64` capability, which wgpu grants when the device has `SHADER_F64` (Vulkan's
//! `shaderFloat64`: lavapipe and NVIDIA have it). [`WgslKernel::uses_f64`] says whether a kernel
//! needs it; the runtime refuses such a kernel on an adapter without it, naming the adapter.
//! `+ - * /`, compares, `select`, `sqrt`, `floor` and `ldexp` are native;
//! everything else is a helper in `float64.rs`, written without reading a float's bits (WGSL
//! cannot bitcast an `f64`): NaN is `!(x == x)`, the sign of a zero that of `1 / x`. Vulkan's
//! GLSL.std.450 `Exp2`, `Log2`, `Sin`, `Pow` take no 64-bit floats, so those are range
//! reduction plus polynomials (`sin` reduces any finite argument modulo `pi/2` exactly enough,
//! Payne-Hanek style); casts to and from every dtype are exact or round and saturate as Rust's
//! `as` does. Sums accumulate in `f64`, like the interpreter's (in the kernel's order).
//!
//! `f16`/`bf16` are refused rather than emulated: two halves share a 32-bit word, so a store needs
//! atomics (or one thread per word) to avoid racing with the neighbour's store; that, and the
//! `shader-f16` path, are left for later. [`device_elem_bytes`] is what the runtime sizes buffers
//! with.
//!
//! # Kernel shapes
//!
//! - A kernel whose body is one top-level `parallel` loop becomes a grid-stride loop over
//!   `global_invocation_id.x` (workgroup size [`ELEMENTWISE_WG`]), so any extent works with at most
//!   [`MAX_WORKGROUPS`] workgroups. The loops nested alone inside it (each its parent's only
//!   statement, extents free of loop variables) join it: one flat index over the product of
//!   their extents, split back into the variables. A short parallel loop (a symbolic batch
//!   of one) then does not leave one invocation the whole nest: slow on any GPU, and wrong on
//!   lavapipe, which ends an invocation's loops after 65,535 iterations without an error.
//! - When that loop's body (or, without a parallel loop, the kernel body) is "accumulators, one
//!   reduce loop nest, epilogue" and the reduction is long (at least [`WG_REDUCE_MIN`] elements, or
//!   symbolic), it becomes a workgroup reduction: one workgroup per output row (rows grid-strided
//!   over workgroups), the reduce nest flattened and strided over the [`REDUCE_WG`] threads, a tree
//!   reduction in `var<workgroup>` memory, and the epilogue run by thread 0.
//! - Any other kernel runs its whole body in one invocation (correct, not fast).
//! - `Kernel::Matmul` becomes a tiled GEMM: 64x64 output tiles per 16x16 workgroup, each thread a
//!   4x4 register block, 16-deep K slices staged through `var<workgroup>` memory, with the
//!   operands' strides (transposes) and batch strides applied in the loads; one shader text for
//!   `f32` and `f64` (lowering makes matmul kernels of `f32` contractions only so far).
//!
//! # Data-dependent checks
//!
//! The status buffer parameter of a kernel (see `lower::kir`) is declared
//! `array<atomic<i32>>`; a failing check sets word 0 with `atomicCompareExchangeWeak` (retried
//! while the word is still 0, so a spurious failure cannot lose the report) and then the value
//! words. Gather and scatter indices may be `i32` or `i64`. A
//! `scatter_add` kernel needs no float atomics: its parallel loop runs over the output positions
//! off the scattered axis, and each invocation zeroes its line and adds its `K` index positions
//! in order, so the work is `O(numel(out) + numel(index))` spread over `numel(out) / A` threads.
//!
//! # Semantics (against `air::interp`)
//!
//! Matched: integer `div`/`mod` by zero give 0 (and are reported through the status buffer) and
//! `MIN / -1` wraps; `max`/`min` of floats
//! propagate NaN and order `-0 < +0` (NaN tests read the bits, so fast-math drivers keep them);
//! float-to-int casts truncate, saturate, and give 0 for NaN; a float is `true` as a bool when its
//! bits (sign aside) are non-zero; `cmpne` is `!(a == b)`; `erf` is a polynomial (Taylor series
//! below 0.5, Abramowitz-Stegun 7.1.26 above: absolute error under 2e-7); `pow` handles negative
//! bases with integer exponents, `pow(x, 0) = 1` and `pow(1, y) = 1`.
//! `f64` matches the same list (and `pow(-0, y)` keeps the sign of zero); `exp2`, `log2`, `sin`
//! are within a few ULP of libm and `erf` within a few more (the bounds are asserted in
//! `crates/runtime/tests/gpu/wgpu_ops.rs`). Lavapipe's `f64` `trunc` and `f64 <-> u32` conversions
//! are wrong for some values, so the helpers build `trunc` from `floor` and convert words through
//! `i32`.
//! Deviations: float sums accumulate in `f32` in the kernel's order (a tree order in workgroup
//! reductions), where the interpreter sums in `f64`; `exp2`/`log2`/`sin`/`sqrt`/`/` have the
//! driver's precision (Vulkan allows a few ULP; `sin` is only absolutely accurate to about 2^-11
//! on `[-pi, pi]`); `pow` is `exp2(y * log2(|x|))` (relative error grows with `|y * log2 x|`);
//! float `mod` is the driver's `OpFRem`; `pow(-0, y)` ignores the sign of zero. For `f64`: `/`
//! and `sqrt` have the driver's precision (correctly rounded on lavapipe and NVIDIA, though
//! Vulkan only promises single-precision accuracy), `pow` is `exp2(y * log2(|x|))` like the
//! `f32` one (relative error grows with `|y * log2 x|`, about 1e-13 at 1000), and subnormal
//! results depend on the driver preserving `f64` denormals.

mod emit;
mod float64;
mod int64;
mod matmul;

use lower::kir::{IExpr, Kernel, Stmt};

use crate::error::{CodegenError, Result};
use air::DType;

/// Threads per workgroup of element-wise (grid-stride) kernels.
pub const ELEMENTWISE_WG: u32 = 256;
/// Threads per workgroup of workgroup reductions (a power of two).
pub const REDUCE_WG: u32 = 256;
/// Reductions with at least this many elements per output (or a symbolic count) use a workgroup
/// per output; shorter ones use a thread per output.
pub const WG_REDUCE_MIN: i64 = 128;
/// The most workgroups one dispatch dimension gets (WebGPU's guaranteed limit); grid-stride loops
/// cover the rest.
pub const MAX_WORKGROUPS: u32 = 65535;
/// Output tile of the matmul shader (rows and columns per workgroup).
pub const MATMUL_TILE: i64 = 64;

/// How many workgroups one launch of a kernel needs, as a function of the symbol values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dispatch {
    /// `ceil(extent / per_workgroup)` workgroups (grid-stride loop over `extent`).
    Grid { extent: IExpr, per_workgroup: u32 },
    /// One workgroup per row (`rows` of them).
    Rows { rows: IExpr },
    /// Exactly one workgroup.
    Single,
    /// `(ceil(n / tile), ceil(m / tile), batch)` workgroups.
    Matmul { m: IExpr, n: IExpr, batch: IExpr },
}

impl Dispatch {
    /// The workgroup counts for symbol values `syms`, each clamped to [`MAX_WORKGROUPS`] (the
    /// shaders grid-stride over the rest). `None` when there is nothing to do (a zero extent).
    pub fn workgroups(&self, syms: &[i64]) -> Option<[u32; 3]> {
        let clamp = |x: i64| x.clamp(0, MAX_WORKGROUPS as i64) as u32;
        let wg = match self {
            Dispatch::Grid { extent, per_workgroup } => {
                let e = extent.eval(&[], syms);
                [clamp(div_ceil(e, *per_workgroup as i64)), 1, 1]
            }
            Dispatch::Rows { rows } => [clamp(rows.eval(&[], syms)), 1, 1],
            Dispatch::Single => [1, 1, 1],
            Dispatch::Matmul { m, n, batch } => {
                let (m, n, b) = (m.eval(&[], syms), n.eval(&[], syms), batch.eval(&[], syms));
                [clamp(div_ceil(n, MATMUL_TILE)), clamp(div_ceil(m, MATMUL_TILE)), clamp(b)]
            }
        };
        if wg.contains(&0) { None } else { Some(wg) }
    }
}

fn div_ceil(a: i64, b: i64) -> i64 {
    if a <= 0 { 0 } else { (a + b - 1) / b }
}

/// One kernel as WGSL, with what the runtime needs to launch it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslKernel {
    /// The shader module's text.
    pub source: String,
    /// The compute entry point's name.
    pub entry: &'static str,
    /// Number of `vec4<i32>` the `syms` uniform array declares (at least 1).
    pub sym_vec4s: u32,
    /// Per buffer parameter (binding `p + 1`): whether it is declared `read_write` (else `read`);
    /// the bind-group layout must say the same.
    pub read_write: Vec<bool>,
    /// The workgroup counts of a launch.
    pub dispatch: Dispatch,
    /// Threads per workgroup (for reports).
    pub workgroup_size: [u32; 3],
    /// How the kernel was mapped, for reports and tests (`grid`, `workgroup-reduce`, `single`,
    /// `matmul`).
    pub strategy: &'static str,
    /// Whether the shader uses `f64` (buffers, registers or accumulators), so the device needs
    /// `SHADER_F64` (naga's `FLOAT64` capability) to compile it.
    pub uses_f64: bool,
}

/// Bytes one element of `dtype` takes in a device buffer (`bool` is a 32-bit word, `i64` two, in
/// the host's little-endian layout), or `Unsupported` for dtypes WGSL kernels do not handle.
pub fn device_elem_bytes(dtype: DType) -> Result<usize> {
    match dtype {
        DType::F32 | DType::I32 | DType::Bool => Ok(4),
        DType::I64 | DType::F64 => Ok(8),
        other => Err(unsupported_dtype(other)),
    }
}

pub(crate) fn unsupported_dtype(dtype: DType) -> CodegenError {
    CodegenError::Unsupported(format!(
        "dtype {dtype} on wgpu (half-precision storage is not implemented in the WGSL backend); use f32, f64, i32, i64 or bool"
    ))
}

/// Generates the WGSL shader of `kernel` (read parameters declared `read`).
pub fn generate(kernel: &Kernel) -> Result<WgslKernel> {
    generate_with_access(kernel, &[])
}

/// Generates the WGSL shader of `kernel`, declaring parameter `p` `read_write` when it is written
/// or `force_read_write[p]` is true. A runtime that binds several parameters to ranges of one
/// buffer needs that: wgpu tracks usage per buffer, and a buffer bound both `read` and
/// `read_write` in one dispatch is a usage conflict.
pub fn generate_with_access(kernel: &Kernel, force_read_write: &[bool]) -> Result<WgslKernel> {
    for p in kernel.params() {
        device_elem_bytes(p.dtype)?;
    }
    let mut w = match kernel {
        Kernel::Loops(k) => emit::loop_kernel(k, force_read_write)?,
        Kernel::Matmul(m) => matmul::matmul_kernel(m, force_read_write)?,
    };
    w.uses_f64 = uses_f64(kernel);
    Ok(w)
}

/// Whether any parameter, register or accumulator of `kernel` is `f64`.
pub fn uses_f64(kernel: &Kernel) -> bool {
    fn stmts(body: &[Stmt]) -> bool {
        body.iter().any(|s| match s {
            Stmt::Let { dtype, .. } | Stmt::AccInit { dtype, .. } => *dtype == DType::F64,
            Stmt::Loop { body, .. } => stmts(body),
            _ => false,
        })
    }
    kernel.params().iter().any(|p| p.dtype == DType::F64)
        || match kernel {
            Kernel::Loops(k) => stmts(&k.body),
            Kernel::Matmul(m) => m.dtype == DType::F64,
        }
}

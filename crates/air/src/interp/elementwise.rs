//! Element-wise numerics of the interpreter: unary and binary ops, `where`, casts and fills.
//!
//! Each op first picks one plain scalar function for the operand dtype from `crate::scalar` (or
//! reports the dtype as unsupported), then maps that function over the elements. `f16` and `bf16`
//! elements are widened to `f32`, computed, and rounded back to storage after every op.

use half::{bf16, f16};

use crate::dtype::{DType, Scalar};
use crate::host::{Element, HostData};
use crate::op::{BinaryOp, UnaryOp};
use crate::scalar::{
    bool_binary, bool_unary, compare, float_binary, float_to_bool, float_to_f32, float_to_i32, float_to_i64,
    float_unary, int_binary, int_to_bool, int_to_f32, int_to_f64, int_to_i32, int_unary, to_bf16, to_f16,
};

/// The 16-bit storage floats, which compute in `f32`.
pub(super) trait Half: Copy {
    fn widen(self) -> f32;
    fn narrow(x: f32) -> Self;
}
impl Half for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(x: f32) -> Self {
        to_f16(x)
    }
}
impl Half for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(x: f32) -> Self {
        to_bf16(x)
    }
}

fn map<T: Copy, U>(v: &[T], f: fn(T) -> U) -> Vec<U> {
    v.iter().map(|&x| f(x)).collect()
}

fn map_half<H: Half>(v: &[H], f: fn(f32) -> f32) -> Vec<H> {
    v.iter().map(|&x| H::narrow(f(x.widen()))).collect()
}

fn zip<T: Copy, U>(a: &[T], b: &[T], f: fn(T, T) -> U) -> Vec<U> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

fn zip_half<H: Half>(a: &[H], b: &[H], f: fn(f32, f32) -> f32) -> Vec<H> {
    a.iter().zip(b).map(|(&x, &y)| H::narrow(f(x.widen(), y.widen()))).collect()
}

/// Applies a unary op to every element.
pub(super) fn unary(op: UnaryOp, x: &HostData) -> Result<HostData, String> {
    let unsupported = || format!("{} does not support dtype {}", op.name(), x.dtype());
    Ok(match x {
        HostData::Bool(v) => HostData::Bool(map(v, bool_unary(op).ok_or_else(unsupported)?)),
        HostData::I32(v) => HostData::I32(map(v, int_unary(op).ok_or_else(unsupported)?)),
        HostData::I64(v) => HostData::I64(map(v, int_unary(op).ok_or_else(unsupported)?)),
        HostData::F16(v) => HostData::F16(map_half(v, float_unary(op).ok_or_else(unsupported)?)),
        HostData::BF16(v) => HostData::BF16(map_half(v, float_unary(op).ok_or_else(unsupported)?)),
        HostData::F32(v) => HostData::F32(map(v, float_unary(op).ok_or_else(unsupported)?)),
        HostData::F64(v) => HostData::F64(map(v, float_unary(op).ok_or_else(unsupported)?)),
    })
}

/// Applies a binary op element by element to two arrays of one dtype and length.
pub(super) fn binary(op: BinaryOp, a: &HostData, b: &HostData) -> Result<HostData, String> {
    if a.dtype() != b.dtype() || a.len() != b.len() {
        return Err(format!(
            "{}: operands differ: {} x {} and {} x {}",
            op.name(),
            a.dtype(),
            a.len(),
            b.dtype(),
            b.len()
        ));
    }
    let unsupported = || format!("{} does not support dtype {}", op.name(), a.dtype());
    if op.is_comparison() {
        let out = match (a, b) {
            (HostData::Bool(x), HostData::Bool(y)) => zip(x, y, compare(op).ok_or_else(unsupported)?),
            (HostData::I32(x), HostData::I32(y)) => zip(x, y, compare(op).ok_or_else(unsupported)?),
            (HostData::I64(x), HostData::I64(y)) => zip(x, y, compare(op).ok_or_else(unsupported)?),
            (HostData::F16(x), HostData::F16(y)) => zip(x, y, compare(op).ok_or_else(unsupported)?),
            (HostData::BF16(x), HostData::BF16(y)) => zip(x, y, compare(op).ok_or_else(unsupported)?),
            (HostData::F32(x), HostData::F32(y)) => zip(x, y, compare(op).ok_or_else(unsupported)?),
            (HostData::F64(x), HostData::F64(y)) => zip(x, y, compare(op).ok_or_else(unsupported)?),
            _ => return Err(unsupported()),
        };
        return Ok(HostData::Bool(out));
    }
    Ok(match (a, b) {
        (HostData::Bool(x), HostData::Bool(y)) => HostData::Bool(zip(x, y, bool_binary(op).ok_or_else(unsupported)?)),
        (HostData::I32(x), HostData::I32(y)) => HostData::I32(zip(x, y, int_binary(op).ok_or_else(unsupported)?)),
        (HostData::I64(x), HostData::I64(y)) => HostData::I64(zip(x, y, int_binary(op).ok_or_else(unsupported)?)),
        (HostData::F16(x), HostData::F16(y)) => {
            HostData::F16(zip_half(x, y, float_binary(op).ok_or_else(unsupported)?))
        }
        (HostData::BF16(x), HostData::BF16(y)) => {
            HostData::BF16(zip_half(x, y, float_binary(op).ok_or_else(unsupported)?))
        }
        (HostData::F32(x), HostData::F32(y)) => HostData::F32(zip(x, y, float_binary(op).ok_or_else(unsupported)?)),
        (HostData::F64(x), HostData::F64(y)) => HostData::F64(zip(x, y, float_binary(op).ok_or_else(unsupported)?)),
        _ => return Err(unsupported()),
    })
}

fn pick<T: Copy>(cond: &[bool], a: &[T], b: &[T]) -> Vec<T> {
    cond.iter().zip(a.iter().zip(b)).map(|(&c, (&x, &y))| if c { x } else { y }).collect()
}

/// `where(cond, a, b)`: `a` where `cond` holds, else `b`.
pub(super) fn select(cond: &HostData, a: &HostData, b: &HostData) -> Result<HostData, String> {
    let HostData::Bool(c) = cond else {
        return Err(format!("where: condition must be bool, got {}", cond.dtype()));
    };
    if a.dtype() != b.dtype() || a.len() != c.len() || b.len() != c.len() {
        return Err(format!(
            "where: operands differ: bool x {}, {} x {}, {} x {}",
            c.len(),
            a.dtype(),
            a.len(),
            b.dtype(),
            b.len()
        ));
    }
    Ok(match (a, b) {
        (HostData::Bool(x), HostData::Bool(y)) => HostData::Bool(pick(c, x, y)),
        (HostData::I32(x), HostData::I32(y)) => HostData::I32(pick(c, x, y)),
        (HostData::I64(x), HostData::I64(y)) => HostData::I64(pick(c, x, y)),
        (HostData::F16(x), HostData::F16(y)) => HostData::F16(pick(c, x, y)),
        (HostData::BF16(x), HostData::BF16(y)) => HostData::BF16(pick(c, x, y)),
        (HostData::F32(x), HostData::F32(y)) => HostData::F32(pick(c, x, y)),
        (HostData::F64(x), HostData::F64(y)) => HostData::F64(pick(c, x, y)),
        _ => return Err(format!("where: operand dtypes differ: {} and {}", a.dtype(), b.dtype())),
    })
}

/// Converts integers (bools as 0/1) to `to`: to bool is `!= 0`; to `i32` keeps the low 32 bits
/// (Rust `as`); to `f32`/`f64` rounds to nearest even; to `f16`/`bf16` rounds to `f32` first, then
/// to storage.
pub(super) fn ints_to(values: impl Iterator<Item = i64>, to: DType) -> HostData {
    match to {
        DType::Bool => HostData::Bool(values.map(int_to_bool).collect()),
        DType::I32 => HostData::I32(values.map(int_to_i32).collect()),
        DType::I64 => HostData::I64(values.collect()),
        DType::F16 => HostData::F16(values.map(|x| to_f16(int_to_f32(x))).collect()),
        DType::BF16 => HostData::BF16(values.map(|x| to_bf16(int_to_f32(x))).collect()),
        DType::F32 => HostData::F32(values.map(int_to_f32).collect()),
        DType::F64 => HostData::F64(values.map(int_to_f64).collect()),
    }
}

/// Converts floats (held exactly as `f64`) to `to`: to bool is `!= 0` (NaN is true); to ints
/// truncates toward zero and saturates, NaN giving 0 (Rust `as`); to `f16`/`bf16` rounds to `f32`
/// first, then to storage.
pub(super) fn floats_to(values: impl Iterator<Item = f64>, to: DType) -> HostData {
    match to {
        DType::Bool => HostData::Bool(values.map(float_to_bool).collect()),
        DType::I32 => HostData::I32(values.map(float_to_i32).collect()),
        DType::I64 => HostData::I64(values.map(float_to_i64).collect()),
        DType::F16 => HostData::F16(values.map(|x| to_f16(float_to_f32(x))).collect()),
        DType::BF16 => HostData::BF16(values.map(|x| to_bf16(float_to_f32(x))).collect()),
        DType::F32 => HostData::F32(values.map(float_to_f32).collect()),
        DType::F64 => HostData::F64(values.collect()),
    }
}

/// Converts every element to `to` (see `ints_to` and `floats_to`).
pub(super) fn cast(x: &HostData, to: DType) -> HostData {
    match x {
        HostData::Bool(v) => ints_to(v.iter().map(|&b| b as i64), to),
        HostData::I32(v) => ints_to(v.iter().map(|&i| i as i64), to),
        HostData::I64(v) => ints_to(v.iter().copied(), to),
        HostData::F16(v) => floats_to(v.iter().map(|x| x.to_f64()), to),
        HostData::BF16(v) => floats_to(v.iter().map(|x| x.to_f64()), to),
        HostData::F32(v) => floats_to(v.iter().map(|&x| x as f64), to),
        HostData::F64(v) => floats_to(v.iter().copied(), to),
    }
}

/// `n` copies of `value` converted to `dtype` with the cast rules.
pub(super) fn fill(dtype: DType, n: usize, value: Scalar) -> HostData {
    let one = match value {
        Scalar::Bool(b) => ints_to(std::iter::once(b as i64), dtype),
        Scalar::Int(i) => ints_to(std::iter::once(i), dtype),
        Scalar::Float(x) => floats_to(std::iter::once(x), dtype),
    };
    crate::with_host_data!(&one, v => Element::wrap(vec![v[0]; n]))
}

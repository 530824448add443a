//! Element-wise numerics of the interpreter: unary and binary ops, `where`, casts and fills.
//!
//! Each op first picks one plain scalar function for the operand dtype (or reports the dtype as
//! unsupported), then maps that function over the elements. `f16` and `bf16` elements are widened
//! to `f32`, computed, and rounded back to storage after every op.

use std::ops::{Add, BitAnd, BitOr, Div, Mul, Neg, Not, Rem, Sub};

use half::{bf16, f16};

use crate::dtype::{DType, Scalar};
use crate::host::{Element, HostData};
use crate::op::{BinaryOp, UnaryOp};

/// The two float types the interpreter computes in. Transcendentals come from the `libm` crate so
/// that results are the same on every platform.
pub(super) trait Float:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Rem<Output = Self>
    + Neg<Output = Self>
{
    const ONE: Self;
    fn exp2(self) -> Self;
    fn log2(self) -> Self;
    fn sin(self) -> Self;
    fn sqrt(self) -> Self;
    fn erf(self) -> Self;
    fn trunc(self) -> Self;
    fn pow(self, exponent: Self) -> Self;
    fn is_nan(self) -> bool;
    fn is_sign_positive(self) -> bool;
}

macro_rules! float_impl {
    ($t:ty, $exp2:path, $log2:path, $sin:path, $erf:path, $pow:path) => {
        impl Float for $t {
            const ONE: Self = 1.0;
            fn exp2(self) -> Self {
                $exp2(self)
            }
            fn log2(self) -> Self {
                $log2(self)
            }
            fn sin(self) -> Self {
                $sin(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn erf(self) -> Self {
                $erf(self)
            }
            fn trunc(self) -> Self {
                <$t>::trunc(self)
            }
            fn pow(self, exponent: Self) -> Self {
                $pow(self, exponent)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_sign_positive(self) -> bool {
                <$t>::is_sign_positive(self)
            }
        }
    };
}
float_impl!(f32, libm::exp2f, libm::log2f, libm::sinf, libm::erff, libm::powf);
float_impl!(f64, libm::exp2, libm::log2, libm::sin, libm::erf, libm::pow);

/// The two integer types. Arithmetic wraps; division and remainder by zero give zero.
pub(super) trait Int: Copy + Ord + Not<Output = Self> + BitAnd<Output = Self> + BitOr<Output = Self> {
    const ZERO: Self;
    const MIN: Self;
    fn wrapping_add(self, other: Self) -> Self;
    fn wrapping_sub(self, other: Self) -> Self;
    fn wrapping_mul(self, other: Self) -> Self;
    fn wrapping_div(self, other: Self) -> Self;
    fn wrapping_rem(self, other: Self) -> Self;
    fn wrapping_neg(self) -> Self;
}

macro_rules! int_impl {
    ($t:ty) => {
        impl Int for $t {
            const ZERO: Self = 0;
            const MIN: Self = <$t>::MIN;
            fn wrapping_add(self, other: Self) -> Self {
                <$t>::wrapping_add(self, other)
            }
            fn wrapping_sub(self, other: Self) -> Self {
                <$t>::wrapping_sub(self, other)
            }
            fn wrapping_mul(self, other: Self) -> Self {
                <$t>::wrapping_mul(self, other)
            }
            fn wrapping_div(self, other: Self) -> Self {
                <$t>::wrapping_div(self, other)
            }
            fn wrapping_rem(self, other: Self) -> Self {
                <$t>::wrapping_rem(self, other)
            }
            fn wrapping_neg(self) -> Self {
                <$t>::wrapping_neg(self)
            }
        }
    };
}
int_impl!(i32);
int_impl!(i64);

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
        f16::from_f32(x)
    }
}
impl Half for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// IEEE 754-2019 `maximum`: NaN if either operand is NaN (the first NaN operand is returned),
/// and `+0` is greater than `-0`.
pub(super) fn float_max<T: Float>(a: T, b: T) -> T {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a > b {
        a
    } else if b > a {
        b
    } else if a.is_sign_positive() {
        a
    } else {
        b
    }
}

/// IEEE 754-2019 `minimum`: NaN if either operand is NaN, and `-0` is less than `+0`.
pub(super) fn float_min<T: Float>(a: T, b: T) -> T {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a < b {
        a
    } else if b < a {
        b
    } else if !a.is_sign_positive() {
        a
    } else {
        b
    }
}

fn int_div<T: Int>(a: T, b: T) -> T {
    if b == T::ZERO { T::ZERO } else { a.wrapping_div(b) }
}

fn int_rem<T: Int>(a: T, b: T) -> T {
    if b == T::ZERO { T::ZERO } else { a.wrapping_rem(b) }
}

fn float_unary<T: Float>(op: UnaryOp) -> Option<fn(T) -> T> {
    let f: fn(T) -> T = match op {
        UnaryOp::Neg => |x| -x,
        UnaryOp::Exp2 => T::exp2,
        UnaryOp::Log2 => T::log2,
        UnaryOp::Sin => T::sin,
        UnaryOp::Sqrt => T::sqrt,
        UnaryOp::Recip => |x| T::ONE / x,
        UnaryOp::Erf => T::erf,
        UnaryOp::Trunc => T::trunc,
        UnaryOp::Not => return None,
    };
    Some(f)
}

fn int_unary<T: Int>(op: UnaryOp) -> Option<fn(T) -> T> {
    let f: fn(T) -> T = match op {
        UnaryOp::Neg => T::wrapping_neg,
        UnaryOp::Not => |x| !x,
        _ => return None,
    };
    Some(f)
}

fn bool_unary(op: UnaryOp) -> Option<fn(bool) -> bool> {
    let f: fn(bool) -> bool = match op {
        UnaryOp::Not => |x| !x,
        _ => return None,
    };
    Some(f)
}

fn float_binary<T: Float>(op: BinaryOp) -> Option<fn(T, T) -> T> {
    let f: fn(T, T) -> T = match op {
        BinaryOp::Add => |a, b| a + b,
        BinaryOp::Sub => |a, b| a - b,
        BinaryOp::Mul => |a, b| a * b,
        BinaryOp::Div => |a, b| a / b,
        BinaryOp::Max => float_max,
        BinaryOp::Min => float_min,
        BinaryOp::Mod => |a, b| a % b,
        BinaryOp::Pow => T::pow,
        _ => return None,
    };
    Some(f)
}

fn int_binary<T: Int>(op: BinaryOp) -> Option<fn(T, T) -> T> {
    let f: fn(T, T) -> T = match op {
        BinaryOp::Add => T::wrapping_add,
        BinaryOp::Sub => T::wrapping_sub,
        BinaryOp::Mul => T::wrapping_mul,
        BinaryOp::Div => int_div,
        BinaryOp::Max => |a, b| a.max(b),
        BinaryOp::Min => |a, b| a.min(b),
        BinaryOp::Mod => int_rem,
        BinaryOp::And => |a, b| a & b,
        BinaryOp::Or => |a, b| a | b,
        _ => return None,
    };
    Some(f)
}

fn bool_binary(op: BinaryOp) -> Option<fn(bool, bool) -> bool> {
    let f: fn(bool, bool) -> bool = match op {
        BinaryOp::And | BinaryOp::Min => |a, b| a && b,
        BinaryOp::Or | BinaryOp::Max => |a, b| a || b,
        _ => return None,
    };
    Some(f)
}

/// Comparisons work on every dtype; floats follow IEEE 754 (every comparison with NaN is false,
/// except `cmpne`, which is true), and `false < true`.
fn compare<T: PartialOrd>(op: BinaryOp) -> Option<fn(T, T) -> bool> {
    let f: fn(T, T) -> bool = match op {
        BinaryOp::CmpLt => |a, b| a < b,
        BinaryOp::CmpEq => |a, b| a == b,
        BinaryOp::CmpNe => |a, b| a != b,
        _ => return None,
    };
    Some(f)
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
        DType::Bool => HostData::Bool(values.map(|x| x != 0).collect()),
        DType::I32 => HostData::I32(values.map(|x| x as i32).collect()),
        DType::I64 => HostData::I64(values.collect()),
        DType::F16 => HostData::F16(values.map(|x| f16::from_f32(x as f32)).collect()),
        DType::BF16 => HostData::BF16(values.map(|x| bf16::from_f32(x as f32)).collect()),
        DType::F32 => HostData::F32(values.map(|x| x as f32).collect()),
        DType::F64 => HostData::F64(values.map(|x| x as f64).collect()),
    }
}

/// Converts floats (held exactly as `f64`) to `to`: to bool is `!= 0` (NaN is true); to ints
/// truncates toward zero and saturates, NaN giving 0 (Rust `as`); to `f16`/`bf16` rounds to `f32`
/// first, then to storage.
pub(super) fn floats_to(values: impl Iterator<Item = f64>, to: DType) -> HostData {
    match to {
        DType::Bool => HostData::Bool(values.map(|x| x != 0.0).collect()),
        DType::I32 => HostData::I32(values.map(|x| x as i32).collect()),
        DType::I64 => HostData::I64(values.map(|x| x as i64).collect()),
        DType::F16 => HostData::F16(values.map(|x| f16::from_f32(x as f32)).collect()),
        DType::BF16 => HostData::BF16(values.map(|x| bf16::from_f32(x as f32)).collect()),
        DType::F32 => HostData::F32(values.map(|x| x as f32).collect()),
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

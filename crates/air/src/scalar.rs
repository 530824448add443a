//! The scalar semantics of the element-wise ops, written once: unary and binary ops, comparisons
//! and casts on one value of each dtype, with the edge behaviour of PyTorch that the
//! [`crate::interp`] module docs state (IEEE 754-2019 `maximum`/`minimum`, `mod` with the sign of
//! the dividend, wrapping integers, saturating float-to-int casts, `f16`/`bf16` computed in
//! `f32` and rounded to storage after every op, `libm` transcendentals).
//!
//! Two levels, one table:
//! - typed: [`float_unary`], [`int_unary`], [`bool_unary`], [`float_binary`], [`int_binary`],
//!   [`bool_binary`] and [`compare`] pick the function of an op for one element type (or `None`
//!   when the op does not apply to it), so that a caller maps it over many elements; the
//!   conversions ([`int_to_f32`], [`float_to_i32`], [`to_f16`], ...) are the cast rules per pair
//!   of types.
//! - per value: [`unary`], [`binary`] and [`cast`] take a [`Scalar`] holding a value of a given
//!   dtype (floats exactly as `f64`, ints as `i64`) and return one, for executors that
//!   interpret one element at a time and for constant folding.
//!
//! The interpreter, `lower`'s kir executor and constant folding, and codegen's test oracle all
//! call these functions, so every oracle has the same bits.
//!
//! Integer division and remainder by zero give 0 here; the interpreter and the compiled
//! backends report them as errors of the run before any value is used.

use std::ops::{Add, BitAnd, BitOr, Div, Mul, Neg, Not, Rem, Sub};

use half::{bf16, f16};

use crate::dtype::{DType, Scalar};
use crate::op::{BinaryOp, UnaryOp};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// The two float types element-wise ops compute in (`f16` and `bf16` compute in `f32`).
/// Transcendentals come from the `libm` crate, so results are the same on every platform.
pub trait Float:
    sealed::Sealed
    + Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Rem<Output = Self>
    + Neg<Output = Self>
{
    /// One.
    const ONE: Self;
    /// `2^self`.
    fn exp2(self) -> Self;
    /// Base-2 logarithm.
    fn log2(self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Square root, correctly rounded.
    fn sqrt(self) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// Rounds toward zero.
    fn trunc(self) -> Self;
    /// `self ** exponent`.
    fn pow(self, exponent: Self) -> Self;
    /// Whether the value is NaN.
    fn is_nan(self) -> bool;
    /// Whether the sign bit is clear.
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

/// The two integer types. Arithmetic wraps (two's complement); division and remainder by zero
/// give zero here (see the module docs).
pub trait Int: sealed::Sealed + Copy + Ord + Not<Output = Self> + BitAnd<Output = Self> + BitOr<Output = Self> {
    /// Zero.
    const ZERO: Self;
    /// The smallest value (the identity of `max`).
    const MIN: Self;
    /// Wrapping `+`.
    fn wrapping_add(self, other: Self) -> Self;
    /// Wrapping `-`.
    fn wrapping_sub(self, other: Self) -> Self;
    /// Wrapping `*`.
    fn wrapping_mul(self, other: Self) -> Self;
    /// Division toward zero; `MIN / -1` wraps to `MIN`.
    fn wrapping_div(self, other: Self) -> Self;
    /// Remainder with the sign of the dividend; `MIN % -1` is 0.
    fn wrapping_rem(self, other: Self) -> Self;
    /// Wrapping negation.
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

/// IEEE 754-2019 `maximum`: NaN if either operand is NaN (the first NaN operand is returned),
/// and `+0` is greater than `-0`.
pub fn float_max<T: Float>(a: T, b: T) -> T {
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
pub fn float_min<T: Float>(a: T, b: T) -> T {
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

/// The function of a unary op on floats, or `None` (`not`).
pub fn float_unary<T: Float>(op: UnaryOp) -> Option<fn(T) -> T> {
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

/// The function of a unary op on ints (`neg` wraps, `not` is bitwise), or `None`.
pub fn int_unary<T: Int>(op: UnaryOp) -> Option<fn(T) -> T> {
    let f: fn(T) -> T = match op {
        UnaryOp::Neg => T::wrapping_neg,
        UnaryOp::Not => |x| !x,
        _ => return None,
    };
    Some(f)
}

/// The function of a unary op on bools (`not`), or `None`.
pub fn bool_unary(op: UnaryOp) -> Option<fn(bool) -> bool> {
    let f: fn(bool) -> bool = match op {
        UnaryOp::Not => |x| !x,
        _ => return None,
    };
    Some(f)
}

/// The function of a (non-comparison) binary op on floats, or `None`.
pub fn float_binary<T: Float>(op: BinaryOp) -> Option<fn(T, T) -> T> {
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

/// The function of a (non-comparison) binary op on ints, or `None`.
pub fn int_binary<T: Int>(op: BinaryOp) -> Option<fn(T, T) -> T> {
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

/// The function of a (non-comparison) binary op on bools (`max` is `or`, `min` is `and`), or
/// `None`.
pub fn bool_binary(op: BinaryOp) -> Option<fn(bool, bool) -> bool> {
    let f: fn(bool, bool) -> bool = match op {
        BinaryOp::And | BinaryOp::Min => |a, b| a && b,
        BinaryOp::Or | BinaryOp::Max => |a, b| a || b,
        _ => return None,
    };
    Some(f)
}

/// The function of a comparison on any element type, or `None` for other ops. Floats follow
/// IEEE 754 (every comparison with NaN is false, except `cmpne`, which is true); `false < true`.
pub fn compare<T: PartialOrd>(op: BinaryOp) -> Option<fn(T, T) -> bool> {
    let f: fn(T, T) -> bool = match op {
        BinaryOp::CmpLt => |a, b| a < b,
        BinaryOp::CmpEq => |a, b| a == b,
        BinaryOp::CmpNe => |a, b| a != b,
        _ => return None,
    };
    Some(f)
}

// The cast rules, one function per pair of types. Ints come as `i64` (bools as 0/1), floats as
// `f64` (exactly: every float dtype's values are `f64` values).

/// Int to bool: `x != 0`.
pub fn int_to_bool(x: i64) -> bool {
    x != 0
}
/// Int to `i32`: the low 32 bits (Rust `as`).
pub fn int_to_i32(x: i64) -> i32 {
    x as i32
}
/// Int to `f32`: rounds to nearest even.
pub fn int_to_f32(x: i64) -> f32 {
    x as f32
}
/// Int to `f64`: rounds to nearest even.
pub fn int_to_f64(x: i64) -> f64 {
    x as f64
}
/// Float to bool: `x != 0` (NaN is true).
pub fn float_to_bool(x: f64) -> bool {
    x != 0.0
}
/// Float to `i32`: truncates toward zero and saturates; NaN gives 0 (Rust `as`).
pub fn float_to_i32(x: f64) -> i32 {
    x as i32
}
/// Float to `i64`: truncates toward zero and saturates; NaN gives 0 (Rust `as`).
pub fn float_to_i64(x: f64) -> i64 {
    x as i64
}
/// Float to `f32`: rounds to nearest even.
pub fn float_to_f32(x: f64) -> f32 {
    x as f32
}
/// An `f32` rounded to `f16` storage (nearest, ties to even). Anything else becomes `f16` by
/// way of `f32`.
pub fn to_f16(x: f32) -> f16 {
    f16::from_f32(x)
}
/// An `f32` rounded to `bf16` storage (nearest, ties to even).
pub fn to_bf16(x: f32) -> bf16 {
    bf16::from_f32(x)
}

/// `x` (an `f32` result) rounded to the storage of `dtype` (`f16` or `bf16`; `f32` keeps it),
/// as the exact `f64` value of the stored number.
fn round_to(dtype: DType, x: f32) -> f64 {
    match dtype {
        DType::F16 => to_f16(x).to_f64(),
        DType::BF16 => to_bf16(x).to_f64(),
        _ => x as f64,
    }
}

/// `x` (any kind of scalar) converted to `to` with the cast rules: the result is the kind `to`
/// holds, with the value an element of `to` has (ints wrapped to `i32`, floats rounded to the
/// float type's storage).
pub fn cast(x: Scalar, to: DType) -> Scalar {
    match x {
        Scalar::Bool(b) => cast_int(b as i64, to),
        Scalar::Int(i) => cast_int(i, to),
        Scalar::Float(v) => cast_float(v, to),
    }
}

fn cast_int(x: i64, to: DType) -> Scalar {
    match to {
        DType::Bool => Scalar::Bool(int_to_bool(x)),
        DType::I32 => Scalar::Int(int_to_i32(x) as i64),
        DType::I64 => Scalar::Int(x),
        DType::F16 | DType::BF16 | DType::F32 => Scalar::Float(round_to(to, int_to_f32(x))),
        DType::F64 => Scalar::Float(int_to_f64(x)),
    }
}

fn cast_float(x: f64, to: DType) -> Scalar {
    match to {
        DType::Bool => Scalar::Bool(float_to_bool(x)),
        DType::I32 => Scalar::Int(float_to_i32(x) as i64),
        DType::I64 => Scalar::Int(float_to_i64(x)),
        DType::F16 | DType::BF16 | DType::F32 => Scalar::Float(round_to(to, float_to_f32(x))),
        DType::F64 => Scalar::Float(x),
    }
}

/// `op(x)` for a value `x` of `dtype` (of the kind `dtype` holds), or `None` when the op does not
/// apply to the dtype or `x` is of another kind.
pub fn unary(op: UnaryOp, x: Scalar, dtype: DType) -> Option<Scalar> {
    Some(match (dtype, x) {
        (DType::Bool, Scalar::Bool(b)) => Scalar::Bool(bool_unary(op)?(b)),
        (DType::I32, Scalar::Int(i)) => Scalar::Int(int_unary::<i32>(op)?(i as i32) as i64),
        (DType::I64, Scalar::Int(i)) => Scalar::Int(int_unary::<i64>(op)?(i)),
        (DType::F64, Scalar::Float(v)) => Scalar::Float(float_unary::<f64>(op)?(v)),
        (DType::F16 | DType::BF16 | DType::F32, Scalar::Float(v)) => {
            Scalar::Float(round_to(dtype, float_unary::<f32>(op)?(v as f32)))
        }
        _ => return None,
    })
}

/// `op(a, b)` for values of `dtype` (comparisons give a bool), or `None` when the op does not
/// apply to the dtype or an operand is of another kind.
pub fn binary(op: BinaryOp, a: Scalar, b: Scalar, dtype: DType) -> Option<Scalar> {
    if op.is_comparison() {
        return Some(Scalar::Bool(match (a, b) {
            (Scalar::Bool(x), Scalar::Bool(y)) => compare::<bool>(op)?(x, y),
            (Scalar::Int(x), Scalar::Int(y)) => compare::<i64>(op)?(x, y),
            // Every float dtype's values are exact in `f64`, so comparing there is exact.
            (Scalar::Float(x), Scalar::Float(y)) => compare::<f64>(op)?(x, y),
            _ => return None,
        }));
    }
    Some(match (dtype, a, b) {
        (DType::Bool, Scalar::Bool(x), Scalar::Bool(y)) => Scalar::Bool(bool_binary(op)?(x, y)),
        (DType::I32, Scalar::Int(x), Scalar::Int(y)) => Scalar::Int(int_binary::<i32>(op)?(x as i32, y as i32) as i64),
        (DType::I64, Scalar::Int(x), Scalar::Int(y)) => Scalar::Int(int_binary::<i64>(op)?(x, y)),
        (DType::F64, Scalar::Float(x), Scalar::Float(y)) => Scalar::Float(float_binary::<f64>(op)?(x, y)),
        (DType::F16 | DType::BF16 | DType::F32, Scalar::Float(x), Scalar::Float(y)) => {
            Scalar::Float(round_to(dtype, float_binary::<f32>(op)?(x as f32, y as f32)))
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_and_min_order_signed_zeros_and_propagate_nan() {
        assert!(float_max(0.0f32, -0.0).is_sign_positive());
        assert!(float_min(0.0f64, -0.0).is_sign_negative());
        assert!(float_max(1.0f32, f32::NAN).is_nan() && float_min(f64::NAN, 1.0).is_nan());
    }

    #[test]
    fn ints_wrap_and_divide_by_zero_to_zero() {
        let i32_of = |op, a: i64, b: i64| binary(op, Scalar::Int(a), Scalar::Int(b), DType::I32);
        assert_eq!(i32_of(BinaryOp::Add, i32::MAX as i64, 1), Some(Scalar::Int(i32::MIN as i64)));
        assert_eq!(i32_of(BinaryOp::Div, i32::MIN as i64, -1), Some(Scalar::Int(i32::MIN as i64)));
        assert_eq!(i32_of(BinaryOp::Mod, i32::MIN as i64, -1), Some(Scalar::Int(0)));
        assert_eq!(i32_of(BinaryOp::Div, 7, 0), Some(Scalar::Int(0)));
        assert_eq!(unary(UnaryOp::Neg, Scalar::Int(i64::MIN), DType::I64), Some(Scalar::Int(i64::MIN)));
        assert_eq!(unary(UnaryOp::Sqrt, Scalar::Int(4), DType::I64), None);
    }

    #[test]
    fn halves_round_after_every_op_and_casts_saturate() {
        // 1 + 2^-11 is not an f16: the sum rounds (ties to even) back to 1.
        let one = Scalar::Float(1.0);
        let tiny = Scalar::Float(2f64.powi(-11));
        assert_eq!(binary(BinaryOp::Add, one, tiny, DType::F16), Some(Scalar::Float(1.0)));
        assert_eq!(binary(BinaryOp::Add, one, tiny, DType::F32), Some(Scalar::Float(1.0 + 2f64.powi(-11))));
        assert_eq!(cast(Scalar::Float(1e10), DType::I32), Scalar::Int(i32::MAX as i64));
        assert_eq!(cast(Scalar::Float(f64::NAN), DType::I64), Scalar::Int(0));
        assert_eq!(cast(Scalar::Float(f64::NAN), DType::Bool), Scalar::Bool(true));
        assert_eq!(cast(Scalar::Int(1 << 40), DType::I32), Scalar::Int(0));
        assert_eq!(cast(Scalar::Bool(true), DType::BF16), Scalar::Float(1.0));
    }

    #[test]
    fn comparisons_with_nan_are_false_but_cmpne() {
        let (nan, one) = (Scalar::Float(f64::NAN), Scalar::Float(1.0));
        for (op, want) in [(BinaryOp::CmpLt, false), (BinaryOp::CmpEq, false), (BinaryOp::CmpNe, true)] {
            assert_eq!(binary(op, nan, one, DType::F32), Some(Scalar::Bool(want)), "{op:?}");
        }
    }
}

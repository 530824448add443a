//! Element types (`DType`) and scalar values (`Scalar`) of the IR.

use std::fmt;

/// The element type of a tensor.
///
/// `F16` and `BF16` are storage types: every op computes them in `f32` and rounds its result to
/// storage (the facade computes its composite ops, `tanh`, `softmax`, the norms, wholly in `f32`).
/// `F64` exists so that gradient checks can run in double precision through the interpreter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Booleans, one byte each (0 or 1).
    Bool,
    /// 32-bit signed integers.
    I32,
    /// 64-bit signed integers.
    I64,
    /// IEEE 754 half precision (a storage type, see above).
    F16,
    /// bfloat16 (a storage type, see above).
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
}

impl DType {
    /// Every dtype, in a fixed order (useful for tests and parsers).
    pub const ALL: [DType; 7] = [DType::Bool, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];

    /// Bytes one element takes in memory.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bool => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Whether this is a float dtype (`f16`, `bf16`, `f32`, `f64`).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Whether this is a half-width float (`f16`, `bf16`): a storage type computed in `f32`.
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// Whether this is an integer dtype (`i32`, `i64`).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// Whether this is `bool`.
    pub fn is_bool(self) -> bool {
        self == DType::Bool
    }

    /// The name used by the text form (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// The dtype whose text-form name is `name` (the inverse of [`DType::name`]), or `None`.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The dtype both operands are promoted to (PyTorch-like: float beats int beats bool, wider
    /// beats narrower; `f16` with `bf16` gives `f32`).
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            _ => a.max(b),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A scalar constant. Floats keep `f64` precision; equality and hashing compare bits so that
/// `NaN` constants are hash-consable and `-0.0 != 0.0`.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// A boolean, the value kind of `bool`.
    Bool(bool),
    /// An integer, the value kind of both integer dtypes.
    Int(i64),
    /// A float at `f64` precision, the value kind of every float dtype.
    Float(f64),
}

impl Scalar {
    /// The value as `f64`; bools become 0 or 1.
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(x) => x,
        }
    }

    /// The value as `i64`; bools become 0 or 1, floats truncate toward zero and saturate (NaN gives
    /// 0, as Rust's `as`).
    pub fn as_i64(self) -> i64 {
        match self {
            Scalar::Bool(b) => b as i64,
            Scalar::Int(i) => i,
            Scalar::Float(x) => x as i64,
        }
    }

    /// The value as `bool`: true when non-zero (NaN is non-zero).
    pub fn as_bool(self) -> bool {
        match self {
            Scalar::Bool(b) => b,
            Scalar::Int(i) => i != 0,
            Scalar::Float(x) => x != 0.0,
        }
    }

    /// This value converted to the kind of scalar that `dtype` holds.
    pub fn cast(self, dtype: DType) -> Scalar {
        if dtype.is_float() {
            Scalar::Float(self.as_f64())
        } else if dtype.is_int() {
            Scalar::Int(self.as_i64())
        } else {
            Scalar::Bool(self.as_bool())
        }
    }

    /// Whether this scalar's kind fits `dtype` (a float for float dtypes, and so on).
    pub fn fits(self, dtype: DType) -> bool {
        match self {
            Scalar::Bool(_) => dtype.is_bool(),
            Scalar::Int(_) => dtype.is_int(),
            Scalar::Float(_) => dtype.is_float(),
        }
    }

    fn key(self) -> (u8, u64) {
        match self {
            Scalar::Bool(b) => (0, b as u64),
            Scalar::Int(i) => (1, i as u64),
            Scalar::Float(x) => (2, x.to_bits()),
        }
    }
}

impl PartialEq for Scalar {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Scalar {}
impl std::hash::Hash for Scalar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state)
    }
}

impl fmt::Display for Scalar {
    /// Prints so that the text parser reads back the same value: floats always carry a `.`,
    /// `e`, `inf` or `nan`, using Rust's shortest round-trip formatting.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => {
                if x.is_nan() {
                    f.write_str("nan")
                } else if x.is_infinite() {
                    f.write_str(if x > 0.0 { "inf" } else { "-inf" })
                } else {
                    let s = format!("{x:?}");
                    f.write_str(&s)
                }
            }
        }
    }
}

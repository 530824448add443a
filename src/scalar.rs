//! Scalars as op arguments: `&t + 2.0`, `t.maximum(0.0)`, `mask.where_cond(&x, -1.0)`.
//!
//! A scalar next to a tensor is "weak" as in PyTorch: it takes the tensor's dtype unless its kind
//! is higher (a float scalar with an int tensor gives `f32`, an int scalar with a bool tensor
//! gives `i64`).

use air::{DType, Scalar};

use crate::tensor::Tensor;

/// A Rust value usable as a scalar constant.
pub trait IntoScalar: Copy {
    /// The value as an air scalar.
    fn into_scalar(self) -> Scalar;
}

macro_rules! scalars {
    ($($t:ty => $e:expr),* $(,)?) => {$(
        impl IntoScalar for $t {
            fn into_scalar(self) -> Scalar {
                let f: fn($t) -> Scalar = $e;
                f(self)
            }
        }
    )*};
}
scalars!(
    f32 => |x| Scalar::Float(x as f64),
    f64 => Scalar::Float,
    i32 => |x| Scalar::Int(x as i64),
    i64 => Scalar::Int,
    usize => |x| Scalar::Int(x as i64),
    bool => Scalar::Bool,
    half::f16 => |x| Scalar::Float(x.to_f64()),
    half::bf16 => |x| Scalar::Float(x.to_f64()),
    Scalar => |x| x,
);

/// An op argument: a tensor, or a scalar that becomes a constant tensor.
#[derive(Clone, Debug)]
pub enum Arg {
    /// A tensor operand.
    Tensor(Tensor),
    /// A scalar operand, typed against the other operand (see the module docs).
    Scalar(Scalar),
}

/// Anything an element-wise op accepts as an operand: `&Tensor`, `Tensor` or a scalar.
pub trait Operand {
    /// The operand as an [`Arg`].
    fn into_arg(self) -> Arg;
}

impl Operand for &Tensor {
    fn into_arg(self) -> Arg {
        Arg::Tensor(self.clone())
    }
}
impl Operand for Tensor {
    fn into_arg(self) -> Arg {
        Arg::Tensor(self)
    }
}
impl Operand for &&Tensor {
    fn into_arg(self) -> Arg {
        Arg::Tensor((*self).clone())
    }
}
macro_rules! scalar_operands {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn into_arg(self) -> Arg {
                Arg::Scalar(self.into_scalar())
            }
        }
    )*};
}
scalar_operands!(f32, f64, i32, i64, usize, bool, half::f16, half::bf16, Scalar);

/// The dtype a weak scalar takes next to a tensor of dtype `tensor`.
pub(crate) fn weak_dtype(scalar: Scalar, tensor: DType) -> DType {
    match scalar {
        Scalar::Float(_) if !tensor.is_float() => DType::F32,
        Scalar::Int(_) if tensor.is_bool() => DType::I64,
        _ => tensor,
    }
}

/// The dtype of a scalar with no tensor beside it (PyTorch's defaults).
pub(crate) fn default_dtype(scalar: Scalar) -> DType {
    match scalar {
        Scalar::Bool(_) => DType::Bool,
        Scalar::Int(_) => DType::I64,
        Scalar::Float(_) => DType::F32,
    }
}

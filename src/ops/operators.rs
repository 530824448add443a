//! `std::ops` operators: `+ - * /` on `Tensor` and `&Tensor` with tensors or scalars on either
//! side, unary `-`, and the bitwise `& | ^ !` (PyTorch's `& | ^ ~`; logical on bools) with a
//! tensor on the left. They are the named methods (`add`, `sub`, `bitwise_and`, ...) under
//! another spelling.
//!
//! A scalar on the right may be any [`Operand`] scalar (`f32`, `f64`, `i32`, `i64`, ...). A scalar
//! on the left is `f32` or `i64` only: with one impl per literal kind, `let y = 2.0 * &x;` infers
//! the literal's type at once, so `y.exp()` compiles; with both `f32` and `f64` impls it would need
//! an annotation. For an `f64` value on the left, write `&x * value` (or `value as f32`).

use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Sub};

use air::BinaryOp;

use crate::ops::elementwise::scalar_lhs;
use crate::scalar::{IntoScalar, Operand};
use crate::tensor::{Site, Tensor};

macro_rules! binary_operators {
    ($($tr:ident $f:ident $op:ident $name:literal),*) => {$(
        impl<R: Operand> $tr<R> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $f(self, rhs: R) -> Tensor {
                Tensor::$f(self, rhs)
            }
        }
        impl<R: Operand> $tr<R> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $f(self, rhs: R) -> Tensor {
                Tensor::$f(&self, rhs)
            }
        }
        scalar_lhs_operators!($tr $f $op $name: f32, i64);
    )*};
}

macro_rules! scalar_lhs_operators {
    ($tr:ident $f:ident $op:ident $name:literal: $($t:ty),*) => {$(
        impl $tr<&Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn $f(self, rhs: &Tensor) -> Tensor {
                scalar_lhs(Site::here($name), BinaryOp::$op, self.into_scalar(), rhs)
            }
        }
        impl $tr<Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn $f(self, rhs: Tensor) -> Tensor {
                scalar_lhs(Site::here($name), BinaryOp::$op, self.into_scalar(), &rhs)
            }
        }
    )*};
}

binary_operators!(Add add Add "add", Sub sub Sub "sub", Mul mul Mul "mul", Div div Div "div");

macro_rules! bitwise_operators {
    ($($tr:ident $f:ident $method:ident),*) => {$(
        impl<R: Operand> $tr<R> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $f(self, rhs: R) -> Tensor {
                Tensor::$method(self, rhs)
            }
        }
        impl<R: Operand> $tr<R> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $f(self, rhs: R) -> Tensor {
                Tensor::$method(&self, rhs)
            }
        }
    )*};
}

bitwise_operators!(BitAnd bitand bitwise_and, BitOr bitor bitwise_or, BitXor bitxor bitwise_xor);

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(&self)
    }
}

impl Not for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        Tensor::bitwise_not(self)
    }
}

impl Not for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        Tensor::bitwise_not(&self)
    }
}

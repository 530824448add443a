//! `std::ops` operators: `+ - * /` on `Tensor` and `&Tensor` with tensors or scalars on either
//! side, and unary `-`. They are the named methods (`add`, `sub`, ...) under another spelling.
//!
//! A scalar on the right may be any [`Operand`] scalar (`f32`, `f64`, `i32`, `i64`, ...). A scalar
//! on the left is `f32` or `i64` only: with one impl per literal kind, `let y = 2.0 * &x;` infers
//! the literal's type at once, so `y.exp()` compiles; with both `f32` and `f64` impls it would need
//! an annotation. For an `f64` value on the left, write `&x * value` (or `value as f32`).

use std::ops::{Add, Div, Mul, Neg, Sub};

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

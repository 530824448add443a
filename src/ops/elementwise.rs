//! Element-wise ops: operand resolution (weak scalars, dtype promotion, numpy broadcasting), the
//! binary and unary primitives, and the activations built from them.
//!
//! Float-only ops (`exp`, `sqrt`, `sigmoid`, ...) first cast integer and bool inputs to `f32`, as
//! PyTorch does. Higher ops are compositions of air primitives: `exp(x) = exp2(x * log2 e)`,
//! `log(x) = log2(x) * ln 2`, `cos(x) = sin(x + pi/2)`, and so on.

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_PI, FRAC_PI_2, LN_2, LOG2_E};

use air::{BinaryOp, DType, Scalar, Shape, UnaryOp};

use crate::scalar::{Arg, IntoScalar, Operand, default_dtype, weak_dtype};
use crate::shape::broadcast_shapes;
use crate::tensor::{Site, Tensor};

/// Broadcasts `t` to `shape` numpy-style: a reshape that prepends 1s, then an expand. Each step
/// is skipped when it would change nothing.
pub(crate) fn broadcast_to(site: Site, t: &Tensor, shape: &Shape) -> Tensor {
    if t.shape() == shape {
        return t.clone();
    }
    let mut t = t.clone();
    if t.ndim() < shape.len() {
        let mut padded: Shape = std::iter::repeat_n(air::Dim::Const(1), shape.len() - t.ndim()).collect();
        padded.extend(t.shape().iter().cloned());
        t = t.p_reshape(site, padded);
    }
    if t.shape() != shape { t.p_expand(site, shape.clone()) } else { t }
}

/// Turns operands into tensors of one shape (the broadcast of the tensor operands) and, from
/// index `skip` on, one dtype (promotion of the tensor operands, then weak scalars). Operands
/// before `skip` keep their dtype (the condition of `where`). Returns the first error tensor.
pub(crate) fn resolve(site: Site, args: Vec<Arg>, skip: usize) -> Result<Vec<Tensor>, Tensor> {
    let mut shape: Option<Shape> = None;
    let mut dtype: Option<DType> = None;
    let mut first: Option<Tensor> = None;
    for arg in &args {
        if let Arg::Tensor(t) = arg
            && t.error().is_some()
        {
            return Err(t.clone());
        }
    }
    for (i, arg) in args.iter().enumerate() {
        if let Arg::Tensor(t) = arg {
            first.get_or_insert_with(|| t.clone());
            shape = Some(match shape {
                None => t.shape().clone(),
                Some(s) => broadcast_shapes(&s, t.shape()).map_err(|m| site.fail(m))?,
            });
            if i >= skip {
                dtype = Some(dtype.map_or(t.dtype(), |d| DType::promote(d, t.dtype())));
            }
        }
    }
    for arg in args.iter().skip(skip) {
        if let Arg::Scalar(s) = arg {
            dtype = Some(dtype.map_or(default_dtype(*s), |d| weak_dtype(*s, d)));
        }
    }
    let (Some(first), Some(shape)) = (first, shape) else {
        return Err(site.fail("needs at least one tensor operand"));
    };
    let dtype = dtype.unwrap_or(DType::F32);
    let mut out = Vec::with_capacity(args.len());
    for (i, arg) in args.into_iter().enumerate() {
        out.push(match arg {
            Arg::Tensor(t) => {
                let t = if i >= skip { t.p_cast(site, dtype) } else { t };
                broadcast_to(site, &t, &shape)
            }
            Arg::Scalar(s) => first.const_operand(site, s, dtype, shape.clone()),
        });
    }
    Ok(out)
}

/// `lhs op rhs` after resolution. `float` casts non-float operands to `f32` first (true division).
/// On two bools, `+` is logical or and `*` logical and, and `-` is an error, as in PyTorch.
fn binary(site: Site, op: BinaryOp, lhs: Arg, rhs: Arg, float: bool) -> Tensor {
    match resolve(site, vec![lhs, rhs], 0) {
        Ok(v) => {
            let (mut a, mut b) = (v[0].clone(), v[1].clone());
            if float && !a.dtype().is_float() {
                a = a.p_cast(site, DType::F32);
                b = b.p_cast(site, DType::F32);
            }
            let op = if a.dtype().is_bool() {
                match op {
                    BinaryOp::Add => BinaryOp::Or,
                    BinaryOp::Mul => BinaryOp::And,
                    BinaryOp::Sub => return site.fail(BOOL_SUB),
                    other => other,
                }
            } else {
                op
            };
            a.p_binary(site, op, &b)
        }
        Err(e) => e,
    }
}

/// PyTorch refuses `-` on two bools and on one; so does Kiln, with the same advice.
const BOOL_SUB: &str =
    "subtracting two bool tensors is not supported (as in PyTorch); use logical_xor() or `^` instead";
const BOOL_NEG: &str =
    "negating a bool tensor is not supported (as in PyTorch); to invert a mask use logical_not() or `!`";

/// Comparisons: bools compare as integers for the ordering ops.
fn compare(site: Site, op: BinaryOp, lhs: Arg, rhs: Arg) -> Tensor {
    match resolve(site, vec![lhs, rhs], 0) {
        Ok(v) => {
            let (mut a, mut b) = (v[0].clone(), v[1].clone());
            if op == BinaryOp::CmpLt && a.dtype().is_bool() {
                a = a.p_cast(site, DType::I32);
                b = b.p_cast(site, DType::I32);
            }
            a.p_binary(site, op, &b)
        }
        Err(e) => e,
    }
}

/// The public binary ops on `Tensor`, all taking any [`Operand`] (tensor or scalar).
impl Tensor {
    /// Element-wise `self + rhs` with broadcasting. On two bools it is logical or (`True + True`
    /// is `True`), as in PyTorch; a bool plus an integer scalar promotes to `i64`.
    #[track_caller]
    pub fn add(&self, rhs: impl Operand) -> Tensor {
        binary(Site::here("add"), BinaryOp::Add, Arg::Tensor(self.clone()), rhs.into_arg(), false)
    }

    /// Element-wise `self - rhs`. Two bools are an error, as in PyTorch.
    #[track_caller]
    pub fn sub(&self, rhs: impl Operand) -> Tensor {
        binary(Site::here("sub"), BinaryOp::Sub, Arg::Tensor(self.clone()), rhs.into_arg(), false)
    }

    /// Element-wise `self * rhs`. On two bools it is logical and, as in PyTorch.
    #[track_caller]
    pub fn mul(&self, rhs: impl Operand) -> Tensor {
        binary(Site::here("mul"), BinaryOp::Mul, Arg::Tensor(self.clone()), rhs.into_arg(), false)
    }

    /// Element-wise true division (integers are divided as `f32`, like `torch.div`).
    #[track_caller]
    pub fn div(&self, rhs: impl Operand) -> Tensor {
        binary(Site::here("div"), BinaryOp::Div, Arg::Tensor(self.clone()), rhs.into_arg(), true)
    }

    /// Element-wise maximum (NaN if either is NaN, like `torch.maximum`). Ties split the gradient
    /// evenly, except against a scalar (a constant), which takes the tie (as `relu`, `clamp_min`).
    #[track_caller]
    pub fn maximum(&self, rhs: impl Operand) -> Tensor {
        binary(Site::here("maximum"), BinaryOp::Max, Arg::Tensor(self.clone()), rhs.into_arg(), false)
    }

    /// Element-wise minimum (NaN if either is NaN, like `torch.minimum`). Ties split the gradient
    /// evenly, except against a scalar (a constant), which takes the tie (as `clamp_max`).
    #[track_caller]
    pub fn minimum(&self, rhs: impl Operand) -> Tensor {
        binary(Site::here("minimum"), BinaryOp::Min, Arg::Tensor(self.clone()), rhs.into_arg(), false)
    }

    /// Element-wise `self ** rhs`, computed in floating point (integers become `f32`).
    #[track_caller]
    pub fn pow(&self, rhs: impl Operand) -> Tensor {
        binary(Site::here("pow"), BinaryOp::Pow, Arg::Tensor(self.clone()), rhs.into_arg(), true)
    }

    /// Remainder with the sign of the dividend (`torch.fmod`, C `fmod`).
    #[track_caller]
    pub fn fmod(&self, rhs: impl Operand) -> Tensor {
        binary(Site::here("fmod"), BinaryOp::Mod, Arg::Tensor(self.clone()), rhs.into_arg(), false)
    }

    /// Remainder with the sign of the divisor (`torch.remainder`, Python `%`).
    #[track_caller]
    pub fn remainder(&self, rhs: impl Operand) -> Tensor {
        let site = Site::here("remainder");
        let (a, b) = match resolve(site, vec![Arg::Tensor(self.clone()), rhs.into_arg()], 0) {
            Ok(v) => (v[0].clone(), v[1].clone()),
            Err(e) => return e,
        };
        let r = a.p_binary(site, BinaryOp::Mod, &b);
        let zero = r.const_like(site, Scalar::Int(0), r.dtype(), r.shape().clone());
        let r_neg = r.p_binary(site, BinaryOp::CmpLt, &zero);
        let b_neg = b.p_binary(site, BinaryOp::CmpLt, &zero);
        let signs_differ = r_neg.p_binary(site, BinaryOp::CmpNe, &b_neg);
        let nonzero = r.p_binary(site, BinaryOp::CmpNe, &zero);
        let fix = nonzero.p_binary(site, BinaryOp::And, &signs_differ);
        let shifted = r.p_binary(site, BinaryOp::Add, &b);
        Tensor::p_where(site, &fix, &shifted, &r)
    }

    /// `self < rhs` (bool).
    #[track_caller]
    pub fn lt(&self, rhs: impl Operand) -> Tensor {
        compare(Site::here("lt"), BinaryOp::CmpLt, Arg::Tensor(self.clone()), rhs.into_arg())
    }

    /// `self > rhs` (bool).
    #[track_caller]
    pub fn gt(&self, rhs: impl Operand) -> Tensor {
        compare(Site::here("gt"), BinaryOp::CmpLt, rhs.into_arg(), Arg::Tensor(self.clone()))
    }

    /// `self <= rhs` (bool): `lt or eq`, so NaN gives false.
    #[track_caller]
    pub fn le(&self, rhs: impl Operand) -> Tensor {
        let site = Site::here("le");
        let rhs = rhs.into_arg();
        let lt = compare(site, BinaryOp::CmpLt, Arg::Tensor(self.clone()), rhs.clone());
        let eq = compare(site, BinaryOp::CmpEq, Arg::Tensor(self.clone()), rhs);
        Tensor::apply(site, air::Op::Binary(BinaryOp::Or), &[&lt, &eq])
    }

    /// `self >= rhs` (bool): `gt or eq`, so NaN gives false.
    #[track_caller]
    pub fn ge(&self, rhs: impl Operand) -> Tensor {
        let site = Site::here("ge");
        let rhs = rhs.into_arg();
        let gt = compare(site, BinaryOp::CmpLt, rhs.clone(), Arg::Tensor(self.clone()));
        let eq = compare(site, BinaryOp::CmpEq, Arg::Tensor(self.clone()), rhs);
        Tensor::apply(site, air::Op::Binary(BinaryOp::Or), &[&gt, &eq])
    }

    /// `self == rhs` (bool), element-wise.
    #[track_caller]
    pub fn eq(&self, rhs: impl Operand) -> Tensor {
        compare(Site::here("eq"), BinaryOp::CmpEq, Arg::Tensor(self.clone()), rhs.into_arg())
    }

    /// `self != rhs` (bool), element-wise.
    #[track_caller]
    pub fn ne(&self, rhs: impl Operand) -> Tensor {
        compare(Site::here("ne"), BinaryOp::CmpNe, Arg::Tensor(self.clone()), rhs.into_arg())
    }

    /// Logical and (operands are read as `x != 0`).
    #[track_caller]
    pub fn logical_and(&self, rhs: impl Operand) -> Tensor {
        logical(Site::here("logical_and"), BinaryOp::And, self, rhs.into_arg())
    }

    /// Logical or (operands are read as `x != 0`).
    #[track_caller]
    pub fn logical_or(&self, rhs: impl Operand) -> Tensor {
        logical(Site::here("logical_or"), BinaryOp::Or, self, rhs.into_arg())
    }

    /// Logical exclusive or (operands are read as `x != 0`).
    #[track_caller]
    pub fn logical_xor(&self, rhs: impl Operand) -> Tensor {
        logical(Site::here("logical_xor"), BinaryOp::CmpNe, self, rhs.into_arg())
    }

    /// Logical not (bool result; numbers are read as `x != 0`).
    #[track_caller]
    pub fn logical_not(&self) -> Tensor {
        let site = Site::here("logical_not");
        self.p_cast(site, DType::Bool).p_unary(site, UnaryOp::Not)
    }

    /// Bitwise and of bools or integers (`torch.bitwise_and`, the `&` operator): logical and on
    /// bools. Floats are an error.
    #[track_caller]
    pub fn bitwise_and(&self, rhs: impl Operand) -> Tensor {
        bitwise(Site::here("bitwise_and"), BinaryOp::And, self, rhs.into_arg())
    }

    /// Bitwise or of bools or integers (`torch.bitwise_or`, the `|` operator).
    #[track_caller]
    pub fn bitwise_or(&self, rhs: impl Operand) -> Tensor {
        bitwise(Site::here("bitwise_or"), BinaryOp::Or, self, rhs.into_arg())
    }

    /// Bitwise exclusive or of bools or integers (`torch.bitwise_xor`, the `^` operator):
    /// `(a | b) & !(a & b)`, which on bools is `a != b`.
    #[track_caller]
    pub fn bitwise_xor(&self, rhs: impl Operand) -> Tensor {
        let site = Site::here("bitwise_xor");
        let rhs = rhs.into_arg();
        let either = bitwise(site, BinaryOp::Or, self, rhs.clone());
        let both = bitwise(site, BinaryOp::And, self, rhs);
        if either.error().is_some() {
            return either;
        }
        either.p_binary(site, BinaryOp::And, &both.p_unary(site, UnaryOp::Not))
    }

    /// Bitwise not (`torch.bitwise_not`, the `!` operator, PyTorch's `~`): logical not on bools,
    /// `-x - 1` on integers. Floats are an error.
    #[track_caller]
    pub fn bitwise_not(&self) -> Tensor {
        let site = Site::here("bitwise_not");
        if self.error().is_none() && self.dtype().is_float() {
            return site.fail(format!("needs a bool or integer tensor, got {}", self.dtype()));
        }
        self.p_unary(site, UnaryOp::Not)
    }

    /// `where(self, a, b)`: picks `a` where `self` (a bool tensor) is true, else `b`. All three
    /// broadcast together; `a` and `b` may be scalars. PyTorch's `torch.where(cond, a, b)`; see
    /// also the free function [`where_cond`](crate::where_cond).
    #[track_caller]
    pub fn where_cond(&self, a: impl Operand, b: impl Operand) -> Tensor {
        self.select_where(Site::here("where"), a, b)
    }

    /// The same as [`Tensor::where_cond`], under its first name. A trailing `_` means "in place"
    /// in PyTorch, which this is not: new code should say `where_cond`.
    #[deprecated(note = "use `where_cond`: a trailing `_` means in-place in PyTorch, which this is not")]
    #[track_caller]
    pub fn where_(&self, a: impl Operand, b: impl Operand) -> Tensor {
        self.select_where(Site::here("where"), a, b)
    }

    fn select_where(&self, site: Site, a: impl Operand, b: impl Operand) -> Tensor {
        if self.error().is_none() && !self.dtype().is_bool() {
            return site.fail(format!("condition must be bool, got {}", self.dtype()));
        }
        match resolve(site, vec![Arg::Tensor(self.clone()), a.into_arg(), b.into_arg()], 1) {
            Ok(v) => Tensor::p_where(site, &v[0], &v[1], &v[2]),
            Err(e) => e,
        }
    }
}

fn logical(site: Site, op: BinaryOp, lhs: &Tensor, rhs: Arg) -> Tensor {
    let rhs = match rhs {
        Arg::Tensor(t) => t.p_cast(site, DType::Bool),
        Arg::Scalar(s) => {
            if lhs.error().is_some() {
                return lhs.clone();
            }
            lhs.const_like(site, Scalar::Bool(s.as_bool()), DType::Bool, Shape::new())
        }
    };
    match resolve(site, vec![Arg::Tensor(lhs.p_cast(site, DType::Bool)), Arg::Tensor(rhs)], 0) {
        Ok(v) => v[0].p_binary(site, op, &v[1]),
        Err(e) => e,
    }
}

/// `lhs op rhs` for the bitwise ops (`and`, `or`): bools and integers of one promoted dtype;
/// floats are an error naming the op.
fn bitwise(site: Site, op: BinaryOp, lhs: &Tensor, rhs: Arg) -> Tensor {
    let v = match resolve(site, vec![Arg::Tensor(lhs.clone()), rhs], 0) {
        Ok(v) => v,
        Err(e) => return e,
    };
    if v[0].dtype().is_float() {
        return site.fail(format!("needs bool or integer tensors, got {}", v[0].dtype()));
    }
    v[0].p_binary(site, op, &v[1])
}

/// `where(cond, a, b)` as a free function (PyTorch's `torch.where(cond, a, b)`); the same as
/// `cond.where_cond(a, b)`.
#[track_caller]
pub fn where_cond(cond: &Tensor, a: impl Operand, b: impl Operand) -> Tensor {
    cond.select_where(Site::here("where"), a, b)
}

/// The same as [`where_cond`], under its first name (a trailing `_` reads as "in place" in
/// PyTorch, which this is not: new code should say `where_cond`).
#[deprecated(note = "use `where_cond`: a trailing `_` means in-place in PyTorch, which this is not")]
#[track_caller]
pub fn where_(cond: &Tensor, a: impl Operand, b: impl Operand) -> Tensor {
    cond.select_where(Site::here("where"), a, b)
}

/// Scalar-on-the-left helpers for the operator impls (`2.0 - &t`).
pub(crate) fn scalar_lhs(site: Site, op: BinaryOp, lhs: Scalar, rhs: &Tensor) -> Tensor {
    binary(site, op, Arg::Scalar(lhs), Arg::Tensor(rhs.clone()), op == BinaryOp::Div)
}

/// How `gelu` approximates (PyTorch's `approximate=` argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GeluApprox {
    /// The exact form `0.5 x (1 + erf(x / sqrt 2))`.
    #[default]
    None,
    /// The tanh form `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Tanh,
}

impl Tensor {
    /// `self` as a float tensor: integers and bools become `f32`.
    pub(crate) fn float_input(&self, site: Site) -> Tensor {
        if self.error().is_some() || self.dtype().is_float() { self.clone() } else { self.p_cast(site, DType::F32) }
    }

    /// `self` as the operand of a composite float op (several IR ops), and the dtype of the op's
    /// result, to which the caller casts it at the end: integers and bools become `f32` (and so
    /// does the result, as in PyTorch); `f16` and `bf16` are widened to `f32` and the result is
    /// rounded back once, which is PyTorch's "opmath" for these ops. Every IR op rounds a half
    /// result, so steps computed in the half dtype would each round: `tanh(3)` in bf16 would be
    /// 1.0 (`1 + exp(-6)` rounds to 1) where PyTorch gives 0.9961.
    pub(crate) fn opmath(&self, site: Site) -> (Tensor, DType) {
        let x = self.float_input(site);
        let dtype = x.dtype();
        if x.error().is_none() && dtype.is_half() { (x.p_cast(site, DType::F32), dtype) } else { (x, dtype) }
    }

    fn float_unary(&self, site: Site, op: UnaryOp) -> Tensor {
        self.float_input(site).p_unary(site, op)
    }

    /// A scalar constant with `self`'s dtype and shape, as an op's operand (shared between the
    /// ops that splat the same value at the same shape: [`Tensor::const_operand`]).
    pub(crate) fn splat(&self, site: Site, value: impl IntoScalar) -> Tensor {
        if self.error().is_some() {
            return self.clone();
        }
        self.const_operand(site, value.into_scalar(), self.dtype(), self.shape().clone())
    }

    /// Element-wise negation. Bools are an error, as in PyTorch (use `logical_not`).
    #[track_caller]
    pub fn neg(&self) -> Tensor {
        let site = Site::here("neg");
        if self.error().is_none() && self.dtype().is_bool() {
            return site.fail(BOOL_NEG);
        }
        self.p_unary(site, UnaryOp::Neg)
    }

    /// `2 ** x`.
    #[track_caller]
    pub fn exp2(&self) -> Tensor {
        self.float_unary(Site::here("exp2"), UnaryOp::Exp2)
    }

    /// `log2(x)`.
    #[track_caller]
    pub fn log2(&self) -> Tensor {
        self.float_unary(Site::here("log2"), UnaryOp::Log2)
    }

    /// `e ** x`, as `exp2(x * log2(e))`.
    #[track_caller]
    pub fn exp(&self) -> Tensor {
        let site = Site::here("exp");
        let (x, dtype) = self.opmath(site);
        x.p_binary(site, BinaryOp::Mul, &x.splat(site, LOG2_E)).p_unary(site, UnaryOp::Exp2).p_cast(site, dtype)
    }

    /// The natural logarithm, as `log2(x) * ln(2)`.
    #[track_caller]
    pub fn log(&self) -> Tensor {
        let site = Site::here("log");
        let (x, dtype) = self.opmath(site);
        let x = x.p_unary(site, UnaryOp::Log2);
        x.p_binary(site, BinaryOp::Mul, &x.splat(site, LN_2)).p_cast(site, dtype)
    }

    /// Square root.
    #[track_caller]
    pub fn sqrt(&self) -> Tensor {
        self.float_unary(Site::here("sqrt"), UnaryOp::Sqrt)
    }

    /// `1 / sqrt(x)`.
    #[track_caller]
    pub fn rsqrt(&self) -> Tensor {
        let site = Site::here("rsqrt");
        let (x, dtype) = self.opmath(site);
        x.p_unary(site, UnaryOp::Sqrt).p_unary(site, UnaryOp::Recip).p_cast(site, dtype)
    }

    /// `1 / x`.
    #[track_caller]
    pub fn reciprocal(&self) -> Tensor {
        self.float_unary(Site::here("reciprocal"), UnaryOp::Recip)
    }

    /// `x * x`.
    #[track_caller]
    pub fn square(&self) -> Tensor {
        let site = Site::here("square");
        self.p_binary(site, BinaryOp::Mul, self)
    }

    /// Sine.
    #[track_caller]
    pub fn sin(&self) -> Tensor {
        self.float_unary(Site::here("sin"), UnaryOp::Sin)
    }

    /// Cosine, as `sin(x + pi/2)`.
    #[track_caller]
    pub fn cos(&self) -> Tensor {
        let site = Site::here("cos");
        let (x, dtype) = self.opmath(site);
        x.p_binary(site, BinaryOp::Add, &x.splat(site, FRAC_PI_2)).p_unary(site, UnaryOp::Sin).p_cast(site, dtype)
    }

    /// Arctangent, in `(-pi/2, pi/2)`: `|x|` reduced to `[-tan(pi/8), tan(pi/8)]` by `pi/4 + atan((x - 1) /
    /// (x + 1))` above `tan(pi/8)` and `pi/2 + atan(-1/x)` above `tan(3 pi/8)`, then an odd
    /// polynomial of degree 9 (Cephes' single-precision coefficients), within a few f32 ulps; the
    /// sign put back. Each branch's operands are kept finite where it is not taken, so the
    /// gradient is a number everywhere.
    #[track_caller]
    pub fn atan(&self) -> Tensor {
        let site = Site::here("atan");
        let (x, dtype) = self.opmath(site);
        let a = x.abs();
        let big = a.gt(2.414_213_562_373_095);
        let mid = a.gt(0.414_213_562_373_095).logical_and(big.logical_not());
        let inverse = big.where_cond(&a, 1.0).reciprocal().neg();
        let shifted = a.sub(1.0).div(a.add(1.0));
        // Below tan(pi/8) the polynomial takes `x` itself (it is odd): no `|x|`, whose gradient at
        // 0 is 0, on the path through 0.
        let t = big.where_cond(&inverse, mid.where_cond(&shifted, &x));
        let base = big.where_cond(
            a.full_like(FRAC_PI_2),
            mid.where_cond(a.full_like(std::f64::consts::FRAC_PI_4), a.zeros_like()),
        );
        let z = t.mul(&t);
        let poly = z.mul(8.053_744_495_38e-2).sub(1.387_768_560_32e-1).mul(&z).add(1.997_771_064_78e-1).mul(&z);
        let poly = poly.sub(3.333_294_915_39e-1).mul(&z).mul(&t).add(&t);
        let r = base.add(poly);
        let reduced = big.logical_or(&mid);
        reduced.logical_and(x.lt(0.0)).where_cond(r.neg(), r).p_cast(site, dtype)
    }

    /// Arcsine, as `atan(x / sqrt((1 - x)(1 + x)))` (`±pi/2` at `±1`, NaN outside `[-1, 1]`).
    #[track_caller]
    pub fn asin(&self) -> Tensor {
        let site = Site::here("asin");
        let (x, dtype) = self.opmath(site);
        x.div(x.neg().add(1.0).mul(x.add(1.0)).sqrt()).atan().p_cast(site, dtype)
    }

    /// Arccosine, as `2 atan(sqrt((1 - x) / (1 + x)))` (accurate near `1`, `pi` at `-1`, NaN
    /// outside `[-1, 1]`).
    #[track_caller]
    pub fn acos(&self) -> Tensor {
        let site = Site::here("acos");
        let (x, dtype) = self.opmath(site);
        x.neg().add(1.0).div(x.add(1.0)).sqrt().atan().mul(2.0).p_cast(site, dtype)
    }

    /// The error function.
    #[track_caller]
    pub fn erf(&self) -> Tensor {
        self.float_unary(Site::here("erf"), UnaryOp::Erf)
    }

    /// Rounds toward zero.
    #[track_caller]
    pub fn trunc(&self) -> Tensor {
        self.float_unary(Site::here("trunc"), UnaryOp::Trunc)
    }

    /// Rounds toward negative infinity: `trunc(x) - (trunc(x) > x)`.
    #[track_caller]
    pub fn floor(&self) -> Tensor {
        let site = Site::here("floor");
        let x = self.float_input(site);
        let t = x.p_unary(site, UnaryOp::Trunc);
        let above = x.p_binary(site, BinaryOp::CmpLt, &t);
        let lower = t.p_binary(site, BinaryOp::Sub, &t.splat(site, 1.0));
        Tensor::p_where(site, &above, &lower, &t)
    }

    /// Rounds toward positive infinity: `trunc(x) + (trunc(x) < x)`.
    #[track_caller]
    pub fn ceil(&self) -> Tensor {
        let site = Site::here("ceil");
        let x = self.float_input(site);
        let t = x.p_unary(site, UnaryOp::Trunc);
        let below = t.p_binary(site, BinaryOp::CmpLt, &x);
        let higher = t.p_binary(site, BinaryOp::Add, &t.splat(site, 1.0));
        Tensor::p_where(site, &below, &higher, &t)
    }

    /// Absolute value: `where(x < 0, -x, where(x == 0, 0, x))`. The gradient is `sign(x)`, 0 at
    /// `x == 0` as in PyTorch, and `abs(-0.0)` is `+0.0`.
    #[track_caller]
    pub fn abs(&self) -> Tensor {
        let site = Site::here("abs");
        if self.error().is_some() || self.dtype().is_bool() {
            return self.clone();
        }
        let zero = self.splat(site, 0);
        let negative = self.p_binary(site, BinaryOp::CmpLt, &zero);
        let is_zero = self.p_binary(site, BinaryOp::CmpEq, &zero);
        let non_negative = Tensor::p_where(site, &is_zero, &zero, self);
        Tensor::p_where(site, &negative, &self.p_unary(site, UnaryOp::Neg), &non_negative)
    }

    /// Hyperbolic tangent as `2 * sigmoid(2x) - 1 = 2 / (1 + exp(-2x)) - 1`, within a few `1e-7`
    /// of `tanh` absolutely and exactly `±1` where it saturates. The exponent is capped at 80 (so
    /// `x < -40`, where `tanh` is `-1` in f32, still gives `-1`): `exp` never overflows, so neither
    /// the value nor the gradient is ever NaN for a number. It reads `x` once and has no divide,
    /// so the scheduler fuses it with `x`'s producer however costly that is (a form that reads `x`
    /// several times, as a sign test and `|x|` do, makes an expensive `x` a kernel of its own).
    #[track_caller]
    pub fn tanh(&self) -> Tensor {
        let site = Site::here("tanh");
        let (x, dtype) = self.opmath(site);
        let t = x.mul(-2.0);
        let e = t.p_binary(site, BinaryOp::Min, &t.splat(site, 80.0)).exp();
        let s = e.p_binary(site, BinaryOp::Add, &e.splat(site, 1.0)).p_unary(site, UnaryOp::Recip);
        let y = s.p_binary(site, BinaryOp::Mul, &s.splat(site, 2.0)).p_binary(site, BinaryOp::Sub, &s.splat(site, 1.0));
        y.p_cast(site, dtype)
    }

    /// `1 / (1 + exp2(min(x * -log2(e), cap)))`; saturates cleanly to 0 and 1. The exponent is
    /// capped just below where `exp2` overflows (127 in f32, where halves compute, and 1022 in
    /// f64), so `1 + exp` stays finite: the gradient, whose chain rule multiplies `exp`'s
    /// derivative by `recip`'s, is 0 rather than `0 * inf = NaN` far left (PyTorch gives 0 there
    /// too), and the value there is `sigmoid` at the cap (`2^-127` in f32) instead of a subnormal.
    /// Multiplying by `-log2(e)` rounds exactly as negating and then multiplying by `log2(e)`, and
    /// saves the negation: five ops, which keeps the gate math of a recurrent step one kernel.
    #[track_caller]
    pub fn sigmoid(&self) -> Tensor {
        let site = Site::here("sigmoid");
        let (x, dtype) = self.opmath(site);
        let cap = if x.dtype() == DType::F64 { 1022.0 } else { 127.0 };
        let t = x.p_binary(site, BinaryOp::Mul, &x.splat(site, -LOG2_E));
        let e = t.p_binary(site, BinaryOp::Min, &t.splat(site, cap)).p_unary(site, UnaryOp::Exp2);
        e.p_binary(site, BinaryOp::Add, &e.splat(site, 1.0)).p_unary(site, UnaryOp::Recip).p_cast(site, dtype)
    }

    /// `max(x, 0)`: NaN stays NaN, and the gradient is 0 at `x == 0`, as PyTorch's `relu` (a
    /// constant operand wins `max` ties in `lower::autodiff`).
    #[track_caller]
    pub fn relu(&self) -> Tensor {
        let site = Site::here("relu");
        self.p_binary(site, BinaryOp::Max, &self.splat(site, 0))
    }

    /// Exact GELU, `0.5 x (1 + erf(x / sqrt 2))` (PyTorch's default).
    #[track_caller]
    pub fn gelu(&self) -> Tensor {
        self.gelu_with(GeluApprox::None)
    }

    /// GELU with the tanh approximation (PyTorch's `approximate="tanh"`).
    #[track_caller]
    pub fn gelu_tanh(&self) -> Tensor {
        self.gelu_with(GeluApprox::Tanh)
    }

    /// GELU, exact or approximated.
    #[track_caller]
    pub fn gelu_with(&self, approximate: GeluApprox) -> Tensor {
        let site = Site::here("gelu");
        let (x, dtype) = self.opmath(site);
        let y = match approximate {
            GeluApprox::None => x.mul(0.5).mul(x.mul(FRAC_1_SQRT_2).erf().add(1.0)),
            // `0.5 x (1 + tanh(u)) = x sigmoid(2u)`: the same function in five ops fewer.
            GeluApprox::Tanh => {
                let cube = x.p_binary(site, BinaryOp::Mul, &x).p_binary(site, BinaryOp::Mul, &x);
                let u2 = x.add(cube.mul(0.044715)).mul(2.0 * FRAC_2_PI.sqrt());
                x.p_binary(site, BinaryOp::Mul, &u2.sigmoid())
            }
        };
        y.p_cast(site, dtype)
    }

    /// `x * sigmoid(x)`.
    #[track_caller]
    pub fn silu(&self) -> Tensor {
        let site = Site::here("silu");
        let (x, dtype) = self.opmath(site);
        x.p_binary(site, BinaryOp::Mul, &x.sigmoid()).p_cast(site, dtype)
    }

    /// Clamps to `[min, max]`: `minimum(maximum(x, min), max)` (`max` wins where `min > max`;
    /// NaN stays NaN). As in PyTorch the gradient reaches `x` only strictly inside the bounds: a
    /// constant operand wins ties in `lower::autodiff`, so it is 0 at `x == min` and `x == max`.
    #[track_caller]
    pub fn clamp(&self, min: impl IntoScalar, max: impl IntoScalar) -> Tensor {
        self.maximum(min.into_scalar()).minimum(max.into_scalar())
    }

    /// `maximum(x, min)` (PyTorch's `clamp_min`; gradient 0 at `x == min`).
    #[track_caller]
    pub fn clamp_min(&self, min: impl IntoScalar) -> Tensor {
        self.maximum(min.into_scalar())
    }

    /// `minimum(x, max)` (PyTorch's `clamp_max`; gradient 0 at `x == max`).
    #[track_caller]
    pub fn clamp_max(&self, max: impl IntoScalar) -> Tensor {
        self.minimum(max.into_scalar())
    }

    /// Converts to `dtype` (a no-op when it already is). See the interpreter docs for the rules.
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Tensor {
        self.p_cast(Site::here("cast"), dtype)
    }

    /// The same as [`Tensor::cast`] (PyTorch's `.to(dtype)`).
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        self.p_cast(Site::here("to_dtype"), dtype)
    }
}

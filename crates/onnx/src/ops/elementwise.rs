//! Element-wise ops: unary math and activations, binary arithmetic and comparisons (numpy
//! broadcasting), variadic Max/Min/Sum/Mean, Where, Clip, Cast, Dropout (inference).

use kiln::{DType, GeluApprox, Tensor};

use super::{Ctx, OpResult};

/// `max(x, 0) + log(1 + e)` with `e = exp(-|x|)`: softplus without overflow for large `x`, and
/// with `log(1 + e)` as its series `e - e^2/2 + e^3/3` for `e < 0.01` (where `1 + e` would round
/// away `e`'s low bits; the series' error is below `e^4/4`).
pub(super) fn softplus(x: &Tensor) -> Tensor {
    let e = x.abs().neg().exp();
    let series = e.mul(e.mul(e.div(3.0).sub(0.5)).add(1.0));
    x.maximum(0.0).add(e.lt(0.01).where_cond(&series, e.add(1.0).log()))
}

/// `tanh`, with its series `x - x^3/3` for `|x| < 0.01` (error below `2|x|^5/15`): the facade's
/// tanh loses relative precision near 0 (about 1e-3 at 1e-4, where softplus of a very negative
/// number lands in Mish).
fn tanh(x: &Tensor) -> Tensor {
    let series = x.sub(x.square().mul(x).div(3.0));
    x.abs().lt(0.01).where_cond(&series, x.tanh())
}

/// Round half to even (ONNX's Round, numpy's `round`).
pub(super) fn round_even(x: &Tensor) -> Tensor {
    let r = x.floor();
    let diff = x.sub(&r);
    let odd = r.remainder(2.0).ne(0.0);
    let up = r.add(1.0);
    let tie = odd.where_cond(&up, &r);
    diff.gt(0.5).where_cond(&up, diff.lt(0.5).where_cond(&r, &tie))
}

pub(super) fn unary(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let alpha = |d: f32| ctx.float("alpha", d).map(f64::from);
    let y = match ctx.op() {
        "Abs" => x.abs(),
        "Neg" => x.neg(),
        "Exp" => x.exp(),
        "Log" => x.log(),
        "Sqrt" => x.sqrt(),
        "Reciprocal" => x.reciprocal(),
        "Floor" => x.floor(),
        "Ceil" => x.ceil(),
        "Sin" => x.sin(),
        "Cos" => x.cos(),
        "Tan" => x.sin().div(x.cos()),
        "Atan" => x.atan(),
        "Asin" => x.asin(),
        "Acos" => x.acos(),
        "Tanh" => tanh(x),
        "Sigmoid" => x.sigmoid(),
        "Relu" => x.relu(),
        "Erf" => x.erf(),
        "Sign" => {
            let dt = x.dtype();
            x.gt(0.0).cast(dt).sub(x.lt(0.0).cast(dt))
        }
        "Identity" => x.clone(),
        "Not" => x.logical_not(),
        "BitwiseNot" => x.bitwise_not(),
        "Softplus" => softplus(x),
        "Softsign" => x.div(x.abs().add(1.0)),
        "Elu" => {
            let a = alpha(1.0)?;
            x.lt(0.0).where_cond(x.exp().sub(1.0).mul(a), x)
        }
        "Celu" => {
            let a = alpha(1.0)?;
            x.maximum(0.0).add(x.div(a).exp().sub(1.0).mul(a).minimum(0.0))
        }
        "Selu" => {
            let a = alpha(1.673_263_2)?;
            let g = f64::from(ctx.float("gamma", 1.050_701)?);
            x.le(0.0).where_cond(x.exp().mul(a).sub(a), x).mul(g)
        }
        "LeakyRelu" => {
            let a = alpha(0.01)?;
            x.lt(0.0).where_cond(x.mul(a), x)
        }
        "HardSigmoid" => {
            let a = alpha(0.2)?;
            let b = f64::from(ctx.float("beta", 0.5)?);
            x.mul(a).add(b).clamp(0.0, 1.0)
        }
        "HardSwish" => x.mul(x.div(6.0).add(0.5).clamp(0.0, 1.0)),
        "ThresholdedRelu" => {
            let a = alpha(1.0)?;
            x.gt(a).where_cond(x, x.zeros_like())
        }
        "Mish" => x.mul(tanh(&softplus(x))),
        "Swish" => x.mul(x.mul(alpha(1.0)?).sigmoid()),
        "Gelu" => match ctx.string("approximate")?.as_deref().unwrap_or("none") {
            "none" => x.gelu_with(GeluApprox::None),
            "tanh" => x.gelu_with(GeluApprox::Tanh),
            other => return Err(format!("approximate = {other:?} is not one of \"none\", \"tanh\"").into()),
        },
        "Round" => round_even(x),
        "IsNaN" => x.ne(x),
        "IsInf" => {
            let pos = x.eq(f64::INFINITY);
            let neg = x.eq(f64::NEG_INFINITY);
            match (ctx.int("detect_positive", 1)? != 0, ctx.int("detect_negative", 1)? != 0) {
                (true, true) => pos.logical_or(&neg),
                (true, false) => pos,
                (false, true) => neg,
                (false, false) => x.ne(x).logical_and(x.eq(x)),
            }
        }
        "Sinh" => x.exp().sub(x.neg().exp()).mul(0.5),
        "Cosh" => x.exp().add(x.neg().exp()).mul(0.5),
        "Asinh" => x.add(x.square().add(1.0).sqrt()).log(),
        "Acosh" => x.add(x.square().sub(1.0).sqrt()).log(),
        "Atanh" => x.add(1.0).div(x.neg().add(1.0)).log().mul(0.5),
        "Shrink" => {
            let l = f64::from(ctx.float("lambd", 0.5)?);
            let b = f64::from(ctx.float("bias", 0.0)?);
            x.lt(-l).where_cond(x.add(b), x.gt(l).where_cond(x.sub(b), x.zeros_like()))
        }
        other => return Err(format!("{other} is not an element-wise unary op").into()),
    };
    Ok(vec![y])
}

/// The value of `t` if it holds data (an initializer or a `Constant`) and one element.
fn constant_scalar(t: &Tensor) -> Option<f64> {
    if !t.is_realized() || t.numel().ok()? != kiln::Dim::Const(1) {
        return None;
    }
    let host = t.to_host().ok()?;
    Some(host.data.get(0).as_f64())
}

pub(super) fn binary(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (a, b) = (ctx.input(0)?, ctx.input(1)?);
    let dt = a.dtype();
    let y = match ctx.op() {
        "Add" => a.add(b),
        "Sub" => a.sub(b),
        "Mul" => a.mul(b),
        "Div" if dt.is_float() => a.div(b),
        // Integer division truncates toward zero (C semantics, as onnxruntime).
        "Div" => a.div(b).trunc().cast(dt),
        // A constant square or cube is multiplied out, as onnxruntime does: a general `pow`
        // runs a library call per element (an exported GPT-2's GELU, `x + 0.044715 x^3`, spent
        // 80% of its steady call in it).
        "Pow" if dt.is_float() && constant_scalar(b) == Some(2.0) => a.mul(a),
        "Pow" if dt.is_float() && constant_scalar(b) == Some(3.0) => a.mul(a).mul(a),
        "Pow" => a.pow(b).cast(dt),
        "Equal" => a.eq(b),
        "Less" => a.lt(b),
        "Greater" => a.gt(b),
        "LessOrEqual" => a.le(b),
        "GreaterOrEqual" => a.ge(b),
        "And" => a.logical_and(b),
        "Or" => a.logical_or(b),
        "Xor" => a.logical_xor(b),
        "BitwiseAnd" => a.bitwise_and(b),
        "BitwiseOr" => a.bitwise_or(b),
        "BitwiseXor" => a.bitwise_xor(b),
        "Mod" => {
            if ctx.int("fmod", 0)? != 0 {
                a.fmod(b)
            } else if dt.is_float() {
                return Err("Mod of floats needs fmod = 1".into());
            } else {
                a.remainder(b)
            }
        }
        "PRelu" => a.lt(0.0).where_cond(a.mul(b), a),
        other => return Err(format!("{other} is not an element-wise binary op").into()),
    };
    Ok(vec![y])
}

pub(super) fn variadic(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let xs = ctx.all();
    let Some((first, rest)) = xs.split_first() else {
        return Err("needs at least one input".into());
    };
    let mut acc = (*first).clone();
    for x in rest {
        acc = match ctx.op() {
            "Max" => acc.maximum(*x),
            "Min" => acc.minimum(*x),
            _ => acc.add(*x),
        };
    }
    if ctx.op() == "Mean" {
        acc = acc.div(xs.len() as f64);
    }
    Ok(vec![acc])
}

pub(super) fn where_op(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    Ok(vec![ctx.input(0)?.where_cond(ctx.input(1)?, ctx.input(2)?)])
}

pub(super) fn clip(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let mut y = x.clone();
    if ctx.opset < 11 {
        y = y.maximum(f64::from(ctx.float("min", f32::NEG_INFINITY)?));
        y = y.minimum(f64::from(ctx.float("max", f32::INFINITY)?));
    } else {
        if let Some(lo) = ctx.opt(1) {
            y = y.maximum(lo);
        }
        if let Some(hi) = ctx.opt(2) {
            y = y.minimum(hi);
        }
    }
    Ok(vec![y])
}

pub(super) fn cast(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let to = if ctx.op() == "CastLike" { ctx.input(1)?.dtype() } else { ctx.dtype_attr("to")? };
    if to == DType::Bool || x.dtype() == DType::Bool || to.is_float() == x.dtype().is_float() {
        return Ok(vec![x.cast(to)]);
    }
    // Float to integer truncates toward zero (C semantics); integer to float rounds.
    Ok(vec![if x.dtype().is_float() { x.trunc().cast(to) } else { x.cast(to) }])
}

pub(super) fn dropout(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let training = match ctx.opt(2) {
        Some(t) if ctx.opset >= 12 => ctx.scalar_f64(t)? != 0.0,
        _ => false,
    };
    let ratio = match ctx.opt(1) {
        Some(r) if ctx.opset >= 12 => ctx.scalar_f64(r)?,
        _ => f64::from(ctx.float("ratio", 0.5)?),
    };
    if training && ratio != 0.0 {
        return Err("training-mode dropout (random masks) is not supported".into());
    }
    Ok(vec![x.clone(), x.ones_like().cast(DType::Bool)])
}

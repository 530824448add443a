//! Dense and normalization ops: MatMul, Gemm, Layer/Batch/Instance/Lp/MeanVariance
//! normalization (inference semantics).

use kiln::{DType, Tensor};

use super::{Ctx, OpResult, axis};

pub(super) fn matmul(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    Ok(vec![ctx.input(0)?.matmul(ctx.input(1)?)])
}

pub(super) fn gemm(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (mut a, mut b) = (ctx.input(0)?.clone(), ctx.input(1)?.clone());
    if a.ndim() != 2 || b.ndim() != 2 {
        return Err(format!("A and B must be 2-D, got ranks {} and {}", a.ndim(), b.ndim()).into());
    }
    if ctx.int("transA", 0)? != 0 {
        a = a.transpose(0, 1);
    }
    if ctx.int("transB", 0)? != 0 {
        b = b.transpose(0, 1);
    }
    let alpha = f64::from(ctx.float("alpha", 1.0)?);
    let beta = f64::from(ctx.float("beta", 1.0)?);
    let mut y = a.matmul(&b);
    if alpha != 1.0 {
        y = y.mul(alpha);
    }
    if let Some(c) = ctx.opt(2) {
        y = y.add(if beta != 1.0 { c.mul(beta) } else { c.clone() });
    }
    Ok(vec![y])
}

/// `(x - mean) * rsqrt(var + eps)` over `axes`, with the mean and the inverse deviation.
fn normalize(x: &Tensor, axes: &[usize], eps: f64) -> (Tensor, Tensor, Tensor) {
    let mean = x.mean_keepdim(axes.to_vec());
    let centered = x.sub(&mean);
    let inv = centered.square().mean_keepdim(axes.to_vec()).add(eps).rsqrt();
    (centered.mul(&inv), mean, inv)
}

/// The shared attributes of LayerNormalization and RMSNormalization: the normalized axes (`axis`
/// to the last), epsilon, and the input in the type it is computed in (`stash_type` 1, the
/// default, is f32).
fn last_axes_norm(ctx: &Ctx) -> OpResult<(Tensor, Vec<usize>, f64)> {
    let x = ctx.input(0)?;
    let a = axis(ctx.int("axis", -1)?, x.ndim())?;
    let eps = f64::from(ctx.float("epsilon", 1e-5)?);
    let work = if ctx.int("stash_type", 1)? == 1 && x.dtype() != DType::F64 { x.cast(DType::F32) } else { x.clone() };
    Ok((work, (a..x.ndim()).collect(), eps))
}

pub(super) fn layer_norm(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let dtype = ctx.input(0)?.dtype();
    let (work, axes, eps) = last_axes_norm(ctx)?;
    let (mut y, mean, inv) = normalize(&work, &axes, eps);
    y = y.cast(dtype).mul(ctx.input(1)?);
    if let Some(b) = ctx.opt(2) {
        y = y.add(b);
    }
    Ok(vec![y, mean, inv])
}

/// A per-channel parameter `[C]` shaped to broadcast against `[N, C, ...]` of rank `rank`.
fn channel(p: &Tensor, rank: usize) -> Tensor {
    let mut y = p.clone();
    for _ in 2..rank {
        y = y.unsqueeze(-1);
    }
    y
}

pub(super) fn batch_norm(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let r = x.ndim();
    if r < 2 {
        return Err("needs rank >= 2".into());
    }
    if ctx.int("training_mode", 0)? != 0 || (ctx.opset < 7 && ctx.int("is_test", 0)? == 0 && ctx.node.output.len() > 1)
    {
        return Err("training-mode batch normalization is not supported".into());
    }
    let eps = f64::from(ctx.float("epsilon", 1e-5)?);
    let (scale, bias, mean, var) = (ctx.input(1)?, ctx.input(2)?, ctx.input(3)?, ctx.input(4)?);
    let inv = channel(var, r).add(eps).rsqrt();
    let y = x.sub(channel(mean, r)).mul(inv.mul(channel(scale, r))).add(channel(bias, r));
    Ok(vec![y])
}

pub(super) fn instance_norm(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let r = x.ndim();
    if r < 3 {
        return Err("needs rank >= 3".into());
    }
    let eps = f64::from(ctx.float("epsilon", 1e-5)?);
    let axes: Vec<usize> = (2..r).collect();
    let (y, _, _) = normalize(x, &axes, eps);
    Ok(vec![y.mul(channel(ctx.input(1)?, r)).add(channel(ctx.input(2)?, r))])
}

pub(super) fn lp_norm(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let a = axis(ctx.int("axis", -1)?, x.ndim())?;
    let norm = match ctx.int("p", 2)? {
        1 => x.abs().sum_keepdim(a),
        2 => x.square().sum_keepdim(a).sqrt(),
        p => return Err(format!("p = {p} is not 1 or 2").into()),
    };
    // A zero norm (an all-zero slice) gives zeros, not 0/0.
    let safe = norm.eq(0.0).where_cond(norm.ones_like(), &norm);
    Ok(vec![x.div(safe)])
}

pub(super) fn mean_variance_norm(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let axes = ctx.ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
    let axes = axes.iter().map(|&a| axis(a, x.ndim())).collect::<OpResult<Vec<_>>>()?;
    let (y, _, _) = normalize(x, &axes, 1e-9);
    Ok(vec![y])
}

pub(super) fn rms_norm(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let dtype = ctx.input(0)?.dtype();
    let (work, axes, eps) = last_axes_norm(ctx)?;
    let inv = work.square().mean_keepdim(axes).add(eps).rsqrt();
    Ok(vec![work.mul(inv).cast(dtype).mul(ctx.input(1)?)])
}

/// Negative log-likelihood of `log_prob` (`[N, C, d...]`) at `target` (`[N, d...]`), with the
/// optional class `weight`, `ignore_index` and `reduction` attributes of NegativeLogLikelihoodLoss
/// and SoftmaxCrossEntropyLoss.
fn nll(ctx: &Ctx, log_prob: &Tensor, target: &Tensor, weight: Option<&Tensor>) -> OpResult<Tensor> {
    if log_prob.ndim() < 2 || target.ndim() + 1 != log_prob.ndim() {
        return Err(format!(
            "input {} and target {} are not [N, C, d...] and [N, d...]",
            super::show(log_prob),
            super::show(target)
        )
        .into());
    }
    let keep = match ctx.attr("ignore_index") {
        Some(_) => Some(target.ne(ctx.int("ignore_index", 0)?)),
        None => None,
    };
    let safe = match &keep {
        Some(k) => k.where_cond(target, target.zeros_like()),
        None => target.clone(),
    };
    let picked = log_prob.gather(1, &safe.unsqueeze(1)).squeeze(1);
    let mut w = match weight {
        Some(w) => w.index_select(0, &safe.reshape(&[-1])).reshape(safe.shape()),
        None => picked.ones_like(),
    };
    if let Some(k) = &keep {
        w = k.where_cond(&w, w.zeros_like());
    }
    let loss = picked.neg().mul(&w);
    Ok(match ctx.string("reduction")?.as_deref().unwrap_or("mean") {
        "none" => loss,
        "sum" => loss.sum_all(),
        "mean" => loss.sum_all().div(w.sum_all()),
        other => return Err(format!("reduction {other:?} is not none, sum or mean").into()),
    })
}

pub(super) fn nll_loss(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    Ok(vec![nll(ctx, ctx.input(0)?, ctx.input(1)?, ctx.opt(2))?])
}

pub(super) fn softmax_cross_entropy(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let scores = ctx.input(0)?;
    if scores.ndim() < 2 {
        return Err("scores must be [N, C, ...]".into());
    }
    let log_prob = scores.log_softmax(1);
    Ok(vec![nll(ctx, &log_prob, ctx.input(1)?, ctx.opt(2))?, log_prob])
}

/// GroupNormalization: `[N, C, ...]` normalized over each group of `C / num_groups` channels and
/// all spatial positions (computed in f32, or f64 for f64 input), then scaled and shifted per channel
/// (opset 21's `[C]` scale and bias) or per group (opset 18's `[num_groups]`).
pub(super) fn group_norm(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let d = super::dims(x)?;
    if d.len() < 3 {
        return Err(format!("input {} must be [N, C, ...]", super::show(x)).into());
    }
    let (n, c) = (d[0], d[1]);
    let groups = usize::try_from(ctx.int("num_groups", 0)?).ok().filter(|&g| g >= 1 && c % g == 0);
    let g = groups.ok_or_else(|| format!("num_groups must divide the {c} channels"))?;
    let eps = f64::from(ctx.float("epsilon", 1e-5)?);
    let work = if x.dtype() == DType::F64 { x.clone() } else { x.cast(DType::F32) };
    let grouped = work.reshape(vec![n, g, d[1..].iter().product::<usize>() / g]);
    let (normed, _, _) = normalize(&grouped, &[2], eps);
    let mut shape = vec![1usize; d.len()];
    shape[1] = c;
    let per_channel = |p: &Tensor| -> OpResult<Tensor> {
        let len = p.shape().iter().map(|v| v.as_const()).product::<Option<i64>>();
        match len {
            Some(l) if l as usize == c => Ok(p.reshape(shape.clone())),
            // One value per group, repeated for its channels.
            Some(l) if l as usize == g => Ok(p.reshape(vec![g, 1]).expand(vec![g, c / g]).reshape(shape.clone())),
            _ => Err(format!("scale and bias {} must hold C = {c} or num_groups = {g} values", super::show(p)).into()),
        }
    };
    let (scale, bias) = (per_channel(ctx.input(1)?)?, per_channel(ctx.input(2)?)?);
    let y = normed.reshape(d.clone()).cast(x.dtype()).mul(scale).add(bias);
    Ok(vec![y])
}

/// LRN: each element divided by `(bias + alpha / size * s)^beta`, `s` the sum of squares over
/// the `size` neighbouring channels: a sum of shifted slices of the zero-padded squares.
pub(super) fn lrn(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let size = usize::try_from(ctx.int("size", 0)?).ok().filter(|&s| s >= 1).ok_or("size must be positive")?;
    let (alpha, beta, bias) =
        (f64::from(ctx.float("alpha", 1e-4)?), f64::from(ctx.float("beta", 0.75)?), f64::from(ctx.float("bias", 1.0)?));
    let c = x.shape().get(1).and_then(|d| d.as_const()).ok_or("LRN needs [N, C, ...] with concrete channels")?;
    // floor((size - 1) / 2) channels before each one, the rest after.
    let before = (size - 1) / 2;
    let after = size - 1 - before;
    let mut pads = vec![(0, 0); x.ndim()];
    pads[1] = (before, after);
    let squares = x.square().pad(&pads, 0.0);
    let sum = (0..size).map(|j| squares.narrow(1, j as i64, c)).reduce(|a, b| a.add(&b)).expect("size >= 1");
    Ok(vec![x.div(sum.mul(alpha / size as f64).add(bias).pow(beta))])
}

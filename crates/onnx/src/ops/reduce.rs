//! Reductions (ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp), CumSum and
//! CumProd, TopK, ArgMax/ArgMin and Softmax/LogSoftmax/Hardmax, with each opset's axis rules.

use kiln::{DType, Tensor};

use super::shape::take;
use super::{Ctx, OpResult, axis};

pub(super) fn reduce(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    // Axes moved from an attribute to input 1: ReduceSum at opset 13, the others at 18.
    let since = if ctx.op() == "ReduceSum" { 13 } else { 18 };
    let axes = if ctx.opset < since { ctx.ints("axes")? } else { ctx.opt_values(1)? };
    let keep = ctx.int("keepdims", 1)? != 0;
    let axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a.iter().map(|&a| axis(a, x.ndim())).collect::<OpResult<_>>()?,
        _ if ctx.opset >= since && ctx.int("noop_with_empty_axes", 0)? != 0 => {
            let y = match ctx.op() {
                "ReduceL1" => x.abs(),
                "ReduceSumSquare" => x.square(),
                "ReduceL2" => x.square().sqrt(),
                "ReduceLogSum" => x.log(),
                _ => x.clone(),
            };
            return Ok(vec![y]);
        }
        _ => (0..x.ndim()).collect(),
    };
    let y = match ctx.op() {
        "ReduceSum" => x.sum_keepdim(&axes),
        "ReduceMean" => x.mean_keepdim(&axes),
        "ReduceMax" => x.amax_keepdim(&axes),
        "ReduceMin" => x.amin_keepdim(&axes),
        "ReduceL1" => x.abs().sum_keepdim(&axes),
        "ReduceL2" => x.square().sum_keepdim(&axes).sqrt(),
        "ReduceSumSquare" => x.square().sum_keepdim(&axes),
        "ReduceLogSum" => x.sum_keepdim(&axes).log(),
        "ReduceLogSumExp" => x.logsumexp_keepdim(&axes),
        "ReduceProd" => product_keepdim(x, &axes)?,
        other => return Err(format!("{other} is not a reduction").into()),
    };
    Ok(vec![without(y, &axes, keep)])
}

/// The product over `axes`, kept with size 1: per axis a tree of pairwise products (an odd
/// length padded with a 1), `log2(n)` element-wise multiplies over a concrete axis of `n`.
fn product_keepdim(x: &Tensor, axes: &[usize]) -> OpResult<Tensor> {
    let mut y = x.clone();
    for &a in axes {
        let mut n = y.shape()[a].as_const().ok_or("ReduceProd needs concrete reduced axes")?;
        if n == 0 {
            // The empty product.
            y = y.sum_keepdim(a).ones_like();
            continue;
        }
        while n > 1 {
            if n % 2 == 1 {
                let mut pads = vec![(0, 0); y.ndim()];
                pads[a] = (0, 1);
                y = y.pad(&pads, 1.0);
                n += 1;
            }
            let mut pairs = y.shape().to_vec();
            pairs[a] = (n / 2).into();
            pairs.insert(a + 1, 2.into());
            let p = y.reshape(pairs);
            y = p.narrow(a as i64 + 1, 0, 1).mul(p.narrow(a as i64 + 1, 1, 1)).squeeze(a + 1);
            n /= 2;
        }
    }
    Ok(y)
}

/// CumSum and CumProd: running sums or products along `axis` (input 1), `exclusive` (each
/// leaves its own element out) and `reverse` (from the end). A Hillis-Steele scan: `log2(n)`
/// rounds, each combining every element with the one `2^r` before it (the identity before the
/// start), so the graph and the work grow as `n log n`, not `n^2`. A sum along a symbolic axis
/// (RoBERTa's and OPT's positions, counted from the attention mask over the sequence) is a
/// masked sum over an `n x n` triangle instead ([`masked_cumsum`]).
pub(super) fn cumulative(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let a = axis(*ctx.values_at(1)?.first().ok_or("axis must hold one value")?, x.ndim())?;
    let product = ctx.op() == "CumProd";
    let (exclusive, reverse) = (ctx.int("exclusive", 0)? != 0, ctx.int("reverse", 0)? != 0);
    let Some(n) = x.shape()[a].as_const() else {
        if product {
            return Err("a running product needs a concrete axis".into());
        }
        return Ok(vec![masked_cumsum(ctx, x, a, exclusive, reverse)]);
    };
    let identity = if product { 1.0 } else { 0.0 };
    let flip = |t: &Tensor| take(ctx, t, a, (0..n).rev().collect());
    // `t` moved `by` positions along the axis, the identity in front.
    let shifted = |t: &Tensor, by: i64| -> Tensor {
        let mut pads = vec![(0, 0); t.ndim()];
        pads[a] = (by as usize, 0);
        t.narrow(a, 0, n - by).pad(&pads, identity)
    };
    let mut y = if reverse { flip(x) } else { x.clone() };
    let mut step = 1;
    while step < n {
        let earlier = shifted(&y, step);
        y = if product { y.mul(&earlier) } else { y.add(&earlier) };
        step *= 2;
    }
    if exclusive && n > 0 {
        y = shifted(&y, 1);
    }
    Ok(vec![if reverse { flip(&y) } else { y }])
}

/// The running sum of `x` along axis `a` of symbolic length `n`: output `j` sums the inputs `i`
/// with `i <= j` (`i < j` when `exclusive`; `>=` and `>` when `reverse`), as one masked sum
/// over `[..., n (j), n (i)]`.
fn masked_cumsum(ctx: &Ctx, x: &Tensor, a: usize, exclusive: bool, reverse: bool) -> Tensor {
    let n = x.shape()[a];
    let i = Tensor::iota_on(n, DType::I64, ctx.device).unsqueeze(0);
    let j = Tensor::iota_on(n, DType::I64, ctx.device).unsqueeze(1);
    let keep = match (reverse, exclusive) {
        (false, false) => i.le(&j),
        (false, true) => i.lt(&j),
        (true, false) => i.ge(&j),
        (true, true) => i.gt(&j),
    };
    // Axis `a` last (`to_last`), and back (`back`).
    let r = x.ndim();
    let to_last: Vec<usize> = (0..r).filter(|&d| d != a).chain([a]).collect();
    let mut back = vec![0; r];
    for (at, &d) in to_last.iter().enumerate() {
        back[d] = at;
    }
    let xs = x.permute(to_last).unsqueeze(r - 1);
    keep.where_cond(&xs, xs.zeros_like()).sum(&[r]).permute(back)
}

/// TopK: the `k` largest (or, with `largest = 0`, smallest) elements along `axis` and their
/// indices, best first, ties to the lower index. `k` rounds, each taking the best element not
/// yet taken: among the positions holding the best remaining value, the first one not taken
/// (so a value equal to the masking infinity is still found in order).
pub(super) fn top_k(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let a = axis(ctx.int("axis", -1)?, x.ndim())?;
    // K is an attribute before opset 10.
    let k = if ctx.opset < 10 { vec![ctx.int("k", -1)?] } else { ctx.values_at(1)? };
    let k = match k.as_slice() {
        [k] if *k >= 0 => *k,
        other => return Err(format!("K {other:?} is not one non-negative count").into()),
    };
    let n = x.shape()[a].as_const().ok_or("TopK needs a concrete axis")?;
    if k > n {
        return Err(format!("K = {k} is more than the {n} elements along axis {a}").into());
    }
    let largest = ctx.int("largest", 1)? != 0;
    let mut shape = vec![1usize; x.ndim()];
    shape[a] = n as usize;
    let positions = ctx.i64s((0..n).collect(), &shape);
    let worst = if largest { f64::NEG_INFINITY } else { f64::INFINITY };
    let worst = match x.dtype() {
        kiln::DType::I32 => x.full_like(if largest { i32::MIN } else { i32::MAX }),
        kiln::DType::I64 => x.full_like(if largest { i64::MIN } else { i64::MAX }),
        _ => x.ones_like().mul(worst),
    };
    let mut taken = positions.lt(0i64);
    let (mut values, mut indices) = (Vec::new(), Vec::new());
    for _ in 0..k {
        let key = taken.where_cond(&worst, x);
        let best = if largest { key.amax_keepdim(a) } else { key.amin_keepdim(a) };
        let candidates = key.eq(&best).logical_and(taken.logical_not());
        let index = candidates.cast(kiln::DType::I32).argmax_keepdim(a);
        values.push(x.gather(a, &index));
        taken = taken.logical_or(positions.eq(&index));
        indices.push(index);
    }
    if k == 0 {
        return Ok(vec![x.narrow(a, 0, 0), x.narrow(a, 0, 0).cast(kiln::DType::I64)]);
    }
    let (values, indices): (Vec<&Tensor>, Vec<&Tensor>) = (values.iter().collect(), indices.iter().collect());
    Ok(vec![Tensor::cat(&values, a), Tensor::cat(&indices, a).cast(kiln::DType::I64)])
}

/// `y` with the reduced `axes` (kept with size 1) removed unless `keep` (ONNX's `keepdims`).
fn without(mut y: Tensor, axes: &[usize], keep: bool) -> Tensor {
    if !keep {
        let mut axes = axes.to_vec();
        axes.sort_unstable();
        axes.dedup();
        for &a in axes.iter().rev() {
            y = y.squeeze(a);
        }
    }
    y
}

pub(super) fn arg(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let a = axis(ctx.int("axis", 0)?, x.ndim())?;
    let keep = ctx.int("keepdims", 1)? != 0;
    let max = ctx.op() == "ArgMax";
    let pick = |t: &Tensor| without(if max { t.argmax_keepdim(a) } else { t.argmin_keepdim(a) }, &[a], keep);
    if ctx.int("select_last_index", 0)? == 0 {
        return Ok(vec![pick(x)]);
    }
    // The last extremum is the first one of the reversed axis.
    let n = x.shape()[a].as_const().ok_or("select_last_index needs a concrete axis")?;
    let reversed = take(ctx, x, a, (0..n).rev().collect());
    Ok(vec![pick(&reversed).neg().add(n - 1)])
}

pub(super) fn softmax(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let r = x.ndim();
    let apply = |t: &Tensor, a: usize| -> Tensor {
        match ctx.op() {
            "Softmax" => t.softmax(a),
            "LogSoftmax" => t.log_softmax(a),
            _ => {
                let n = t.shape()[a].as_const().unwrap_or(0);
                let mut shape = vec![1usize; t.ndim()];
                shape[a] = n.max(0) as usize;
                let iota = ctx.i64s((0..n).collect(), &shape);
                t.argmax_keepdim(a).eq(&iota).cast(t.dtype())
            }
        }
    };
    if r == 0 {
        return Err("needs rank >= 1".into());
    }
    if ctx.opset >= 13 {
        let a = axis(ctx.int("axis", -1)?, r)?;
        if ctx.op() == "Hardmax" && x.shape()[a].as_const().is_none() {
            return Err("Hardmax needs a concrete axis".into());
        }
        return Ok(vec![apply(x, a)]);
    }
    // Before opset 13: the input is seen as 2-D [prod(dims[..axis]), prod(dims[axis..])].
    let a = ctx.int("axis", 1)?;
    let a = if a < 0 { a + r as i64 } else { a };
    if a < 0 || a > r as i64 {
        return Err(format!("axis {a} is out of range for rank {r}").into());
    }
    let flat = if a == 0 { x.flatten(0, -1).unsqueeze(0) } else { x.flatten(a, -1).flatten(0, a - 1) };
    let flat = if a as usize == r { x.flatten(0, -1).unsqueeze(1) } else { flat };
    Ok(vec![apply(&flat, 1).reshape(x.shape())])
}

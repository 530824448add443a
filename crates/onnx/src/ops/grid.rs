//! GridSample and AffineGrid. GridSample: `X` (`[N, C, D1, ..., Dk]`, k = 2 or 3) read at the
//! positions a grid (`[N, O1, ..., Ok, k]`, normalized to `[-1, 1]`, x first) gives, by nearest,
//! linear or cubic interpolation, with zeros, border or reflection padding. AffineGrid makes such
//! a grid from affine maps.
//!
//! The positions are data, so every tap is a gather: per spatial axis, each output position's
//! tap indices (2 for linear, 4 for cubic, 1 for nearest), their weights and whether they lie
//! inside; per combination of taps over the axes, one gather from `X` flattened over its spatial
//! dims, masked and weighted. The steps are those of ONNX's reference implementation.

use kiln::{DType, Dim, HostData, HostTensor, Tensor};

use super::elementwise::round_even;
use super::{Ctx, OpResult, dims, show};

/// One tap along one axis: its (clamped, in range) index as i64, its weight, and whether it
/// reads the input (false: a zero of `zeros` padding).
struct Tap {
    index: Tensor,
    weight: Option<Tensor>,
    inside: Option<Tensor>,
}

pub(super) fn grid_sample(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (x, grid) = (ctx.input(0)?, ctx.input(1)?);
    let xd = dims(x)?;
    let k = xd
        .len()
        .checked_sub(2)
        .filter(|&k| k == 2 || k == 3)
        .ok_or_else(|| format!("X {} must be [N, C, H, W] or [N, C, D, H, W]", show(x)))?;
    if grid.ndim() != k + 2 || grid.shape()[k + 1].as_const() != Some(k as i64) {
        return Err(format!("grid {} must be [N, out..., {k}] for X {}", show(grid), show(x)).into());
    }
    let mode = match ctx.string("mode")?.as_deref().unwrap_or(if ctx.opset < 20 { "bilinear" } else { "linear" }) {
        "bilinear" | "linear" => 1,
        "nearest" => 0,
        "bicubic" | "cubic" => 3,
        other => return Err(format!("mode {other:?} is not supported").into()),
    };
    let padding = ctx.string("padding_mode")?.unwrap_or_else(|| "zeros".into());
    if !matches!(padding.as_str(), "zeros" | "border" | "reflection") {
        return Err(format!("padding_mode {padding:?} is not supported").into());
    }
    let align = ctx.int("align_corners", 0)? != 0;
    let spatial = &xd[2..];
    let work = if x.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let grid = grid.cast(work);
    // Per spatial axis (first to last), its taps.
    let mut taps: Vec<Vec<Tap>> = Vec::with_capacity(k);
    for (axis, &len) in spatial.iter().enumerate() {
        let len_f = len as f64;
        // The grid's last dim lists x (the last spatial axis) first.
        let normalized = grid.narrow(k + 1, (k - 1 - axis) as i64, 1).squeeze(k + 1);
        let mut c = if align {
            normalized.add(1.0).mul((len_f - 1.0) / 2.0)
        } else {
            normalized.add(1.0).mul(len_f).sub(1.0).div(2.0)
        };
        if mode == 0 {
            c = round_even(&c);
        }
        let (lo, hi) = if align { (0.0, len_f - 1.0) } else { (-0.5, len_f - 0.5) };
        // Coordinates outside the border first moved in (border, reflection).
        let outside = c.lt(lo).logical_or(c.gt(hi));
        c = match padding.as_str() {
            "border" => outside.where_cond(c.clamp(0.0, len_f - 1.0), &c),
            "reflection" => outside.where_cond(reflect(&c, lo, hi), &c),
            _ => c,
        };
        let pixel = |i: Tensor, weight: Option<Tensor>| -> Tap {
            // `i` is integral: a tap's index before padding.
            match padding.as_str() {
                "zeros" => Tap {
                    inside: Some(i.ge(0.0).logical_and(i.lt(len_f))),
                    index: i.clamp(0.0, len_f - 1.0).cast(DType::I64),
                    weight,
                },
                "border" => Tap { index: i.clamp(0.0, len_f - 1.0).cast(DType::I64), weight, inside: None },
                _ => Tap {
                    index: reflect(&i, lo, hi).trunc().clamp(0.0, len_f - 1.0).cast(DType::I64),
                    weight,
                    inside: None,
                },
            }
        };
        let axis_taps = match mode {
            0 => vec![pixel(c.trunc(), None)],
            _ => {
                let base = c.floor();
                let t = c.sub(&base);
                let weights: Vec<Tensor> =
                    if mode == 1 { vec![t.neg().add(1.0), t.clone()] } else { cubic_weights(&t) };
                let first = if mode == 1 { 0.0 } else { -1.0 };
                weights.into_iter().enumerate().map(|(j, w)| pixel(base.add(first + j as f64), Some(w))).collect()
            }
        };
        taps.push(axis_taps);
    }
    // Every combination of one tap per axis: a gather from X flattened over its spatial dims.
    let n = x.shape()[0];
    let channels = xd[1];
    let total: usize = spatial.iter().product();
    let outs: Vec<Dim> = grid.shape()[1..=k].to_vec();
    let flat_out: i64 = outs
        .iter()
        .map(|d| d.as_const())
        .product::<Option<i64>>()
        .ok_or_else(|| format!("grid {}: the output's spatial dims must be concrete", show(&grid)))?;
    let source = x.reshape(vec![n, Dim::from(channels as i64), Dim::from(total as i64)]);
    // Every combination of one tap per axis (the last axis fastest).
    let mut combinations: Vec<Vec<&Tap>> = vec![Vec::new()];
    for axis_taps in &taps {
        combinations = combinations
            .into_iter()
            .flat_map(|c| axis_taps.iter().map(move |t| [c.clone(), vec![t]].concat()))
            .collect();
    }
    let flat = |t: Tensor| t.reshape(vec![n, Dim::from(1), Dim::from(flat_out)]);
    let values = combinations.into_iter().map(|combination| {
        let index = combination
            .iter()
            .enumerate()
            .map(|(axis, tap)| tap.index.mul(spatial[axis + 1..].iter().product::<usize>() as i64))
            .reduce(|a, b| a.add(&b))
            .expect("k >= 2");
        let index = flat(index).expand(vec![n, Dim::from(channels as i64), Dim::from(flat_out)]);
        let mut value = source.gather(2, &index).cast(work);
        if let Some(inside) = combination.iter().filter_map(|t| t.inside.clone()).reduce(|a, b| a.logical_and(&b)) {
            value = flat(inside).where_cond(&value, 0.0);
        }
        if let Some(weight) = combination.iter().filter_map(|t| t.weight.clone()).reduce(|a, b| a.mul(&b)) {
            value = value.mul(flat(weight));
        }
        value
    });
    let sum = values.reduce(|a, b| a.add(&b)).expect("one combination at least");
    let mut shape = vec![n, Dim::from(channels as i64)];
    shape.extend(outs);
    Ok(vec![sum.reshape(shape).cast(x.dtype())])
}

/// `c` reflected by the near border until it lies in `[lo, hi]` (ONNX's reference: the distance
/// past the border folded by whole ranges, mirrored on odd folds).
fn reflect(c: &Tensor, lo: f64, hi: f64) -> Tensor {
    let range = hi - lo;
    let fold = |past: Tensor, near: f64, far: f64, inward: f64| -> Tensor {
        // `inward`: +1 when going in from `near` increases the coordinate.
        let folds = past.div(range).trunc();
        let rest = past.sub(folds.mul(range));
        let even = folds.remainder(2.0).eq(0.0);
        even.where_cond(rest.mul(inward).add(near), rest.mul(-inward).add(far))
    };
    let below = fold(c.neg().add(lo), lo, hi, 1.0);
    let above = fold(c.sub(hi), hi, lo, -1.0);
    c.lt(lo).where_cond(below, c.gt(hi).where_cond(above, c))
}

/// Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 from a fraction `t`.
fn cubic_weights(t: &Tensor) -> Vec<Tensor> {
    let a = -0.75;
    let near = |x: Tensor| x.mul(a + 2.0).sub(a + 3.0).mul(&x).mul(&x).add(1.0);
    let far = |x: Tensor| x.mul(a).sub(5.0 * a).mul(&x).add(8.0 * a).mul(&x).sub(4.0 * a);
    let u = t.neg().add(1.0);
    vec![far(t.add(1.0)), near(t.clone()), near(u.clone()), far(u.add(1.0))]
}

/// AffineGrid: the sampling grid (`[N, H, W, 2]` or `[N, D, H, W, 3]`, x first) that `theta`
/// (`[N, 2, 3]` or `[N, 3, 4]`) maps the output's normalized positions to: a constant
/// `[positions, k + 1]` of homogeneous coordinates (pixel centres, or corners with
/// `align_corners`) times each `theta` transposed.
pub(super) fn affine_grid(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let theta = ctx.input(0)?;
    let size = ctx.values_at(1)?;
    let spatial: Vec<usize> = match size.as_slice() {
        [_, _, rest @ ..] if (rest.len() == 2 || rest.len() == 3) && rest.iter().all(|&v| v > 0) => {
            rest.iter().map(|&v| v as usize).collect()
        }
        other => return Err(format!("size {other:?} is not [N, C, H, W] or [N, C, D, H, W]").into()),
    };
    let k = spatial.len();
    if theta.ndim() != 3
        || theta.shape()[1].as_const() != Some(k as i64)
        || theta.shape()[2].as_const() != Some(k as i64 + 1)
    {
        return Err(format!("theta {} is not [N, {k}, {}] for size {size:?}", show(theta), k + 1).into());
    }
    let align = ctx.int("align_corners", 0)? != 0;
    let coordinate = |i: usize, len: usize| -> f64 {
        if align {
            if len == 1 { -1.0 } else { -1.0 + 2.0 * i as f64 / (len - 1) as f64 }
        } else {
            -1.0 + (2 * i + 1) as f64 / len as f64
        }
    };
    let positions: usize = spatial.iter().product();
    let mut homo = Vec::with_capacity(positions * (k + 1));
    for p in 0..positions {
        // The position's index along each spatial axis, the last fastest.
        let mut rest = p;
        let mut at = vec![0usize; k];
        for axis in (0..k).rev() {
            at[axis] = rest % spatial[axis];
            rest /= spatial[axis];
        }
        // x (the last axis) first, then y (and z), then 1.
        homo.extend((0..k).rev().map(|axis| coordinate(at[axis], spatial[axis])));
        homo.push(1.0);
    }
    let homo = HostTensor::new(HostData::F64(homo), vec![positions, k + 1]).map_err(|e| e.to_string())?;
    let grid = ctx.constant(homo).cast(theta.dtype()).matmul(&theta.transpose(1, 2));
    let mut shape = vec![theta.shape()[0]];
    shape.extend(spatial.iter().map(|&d| Dim::from(d as i64)));
    shape.push(Dim::from(k as i64));
    Ok(vec![grid.reshape(shape)])
}

//! Resize (opset 11 on; the older Upsample too): nearest, linear and cubic interpolation, with
//! every coordinate transformation, antialiasing, `exclude_outside`, `keep_aspect_ratio_policy`,
//! `axes` and `tf_crop_and_resize`'s region and extrapolation value.
//!
//! Interpolation is separable, so each resized axis is one linear map from its `in` positions to
//! its `out` positions: a constant `[out, in]` matrix of coefficients computed at import (in f64,
//! from the node's attributes and the concrete sizes) and applied with one matmul along the axis.
//! Where every output position copies one input position (nearest, or an axis resized by an
//! integer position map), the axis is an `index_select` instead: exact for every dtype, and no
//! `0 * inf` from the matrix's zeros.

use kiln::{DType, HostData, HostTensor, Tensor};

use super::{Ctx, OpResult, axis, show};

/// The interpolation the node asks for.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest(Rounding),
    Linear,
    Cubic { a: f64 },
}

/// How `nearest` picks between the two input positions around a source coordinate.
#[derive(Clone, Copy, PartialEq)]
enum Rounding {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
}

/// Everything that decides one axis's coefficients besides its sizes.
struct Options {
    mode: Mode,
    transform: String,
    antialias: bool,
    exclude_outside: bool,
    extrapolation: f64,
}

pub(super) fn resize(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let rank = x.ndim();
    let upsample = ctx.op() == "Upsample";
    let legacy = upsample || ctx.opset < 11;
    let mode_name = ctx.string("mode")?.unwrap_or_else(|| "nearest".into());
    let rounding = match ctx.string("nearest_mode")?.as_deref() {
        // Upsample and Resize-10 take the floor of an asymmetric coordinate.
        _ if legacy => Rounding::Floor,
        None | Some("round_prefer_floor") => Rounding::PreferFloor,
        Some("round_prefer_ceil") => Rounding::PreferCeil,
        Some("floor") => Rounding::Floor,
        Some("ceil") => Rounding::Ceil,
        Some(other) => return Err(format!("nearest_mode {other:?} is not supported").into()),
    };
    let mode = match mode_name.as_str() {
        "nearest" => Mode::Nearest(rounding),
        "linear" | "bilinear" | "trilinear" => Mode::Linear,
        "cubic" => Mode::Cubic { a: f64::from(ctx.float("cubic_coeff_a", -0.75)?) },
        other => return Err(format!("mode {other:?} is not supported").into()),
    };
    let options = Options {
        mode,
        transform: if legacy {
            "asymmetric".into()
        } else {
            ctx.string("coordinate_transformation_mode")?.unwrap_or_else(|| "half_pixel".into())
        },
        antialias: ctx.int("antialias", 0)? != 0,
        exclude_outside: ctx.int("exclude_outside", 0)? != 0,
        extrapolation: f64::from(ctx.float("extrapolation_value", 0.0)?),
    };
    if options.antialias && matches!(mode, Mode::Nearest(_)) {
        return Err("antialias is not defined for nearest".into());
    }
    // The resized axes and, per axis, the scale and output size.
    let axes: Vec<usize> = match ctx.ints("axes")? {
        Some(a) => a.iter().map(|&v| axis(v, rank)).collect::<OpResult<_>>()?,
        None => (0..rank).collect(),
    };
    // Upsample before opset 9 has a `scales` attribute; Upsample 9 and Resize 10 a scales input;
    // Resize 11 on roi, scales and sizes inputs.
    let (scales_at, sizes_at, roi_at) = if upsample && ctx.opset < 9 {
        (None, None, None)
    } else if legacy {
        (Some(1), None, None)
    } else {
        (Some(2), Some(3), Some(1))
    };
    let floats_of = |i: Option<usize>| -> OpResult<Option<Vec<f64>>> {
        match i.and_then(|i| ctx.opt(i)) {
            None => Ok(None),
            Some(t) => {
                let host = t.to_host()?;
                Ok((host.numel() > 0).then(|| (0..host.numel()).map(|j| host.data.get(j).as_f64()).collect()))
            }
        }
    };
    let scales = match scales_at {
        None => ctx.floats("scales")?.map(|v| v.into_iter().map(f64::from).collect()),
        at => floats_of(at)?,
    };
    // Sizes as known shape values: a symbolic one must be the input's own dim (MobileViT sizes
    // its upsampling `[batch, C, h, w]` from the input's shape), an axis left as it is (`None`).
    let sizes =
        match sizes_at.filter(|&i| ctx.opt(i).is_some_and(|t| t.shape().iter().any(|d| d.as_const() != Some(0)))) {
            Some(i) => {
                let values = ctx.dim_values(i)?;
                let mut sizes = Vec::with_capacity(values.len());
                for (k, v) in values.iter().enumerate() {
                    sizes.push(match v.as_const() {
                        Some(v) => Some(v),
                        None if axes.get(k).is_some_and(|&a| x.shape()[a] == *v) => None,
                        None => return Err(format!("the size {v} of axis {k} is symbolic").into()),
                    });
                }
                Some(sizes)
            }
            None => None,
        };
    let roi = floats_of(roi_at)?;
    // A symbolic dim (a batch) can only be an axis the node leaves as it is (scale 1).
    let in_dims: Vec<Option<usize>> = x.shape().iter().map(|d| d.as_const().map(|v| v as usize)).collect();
    let (scale, out) = targets(ctx, &in_dims, &axes, scales, sizes)?;
    let roi = |a: usize| -> (f64, f64) {
        let r = roi.as_deref().unwrap_or(&[]);
        let k = axes.iter().position(|&b| b == a);
        match k {
            Some(k) if r.len() == 2 * axes.len() => (r[k], r[axes.len() + k]),
            _ if r.len() == 2 * rank => (r[a], r[rank + a]),
            _ => (0.0, 1.0),
        }
    };
    let mut y = x.clone();
    for &a in &axes {
        let r = roi(a);
        let (len, size, s) = match (in_dims[a], out[a]) {
            (Some(len), Some(size)) => (len, size, scale[a]),
            _ if scale[a] == 1.0 && r == (0.0, 1.0) => continue,
            _ => return Err(format!("X {}: the resized axis {a} must be concrete", show(x)).into()),
        };
        if size == len && (s - 1.0).abs() < 1e-12 && r == (0.0, 1.0) {
            continue;
        }
        y = resize_axis(ctx, &y, a, len, size, s, r, &options)?;
    }
    Ok(vec![y])
}

/// Per axis, the scale and the output size, from `scales` or `sizes` (with
/// `keep_aspect_ratio_policy`) for the resized `axes`; other axes keep their size.
/// Sizes are `None` where the input's dim is symbolic (the caller checks it is left as it is).
fn targets(
    ctx: &Ctx,
    in_dims: &[Option<usize>],
    axes: &[usize],
    scales: Option<Vec<f64>>,
    sizes: Option<Vec<Option<i64>>>,
) -> OpResult<(Vec<f64>, Vec<Option<usize>>)> {
    let rank = in_dims.len();
    let mut scale = vec![1.0; rank];
    let mut out = in_dims.to_vec();
    // The scale of a symbolic dim given `size`: none can be known, so it counts as changed.
    let ratio = |size: usize, len: Option<usize>| len.map_or(f64::NAN, |len| size as f64 / len as f64);
    match (scales, sizes) {
        (_, Some(sizes)) => {
            if sizes.len() != axes.len() || sizes.iter().any(|&v| v.is_some_and(|v| v < 0)) {
                return Err(format!("sizes {sizes:?} do not fit the {} resized axes", axes.len()).into());
            }
            // `None`: the input's own (symbolic) size, scale 1.
            for (&a, &v) in axes.iter().zip(&sizes) {
                if let Some(v) = v {
                    out[a] = Some(v as usize);
                    scale[a] = ratio(v as usize, in_dims[a]);
                }
            }
            let policy = ctx.string("keep_aspect_ratio_policy")?.unwrap_or_else(|| "stretch".into());
            let pick = match policy.as_str() {
                "stretch" => None,
                "not_larger" => Some(axes.iter().map(|&a| scale[a]).fold(f64::INFINITY, f64::min)),
                "not_smaller" => Some(axes.iter().map(|&a| scale[a]).fold(f64::NEG_INFINITY, f64::max)),
                other => return Err(format!("keep_aspect_ratio_policy {other:?} is not supported").into()),
            };
            if let Some(common) = pick {
                for &a in axes {
                    scale[a] = common;
                    out[a] = in_dims[a].map(|len| (common * len as f64 + 0.5) as usize);
                }
            }
        }
        (Some(scales), None) => {
            if scales.len() != axes.len() || scales.iter().any(|&v| v.is_nan() || v <= 0.0 || v.is_infinite()) {
                return Err(format!("scales {scales:?} do not fit the {} resized axes", axes.len()).into());
            }
            for (&a, &s) in axes.iter().zip(&scales) {
                scale[a] = s;
                out[a] = in_dims[a].map(|len| (s * len as f64) as usize);
            }
        }
        (None, None) => return Err("needs scales or sizes".into()),
    }
    Ok((scale, out))
}

/// Axis `a` of `x` (`len` positions) resized to `size` positions at `scale`, `roi` its region
/// for `tf_crop_and_resize`.
#[allow(clippy::too_many_arguments)]
fn resize_axis(
    ctx: &Ctx,
    x: &Tensor,
    a: usize,
    len: usize,
    size: usize,
    scale: f64,
    roi: (f64, f64),
    o: &Options,
) -> OpResult<Tensor> {
    if len == 0 {
        return Err(format!("cannot resize the empty axis {a} of {}", show(x)).into());
    }
    // Per output position: the input positions it reads, their weights, and whether it lies
    // outside the region (`tf_crop_and_resize`'s extrapolation).
    let mut rows: Vec<Vec<(usize, f64)>> = Vec::with_capacity(size);
    let mut outside = vec![false; size];
    let width = scale * len as f64;
    for (q, out) in outside.iter_mut().enumerate() {
        let y = q as f64;
        let src = match o.transform.as_str() {
            "align_corners" if width == 1.0 => 0.0,
            "align_corners" => y * (len as f64 - 1.0) / (width - 1.0),
            "asymmetric" => y / scale,
            "pytorch_half_pixel" if width == 1.0 => -0.5,
            "pytorch_half_pixel" | "half_pixel" => (y + 0.5) / scale - 0.5,
            "half_pixel_symmetric" => {
                let offset = len as f64 / 2.0 * (1.0 - size as f64 / width);
                offset + (y + 0.5) / scale - 0.5
            }
            "tf_crop_and_resize" => {
                let span = (roi.1 - roi.0) * (len as f64 - 1.0);
                let s = if width == 1.0 { span / 2.0 } else { y * span / (width - 1.0) };
                s + roi.0 * (len as f64 - 1.0)
            }
            other => return Err(format!("coordinate_transformation_mode {other:?} is not supported").into()),
        };
        if o.transform == "tf_crop_and_resize" && (src < 0.0 || src > len as f64 - 1.0) {
            *out = true;
            rows.push(Vec::new());
            continue;
        }
        // The fraction past the input position on the left; an exact position counts as the
        // right end of the interval on its left (ratio 1).
        let ratio = if src == src.floor() { 1.0 } else { src - src.floor() };
        let mut coeffs = coefficients(o, ratio, scale);
        let n = coeffs.len() as i64;
        let pad = (n + 1) / 2;
        let shifted = src + pad as f64;
        let p = shifted.floor() as i64;
        let frac = shifted - p as f64;
        let offset = if n % 2 == 0 {
            if frac == 0.0 { -(n / 2) } else { -(n / 2) + 1 }
        } else if frac <= 0.5 {
            -((n - 1) / 2)
        } else {
            -((n - 1) / 2) + 1
        };
        let start = p + offset - pad;
        if o.exclude_outside {
            for (j, c) in coeffs.iter_mut().enumerate() {
                let at = start + j as i64;
                if at < 0 || at >= len as i64 {
                    *c = 0.0;
                }
            }
            let sum: f64 = coeffs.iter().sum();
            let sum = if sum == 0.0 { 1.0 } else { sum };
            coeffs.iter_mut().for_each(|c| *c /= sum);
        }
        let mut row: Vec<(usize, f64)> = Vec::new();
        for (j, &c) in coeffs.iter().enumerate() {
            let at = (start + j as i64).clamp(0, len as i64 - 1) as usize;
            if c != 0.0 {
                match row.iter_mut().find(|(i, _)| *i == at) {
                    Some((_, w)) => *w += c,
                    None => row.push((at, c)),
                }
            }
        }
        rows.push(row);
    }
    let fill = |y: Tensor| -> Tensor {
        if !outside.contains(&true) {
            return y;
        }
        let mut shape = vec![1usize; x.ndim()];
        shape[a] = size;
        let mask = HostTensor::new(HostData::Bool(outside.clone()), shape).map(|h| ctx.constant(h));
        match mask {
            Ok(m) => m.where_cond(o.extrapolation, &y).cast(y.dtype()),
            Err(e) => Tensor::op_error("Resize", e),
        }
    };
    // Every position a copy of one input position: a gather.
    if rows.iter().zip(&outside).all(|(r, &out)| out || (r.len() == 1 && r[0].1 == 1.0)) {
        let picks: Vec<i64> = rows.iter().map(|r| r.first().map_or(0, |&(i, _)| i as i64)).collect();
        let index = ctx.i64s(picks, &[size]);
        return Ok(fill(x.index_select(a, &index)));
    }
    let dtype = x.dtype();
    if !matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(format!("interpolating a {} input (only nearest resizes integers)", dtype.name()).into());
    }
    // The map as [in, out], applied to x's axis moved last.
    let mut map = vec![0.0f64; len * size];
    for (q, row) in rows.iter().enumerate() {
        for &(i, w) in row {
            map[i * size + q] += w;
        }
    }
    let map = HostTensor::new(HostData::F64(map), vec![len, size]).map_err(|e| e.to_string())?;
    let map = ctx.constant(map).cast(dtype);
    let last = x.ndim() - 1;
    let y = x.transpose(a, last).matmul(&map).transpose(a, last);
    Ok(fill(y))
}

/// The weights of the input positions around a source coordinate whose fraction past the left
/// one is `ratio` (in `(0, 1]`), for an axis scaled by `scale`.
fn coefficients(o: &Options, ratio: f64, scale: f64) -> Vec<f64> {
    match o.mode {
        Mode::Nearest(rounding) => {
            let right = if ratio == 1.0 {
                true
            } else {
                match rounding {
                    Rounding::PreferFloor => ratio > 0.5,
                    Rounding::PreferCeil => ratio >= 0.5,
                    Rounding::Floor => false,
                    Rounding::Ceil => true,
                }
            };
            if right { vec![0.0, 1.0] } else { vec![1.0, 0.0] }
        }
        Mode::Linear if o.antialias => {
            let s = scale.min(1.0);
            let start = (-1.0 / s).floor() as i64 + 1;
            let taps = 2 - 2 * start;
            let w: Vec<f64> =
                (start..start + taps).map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0)).collect();
            normalized(w)
        }
        Mode::Linear => vec![1.0 - ratio, ratio],
        Mode::Cubic { a } if o.antialias => {
            let s = scale.min(1.0);
            let first = (-2.0 / s).floor() as i64 + 1;
            let w: Vec<f64> = (first..2 - first).map(|i| cubic(a, s * (i as f64 - ratio))).collect();
            normalized(w)
        }
        Mode::Cubic { a } => vec![cubic(a, 1.0 + ratio), cubic(a, ratio), cubic(a, 1.0 - ratio), cubic(a, 2.0 - ratio)],
    }
}

/// Keys' cubic convolution kernel with parameter `a` at distance `x`.
fn cubic(a: f64, x: f64) -> f64 {
    let x = x.abs();
    if x <= 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}

fn normalized(w: Vec<f64>) -> Vec<f64> {
    let sum: f64 = w.iter().sum();
    w.into_iter().map(|c| c / sum).collect()
}

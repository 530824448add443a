//! PyTorch's spatial functional forms: `pad` (in `F.pad` order, four modes), `interpolate`
//! (nearest, bilinear), `adaptive_avg_pool2d` and `batch_norm` (training and eval).
//!
//! All of them are compositions of the facade's ops: padding modes are concatenations of views,
//! resampling is an `index_select` per axis (a view when a nearest upsampling is by a whole
//! factor), adaptive pooling is two small averaging matmuls, so gradients come from autodiff.

use kiln::{Dim, Tensor};

use super::{affine, first_error, show};

/// How [`pad`] fills the new elements (PyTorch's `mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PadMode {
    /// The given `value` (`"constant"`, the default). Negative pads crop.
    #[default]
    Constant,
    /// The mirror image without the edge (`"reflect"`: `[1, 2, 3]` padded by 2 before is
    /// `[3, 2, 1, 2, 3]`); each pad must be smaller than the axis.
    Reflect,
    /// The edge element repeated (`"replicate"`).
    Replicate,
    /// The other end of the axis (`"circular"`); each pad at most the axis' length.
    Circular,
}

impl PadMode {
    fn name(self) -> &'static str {
        match self {
            PadMode::Constant => "constant",
            PadMode::Reflect => "reflect",
            PadMode::Replicate => "replicate",
            PadMode::Circular => "circular",
        }
    }
}

/// `F.pad(input, pad, mode="constant", value=0)`: `pad` lists `(before, after)` amounts from the
/// LAST axis backwards (`[left, right, top, bottom, ...]`), as PyTorch; it has an even length of
/// at most twice the rank. In constant mode a negative amount removes elements; the other modes
/// pad the trailing axes of a batched input (`[N, C, *]` with 1 to 3 spatial axes, or `[C, *]`)
/// and take non-negative amounts only. Axes being padded by reflect, replicate or circular must
/// have a concrete size.
#[track_caller]
pub fn pad(input: &Tensor, pad: &[i64], mode: PadMode, value: f64) -> Tensor {
    if let Some(e) = first_error(&[Some(input)]) {
        return e;
    }
    let nd = input.ndim();
    // Closures cannot carry `#[track_caller]`: the message is built here, the error made at the
    // `return`, so it names the caller's line.
    let fail = |why: String| format!("pad {pad:?} in {} mode for input {}: {why}", mode.name(), show(input));
    if !pad.len().is_multiple_of(2) || pad.len() / 2 > nd {
        return Tensor::op_error("pad", fail(format!("needs an even number of amounts, at most {}", 2 * nd)));
    }
    let axes = pad.len() / 2;
    if mode != PadMode::Constant {
        if pad.iter().any(|&p| p < 0) {
            return Tensor::op_error("pad", fail("negative amounts are only allowed in constant mode".into()));
        }
        if !(axes < nd && nd - axes <= 2 && (1..=3).contains(&axes)) {
            return Tensor::op_error("pad", fail("pads 1 to 3 trailing axes of a [C, *] or [N, C, *] input".into()));
        }
    }
    let mut x = input.clone();
    for k in 0..axes {
        let axis = nd - 1 - k;
        let (before, after) = (pad[2 * k], pad[2 * k + 1]);
        if before == 0 && after == 0 {
            continue;
        }
        x = match mode {
            PadMode::Constant => match pad_constant(&x, axis, before, after, value) {
                Ok(t) => t,
                Err(why) => return Tensor::op_error("pad", fail(why)),
            },
            _ => {
                let Some(len) = x.shape()[axis].as_const() else {
                    return Tensor::op_error("pad", fail(format!("axis {axis} has symbolic size {}", x.shape()[axis])));
                };
                match pad_mirror(&x, axis, len, before, after, mode) {
                    Ok(t) => t,
                    Err(why) => return Tensor::op_error("pad", fail(why)),
                }
            }
        };
    }
    x
}

/// Constant padding of one axis: the positive amounts padded, the negative ones cropped.
#[track_caller]
fn pad_constant(x: &Tensor, axis: usize, before: i64, after: i64, value: f64) -> Result<Tensor, String> {
    let (crop_lo, crop_hi) = ((-before).max(0), (-after).max(0));
    let x = if crop_lo > 0 || crop_hi > 0 {
        let len = x.shape()[axis];
        let kept = len - Dim::from(crop_lo + crop_hi);
        if let Some(k) = kept.as_const()
            && k < 0
        {
            return Err(format!("crops {} elements of axis {axis} of size {len}", crop_lo + crop_hi));
        }
        x.narrow(axis as i64, crop_lo, kept)
    } else {
        x.clone()
    };
    let (lo, hi) = (before.max(0) as usize, after.max(0) as usize);
    if lo == 0 && hi == 0 {
        return Ok(x);
    }
    let mut pairs = vec![(0, 0); x.ndim()];
    pairs[axis] = (lo, hi);
    Ok(x.pad(&pairs, value))
}

/// Reflect, replicate or circular padding of one axis of concrete length `len`.
#[track_caller]
fn pad_mirror(x: &Tensor, axis: usize, len: i64, before: i64, after: i64, mode: PadMode) -> Result<Tensor, String> {
    let a = axis as i64;
    let row = |i: i64| x.narrow(a, i, 1);
    let rows = |range: &mut dyn Iterator<Item = i64>| range.map(row).collect::<Vec<Tensor>>();
    let (mut lo, mut hi) = match mode {
        PadMode::Reflect => {
            if before >= len || after >= len {
                return Err(format!("each amount must be below the size {len} of axis {axis}"));
            }
            (rows(&mut (1..=before).rev()), rows(&mut (len - 1 - after..len - 1).rev()))
        }
        PadMode::Replicate => {
            if len == 0 {
                return Err(format!("axis {axis} is empty"));
            }
            let edge = |i: i64, n: i64| {
                let mut shape = x.shape().to_vec();
                shape[axis] = Dim::from(n);
                row(i).expand(shape)
            };
            let lo = if before > 0 { vec![edge(0, before)] } else { vec![] };
            let hi = if after > 0 { vec![edge(len - 1, after)] } else { vec![] };
            (lo, hi)
        }
        PadMode::Circular => {
            if before > len || after > len {
                return Err(format!("each amount must be at most the size {len} of axis {axis}"));
            }
            let lo = if before > 0 { vec![x.narrow(a, len - before, before)] } else { vec![] };
            let hi = if after > 0 { vec![x.narrow(a, 0, after)] } else { vec![] };
            (lo, hi)
        }
        PadMode::Constant => unreachable!("constant padding is pad_constant's"),
    };
    lo.push(x.clone());
    lo.append(&mut hi);
    let pieces: Vec<&Tensor> = lo.iter().collect();
    Ok(Tensor::cat(&pieces, a))
}

/// How [`interpolate`] resamples (PyTorch's `mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InterpolateMode {
    /// The element at `floor(dst * scale)` (`"nearest"`, the default).
    #[default]
    Nearest,
    /// Linear in each of the two trailing axes of an `[N, C, H, W]` input (`"bilinear"`).
    Bilinear,
}

/// The output size of [`interpolate`]: given sizes, or factors applied to the input's.
#[derive(Clone, Debug, PartialEq)]
pub enum InterpolateSize {
    /// The output's spatial sizes (`size=`).
    Size(Vec<usize>),
    /// A factor per spatial axis (`scale_factor=`); the output size is `floor(len * factor)` and,
    /// as PyTorch does by default, the source position of `dst` is `dst / factor`.
    Scale(Vec<f64>),
}

/// `F.interpolate(input, size | scale_factor, mode, align_corners)` over the spatial axes of an
/// `[N, C, *]` input (nearest: 1 to 3 of them; bilinear: exactly 2). `align_corners` is bilinear's
/// (`None` is PyTorch's default, `false`); nearest takes `None`. The spatial sizes must be
/// concrete.
#[track_caller]
pub fn interpolate(
    input: &Tensor,
    size: InterpolateSize,
    mode: InterpolateMode,
    align_corners: Option<bool>,
) -> Tensor {
    if let Some(e) = first_error(&[Some(input)]) {
        return e;
    }
    let fail = |why: String| format!("input {}: {why}", show(input));
    let spatial = input.ndim().saturating_sub(2);
    let allowed = match mode {
        InterpolateMode::Nearest => (1..=3).contains(&spatial),
        InterpolateMode::Bilinear => spatial == 2,
    };
    if !allowed {
        return Tensor::op_error(
            "interpolate",
            fail(format!(
                "{mode:?} takes an [N, C, *] input with {} spatial axes",
                match mode {
                    InterpolateMode::Nearest => "1 to 3",
                    InterpolateMode::Bilinear => "2",
                }
            )),
        );
    }
    if mode == InterpolateMode::Nearest && align_corners.is_some() {
        return Tensor::op_error("interpolate", fail("align_corners only applies to bilinear".into()));
    }
    let Some(lens) = input.shape()[2..].iter().map(|d| d.as_const()).collect::<Option<Vec<i64>>>() else {
        return Tensor::op_error("interpolate", fail("the spatial sizes must be concrete".into()));
    };
    // Per axis: (input length, output length, source step `in / out` or `1 / factor`).
    let plan: Vec<(i64, i64, f64)> = match &size {
        InterpolateSize::Size(s) if s.len() == spatial => {
            lens.iter().zip(s).map(|(&l, &o)| (l, o as i64, l as f64 / o as f64)).collect()
        }
        InterpolateSize::Scale(f) if f.len() == spatial && f.iter().all(|f| f.is_finite() && *f > 0.0) => {
            lens.iter().zip(f).map(|(&l, &f)| (l, (l as f64 * f).floor() as i64, 1.0 / f)).collect()
        }
        other => {
            return Tensor::op_error(
                "interpolate",
                fail(format!("{other:?} does not give one positive size or factor per spatial axis")),
            );
        }
    };
    if plan.iter().any(|&(l, o, _)| l == 0 || o <= 0) {
        return Tensor::op_error("interpolate", fail(format!("empty input or output ({plan:?})")));
    }
    let mut x = input.clone();
    for (k, &(len, out, step)) in plan.iter().enumerate() {
        let axis = 2 + k;
        x = match mode {
            InterpolateMode::Nearest => nearest_axis(&x, axis, len, out, step),
            InterpolateMode::Bilinear => linear_axis(&x, axis, len, out, step, align_corners.unwrap_or(false)),
        };
    }
    x
}

/// Nearest resampling of one axis: `x[min(floor(dst * step), len - 1)]`; a view (an expand)
/// when the output repeats each element a whole number of times.
#[track_caller]
fn nearest_axis(x: &Tensor, axis: usize, len: i64, out: i64, step: f64) -> Tensor {
    if out % len == 0 && step == len as f64 / out as f64 {
        let r = out / len;
        let mut split = x.shape().to_vec();
        split.insert(axis + 1, Dim::from(1));
        let mut wide = split.clone();
        wide[axis + 1] = Dim::from(r);
        let mut joined = x.shape().to_vec();
        joined[axis] = Dim::from(out);
        return x.reshape(split).expand(wide).reshape(joined);
    }
    // f32 arithmetic, as PyTorch's CPU kernel computes the source index.
    let src: Vec<i64> = (0..out).map(|d| ((d as f32 * step as f32).floor() as i64).min(len - 1)).collect();
    x.index_select(axis as i64, &Tensor::from_vec_on(src, &[out as usize], x.device()))
}

/// Linear resampling of one axis: `x[i0] * (1 - w) + x[i1] * w` at the source position of each
/// output element (half-pixel centres, or the corners aligned).
#[track_caller]
fn linear_axis(x: &Tensor, axis: usize, len: i64, out: i64, step: f64, align_corners: bool) -> Tensor {
    let mut i0 = Vec::with_capacity(out as usize);
    let mut i1 = Vec::with_capacity(out as usize);
    let mut w = Vec::with_capacity(out as usize);
    for d in 0..out {
        let src = if align_corners {
            if out > 1 { d as f32 * ((len - 1) as f32 / (out - 1) as f32) } else { 0.0 }
        } else {
            ((d as f32 + 0.5) * step as f32 - 0.5).max(0.0)
        };
        let lo = (src.floor() as i64).min(len - 1);
        i0.push(lo);
        i1.push((lo + 1).min(len - 1));
        w.push(src - lo as f32);
    }
    let device = x.device();
    let n = out as usize;
    let mut weight_shape = vec![1usize; x.ndim()];
    weight_shape[axis] = n;
    let w = Tensor::from_vec_on(w, &weight_shape, device).cast(x.dtype());
    let a = x.index_select(axis as i64, &Tensor::from_vec_on(i0, &[n], device));
    let b = x.index_select(axis as i64, &Tensor::from_vec_on(i1, &[n], device));
    a.add(b.sub(&a).mul(&w))
}

/// `F.adaptive_avg_pool2d(input, output_size)` over `[N, C, H, W]` (or `[C, H, W]`): output cell
/// `(i, j)` averages rows `floor(i H / oh) .. ceil((i + 1) H / oh)` and the columns likewise. It
/// is `A_h @ x @ A_w^T` with two small averaging matrices (a reshape and a mean when the sizes
/// divide). `H` and `W` must be concrete.
#[track_caller]
pub fn adaptive_avg_pool2d(input: &Tensor, output_size: (usize, usize)) -> Tensor {
    if let Some(e) = first_error(&[Some(input)]) {
        return e;
    }
    let nd = input.ndim();
    let hw =
        if nd == 3 || nd == 4 { input.shape()[nd - 2].as_const().zip(input.shape()[nd - 1].as_const()) } else { None };
    let (oh, ow) = output_size;
    let Some((h, w)) = hw.filter(|&(h, w)| h > 0 && w > 0 && oh > 0 && ow > 0) else {
        return Tensor::op_error(
            "adaptive_avg_pool2d",
            format!(
                "input {} must be [N, C, H, W] or [C, H, W] with concrete, non-empty H and W, output {output_size:?} non-empty",
                show(input)
            ),
        );
    };
    let (h, w) = (h as usize, w as usize);
    let device = input.device();
    let dtype = input.dtype();
    // `[out, len]`: row `i` averages its bin.
    let averaging = |len: usize, out: usize| -> Tensor {
        let mut m = vec![0f32; out * len];
        for i in 0..out {
            let (start, end) = (i * len / out, ((i + 1) * len).div_ceil(out));
            for j in start..end {
                m[i * len + j] = 1.0 / (end - start) as f32;
            }
        }
        Tensor::from_vec_on(m, &[out, len], device).cast(dtype)
    };
    let rows = averaging(w, ow).transpose(0, 1);
    averaging(h, oh).matmul(&input.matmul(&rows))
}

/// `F.batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
/// momentum=0.1, eps=1e-5)` over the channel axis of `[N, C, *]`. In training mode the batch's
/// mean and biased variance (over every axis but the channels) normalize the input, and the
/// running statistics, when given, are replaced (PyTorch updates them in place) by
/// `(1 - momentum) * running + momentum * batch`, with the unbiased variance; the update carries
/// no gradient. In eval mode the running statistics normalize and are required.
#[track_caller]
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    input: &Tensor,
    running_mean: Option<&mut Tensor>,
    running_var: Option<&mut Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Tensor {
    if let Some(e) = first_error(&[Some(input), running_mean.as_deref(), running_var.as_deref(), weight, bias]) {
        return e;
    }
    let fail = |why: String| format!("input {}: {why}", show(input));
    let nd = input.ndim();
    let Some(c) = (nd >= 2).then(|| input.shape()[1].as_const()).flatten() else {
        return Tensor::op_error("batch_norm", fail("must be [N, C, *] with a concrete C".into()));
    };
    for p in [running_mean.as_deref(), running_var.as_deref(), weight, bias].into_iter().flatten() {
        if p.ndim() != 1 || p.shape()[0].as_const() != Some(c) {
            return Tensor::op_error(
                "batch_norm",
                fail(format!("statistic or affine parameter {} is not [{c}]", show(p))),
            );
        }
    }
    let mut per_channel = vec![Dim::Const(-1)];
    per_channel.extend((2..nd).map(|_| Dim::Const(1)));
    let per_channel = |t: &Tensor| t.reshape(per_channel.clone());
    let axes: Vec<isize> = std::iter::once(0).chain(2..nd as isize).collect();
    // Half inputs compute in f32 and round once (`super::widened`), their parameters too.
    let x = super::widened(input);
    let (weight, bias) = (weight.map(super::widened), bias.map(super::widened));
    let y = if training {
        let centered = x.sub(x.mean_keepdim(&axes));
        let biased = centered.square().mean_keepdim(&axes);
        if running_mean.is_some() || running_var.is_some() {
            // Bessel's correction `n / (n - 1)`, `n` the elements per channel (symbolic when the
            // batch is).
            let n = input.shape().iter().enumerate().filter(|&(i, _)| i != 1).fold(Dim::from(1), |n, (_, d)| n * *d);
            let batch_var = biased.reshape(&[c as usize]);
            let unbiased = match n.as_const() {
                Some(n) => batch_var.mul(n as f64 / (n as f64 - 1.0)),
                None => {
                    let n = x.ones_like().sum(&axes);
                    batch_var.mul(n.div(n.sub(1.0)))
                }
            }
            .detach();
            let batch_mean = x.mean(&axes).detach();
            let blend = |running: &mut Tensor, batch: Tensor| {
                *running = running.mul(1.0 - momentum).add(batch.mul(momentum).cast(running.dtype()));
            };
            if let Some(rm) = running_mean {
                blend(rm, batch_mean);
            }
            if let Some(rv) = running_var {
                blend(rv, unbiased);
            }
        }
        centered.mul(biased.add(eps).rsqrt())
    } else {
        let (Some(mean), Some(var)) = (running_mean, running_var) else {
            return Tensor::op_error("batch_norm", fail("eval mode needs running_mean and running_var".into()));
        };
        // Folded into one scale and one shift per channel: two ops per element.
        let scale = super::widened(var).add(eps).rsqrt();
        let scale = weight.as_ref().map_or(scale.clone(), |w| scale.mul(w));
        let shifted = super::widened(mean).mul(&scale);
        let shift = bias.as_ref().map_or_else(|| shifted.neg(), |b| b.sub(&shifted));
        return super::narrowed(x.mul(per_channel(&scale)).add(per_channel(&shift)), input);
    };
    super::narrowed(
        affine(y, weight.as_ref().map(per_channel).as_ref(), bias.as_ref().map(per_channel).as_ref()),
        input,
    )
}

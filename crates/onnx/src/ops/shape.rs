//! Shape and data-movement ops: Reshape, Transpose, Concat, Flatten, (Un)Squeeze, Expand,
//! Slice, Gather(Elements), Shape, Size, Constant(OfShape), Range, Split, Tile, Pad, Trilu,
//! EyeLike. Shapes, axes and pads given as tensors are read at import: as known shape values
//! (`known`, possibly symbolic) where the op accepts symbolic sizes, else as constants.

use kiln::{DType, Dim, HostData, HostTensor, Scalar, Tensor};

use super::{Ctx, OpResult, axis, dims};

/// `t`'s number of dims.
fn rank(t: &Tensor) -> usize {
    t.ndim()
}

pub(super) fn reshape(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let shape = if ctx.opset < 5 {
        ctx.ints("shape")?.ok_or("attribute shape is required")?.into_iter().map(Dim::Const).collect()
    } else {
        ctx.dim_values(1)?
    };
    let allowzero = ctx.int("allowzero", 0)? != 0;
    let mut out = Vec::with_capacity(shape.len());
    for (i, d) in shape.iter().enumerate() {
        out.push(match d.as_const() {
            Some(0) if !allowzero => x
                .shape()
                .get(i)
                .cloned()
                .ok_or_else(|| format!("shape {shape:?} copies dim {i} of a rank-{} input", x.ndim()))?,
            Some(-1) => Dim::Const(-1),
            Some(d) if d < 0 => return Err(format!("shape {shape:?} has the negative dim {d}").into()),
            _ => *d,
        });
    }
    Ok(vec![x.reshape(out)])
}

pub(super) fn transpose(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let perm = match ctx.ints("perm")? {
        Some(p) => p,
        None => (0..x.ndim() as i64).rev().collect(),
    };
    Ok(vec![x.permute(perm)])
}

pub(super) fn concat(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let xs = ctx.all();
    let first = xs.first().ok_or("needs at least one input")?;
    let a = axis(ctx.int("axis", if ctx.opset < 4 { 1 } else { i64::MIN })?, rank(first))
        .map_err(|_| "attribute axis is missing or out of range")?;
    Ok(vec![kiln::cat(&xs, a)])
}

pub(super) fn flatten(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let r = x.ndim();
    let a = ctx.int("axis", 1)?;
    let a = if a < 0 { a + r as i64 } else { a };
    if a < 0 || a > r as i64 {
        return Err(format!("axis {a} is out of range for rank {r}").into());
    }
    let a = a as usize;
    let y = if r == 0 {
        x.reshape(&[1, 1])
    } else if a == 0 {
        x.flatten(0, -1).unsqueeze(0)
    } else if a == r {
        x.flatten(0, -1).unsqueeze(1)
    } else {
        x.flatten(a as i64, -1).flatten(0, a as i64 - 1)
    };
    Ok(vec![y])
}

/// The axes of an op that took them as an attribute before `since` and as input 1 from then.
fn axes_arg(ctx: &Ctx, since: i64) -> OpResult<Option<Vec<i64>>> {
    if ctx.opset < since { ctx.ints("axes") } else { ctx.opt_values(1) }
}

pub(super) fn squeeze(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let Some(axes) = axes_arg(ctx, 13)? else {
        return Ok(vec![x.squeeze_all()]);
    };
    let mut axes = axes.iter().map(|&a| axis(a, x.ndim())).collect::<OpResult<Vec<_>>>()?;
    axes.sort_unstable();
    axes.dedup();
    let mut y = x.clone();
    for &a in axes.iter().rev() {
        if x.shape()[a].as_const() != Some(1) {
            return Err(format!("cannot squeeze axis {a} of size {}", x.shape()[a]).into());
        }
        y = y.squeeze(a);
    }
    Ok(vec![y])
}

pub(super) fn unsqueeze(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let axes = axes_arg(ctx, 13)?.ok_or("axes are required")?;
    let out_rank = x.ndim() + axes.len();
    let mut axes = axes.iter().map(|&a| axis(a, out_rank)).collect::<OpResult<Vec<_>>>()?;
    axes.sort_unstable();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        return Err("axes repeat".into());
    }
    let mut y = x.clone();
    for &a in &axes {
        y = y.unsqueeze(a);
    }
    Ok(vec![y])
}

pub(super) fn expand(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let shape = ctx.dim_values(1)?;
    let rank = shape.len().max(x.ndim());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let have = (i + x.ndim()).checked_sub(rank).map(|j| x.shape()[j]);
        let want = (i + shape.len()).checked_sub(rank).map(|j| shape[j]);
        out.push(match (have, want) {
            (Some(h), None) => h,
            (Some(h), Some(w)) if w.as_const() == Some(1) => h,
            (_, Some(w)) => w,
            (None, None) => unreachable!("rank is the larger of both"),
        });
    }
    Ok(vec![x.expand(out)])
}

/// The positions `start, start + step, ...` ONNX's Slice takes along an axis of `len` elements.
pub(super) fn slice_positions(len: i64, start: i64, end: i64, step: i64) -> Vec<i64> {
    let norm = |v: i64| if v < 0 { v + len } else { v };
    let (s, e) = (norm(start), norm(end));
    let mut out = Vec::new();
    if step > 0 {
        let (mut i, e) = (s.clamp(0, len), e.clamp(0, len));
        while i < e {
            out.push(i);
            i += step;
        }
    } else {
        let (mut i, e) = (s.clamp(0, len - 1), e.clamp(-1, len - 1));
        while i > e {
            out.push(i);
            i += step;
        }
    }
    out
}

/// `x`'s elements at `positions` along `axis` (a narrow when they are consecutive).
pub(super) fn take(ctx: &Ctx, x: &Tensor, axis: usize, positions: Vec<i64>) -> Tensor {
    let consecutive = positions.windows(2).all(|w| w[1] == w[0] + 1);
    match positions.first() {
        None => x.narrow(axis as i64, 0, 0),
        Some(&p0) if consecutive => x.narrow(axis as i64, p0, positions.len() as i64),
        Some(_) => {
            let n = positions.len();
            x.index_select(axis, &ctx.i64s(positions, &[n]))
        }
    }
}

pub(super) fn slice(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let (starts, ends, axes, steps) = if ctx.opset < 10 {
        (
            ctx.ints("starts")?.ok_or("starts are required")?,
            ctx.ints("ends")?.ok_or("ends are required")?,
            ctx.ints("axes")?,
            None,
        )
    } else {
        let (starts, ends) = (ctx.dim_values(1)?, ctx.dim_values(2)?);
        if starts.iter().chain(&ends).any(|d| !d.is_const()) {
            return symbolic_slice(ctx, x, starts, ends);
        }
        let consts = |v: Vec<Dim>| v.iter().filter_map(Dim::as_const).collect::<Vec<i64>>();
        (consts(starts), consts(ends), ctx.opt_values(3)?, ctx.opt_values(4)?)
    };
    let n = starts.len();
    let axes = axes.unwrap_or_else(|| (0..n as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; n]);
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return Err(format!(
            "starts, ends, axes and steps differ in length ({n}, {}, {}, {})",
            ends.len(),
            axes.len(),
            steps.len()
        )
        .into());
    }
    let mut y = x.clone();
    for i in 0..n {
        let a = axis(axes[i], x.ndim())?;
        if steps[i] == 0 {
            return Err("a step is 0".into());
        }
        let positions = match x.shape()[a].as_const() {
            Some(len) => slice_positions(len, starts[i], ends[i], steps[i]),
            // A symbolic axis: the forward, unit-step slices exported models take of it.
            None => {
                y = narrow_symbolic(&y, a, &Dim::Const(starts[i]), &Dim::Const(ends[i]), steps[i])?;
                continue;
            }
        };
        y = take(ctx, &y, a, positions);
    }
    Ok(vec![y])
}

/// A Slice whose starts or ends are symbolic shape values: forward, unit steps, as `narrow`
/// (whose range the program checks when it runs).
fn symbolic_slice(ctx: &Ctx, x: &Tensor, starts: Vec<Dim>, ends: Vec<Dim>) -> OpResult<Vec<Tensor>> {
    let n = starts.len();
    let axes = ctx.opt_values(3)?.unwrap_or_else(|| (0..n as i64).collect());
    let steps = ctx.opt_values(4)?.unwrap_or_else(|| vec![1; n]);
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return Err("starts, ends, axes and steps differ in length".into());
    }
    let mut y = x.clone();
    for i in 0..n {
        y = narrow_symbolic(&y, axis(axes[i], x.ndim())?, &starts[i], &ends[i], steps[i])?;
    }
    Ok(vec![y])
}

/// `x[start:end:step]` along `axis` with a positive step, where the bounds or the axis are
/// symbolic: a negative constant counts from the end, an end past a concrete axis (ONNX's
/// `INT64_MAX`) stops at it. A step above 1 keeps `⌊(length + step - 1)/step⌋` positions (a
/// floor-division symbol): the range padded by `step - 1` at its end, narrowed to a multiple of
/// the step, every `step`-th kept (Funnel's pooling over the sequence).
fn narrow_symbolic(x: &Tensor, axis: usize, start: &Dim, end: &Dim, step: i64) -> OpResult<Tensor> {
    if step < 1 {
        return Err(format!("a slice with symbolic bounds or axis needs a positive step, got {step}").into());
    }
    let len = x.shape()[axis];
    let resolve = |d: &Dim| -> OpResult<Dim> {
        Ok(match d.as_const() {
            Some(v) if v < 0 => len.checked_add(&Dim::Const(v)).ok_or("a slice bound overflows")?,
            Some(v) if len.as_const().is_some_and(|l| v > l) || (v > i32::MAX as i64 && !len.is_const()) => len,
            _ => *d,
        })
    };
    let (s, e) = (resolve(start)?, resolve(end)?);
    let length = e.checked_sub(&s).ok_or("a slice length overflows")?;
    let y = x.narrow(axis, s, length);
    if step == 1 {
        return Ok(y);
    }
    let kept = (length + Dim::Const(step - 1)).floor_div(step).ok_or("a slice step must be positive")?;
    let mut pads = vec![(0, 0); y.ndim()];
    pads[axis] = (0, step as usize - 1);
    let mut split: Vec<Dim> = y.shape().to_vec();
    split[axis] = kept;
    split.insert(axis + 1, Dim::Const(step));
    Ok(y.pad(&pads, 0.0)
        .narrow(axis, 0, Dim::Const(step) * kept)
        .reshape(split)
        .narrow(axis as i64 + 1, 0, 1)
        .squeeze(axis + 1))
}

/// `idx` with negative entries counted from the end of an axis of `len` elements.
fn wrap_negative(idx: &Tensor, len: &Dim) -> Tensor {
    match len.as_const() {
        Some(n) => idx.lt(0).where_cond(idx.add(n), idx),
        None => idx.lt(0).where_cond(idx.add(dim_value(len, idx.device())), idx),
    }
}

/// `d`'s value as an i64 scalar: a constant, or a symbolic size counted as a sum of ones over
/// it when the program runs (the tensors that use it carry the symbol, which binds it).
fn dim_value(d: &Dim, device: kiln::Device) -> Tensor {
    match d.as_const() {
        Some(c) => Tensor::from_vec_on(vec![c], Vec::<usize>::new(), device),
        None => Tensor::ones_on(vec![*d], DType::I64, device).sum(0),
    }
}

pub(super) fn gather(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (x, idx) = (ctx.input(0)?, ctx.input(1)?);
    let a = axis(ctx.int("axis", 0)?, x.ndim())?;
    let mut out: Vec<Dim> = x.shape()[..a].to_vec();
    out.extend(idx.shape().iter().cloned());
    out.extend(x.shape()[a + 1..].iter().cloned());
    // Indices known at import that pick a contiguous run (a model's `x[:, -1]`): a slice, which
    // the compiler folds into what produces `x` (only the picked part is computed), where a
    // gather would need all of `x` and a data-dependent read.
    if let Some((start, n)) = known_run(ctx.known(1), &x.shape()[a])? {
        return Ok(vec![x.narrow(a, start, n as i64).reshape(out)]);
    }
    let idx = wrap_negative(idx, &x.shape()[a]);
    Ok(vec![x.index_select(a, &idx.reshape(&[-1])).reshape(out)])
}

/// The first index and the count of `known` indices into an axis of `len` elements when they
/// are constants forming an ascending run `k, k+1, ...` (negative ones counted from the end,
/// which needs a constant `len`); an index outside the axis is an error, as in onnxruntime.
fn known_run(known: Option<&super::known::Known>, len: &Dim) -> OpResult<Option<(i64, usize)>> {
    let Some(values) = known.and_then(|k| k.consts()) else { return Ok(None) };
    let mut picked = Vec::with_capacity(values.len());
    for v in values {
        picked.push(match (v < 0, len.as_const()) {
            (false, Some(n)) if v >= n => return Err(format!("index {v} out of range for an axis of {n}").into()),
            (false, _) => v,
            (true, Some(n)) if v + n >= 0 => v + n,
            (true, Some(n)) => return Err(format!("index {v} out of range for an axis of {n}").into()),
            (true, None) => return Ok(None),
        });
    }
    let run = picked.first().is_some_and(|&k| picked.iter().enumerate().all(|(i, &v)| v == k + i as i64));
    Ok(run.then(|| (picked[0], picked.len())))
}

pub(super) fn gather_elements(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (x, idx) = (ctx.input(0)?, ctx.input(1)?);
    let a = axis(ctx.int("axis", 0)?, x.ndim())?;
    Ok(vec![x.gather(a, &wrap_negative(idx, &x.shape()[a]))])
}

pub(super) fn shape(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let r = x.ndim() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(ctx.int("start", 0)?);
    let end = clamp(ctx.int("end", r)?);
    let part: Vec<Dim> = x.shape()[start..end.max(start)].to_vec();
    let n = part.len();
    if let Some(values) = part.iter().map(Dim::as_const).collect::<Option<Vec<i64>>>() {
        return Ok(vec![ctx.i64s(values, &[n])]);
    }
    // A symbolic dim's value as data: the sum of ones over it (its value is known at import
    // too, see `known`, for the ops that take shapes).
    let one_each: Vec<Tensor> = part
        .iter()
        .map(|d| match d.as_const() {
            Some(v) => ctx.i64s(vec![v], &[1]),
            None => Tensor::ones_on(vec![*d], DType::I64, ctx.device)
                .sum_keepdim(0)
                .add(super::known::tie(Some(x), DType::I64).expect("an anchor gives a zero")),
        })
        .collect();
    Ok(vec![kiln::cat(&one_each.iter().collect::<Vec<_>>(), 0)])
}

pub(super) fn size(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let n: usize = dims(ctx.input(0)?)?.iter().product();
    Ok(vec![ctx.i64s(vec![n as i64], &[])])
}

pub(super) fn constant(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let host = if let Some(t) = ctx.tensor_attr("value")? {
        t
    } else if let Some(a) = ctx.attr("value_float") {
        HostTensor::new(HostData::F32(vec![a.f.unwrap_or(0.0)]), vec![])?
    } else if let Some(v) = ctx.floats("value_floats")? {
        let n = v.len();
        HostTensor::new(HostData::F32(v), vec![n])?
    } else if let Some(a) = ctx.attr("value_int") {
        HostTensor::new(HostData::I64(vec![a.i.unwrap_or(0)]), vec![])?
    } else if let Some(v) = ctx.ints("value_ints")? {
        let n = v.len();
        HostTensor::new(HostData::I64(v), vec![n])?
    } else {
        return Err("no supported value attribute (value, value_float(s), value_int(s))".into());
    };
    Ok(vec![ctx.constant(host)])
}

pub(super) fn constant_of_shape(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let shape = ctx.dim_values(0)?;
    if let Some(d) = shape.iter().find(|d| d.as_const().is_some_and(|v| v < 0)) {
        return Err(format!("negative dim {d} in shape {shape:?}").into());
    }
    let (value, dtype) = match ctx.tensor_attr("value")? {
        Some(t) if t.numel() == 1 => (t.data.get(0), t.dtype()),
        Some(t) => return Err(format!("value has {} elements, not 1", t.numel()).into()),
        None => (Scalar::Float(0.0), DType::F32),
    };
    let full = Tensor::full_on(shape, value, dtype, ctx.device);
    Ok(vec![match super::known::tie(ctx.known(0).and_then(|k| k.anchor.as_ref()), dtype) {
        Some(zero) => full.add(zero),
        None => full,
    }])
}

pub(super) fn range(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let dtype = ctx.input(0)?.dtype();
    // A symbolic limit (a sequence length): `start + iota(limit - start)` with a unit step.
    if let Some(limit) = ctx.known(1).filter(|k| k.values.iter().any(|d| !d.is_const())) {
        let (start, delta) = (ctx.dim_values(0)?, ctx.dim_values(2)?);
        let (Some(s), Some(1)) = (start.first().and_then(Dim::as_const), delta.first().and_then(Dim::as_const)) else {
            return Err(
                format!("a symbolic range needs a constant start and step 1, got {start:?} and {delta:?}").into()
            );
        };
        let len = limit.values[0].checked_sub(&Dim::Const(s)).ok_or("the range's length overflows")?;
        let mut y = Tensor::iota_on(len, dtype, ctx.device).add(Scalar::Int(s).cast(dtype));
        if let Some(zero) = super::known::tie(limit.anchor.as_ref(), dtype) {
            y = y.add(zero);
        }
        return Ok(vec![y]);
    }
    let start = ctx.scalar_f64(ctx.input(0)?)?;
    let limit = ctx.scalar_f64(ctx.input(1)?)?;
    let delta = ctx.scalar_f64(ctx.input(2)?)?;
    if delta == 0.0 || !delta.is_finite() {
        return Err(format!("delta {delta} is not a finite, non-zero step").into());
    }
    let n = ((limit - start) / delta).ceil().max(0.0) as usize;
    let iota = ctx.i64s((0..n as i64).collect(), &[n]).cast(dtype);
    Ok(vec![iota.mul(Scalar::Float(delta).cast(dtype)).add(Scalar::Float(start).cast(dtype))])
}

pub(super) fn split(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let a = axis(ctx.int("axis", 0)?, x.ndim())?;
    let len = x.shape()[a].as_const().ok_or("the split axis must be concrete")?;
    let parts = ctx.node.output.len();
    let sizes: Vec<i64> = match if ctx.opset < 13 { ctx.ints("split")? } else { ctx.opt_values(1)? } {
        Some(s) => s,
        None => {
            let n = ctx.int("num_outputs", parts as i64)?.max(1);
            let chunk = (len + n - 1) / n;
            (0..n).map(|i| (len - i * chunk).clamp(0, chunk)).collect()
        }
    };
    if sizes.iter().any(|&s| s < 0) || sizes.iter().sum::<i64>() != len {
        return Err(format!("split sizes {sizes:?} do not add up to the axis' {len}").into());
    }
    let mut start = 0;
    let mut out = Vec::with_capacity(sizes.len());
    for s in sizes {
        out.push(x.narrow(a as i64, start, s));
        start += s;
    }
    Ok(out)
}

pub(super) fn tile(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    // Repeats may be symbolic (BLOOM tiles its ALiBi slopes over the batch).
    let reps = ctx.dim_values(1)?;
    let d = x.shape();
    if reps.len() != d.len() || reps.iter().any(|r| r.as_const().is_some_and(|r| r < 0)) {
        return Err(format!("repeats {reps:?} do not fit rank {}", d.len()).into());
    }
    // Each axis `n` becomes `[1, n]`, expanded to `[r, n]` and merged into `r*n` (symbolic `n`
    // too: rotary tables tile over the sequence).
    let mut split = Vec::new();
    let mut big = Vec::new();
    let mut out = Vec::new();
    for (&n, &r) in d.iter().zip(&reps) {
        split.extend([Dim::Const(1), n]);
        big.extend([r, n]);
        out.push(r * n);
    }
    Ok(vec![x.reshape(split).expand(big).reshape(out)])
}

/// The positions of an axis of `len` elements padded by `(before, after)` in `mode` ("edge"
/// repeats the border, "reflect" mirrors without repeating it, "wrap" is periodic).
fn pad_positions(mode: &str, len: i64, before: i64, after: i64) -> OpResult<Vec<i64>> {
    (-before..len + after)
        .map(|i| match mode {
            "edge" => Ok(i.clamp(0, len - 1)),
            "wrap" => Ok(i.rem_euclid(len)),
            "reflect" if len > 1 => {
                let period = 2 * (len - 1);
                let m = i.rem_euclid(period);
                Ok(if m < len { m } else { period - m })
            }
            "reflect" => Ok(0),
            other => Err(format!("mode {other:?} is not supported").into()),
        })
        .collect()
}

pub(super) fn pad(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let r = x.ndim();
    let mode = ctx.string("mode")?.unwrap_or_else(|| "constant".into());
    let (pads, value) = if ctx.opset < 11 {
        let pads = ctx.ints(if ctx.opset < 2 { "paddings" } else { "pads" })?.ok_or("pads are required")?;
        (pads, f64::from(ctx.float("value", 0.0)?))
    } else {
        let value = match ctx.opt(2) {
            Some(v) => ctx.scalar_f64(v)?,
            None => 0.0,
        };
        (ctx.values_at(1)?, value)
    };
    let axes: Vec<usize> = match ctx.opt_values(3)? {
        Some(a) if ctx.opset >= 18 => a.iter().map(|&a| axis(a, r)).collect::<OpResult<_>>()?,
        _ => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!("{} pads for {} axes", pads.len(), axes.len()).into());
    }
    let n = axes.len();
    let mut y = x.clone();
    // Negative pads crop first; then the positive ones pad.
    let mut amounts = vec![(0usize, 0usize); r];
    for (k, &a) in axes.iter().enumerate() {
        let (b, e) = (pads[k], pads[k + n]);
        let (cb, ce) = ((-b).max(0), (-e).max(0));
        if cb + ce > 0 {
            // A symbolic axis is cropped symbolically; the narrow checks its bounds when the
            // program runs.
            let len = y.shape()[a];
            if len.as_const().is_some_and(|len| cb + ce > len) {
                return Err(format!("pads {pads:?} crop more than axis {a} holds").into());
            }
            y = y.narrow(a as i64, cb, len - Dim::Const(cb + ce));
        }
        amounts[a] = (b.max(0) as usize, e.max(0) as usize);
    }
    if mode == "constant" {
        if amounts.iter().any(|&(b, e)| b + e > 0) {
            y = y.pad(&amounts, value);
        }
        return Ok(vec![y]);
    }
    for (a, &(b, e)) in amounts.iter().enumerate() {
        if b + e == 0 {
            continue;
        }
        let len = y.shape()[a].as_const().ok_or_else(|| format!("{mode} padding needs a concrete axis {a}"))?;
        if len == 0 {
            return Err(format!("cannot {mode}-pad an empty axis").into());
        }
        let positions = pad_positions(&mode, len, b as i64, e as i64)?;
        y = take(ctx, &y, a, positions);
    }
    Ok(vec![y])
}

/// `[rows, cols]` i64 tensor of `col - row`.
fn diagonal_offsets(ctx: &Ctx, rows: usize, cols: usize) -> Tensor {
    let r = ctx.i64s((0..rows as i64).collect(), &[rows, 1]);
    let c = ctx.i64s((0..cols as i64).collect(), &[1, cols]);
    c.sub(&r)
}

pub(super) fn trilu(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let d = dims(x)?;
    if d.len() < 2 {
        return Err("needs rank >= 2".into());
    }
    let k = match ctx.opt(1) {
        Some(k) => ctx.scalar_f64(k)? as i64,
        None => 0,
    };
    let off = diagonal_offsets(ctx, d[d.len() - 2], d[d.len() - 1]);
    let keep = if ctx.int("upper", 1)? != 0 { off.ge(k) } else { off.le(k) };
    Ok(vec![keep.where_cond(x, x.zeros_like())])
}

pub(super) fn eye_like(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let d = dims(x)?;
    if d.len() != 2 {
        return Err("needs a rank-2 input".into());
    }
    let dtype = if ctx.attr("dtype").is_some() { ctx.dtype_attr("dtype")? } else { x.dtype() };
    let k = ctx.int("k", 0)?;
    Ok(vec![diagonal_offsets(ctx, d[0], d[1]).eq(k).cast(dtype)])
}

/// OneHot: `values[1]` where the new `axis` position equals the index (a negative index counts
/// from `depth`), `values[0]` elsewhere; an index outside `[-depth, depth)` gives a row of
/// `values[0]`.
pub(super) fn one_hot(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (indices, values) = (ctx.input(0)?, ctx.input(2)?);
    let depth = ctx.scalar_f64(ctx.input(1)?)?;
    if !(depth >= 1.0 && depth.fract() == 0.0) {
        return Err(format!("depth {depth} is not a positive integer").into());
    }
    let depth = depth as i64;
    let rank = indices.ndim() + 1;
    let a = axis(ctx.int("axis", -1)?, rank)?;
    if values.shape().iter().map(|d| d.as_const()).product::<Option<i64>>() != Some(2) {
        return Err(format!("values {} must hold two elements (off, on)", super::show(values)).into());
    }
    let values = values.reshape(&[2]);
    let (off, on) = (values.narrow(0, 0, 1).squeeze(0), values.narrow(0, 1, 1).squeeze(0));
    let index = if indices.dtype().is_float() { indices.floor() } else { indices.clone() }.cast(kiln::DType::I64);
    let wrapped = index.lt(0i64).where_cond(index.add(depth), &index);
    let mut shape = vec![1usize; rank];
    shape[a] = depth as usize;
    let positions = ctx.i64s((0..depth).collect(), &shape);
    Ok(vec![wrapped.unsqueeze(a).eq(&positions).where_cond(&on, &off)])
}

/// CenterCropPad: each of `axes` (all by default) cropped or zero-padded to its size in `shape`,
/// centred (an odd difference leaves the extra element at the end).
pub(super) fn center_crop_pad(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let sizes = ctx.values_at(1)?;
    let axes: Vec<usize> = match ctx.ints("axes")? {
        Some(a) => a.iter().map(|&v| axis(v, x.ndim())).collect::<OpResult<_>>()?,
        None => (0..x.ndim()).collect(),
    };
    if sizes.len() != axes.len() || sizes.iter().any(|&v| v < 0) {
        return Err(format!("shape {sizes:?} does not fit the {} axes", axes.len()).into());
    }
    let mut y = x.clone();
    for (&a, &want) in axes.iter().zip(&sizes) {
        let have = y.shape()[a].as_const().ok_or("CenterCropPad needs concrete axes")?;
        if want < have {
            y = y.narrow(a, (have - want) / 2, want);
        } else if want > have {
            let mut pads = vec![(0, 0); y.ndim()];
            let before = ((want - have) / 2) as usize;
            pads[a] = (before, (want - have) as usize - before);
            y = y.pad(&pads, 0.0);
        }
    }
    Ok(vec![y])
}

/// ScatterElements (and the older Scatter): `data` with `updates` written (`reduction` none) or
/// added (`add`) at `indices` along `axis`; negative indices count from the end. A `scatter_add`
/// of the updates, and for none a second one counting the writes per position to pick the
/// written ones (ONNX leaves the result of duplicate indices under none undefined: here they
/// add up). `mul`, `max` and `min` are not supported.
pub(super) fn scatter_elements(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (data, indices, updates) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let a = axis(ctx.int("axis", 0)?, data.ndim())?;
    let index = wrap_negative(indices, &data.shape()[a]).cast(kiln::DType::I64);
    scatter(ctx, data, a, &index, updates)
}

/// ScatterND: `data` with `updates` written or added at the index tuples of `indices`'s last
/// axis (each naming a slice of `data`'s leading dims): the leading dims flattened into one
/// axis, then [`scatter_elements`]'s scatter along it.
pub(super) fn scatter_nd(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (data, indices, updates) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let (dd, id) = (data.shape().to_vec(), indices.shape().to_vec());
    let k = id.last().and_then(Dim::as_const).ok_or("indices must have rank >= 1 and a concrete last dim")? as usize;
    if k == 0 || k > dd.len() {
        return Err(format!("index tuples of {k} do not fit data {}", super::show(data)).into());
    }
    // Sizes may be symbolic (BART shifts its decoder's token ids with a ScatterND over batch and
    // sequence), as in `gather_nd`.
    let product = |ds: &[Dim]| ds.iter().try_fold(Dim::Const(1), |acc, d| acc.checked_mul(d)).ok_or("sizes overflow");
    let tuples = product(&id[..id.len() - 1])?;
    let slice = product(&dd[k..])?;
    let device = data.device();
    // One flat position per tuple: sum of index * stride over the first k dims.
    let indices = indices.cast(kiln::DType::I64).reshape(vec![tuples, Dim::from(k)]);
    let mut flat = None;
    for j in 0..k {
        let stride = product(&dd[j + 1..k])?;
        let term = wrap_negative(&indices.narrow(1, j as i64, 1), &dd[j]).mul(dim_value(&stride, device));
        flat = Some(match flat {
            None => term,
            Some(f) => term.add(&f),
        });
    }
    let flat = flat.expect("k >= 1").expand(vec![tuples, slice]);
    let table = data.reshape(vec![product(&dd[..k])?, slice]);
    let values = updates.reshape(vec![tuples, slice]);
    let y = scatter(ctx, &table, 0, &flat, &values)?;
    Ok(vec![y[0].reshape(dd)])
}

/// `data` with `updates` written or added at `index` along `axis` (see [`scatter_elements`]).
fn scatter(ctx: &Ctx, data: &Tensor, axis: usize, index: &Tensor, updates: &Tensor) -> OpResult<Vec<Tensor>> {
    let updates = updates.cast(data.dtype());
    match ctx.string("reduction")?.as_deref().unwrap_or("none") {
        "add" => Ok(vec![data.scatter_add(axis, index, &updates)]),
        "none" => Ok(vec![overwrite(data, axis, index, &updates)]),
        other => Err(format!("reduction {other:?} is not supported (none and add are)").into()),
    }
}

/// GatherND: the slices of `data` at the index tuples of `indices`'s last axis (each naming
/// positions in the `k` dims after the first `batch_dims`, which `data` and `indices` share).
/// `data` seen as `[batch, positions, slice]` rows: one `index_select` of flat row numbers.
pub(super) fn gather_nd(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (data, indices) = (ctx.input(0)?, ctx.input(1)?);
    let (dd, id) = (data.shape().to_vec(), indices.shape().to_vec());
    let b = usize::try_from(ctx.int("batch_dims", 0)?).map_err(|_| "batch_dims must not be negative")?;
    let k = id.last().and_then(Dim::as_const).ok_or("indices must have rank >= 1 and a concrete last dim")? as usize;
    if id.len() < b + 1 || dd.len() < b + k || id[..b] != dd[..b] || k == 0 {
        return Err(format!(
            "indices {} do not fit data {} with {b} batch dims",
            super::show(indices),
            super::show(data)
        )
        .into());
    }
    // Sizes may be symbolic (a mask indexed by broadcast ranges over batch and sequence, as
    // torch.export writes `mask[b, s]`): products of dims as polynomials, strides as values.
    let product = |ds: &[Dim]| ds.iter().try_fold(Dim::Const(1), |acc, d| acc.checked_mul(d)).ok_or("sizes overflow");
    let batch = product(&dd[..b])?;
    let positions = product(&dd[b..b + k])?;
    let slice = product(&dd[b + k..])?;
    let tuples = product(&id[b..id.len() - 1])?;
    let indices = indices.cast(kiln::DType::I64).reshape(vec![batch, tuples, Dim::from(k)]);
    // Row of each tuple: its batch's first row plus the tuple's position in the k dims.
    let device = data.device();
    let mut rows = Tensor::iota_on(batch, DType::I64, device).unsqueeze(1).mul(dim_value(&positions, device));
    for j in 0..k {
        let stride = product(&dd[b + j + 1..b + k])?;
        let column = indices.narrow(2, j as i64, 1).squeeze(2);
        rows = rows.add(wrap_negative(&column, &dd[b + j]).mul(dim_value(&stride, device)));
    }
    let table = data.reshape(vec![batch * positions, slice]);
    let picked = table.index_select(0, &rows.reshape(vec![batch * tuples]));
    let mut shape: Vec<Dim> = id[..id.len() - 1].to_vec();
    shape.extend(&dd[b + k..]);
    Ok(vec![picked.reshape(shape)])
}

/// TensorScatter (opset 24): a key/value cache with `update` written along `axis` from each
/// batch entry's `write_indices` position on (0 without them); `circular` wraps past the end, and
/// `linear` past the end is an error of the run (the index check of `scatter_add`).
pub(super) fn tensor_scatter(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (cache, update) = (ctx.input(0)?, ctx.input(1)?);
    let rank = cache.ndim();
    let a = axis(ctx.int("axis", -2)?, rank)?;
    if a == 0 || update.ndim() != rank {
        return Err(
            format!("update {} does not fit cache {} along axis {a}", super::show(update), super::show(cache)).into()
        );
    }
    let seq = update.shape()[a].as_const().ok_or("the update's length must be concrete")?;
    let max = cache.shape()[a].as_const().ok_or("the cache's length must be concrete")?;
    let mut batch_shape = vec![1i64; rank];
    batch_shape[0] = -1;
    let start = match ctx.opt(2) {
        Some(w) => w.cast(kiln::DType::I64).reshape(batch_shape),
        None => ctx.i64s(vec![0], &vec![1; rank]),
    };
    let mut seq_shape = vec![1usize; rank];
    seq_shape[a] = seq as usize;
    let mut index = start.add(ctx.i64s((0..seq).collect(), &seq_shape));
    match ctx.string("mode")?.as_deref().unwrap_or("linear") {
        "linear" => {}
        "circular" => index = index.remainder(max),
        other => return Err(format!("mode {other:?} is not linear or circular").into()),
    }
    let index = index.expand(update.shape().clone());
    Ok(vec![overwrite(cache, a, &index, &update.cast(cache.dtype()))])
}

/// `data` with `updates` written at `index` along `axis`: a `scatter_add` of the updates where a
/// second one (of ones) counts a write, `data` elsewhere (duplicate positions add up).
pub(super) fn overwrite(data: &Tensor, axis: usize, index: &Tensor, updates: &Tensor) -> Tensor {
    let zeros = data.zeros_like();
    let written = zeros.scatter_add(axis, index, &updates.ones_like()).gt(0.0);
    written.where_cond(zeros.scatter_add(axis, index, updates), data)
}

/// DepthToSpace (DCR or CRD order) and SpaceToDepth on `[N, C, H, W]`: one reshape, one
/// permutation and one reshape.
pub(super) fn depth_space(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let d = dims(x)?;
    let b = usize::try_from(ctx.int("blocksize", 0)?).ok().filter(|&b| b >= 1).ok_or("blocksize must be positive")?;
    let [n, c, h, w] = d[..] else {
        return Err(format!("input {} must be [N, C, H, W]", super::show(x)).into());
    };
    if ctx.op() == "SpaceToDepth" {
        if h % b != 0 || w % b != 0 {
            return Err(format!("H {h} and W {w} must be multiples of blocksize {b}").into());
        }
        let y = x.reshape(vec![n, c, h / b, b, w / b, b]).permute(vec![0, 3, 5, 1, 2, 4]);
        return Ok(vec![y.reshape(vec![n, c * b * b, h / b, w / b])]);
    }
    if c % (b * b) != 0 {
        return Err(format!("C {c} must be a multiple of blocksize^2 = {}", b * b).into());
    }
    let c2 = c / (b * b);
    let y = match ctx.string("mode")?.as_deref().unwrap_or("DCR") {
        "DCR" => x.reshape(vec![n, b, b, c2, h, w]).permute(vec![0, 3, 4, 1, 5, 2]),
        "CRD" => x.reshape(vec![n, c2, b, b, h, w]).permute(vec![0, 1, 4, 2, 5, 3]),
        other => return Err(format!("mode {other:?} is not DCR or CRD").into()),
    };
    Ok(vec![y.reshape(vec![n, c2, h * b, w * b])])
}

/// ReverseSequence: along `time_axis`, each `batch_axis` entry's first `sequence_lens[i]`
/// elements reversed (the rest as they are): one gather of positions computed from the lengths.
pub(super) fn reverse_sequence(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (x, lens) = (ctx.input(0)?, ctx.input(1)?);
    let (b, t) = (axis(ctx.int("batch_axis", 1)?, x.ndim())?, axis(ctx.int("time_axis", 0)?, x.ndim())?);
    if b == t || x.ndim() < 2 {
        return Err("batch_axis and time_axis must be two different axes".into());
    }
    let steps = x.shape()[t].as_const().ok_or("ReverseSequence needs a concrete time axis")?;
    let mut time_shape = vec![1usize; x.ndim()];
    time_shape[t] = steps as usize;
    let time = ctx.i64s((0..steps).collect(), &time_shape);
    let mut batch_shape = vec![1i64; x.ndim()];
    batch_shape[b] = -1;
    let len = lens.cast(kiln::DType::I64).reshape(batch_shape);
    let source = time.lt(&len).where_cond(len.sub(1i64).sub(&time), &time);
    Ok(vec![x.gather(t, &source.expand(x.shape().clone()))])
}

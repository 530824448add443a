//! DFT (opsets 17 and 20) and STFT: the discrete Fourier transform along one axis of a real (`[..., 1]`)
//! or complex (`[..., 2]`, real and imaginary parts) signal, forward (all bins or `onesided`) or
//! inverse (complex, or `onesided`: a real signal from the first `N / 2 + 1` bins, as numpy's
//! `irfft`).
//!
//! A transform of length `N` is a matrix product: the real and imaginary parts, the transformed
//! axis moved last, times constant `cos(2 pi k t / N)` and `sin(2 pi k t / N)` matrices (computed
//! at import in f64), `O(N^2)` multiply-adds per signal; no FFT.

use kiln::{DType, HostData, HostTensor, Tensor};

use super::{Ctx, OpResult, axis, show};

pub(super) fn dft(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let rank = x.ndim();
    let parts = x.shape().last().and_then(|d| d.as_const());
    if rank < 2 || !matches!(parts, Some(1 | 2)) {
        return Err(format!("the signal {} must end in a dim of 1 (real) or 2 (complex)", show(x)).into());
    }
    // The transformed axis, among the dims before the last.
    let a = if ctx.opset >= 20 {
        match ctx.opt_values(2)? {
            Some(v) => *v.first().ok_or("axis must hold one value")?,
            None => -2,
        }
    } else {
        ctx.int("axis", 1)?
    };
    let a = axis(a, rank)?;
    if a == rank - 1 {
        return Err("the transformed axis cannot be the last (real, imaginary) one".into());
    }
    let n_in = x.shape()[a].as_const().ok_or("DFT needs a concrete transformed axis")? as usize;
    let (inverse, onesided) = (ctx.int("inverse", 0)? != 0, ctx.int("onesided", 0)? != 0);
    let n = match ctx.opt_values(1)? {
        Some(v) => match v.as_slice() {
            [len] if *len > 0 => *len as usize,
            other => return Err(format!("dft_length {other:?} is not one positive length").into()),
        },
        None if inverse && onesided => 2 * n_in.saturating_sub(1),
        None => n_in,
    };
    if n == 0 {
        return Err(format!("a transform of length 0 (axis of {n_in})").into());
    }
    Ok(vec![transform(ctx, x, a, n, inverse, onesided)?])
}

/// The transform of length `n` along axis `a` of the signal `x` (`[..., 1 or 2]`).
fn transform(ctx: &Ctx, x: &Tensor, a: usize, n: usize, inverse: bool, onesided: bool) -> OpResult<Tensor> {
    let rank = x.ndim();
    let parts = x.shape()[rank - 1].as_const().unwrap_or(1);
    let n_in = x.shape()[a].as_const().ok_or("the transformed axis must be concrete")? as usize;
    let work = if x.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    // Real and imaginary parts with the axis last: [..., n_in].
    let last = rank - 2;
    let part = |i: i64| x.narrow(rank - 1, i, 1).squeeze(rank - 1).cast(work).transpose(a, last);
    let re = part(0);
    let im = if parts == 2 { Some(part(1)) } else { None };
    // Bins read: the signal cut or zero-padded to n (forward, complex inverse), or the first
    // n / 2 + 1 bins (real inverse).
    let rows = if inverse && onesided { n / 2 + 1 } else { n };
    let fit = |t: Tensor| -> Tensor {
        if n_in >= rows {
            t.narrow(last, 0, rows as i64)
        } else {
            let mut pads = vec![(0, 0); t.ndim()];
            pads[last] = (0, rows - n_in);
            t.pad(&pads, 0.0)
        }
    };
    let (re, im) = (fit(re), im.map(fit));
    let cols = if !inverse && onesided { n / 2 + 1 } else { n };
    // Constant [rows, cols] matrices of cos and sin of 2 pi k t / n, with weights per row.
    let matrix = |f: fn(f64) -> f64, weight: &dyn Fn(usize) -> f64| -> OpResult<Tensor> {
        let mut m = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                let angle = 2.0 * std::f64::consts::PI * ((r * c) % n) as f64 / n as f64;
                m.push(weight(r) * f(angle));
            }
        }
        let host = HostTensor::new(HostData::F64(m), vec![rows, cols]).map_err(|e| e.to_string())?;
        Ok(ctx.constant(host).cast(work))
    };
    let product = |t: &Option<Tensor>, m: &Tensor| t.as_ref().map(|t| t.matmul(m));
    let add = |a: Tensor, b: Option<Tensor>, sign: f64| match b {
        None => a,
        Some(b) => a.add(b.mul(sign)),
    };
    let scale = 1.0 / n as f64;
    let (out_re, out_im) = if !inverse {
        // (a + ib)(cos - i sin) = a cos + b sin + i (b cos - a sin)
        let (c, s) = (matrix(f64::cos, &|_| 1.0)?, matrix(f64::sin, &|_| 1.0)?);
        let re_c = re.matmul(&c);
        let re_s = re.matmul(&s);
        (add(re_c, product(&im, &s), 1.0), Some(add(re_s.neg(), product(&im, &c), 1.0)))
    } else if !onesided {
        // (a + ib)(cos + i sin) / n = (a cos - b sin) / n + i (a sin + b cos) / n
        let (c, s) = (matrix(f64::cos, &|_| scale)?, matrix(f64::sin, &|_| scale)?);
        (add(re.matmul(&c), product(&im, &s), -1.0), Some(add(re.matmul(&s), product(&im, &c), 1.0)))
    } else {
        // A real signal from bins 0..=n/2 of a Hermitian spectrum: the bins strictly between 0
        // and n/2 stand for their mirror images too (weight 2).
        let weight = |k: usize| if k == 0 || 2 * k == n { scale } else { 2.0 * scale };
        let (c, s) = (matrix(f64::cos, &weight)?, matrix(f64::sin, &weight)?);
        (add(re.matmul(&c), product(&im, &s), -1.0), None)
    };
    let back = |t: Tensor| t.transpose(a, last).unsqueeze(rank - 1);
    let y = match out_im {
        Some(im) => Tensor::cat(&[&back(out_re), &back(im)], rank - 1),
        None => back(out_re),
    };
    Ok(y.cast(x.dtype()))
}

/// STFT (opset 17): the one-sided (by default) DFT of each frame of `frame_length` samples,
/// `frame_step` apart, times `window`: `[batch, frames, bins, 2]`. The frames are one gather of
/// constant positions from the signal.
pub(super) fn stft(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    if x.ndim() != 3 {
        return Err(format!("the signal {} must be [batch, length, 1 or 2]", show(x)).into());
    }
    let len = x.shape()[1].as_const().ok_or("STFT needs a concrete signal length")? as usize;
    let step = match ctx.values_at(1)?.as_slice() {
        [s] if *s > 0 => *s as usize,
        other => return Err(format!("frame_step {other:?} is not one positive step").into()),
    };
    let window = ctx.opt(2);
    let frame = match (ctx.opt_values(3)?, window) {
        (Some(v), _) => match v.as_slice() {
            [f] if *f > 0 => *f as usize,
            other => return Err(format!("frame_length {other:?} is not one positive length").into()),
        },
        (None, Some(w)) => w.shape()[0].as_const().ok_or("the window must be concrete")? as usize,
        (None, None) => return Err("needs a window or a frame_length".into()),
    };
    if frame > len {
        return Err(format!("frames of {frame} do not fit a signal of {len}").into());
    }
    let frames = (len - frame) / step + 1;
    let positions: Vec<i64> = (0..frames).flat_map(|f| (0..frame).map(move |t| (f * step + t) as i64)).collect();
    let index = ctx.i64s(positions, &[frames * frame]);
    let d = x.shape().clone();
    let mut framed = x.index_select(1, &index).reshape(vec![d[0], (frames as i64).into(), (frame as i64).into(), d[2]]);
    if let Some(w) = window {
        framed = framed.mul(w.cast(x.dtype()).reshape(vec![frame, 1]));
    }
    let onesided = ctx.int("onesided", 1)? != 0;
    Ok(vec![transform(ctx, &framed, 2, frame, false, onesided)?])
}

/// HannWindow, HammingWindow and BlackmanWindow: `size` samples of the window (periodic by
/// default: the period is `size`, else `size - 1`), computed at import in f64.
pub(super) fn window_function(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let size = match ctx.values_at(0)?.as_slice() {
        [n] if *n >= 0 => *n as usize,
        other => return Err(format!("size {other:?} is not one non-negative count").into()),
    };
    let periodic = ctx.int("periodic", 1)? != 0;
    let period = if periodic { size as f64 } else { size.saturating_sub(1).max(1) as f64 };
    let angle = |n: usize| 2.0 * std::f64::consts::PI * n as f64 / period;
    let values: Vec<f64> = (0..size)
        .map(|n| match ctx.op() {
            "HannWindow" => 0.5 - 0.5 * angle(n).cos(),
            "HammingWindow" => 25.0 / 46.0 - (21.0 / 46.0) * angle(n).cos(),
            _ => 0.42 - 0.5 * angle(n).cos() + 0.08 * (2.0 * angle(n)).cos(),
        })
        .collect();
    let dtype = match ctx.attr("output_datatype") {
        Some(_) => ctx.dtype_attr("output_datatype")?,
        None => DType::F32,
    };
    let host = HostTensor::new(HostData::F64(values), vec![size]).map_err(|e| e.to_string())?;
    Ok(vec![ctx.constant(host).cast(dtype)])
}

//! Sliding-window ops over `[N, C, D1, ..., Dn]` (any number of spatial dims): Conv (groups,
//! dilations, strides, pads, auto_pad), ConvTranspose (as a convolution), MaxPool/AveragePool (ceil_mode, count_include_pad,
//! dilations) and the global pools. Two spatial dims with the same padding on both sides (what
//! PyTorch exports) go through `kiln_nn::functional`'s `conv2d`/`max_pool2d`/`avg_pool2d`, one
//! implementation with the models' fast paths (depthwise, 1x1, tiled pooling); the rest is the
//! general N-d form here: im2col + one batched matmul, windows as views (a pad, a narrow and a
//! reshape per axis, no index arithmetic beyond what the views compose to).

use kiln::{Dim, Tensor, cat};
use kiln_nn::functional as F;

/// `(h, w)` of a 2-D window op.
type Pair = (usize, usize);

use super::{Ctx, OpResult, dims, show};

/// The batch dim (possibly symbolic) and the concrete channel and spatial dims of `[N, C, ...]`.
fn batch_and_dims(x: &Tensor) -> OpResult<(Dim, Vec<usize>)> {
    let Some((n, rest)) = x.shape().split_first() else {
        return Err("needs an [N, C, ...] input".into());
    };
    let mut d = vec![0];
    for dim in rest {
        d.push(
            dim.as_const().ok_or_else(|| format!("needs concrete channel and spatial dims, got {}", show(x)))? as usize
        );
    }
    Ok((*n, d))
}

/// Positions `q + s * o` (`o` in `0..out`) along `axis`; positions outside the axis read `fill`.
fn strided(x: &Tensor, axis: usize, q: i64, s: usize, out: usize, fill: f64) -> Tensor {
    let len = x.shape()[axis].as_const().unwrap_or(0);
    let span = (s * out) as i64;
    let before = (-q).max(0);
    let after = (q + span - len).max(0);
    let mut y = x.clone();
    if before + after > 0 {
        let mut pads = vec![(0, 0); x.ndim()];
        pads[axis] = (before as usize, after as usize);
        y = y.pad(&pads, fill);
    }
    y = y.narrow(axis as i64, q + before, span);
    if s == 1 {
        return y;
    }
    let mut split: Vec<kiln::Dim> = y.shape().to_vec();
    split[axis] = out.into();
    split.insert(axis + 1, s.into());
    y.reshape(split).narrow(axis as i64 + 1, 0, 1).squeeze(axis + 1)
}

/// Attribute `name`'s value per spatial axis (`n` of them, each at least 1), 1 where it is absent.
fn per_axis(ctx: &Ctx, name: &str, n: usize) -> OpResult<Vec<usize>> {
    match ctx.ints(name)? {
        None => Ok(vec![1; n]),
        Some(v) if v.len() == n && v.iter().all(|&x| x >= 1) => Ok(v.iter().map(|&x| x as usize).collect()),
        Some(v) => Err(format!("{name} {v:?} do not fit {n} spatial dims").into()),
    }
}

/// The geometry of a window op: per spatial axis the kernel, stride, dilation, padding before
/// and after, and output size.
struct Geometry {
    kernel: Vec<usize>,
    stride: Vec<usize>,
    dilation: Vec<usize>,
    pad_before: Vec<usize>,
    pad_after: Vec<usize>,
    out: Vec<usize>,
}

impl Geometry {
    /// From the node's attributes for input dims `spatial` and `kernel`.
    fn new(ctx: &Ctx, spatial: &[usize], kernel: Vec<usize>, ceil_mode: bool) -> OpResult<Geometry> {
        let n = spatial.len();
        let (stride, dilation) = (per_axis(ctx, "strides", n)?, per_axis(ctx, "dilations", n)?);
        if kernel.len() != n || kernel.contains(&0) {
            return Err(format!("kernel {kernel:?} does not fit {n} spatial dims").into());
        }
        let auto = ctx.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
        let (mut before, mut after) = (vec![0usize; n], vec![0usize; n]);
        match auto.as_str() {
            "NOTSET" => {
                if let Some(p) = ctx.ints("pads")? {
                    if p.len() != 2 * n || p.iter().any(|&x| x < 0) {
                        return Err(format!("pads {p:?} do not fit {n} spatial dims").into());
                    }
                    for i in 0..n {
                        before[i] = p[i] as usize;
                        after[i] = p[i + n] as usize;
                    }
                }
            }
            "VALID" => {}
            "SAME_UPPER" | "SAME_LOWER" => {
                for i in 0..n {
                    let out = spatial[i].div_ceil(stride[i]);
                    let span = (kernel[i] - 1) * dilation[i] + 1;
                    let total = ((out.max(1) - 1) * stride[i] + span).saturating_sub(spatial[i]);
                    let small = total / 2;
                    (before[i], after[i]) =
                        if auto == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                }
            }
            other => return Err(format!("auto_pad {other:?} is not supported").into()),
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let padded = spatial[i] + before[i] + after[i];
            let span = (kernel[i] - 1) * dilation[i] + 1;
            if span > padded {
                return Err(format!("the window ({span}) is larger than the padded input ({padded})").into());
            }
            let mut o =
                if ceil_mode { (padded - span).div_ceil(stride[i]) + 1 } else { (padded - span) / stride[i] + 1 };
            // A window must start inside the input or its leading padding.
            if ceil_mode && (o - 1) * stride[i] >= spatial[i] + before[i] {
                o -= 1;
            }
            out.push(o);
        }
        Ok(Geometry { kernel, stride, dilation, pad_before: before, pad_after: after, out })
    }

    /// The `(h, w)` stride, padding and dilation of a 2-D window op whose padding is the same
    /// before and after each axis.
    fn symmetric_2d(&self) -> Option<[Pair; 3]> {
        let pair = |v: &[usize]| (v[0], v[1]);
        (self.kernel.len() == 2 && self.pad_before == self.pad_after)
            .then(|| [pair(&self.stride), pair(&self.pad_before), pair(&self.dilation)])
    }

    /// Every kernel offset, first axis slowest.
    fn offsets(&self) -> Vec<Vec<usize>> {
        let mut all = vec![vec![]];
        for &k in &self.kernel {
            all =
                all.into_iter().flat_map(|p: Vec<usize>| (0..k).map(move |j| [p.clone(), vec![j]].concat())).collect();
        }
        all
    }

    /// The window of `x` (`[N, C, spatial...]`) at kernel `offset`: `[N, C, out...]`, `fill`
    /// outside the input.
    fn window(&self, x: &Tensor, offset: &[usize], fill: f64) -> Tensor {
        let mut y = x.clone();
        for (i, &k) in offset.iter().enumerate() {
            let q = (k * self.dilation[i]) as i64 - self.pad_before[i] as i64;
            y = strided(&y, 2 + i, q, self.stride[i], self.out[i], fill);
        }
        y
    }

    /// All windows stacked on a new axis 2: `[N, C, K, out...]`.
    fn stacked(&self, x: &Tensor, fill: f64) -> Tensor {
        let windows: Vec<Tensor> = self.offsets().iter().map(|o| self.window(x, o, fill).unsqueeze(2)).collect();
        let refs: Vec<&Tensor> = windows.iter().collect();
        cat(&refs, 2)
    }
}

pub(super) fn conv(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    if x.shape().iter().skip(2).any(|d| !d.is_const()) {
        return Ok(vec![conv_symbolic(ctx, x, w)?]);
    }
    let ((_, xd), wd) = (batch_and_dims(x)?, dims(w)?);
    if xd.len() < 3 || wd.len() != xd.len() {
        return Err(
            format!("X {} and W {wd:?} must be [N, C, ...] and [M, C/group, ...] of one rank >= 3", show(x)).into()
        );
    }
    let group = ctx.int("group", 1)?;
    let g = usize::try_from(group)
        .ok()
        .filter(|&g| g >= 1 && xd[1] % g == 0 && wd[0] % g == 0)
        .ok_or_else(|| format!("group {group} does not divide the channels"))?;
    let c = xd[1];
    if wd[1] * g != c {
        return Err(format!("W {wd:?} takes {} channels per group; X {} has {c} in {g} groups", wd[1], show(x)).into());
    }
    let kernel = match ctx.ints("kernel_shape")? {
        Some(k) => k.iter().map(|&v| v.max(0) as usize).collect(),
        None => wd[2..].to_vec(),
    };
    if kernel != wd[2..] {
        return Err(format!("kernel_shape {kernel:?} differs from W's {:?}", &wd[2..]).into());
    }
    let geo = Geometry::new(ctx, &xd[2..], kernel, false)?;
    Ok(vec![convolve(x, w, ctx.opt(2), &geo, g)?])
}

/// The windows of a window op over symbolic spatial dims (a sequence, an image of any size):
/// per axis the kernel, stride, dilation and explicit padding, and the output size, a
/// polynomial at stride 1 (`len + pads - (k - 1) * dilation`) and otherwise a floor-division
/// symbol (`⌊(len + pads - span)/s⌋ + 1`, `Dim::floor_div`, bound when the program runs).
struct SymWindows {
    kernel: Vec<usize>,
    stride: Vec<usize>,
    dilation: Vec<usize>,
    pads: Vec<(usize, usize)>,
    out: Vec<Dim>,
    /// ceil_mode: a last, partial window where the input has a remainder.
    ceil: bool,
}

impl SymWindows {
    /// From the node's attributes for `x` (`[N, C, spatial...]`) and `kernel`. `auto_pad`'s SAME
    /// modes need stride 1 on a symbolic axis (their split of the padding depends on the size's
    /// remainder), and ceil_mode padding after each axis of at most the kernel's reach less the
    /// stride (so that no last window starts in that padding, which ONNX drops).
    fn new(ctx: &Ctx, x: &Tensor, kernel: &[usize]) -> OpResult<SymWindows> {
        let n = x.ndim() - 2;
        if kernel.len() != n || kernel.contains(&0) {
            return Err(format!("kernel {kernel:?} does not fit X {}", show(x)).into());
        }
        let ceil = ctx.int("ceil_mode", 0)? != 0;
        let (stride, dilation) = (per_axis(ctx, "strides", n)?, per_axis(ctx, "dilations", n)?);
        let mut pads = vec![(0usize, 0usize); n];
        match ctx.string("auto_pad")?.as_deref().unwrap_or("NOTSET") {
            "NOTSET" => {
                if let Some(p) = ctx.ints("pads")? {
                    if p.len() != 2 * n || p.iter().any(|&v| v < 0) {
                        return Err(format!("pads {p:?} do not fit {n} spatial dims").into());
                    }
                    for i in 0..n {
                        pads[i] = (p[i] as usize, p[i + n] as usize);
                    }
                }
            }
            "VALID" => {}
            // At stride 1 the output keeps the input's size: the dilated kernel's reach less one,
            // split with the odd one after (SAME_UPPER) or before (SAME_LOWER).
            auto @ ("SAME_UPPER" | "SAME_LOWER") => {
                for i in 0..n {
                    if stride[i] != 1 && !x.shape()[2 + i].is_const() {
                        return Err(
                            format!("{auto} at stride {} over a symbolic dim of X {}", stride[i], show(x)).into()
                        );
                    }
                    let total = (kernel[i] - 1) * dilation[i];
                    let small = total / 2;
                    pads[i] = if auto == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                }
            }
            other => return Err(format!("auto_pad {other:?} is not supported").into()),
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let (b, a) = pads[i];
            let span = (kernel[i] - 1) * dilation[i] + 1;
            if ceil && a + stride[i] > span {
                return Err(format!(
                    "ceil_mode with padding {a} after a symbolic axis of X {} (kernel reach {span}, stride {})",
                    show(x),
                    stride[i]
                )
                .into());
            }
            let round_up = if ceil { stride[i] - 1 } else { 0 };
            let reach = x.shape()[2 + i] + Dim::from(b + a + round_up) - Dim::from(span);
            out.push(reach.floor_div(stride[i] as i64).ok_or("a stride must be positive")? + Dim::Const(1));
        }
        Ok(SymWindows { kernel: kernel.to_vec(), stride, dilation, pads, out, ceil })
    }

    /// All windows of `x` stacked on a new axis 2: `[N, C, K, out...]`, `fill` in the padding.
    /// Each axis is padded once, by its padding and `stride - 1` more at the end (twice that
    /// with ceil_mode, whose last window may reach past the padding): a window's strided
    /// positions then always lie inside, whatever the size's remainder; a kernel offset's window
    /// is a narrow of `stride * out` positions, every `stride`-th kept.
    fn stacked(&self, x: &Tensor, fill: f64) -> Tensor {
        let extra = if self.ceil { 2 } else { 1 };
        let mut amounts = vec![(0usize, 0usize); 2];
        amounts.extend(self.pads.iter().zip(&self.stride).map(|(&(b, a), &s)| (b, a + extra * (s - 1))));
        let padded = if amounts.iter().any(|&(b, a)| b + a > 0) { x.pad(&amounts, fill) } else { x.clone() };
        let mut offsets: Vec<Vec<usize>> = vec![vec![]];
        for &k in &self.kernel {
            offsets = offsets.into_iter().flat_map(|p| (0..k).map(move |j| [p.clone(), vec![j]].concat())).collect();
        }
        let windows: Vec<Tensor> = offsets
            .iter()
            .map(|o| {
                let mut y = padded.clone();
                for (i, &j) in o.iter().enumerate() {
                    let (axis, s, out) = (2 + i, self.stride[i], self.out[i]);
                    y = y.narrow(axis as i64, (j * self.dilation[i]) as i64, Dim::from(s) * out);
                    if s > 1 {
                        let mut split: Vec<Dim> = y.shape().to_vec();
                        split[axis] = out;
                        split.insert(axis + 1, s.into());
                        y = y.reshape(split).narrow(axis as i64 + 1, 0, 1).squeeze(axis + 1);
                    }
                }
                y.unsqueeze(2)
            })
            .collect();
        let stacked = cat(&windows.iter().collect::<Vec<_>>(), 2);
        // A window larger than a symbolic axis and its padding is an error when the program runs
        // (onnxruntime refuses it), not an empty result: a zero summed over none of the
        // `len + pads - span` positions, which the run checks are not negative.
        let mut guarded = stacked;
        for (i, &(b, a)) in self.pads.iter().enumerate() {
            let len = x.shape()[2 + i];
            let span = (self.kernel[i] - 1) * self.dilation[i] + 1;
            if !len.is_const() && span > b + a {
                let reach = len + Dim::from(b + a) - Dim::from(span);
                let zero = Tensor::iota_on(reach, x.dtype(), x.device()).narrow(0, 0, 0).sum(0);
                guarded = guarded.add(zero);
            }
        }
        guarded
    }
}

/// A convolution over symbolic spatial dims (a sequence: SqueezeBERT's and Conformer's 1-D
/// convolutions, wav2vec2's; an image of any size): the windows of [`SymWindows`] contracted
/// with the weights in one batched matmul, as [`convolve`] does for concrete sizes.
fn conv_symbolic(ctx: &Ctx, x: &Tensor, w: &Tensor) -> OpResult<Tensor> {
    let wd = dims(w)?;
    let rank = x.ndim();
    if rank < 3 || wd.len() != rank {
        return Err(
            format!("X {} and W {wd:?} must be [N, C, ...] and [M, C/group, ...] of one rank >= 3", show(x)).into()
        );
    }
    let n_sp = rank - 2;
    let c = x.shape()[1].as_const().ok_or_else(|| format!("needs a concrete channel dim, got {}", show(x)))? as usize;
    let group = ctx.int("group", 1)?;
    let g = usize::try_from(group)
        .ok()
        .filter(|&g| g >= 1 && c.is_multiple_of(g) && wd[0].is_multiple_of(g) && wd[1] * g == c)
        .ok_or_else(|| format!("group {group} does not fit X {} and W {wd:?}", show(x)))?;
    let kernel = &wd[2..];
    if ctx.ints("kernel_shape")?.is_some_and(|k| k.iter().map(|&v| v.max(0) as usize).collect::<Vec<_>>() != kernel) {
        return Err(format!("kernel_shape differs from W's {kernel:?}").into());
    }
    let win = SymWindows::new(ctx, x, kernel)?;
    let k: usize = kernel.iter().product();
    let o = win.out.iter().try_fold(Dim::Const(1), |acc, d| acc.checked_mul(d)).ok_or("the output size overflows")?;
    let m = wd[0];
    let cols = win.stacked(x, 0.0).reshape(vec![x.shape()[0], g.into(), ((c / g) * k).into(), o]);
    let mut shape = vec![x.shape()[0], m.into()];
    shape.extend(win.out.iter().copied());
    let mut y = w.reshape(vec![g, m / g, (c / g) * k]).matmul(&cols).reshape(shape);
    if let Some(b) = ctx.opt(2) {
        let mut bshape = vec![m];
        bshape.extend(std::iter::repeat_n(1, n_sp));
        y = y.add(b.reshape(bshape));
    }
    Ok(y)
}

/// MaxPool and AveragePool over symbolic spatial dims ([`SymWindows`]): the windows' maximum,
/// or their sum over how many of each window's positions are in the input (or in the input and
/// its explicit padding, with count_include_pad).
fn pool_symbolic(ctx: &Ctx, x: &Tensor) -> OpResult<Tensor> {
    if x.ndim() < 3 {
        return Err(format!("X {} must be [N, C, ...]", show(x)).into());
    }
    let kernel: Vec<usize> =
        ctx.ints("kernel_shape")?.ok_or("kernel_shape is required")?.iter().map(|&v| v.max(0) as usize).collect();
    let win = SymWindows::new(ctx, x, &kernel)?;
    if ctx.op() == "MaxPool" {
        return Ok(win.stacked(x, f64::NEG_INFINITY).amax(2));
    }
    let sum = win.stacked(x, 0.0).sum(2);
    let mut ones_shape = vec![Dim::Const(1), Dim::Const(1)];
    ones_shape.extend(x.shape()[2..].iter().copied());
    let ones = Tensor::ones_on(ones_shape, x.dtype(), ctx.device);
    let count = if ctx.int("count_include_pad", 0)? != 0 {
        let mut amounts = vec![(0, 0), (0, 0)];
        amounts.extend(win.pads.iter().copied());
        let unpadded = SymWindows { pads: vec![(0, 0); kernel.len()], ..win };
        unpadded.stacked(&ones.pad(&amounts, 1.0), 0.0).sum(2)
    } else {
        win.stacked(&ones, 0.0).sum(2)
    };
    Ok(sum.div(count))
}

/// The convolution of `x` (`[N, C, spatial...]`) with `w` (`[M, C/g, kernel...]`) in `g` groups
/// over the windows of `geo`, plus the bias `b` (`[M]`).
fn convolve(x: &Tensor, w: &Tensor, b: Option<&Tensor>, geo: &Geometry, g: usize) -> OpResult<Tensor> {
    let ((n, xd), wd) = (batch_and_dims(x)?, dims(w)?);
    let (c, m) = (xd[1], wd[0]);
    if let Some([stride, padding, dilation]) = geo.symmetric_2d() {
        let options = F::Conv2dOptions { stride, padding: F::Padding::Explicit(padding), dilation, groups: g };
        return Ok(F::conv2d(x, w, b, options));
    }
    let k: usize = geo.kernel.iter().product();
    let o: usize = geo.out.iter().product();
    // Columns [N, g, C/g * K, O] times weights [g, M/g, C/g * K] -> [N, g, M/g, O].
    let cols = geo.stacked(x, 0.0).reshape(vec![n, g.into(), ((c / g) * k).into(), o.into()]);
    let weights = w.reshape(vec![g, m / g, (c / g) * k]);
    let mut shape = vec![n, m.into()];
    shape.extend(geo.out.iter().map(|&d| Dim::from(d)));
    let mut y = weights.matmul(&cols).reshape(shape);
    if let Some(b) = b {
        let mut bshape = vec![m];
        bshape.extend(std::iter::repeat_n(1, geo.out.len()));
        y = y.add(b.reshape(bshape));
    }
    Ok(y)
}

/// ConvTranspose: the gradient of a convolution with respect to its input, computed as a
/// convolution. Per spatial axis, the input's elements are spread `stride` apart (zeros
/// between), padded by the dilated kernel's reach less the op's `pads` (cropped where that is
/// negative), and convolved at stride 1 with the weights turned around (`[C, M/g, k...]` to
/// `[M, C/g, k...]`, each kernel axis reversed). `output_shape` sets the size (its padding split
/// by `auto_pad` as ONNX's reference splits it), `output_padding` adds to the end.
pub(super) fn conv_transpose(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    let ((_, xd), wd) = (batch_and_dims(x)?, dims(w)?);
    let rank = xd.len();
    if rank < 3 || wd.len() != rank {
        return Err(
            format!("X {} and W {wd:?} must be [N, C, ...] and [C, M/group, ...] of one rank >= 3", show(x)).into()
        );
    }
    let spatial = rank - 2;
    let group = ctx.int("group", 1)?;
    let g = usize::try_from(group)
        .ok()
        .filter(|&g| g >= 1 && xd[1] % g == 0)
        .ok_or_else(|| format!("group {group} does not divide the {} input channels", xd[1]))?;
    let (c, m_g) = (xd[1], wd[1]);
    if wd[0] != c {
        return Err(format!("W {wd:?} is for {} input channels; X {} has {c}", wd[0], show(x)).into());
    }
    let kernel = wd[2..].to_vec();
    if let Some(k) = ctx.ints("kernel_shape")?
        && k.iter().map(|&v| v.max(0) as usize).collect::<Vec<_>>() != kernel
    {
        return Err(format!("kernel_shape {k:?} differs from W's {kernel:?}").into());
    }
    let list = |name: &str, default: usize, min: i64| -> OpResult<Vec<usize>> {
        match ctx.ints(name)? {
            None => Ok(vec![default; spatial]),
            Some(v) if v.len() == spatial && v.iter().all(|&x| x >= min) => Ok(v.iter().map(|&x| x as usize).collect()),
            Some(v) => Err(format!("{name} {v:?} do not fit {spatial} spatial dims").into()),
        }
    };
    let (stride, dilation, extra) = (list("strides", 1, 1)?, list("dilations", 1, 1)?, list("output_padding", 0, 0)?);
    let auto = ctx.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let pads = match ctx.ints("pads")? {
        Some(p) if p.len() == 2 * spatial && p.iter().all(|&v| v >= 0) => p,
        Some(p) => return Err(format!("pads {p:?} do not fit {spatial} spatial dims").into()),
        None => vec![0; 2 * spatial],
    };
    let output_shape = ctx.ints("output_shape")?;
    if let Some(o) = &output_shape
        && (o.len() != spatial || o.iter().any(|&v| v < 1))
    {
        return Err(format!("output_shape {o:?} does not fit {spatial} spatial dims").into());
    }
    // Per axis: the full result's length, the output's start in it and the output's length.
    let mut y = x.clone();
    let mut out = Vec::with_capacity(spatial);
    for i in 0..spatial {
        let (len, s, d, k) = (xd[2 + i] as i64, stride[i] as i64, dilation[i] as i64, kernel[i] as i64);
        let full = s * (len - 1) + extra[i] as i64 + (k - 1) * d + 1;
        let (begin, size) = match (&output_shape, auto.as_str()) {
            (Some(o), "SAME_UPPER" | "SAME_LOWER") => {
                let total = full - o[i];
                let small = total.div_euclid(2);
                (if auto == "SAME_UPPER" { small } else { total - small }, o[i])
            }
            (None, "SAME_UPPER" | "SAME_LOWER") => {
                let total = full - len * s;
                let small = total.div_euclid(2);
                (if auto == "SAME_UPPER" { small } else { total - small }, len * s)
            }
            (Some(o), "NOTSET" | "VALID") => (pads[i] as i64, o[i]),
            (None, "NOTSET" | "VALID") => (pads[i] as i64, full - pads[i] as i64 - pads[i + spatial] as i64),
            (_, other) => return Err(format!("auto_pad {other:?} is not supported").into()),
        };
        if size < 1 {
            return Err(format!("the output's spatial dim {i} would be {size}").into());
        }
        // Spread: [.., len, ..] -> [.., (len - 1) * s + 1, ..] with s - 1 zeros between.
        let axis = 2 + i;
        if s > 1 {
            let mut wide: Vec<Dim> = y.shape().to_vec();
            wide[axis] = Dim::from(len * s);
            let mut pad = vec![(0, 0); y.ndim() + 1];
            pad[axis + 1] = (0, (s - 1) as usize);
            y = y.unsqueeze(axis + 1).pad(&pad, 0.0).reshape(wide).narrow(axis as i64, 0, (len - 1) * s + 1);
        }
        // Pad (or crop) so that a stride-1 window of the dilated kernel at output position o
        // covers the full result's position begin + o.
        let reach = (k - 1) * d;
        let (before, spread) = (reach - begin, (len - 1) * s + 1);
        let after = size + reach - spread - before;
        let mut pad = vec![(0, 0); y.ndim()];
        pad[axis] = (before.max(0) as usize, after.max(0) as usize);
        y = y.pad(&pad, 0.0);
        if before < 0 || after < 0 {
            y = y.narrow(axis as i64, (-before).max(0), size + reach);
        }
        out.push(size as usize);
    }
    // Weights [C, M/g, k...] -> [M, C/g, k...], each kernel axis reversed.
    let mut grouped = vec![g, c / g, m_g];
    grouped.extend(&kernel);
    let mut flat = vec![g * m_g, c / g];
    flat.extend(&kernel);
    let mut wt = w.reshape(grouped).transpose(1, 2).reshape(flat);
    for (i, &k) in kernel.iter().enumerate() {
        let reversed = ctx.i64s((0..k as i64).rev().collect(), &[k]);
        wt = wt.index_select(2 + i, &reversed);
    }
    let geo = Geometry {
        kernel,
        stride: vec![1; spatial],
        dilation,
        pad_before: vec![0; spatial],
        pad_after: vec![0; spatial],
        out,
    };
    Ok(vec![convolve(&y, &wt, ctx.opt(2), &geo, g)?])
}

pub(super) fn pool(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let indices = ctx.node.output.len() > 1 && ctx.node.output[1..].iter().any(|o| !o.is_empty());
    if x.shape().iter().skip(2).any(|d| !d.is_const()) && !indices {
        return Ok(vec![pool_symbolic(ctx, x)?]);
    }
    let (_, xd) = batch_and_dims(x)?;
    if xd.len() < 3 {
        return Err(format!("X {} must be [N, C, ...]", show(x)).into());
    }
    let kernel: Vec<usize> =
        ctx.ints("kernel_shape")?.ok_or("kernel_shape is required")?.iter().map(|&v| v.max(0) as usize).collect();
    let ceil_mode = ctx.int("ceil_mode", 0)? != 0;
    let geo = Geometry::new(ctx, &xd[2..], kernel, ceil_mode)?;
    if ctx.node.output.len() > 1 && ctx.node.output[1..].iter().any(|o| !o.is_empty()) {
        return max_pool_with_indices(ctx, x, &xd, &geo);
    }
    let kernel_2d = (geo.kernel.len() == 2).then(|| (geo.kernel[0], geo.kernel[1]));
    if let (Some([stride, padding, dilation]), Some(k)) = (geo.symmetric_2d(), kernel_2d) {
        // PyTorch's pools take padding of at most half the (dilated) kernel; ONNX allows more.
        let extent = |i: usize| dilation_of(dilation, i) * (geo.kernel[i] - 1) + 1;
        let within = 2 * padding.0 <= extent(0) && 2 * padding.1 <= extent(1);
        if within && ctx.op() == "MaxPool" {
            let options = F::MaxPool2dOptions { stride: Some(stride), padding, dilation: Some(dilation), ceil_mode };
            return Ok(vec![F::max_pool2d(x, k, options)]);
        }
        if within && dilation == (1, 1) {
            let options = F::AvgPool2dOptions {
                stride: Some(stride),
                padding,
                ceil_mode,
                count_include_pad: ctx.int("count_include_pad", 0)? != 0,
                divisor_override: None,
            };
            return Ok(vec![F::avg_pool2d(x, k, options)]);
        }
    }
    if ctx.op() == "MaxPool" {
        return Ok(vec![geo.stacked(x, f64::NEG_INFINITY).amax(2)]);
    }
    let sum = geo.stacked(x, 0.0).sum(2);
    // The divisor: how many positions of each window are in the input (plus the explicit
    // padding with count_include_pad), never the positions ceil_mode adds past the padding.
    let mut ones_shape = vec![1, 1];
    ones_shape.extend(&xd[2..]);
    let ones = Tensor::ones_on(ones_shape, x.dtype(), ctx.device);
    let count = if ctx.int("count_include_pad", 0)? != 0 {
        let mut amounts = vec![(0, 0), (0, 0)];
        amounts.extend(geo.pad_before.iter().zip(&geo.pad_after).map(|(&b, &a)| (b, a)));
        let unpadded = Geometry { pad_before: vec![0; geo.kernel.len()], ..geo };
        unpadded.stacked(&ones.pad(&amounts, 1.0), 0.0).sum(2)
    } else {
        geo.stacked(&ones, 0.0).sum(2)
    };
    Ok(vec![sum.div(count)])
}

fn dilation_of(d: (usize, usize), i: usize) -> usize {
    if i == 0 { d.0 } else { d.1 }
}

pub(super) fn global_pool(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    if x.ndim() < 3 {
        return Err(format!("X must be [N, C, ...], got rank {}", x.ndim()).into());
    }
    let axes: Vec<usize> = (2..x.ndim()).collect();
    Ok(vec![if ctx.op() == "GlobalMaxPool" { x.amax_keepdim(axes) } else { x.mean_keepdim(axes) }])
}

/// MaxPool with its Indices output: the windows stacked (`-inf` outside the input), their
/// maximum and the first position holding it, turned into the flat index of that element in
/// `X` (row-major, or column-major over the spatial dims with `storage_order` 1).
fn max_pool_with_indices(ctx: &Ctx, x: &Tensor, xd: &[usize], geo: &Geometry) -> OpResult<Vec<Tensor>> {
    let windows = geo.stacked(x, f64::NEG_INFINITY);
    let values = windows.amax(2);
    let k = windows.argmax_keepdim(2).squeeze(2).cast(kiln::DType::I64);
    let spatial = &xd[2..];
    let column_major = ctx.int("storage_order", 0)? != 0;
    // Per spatial axis: the input position of kernel offset k at each output position.
    let offsets = geo.offsets();
    let mut terms = Vec::with_capacity(spatial.len());
    for axis in 0..spatial.len() {
        let of_k: Vec<i64> = offsets.iter().map(|o| (o[axis] * geo.dilation[axis]) as i64).collect();
        let table = ctx.i64s(of_k, &[offsets.len()]);
        let mut out_shape = vec![1usize; geo.out.len() + 2];
        out_shape[2 + axis] = geo.out[axis];
        let starts: Vec<i64> =
            (0..geo.out[axis]).map(|o| (o * geo.stride[axis]) as i64 - geo.pad_before[axis] as i64).collect();
        let position =
            table.index_select(0, &k.reshape(&[-1])).reshape(k.shape().clone()).add(ctx.i64s(starts, &out_shape));
        let stride: usize =
            if column_major { spatial[..axis].iter().product() } else { spatial[axis + 1..].iter().product() };
        terms.push(position.mul(stride as i64));
    }
    let flat = terms.into_iter().reduce(|a, b| a.add(&b)).expect("one spatial axis at least");
    // Plus the (batch, channel) plane's first element.
    let plane: usize = spatial.iter().product();
    let n = x.shape()[0];
    let mut nc_shape = vec![1i64; geo.out.len() + 2];
    nc_shape[0] = -1;
    nc_shape[1] = xd[1] as i64;
    let planes = Tensor::iota_on(n, kiln::DType::I64, ctx.device).reshape(vec![n, Dim::from(1)]).mul(xd[1] as i64);
    let planes = planes.add(ctx.i64s((0..xd[1] as i64).collect(), &[1, xd[1]])).mul(plane as i64).reshape(nc_shape);
    Ok(vec![values, flat.add(planes)])
}

/// LpPool: `(sum over the window of |x|^p)^(1/p)`, the windows as Conv's and the pools' (padding
/// counts as zeros).
pub(super) fn lp_pool(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let (_, xd) = batch_and_dims(x)?;
    if xd.len() < 3 {
        return Err(format!("X {} must be [N, C, ...]", show(x)).into());
    }
    let kernel: Vec<usize> =
        ctx.ints("kernel_shape")?.ok_or("kernel_shape is required")?.iter().map(|&v| v.max(0) as usize).collect();
    let geo = Geometry::new(ctx, &xd[2..], kernel, ctx.int("ceil_mode", 0)? != 0)?;
    let p = ctx.int("p", 2)?;
    if p < 1 {
        return Err(format!("p = {p} is not a positive integer").into());
    }
    let powered = match p {
        1 => x.abs(),
        2 => x.square(),
        _ => x.abs().pow(p as f64),
    };
    let sums = geo.stacked(&powered, 0.0).sum(2);
    Ok(vec![match p {
        1 => sums,
        2 => sums.sqrt(),
        _ => sums.pow(1.0 / p as f64),
    }])
}

/// CausalConvWithState (opset 27): a depthwise causal 1-D convolution over `[N, C, L]` that
/// carries its last `k - 1` inputs between calls: the past state (zeros without one) prepended,
/// `k` shifted slices times their per-channel taps, the bias, then the optional SiLU; the second
/// output is the new state.
pub(super) fn causal_conv_with_state(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (x, w) = (ctx.input(0)?, ctx.input(1)?);
    let ((_, xd), wd) = (batch_and_dims(x)?, dims(w)?);
    if xd.len() != 3 || wd.len() != 3 || wd[0] != xd[1] || wd[1] != 1 || wd[2] == 0 {
        return Err(format!("input {} and weight {wd:?} must be [N, C, L] and [C, 1, k]", show(x)).into());
    }
    let (channels, len, k) = (xd[1], xd[2], wd[2]);
    let past = match ctx.opt(3) {
        Some(p) => p.clone(),
        None => {
            let mut pads = vec![(0, 0); 3];
            pads[2] = (k - 1, 0);
            x.narrow(2, 0, 0).pad(&pads, 0.0)
        }
    };
    let padded = cat(&[&past, x], 2);
    let taps = w.reshape(vec![channels, k]);
    let mut y = (0..k)
        .map(|j| padded.narrow(2, j as i64, len as i64).mul(taps.narrow(1, j as i64, 1)))
        .reduce(|a, b| a.add(&b))
        .expect("k >= 1");
    if let Some(b) = ctx.opt(2) {
        y = y.add(b.reshape(vec![channels, 1]));
    }
    match ctx.string("activation")?.as_deref().unwrap_or("none") {
        "none" => {}
        // In f32 whatever the input's type, as ONNX's reference computes it.
        "silu" | "swish" => {
            let wide = y.cast(kiln::DType::F32);
            y = wide.mul(wide.sigmoid()).cast(x.dtype());
        }
        other => return Err(format!("activation {other:?} is not none, silu or swish").into()),
    }
    let state = padded.narrow(2, len as i64, k as i64 - 1);
    Ok(vec![y, state])
}

/// MaxUnpool: `X`'s elements written at the flat positions `I` (MaxPool's Indices) of a zero
/// tensor of the pooled input's shape (from kernel, strides and pads), zero-padded at the end of
/// each spatial dim to `output_shape` where it is given.
pub(super) fn max_unpool(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (x, indices) = (ctx.input(0)?, ctx.input(1)?);
    let xd = dims(x)?;
    let k = xd.len().checked_sub(2).filter(|&k| k >= 1).ok_or_else(|| format!("X {} must be [N, C, ...]", show(x)))?;
    let kernel = ctx.ints("kernel_shape")?.ok_or("kernel_shape is required")?;
    let strides = ctx.ints("strides")?.unwrap_or_else(|| vec![1; k]);
    let pads = ctx.ints("pads")?.unwrap_or_else(|| vec![0; 2 * k]);
    if kernel.len() != k || strides.len() != k || pads.len() != 2 * k {
        return Err(format!("kernel_shape, strides and pads do not fit {k} spatial dims").into());
    }
    let mut inferred = xd[..2].to_vec();
    for i in 0..k {
        let size = (xd[2 + i] as i64 - 1) * strides[i] - (pads[i] + pads[k + i]) + kernel[i];
        inferred.push(usize::try_from(size).map_err(|_| format!("spatial dim {i} would be {size}"))?);
    }
    let total: usize = inferred.iter().product();
    let flat = Tensor::zeros(&[total], x.dtype()).to_device(ctx.device)?;
    let y = super::shape::overwrite(&flat, 0, &indices.cast(kiln::DType::I64).reshape(&[-1]), &x.reshape(&[-1]));
    let mut y = y.reshape(inferred.clone());
    if let Some(shape) = ctx.opt_values(2)? {
        if shape.len() != inferred.len() || shape.iter().zip(&inferred).any(|(&s, &i)| s < i as i64) {
            return Err(format!("output_shape {shape:?} is smaller than the unpooled {inferred:?}").into());
        }
        let pads: Vec<(usize, usize)> = shape.iter().zip(&inferred).map(|(&s, &i)| (0, s as usize - i)).collect();
        y = y.pad(&pads, 0.0);
    }
    Ok(vec![y])
}

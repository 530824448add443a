//! 2-D convolution and pooling over `[N, C, H, W]`, built from views only: the functional forms
//! (`conv1d`, `conv2d`, `conv_transpose2d`, `max_pool2d`, `avg_pool2d`, re-exported by `functional`)
//! and the layers that call them.
//!
//! Each kernel offset's window is one strided, masked view of the input (see [`pick`]): pad for
//! the border, a split `[len / s, s]` for the stride. No view needs div/mod index math when the
//! spatial dims are multiples of the stride. On top of the windows:
//! - a convolution with several input channels per group stacks the windows into im2col columns
//!   `[G, Cg * K, N * OH * OW]` (one copy kernel) and contracts them with one matmul, run as GEMM;
//!   Several filters over one input channel (a 1-to-32 convolution) take this path too: the
//!   multiply-adds are one small GEMM, where as element-wise taps they were a scalar loop;
//! - a depthwise convolution (one input channel and one filter per group) is the sum of each
//!   window times its weight: one element-wise kernel, no columns;
//! - a 1x1 convolution is a matmul on the input itself;
//! - pooling whose windows tile the input (stride = kernel, no padding) is a reshape and one
//!   reduce; overlapping max pooling reduces the stacked windows, average pooling sums them.
//!
//! The spatial dims and channels must be concrete; the batch may be symbolic.

use kiln::{Dim, Tensor};

use crate::Module;
use crate::error::{NnError, Result};
use crate::init;

/// The error tensor of layer `op` for `message`, at the line that called the layer: `x`'s own
/// error instead when `x` already carries one (the earlier error is the one to fix).
#[track_caller]
pub(crate) fn bad_input(x: &Tensor, op: &'static str, message: impl Into<String>) -> Tensor {
    if x.error().is_some() { x.clone() } else { Tensor::op_error(op, message) }
}

/// A shape for an error message: `[2, 3, n]`.
pub(crate) fn show_shape(x: &Tensor) -> String {
    let dims: Vec<String> = x.shape().iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

/// `(n, c, h, w)` of a 4-D input, `n` possibly symbolic.
fn nchw(x: &Tensor) -> Option<(Dim, usize, usize, usize)> {
    match x.shape().as_ref() {
        [n, c, h, w] => Some((*n, c.as_const()? as usize, h.as_const()? as usize, w.as_const()? as usize)),
        _ => None,
    }
}
/// The output size of a window spanning `extent` elements with `stride` over `padded` elements
/// (the window fits: `0 < extent <= padded`, `stride > 0`); with `ceil_mode` a last, partial window
/// counts too, as long as it starts inside the input or its leading padding (PyTorch's rule).
fn out_size(padded: usize, extent: usize, stride: usize, ceil_mode: bool, len_and_before: usize) -> usize {
    if !ceil_mode {
        return (padded - extent) / stride + 1;
    }
    let out = (padded - extent).div_ceil(stride) + 1;
    if (out - 1) * stride >= len_and_before { out - 1 } else { out }
}

/// `x[.., q + s * o, ..]` along `axis` for `o` in `0..out`, where positions outside
/// `0..len` read `pad_value` (PyTorch's padding).
///
/// Every step is a view that composes into one strided window with a validity mask, so the
/// kernels reading it index with affine arithmetic only: the stride is taken by splitting the axis
/// into `[len / s, s]` and keeping phase `q mod s` (the axis is padded at its end to a multiple of
/// `s` first when it is not one already; that padding is the one case that costs a div/mod), and
/// the out-of-range positions come from a pad of the axis.
fn pick(x: &Tensor, axis: usize, q: i64, s: usize, out: usize, pad_value: f64) -> Tensor {
    let len = x.shape()[axis].as_const().unwrap_or(0) as usize;
    let pad_axis = |t: &Tensor, axis: usize, before: usize, after: usize| -> Tensor {
        if before == 0 && after == 0 {
            return t.clone();
        }
        let mut pads = vec![(0, 0); t.ndim()];
        pads[axis] = (before, after);
        t.pad(&pads, pad_value)
    };
    // Rows `q..q + out` of an axis of `len` elements: the part inside `0..len`, then the padding.
    let rows = |t: &Tensor, axis: usize, len: usize, q: i64, out: usize| -> Tensor {
        let (lo, hi) = (q.clamp(0, len as i64), (q + out as i64).clamp(0, len as i64));
        if hi <= lo {
            // The whole range is padding: an empty slice padded to `out`.
            return pad_axis(&t.narrow(axis as i64, 0, 0), axis, out, 0);
        }
        let inside = t.narrow(axis as i64, lo, hi - lo);
        pad_axis(&inside, axis, (lo - q) as usize, (q + out as i64 - hi) as usize)
    };
    if s == 1 {
        return rows(x, axis, len, q, out);
    }
    let full = len.div_ceil(s) * s;
    let x = pad_axis(x, axis, 0, full - len);
    let mut split: Vec<Dim> = x.shape().to_vec();
    split[axis] = Dim::from(full / s);
    split.insert(axis + 1, Dim::from(s));
    let phase = q.rem_euclid(s as i64);
    let x = x.reshape(split).narrow(axis as i64 + 1, phase, 1).squeeze(axis as i64 + 1);
    rows(&x, axis, full / s, q.div_euclid(s as i64), out)
}

/// The `[N, C, OH, OW]` window of `x` for kernel offset `(i, j)`: element `(oh, ow)` is
/// `x[.., sh * oh + dh * i - ph, sw * ow + dw * j - pw]`, `pad_value` outside the input.
fn window(x: &Tensor, offset: (usize, usize), geometry: &Geometry, pad_value: f64) -> Tensor {
    let g = geometry;
    let q = |k: usize, d: usize, p: usize| (k * d) as i64 - p as i64;
    let rows = pick(x, 2, q(offset.0, g.dilation.0, g.padding.0), g.stride.0, g.out.0, pad_value);
    pick(&rows, 3, q(offset.1, g.dilation.1, g.padding.1), g.stride.1, g.out.1, pad_value)
}

/// How a sliding-window op is laid over its input: what [`Geometry::new`] takes.
#[derive(Clone, Copy, Debug)]
struct Window {
    kernel: (usize, usize),
    stride: (usize, usize),
    /// `(before, after)` padding of the rows and of the columns.
    padding: [(usize, usize); 2],
    dilation: (usize, usize),
    ceil_mode: bool,
}

/// The sizes of a sliding-window op applied to one input.
struct Geometry {
    n: Dim,
    c: usize,
    /// The input's `(h, w)`.
    input: (usize, usize),
    kernel: (usize, usize),
    stride: (usize, usize),
    /// The padding before the rows and before the columns (the padding after only shapes `out`).
    padding: (usize, usize),
    dilation: (usize, usize),
    out: (usize, usize),
}

impl Geometry {
    /// The geometry of a window op over `x`, or the message saying, in words, why it does not
    /// apply: `x` is not `[N, C, H, W]` with concrete `C, H, W`, the kernel is empty, or its
    /// (dilated) extent is larger than the padded input.
    fn new(x: &Tensor, w: Window) -> std::result::Result<Geometry, String> {
        let Some((n, c, h, wd)) = nchw(x) else {
            return Err(format!("input must be [N, C, H, W] with concrete C, H and W, got {}", show_shape(x)));
        };
        let (kh, kw) = w.kernel;
        if kh == 0 || kw == 0 {
            return Err(format!("kernel {kh}x{kw} is empty"));
        }
        if w.stride.0 == 0 || w.stride.1 == 0 || w.dilation.0 == 0 || w.dilation.1 == 0 {
            return Err(format!("stride {:?} and dilation {:?} must be positive", w.stride, w.dilation));
        }
        let [(pt, pb), (pl, pr)] = w.padding;
        let (hp, wp) = (h + pt + pb, wd + pl + pr);
        let (eh, ew) = (w.dilation.0 * (kh - 1) + 1, w.dilation.1 * (kw - 1) + 1);
        if eh > hp || ew > wp {
            let what = if w.dilation == (1, 1) {
                format!("kernel {kh}x{kw}")
            } else {
                format!("kernel {kh}x{kw} dilated by {:?} (extent {eh}x{ew})", w.dilation)
            };
            return Err(if hp == h && wp == wd {
                format!("{what} is larger than the input {h}x{wd}")
            } else {
                format!("{what} is larger than the padded input {hp}x{wp} (input {h}x{wd})")
            });
        }
        let out =
            (out_size(hp, eh, w.stride.0, w.ceil_mode, h + pt), out_size(wp, ew, w.stride.1, w.ceil_mode, wd + pl));
        Ok(Geometry {
            n,
            c,
            input: (h, wd),
            kernel: w.kernel,
            stride: w.stride,
            padding: (pt, pl),
            dilation: w.dilation,
            out,
        })
    }

    /// For pooling: padding may be at most half the (dilated) kernel (as PyTorch requires), or
    /// some windows would lie wholly in the padding.
    fn check_pool_padding(&self, padding: (usize, usize)) -> std::result::Result<(), String> {
        let (kh, kw) = self.kernel;
        let (eh, ew) = (self.dilation.0 * (kh - 1) + 1, self.dilation.1 * (kw - 1) + 1);
        let (ph, pw) = padding;
        if 2 * ph > eh || 2 * pw > ew {
            return Err(format!("padding ({ph}, {pw}) must be at most half the kernel {kh}x{kw}"));
        }
        Ok(())
    }

    /// Every kernel offset's window, row-major in `(i, j)`: views of one padded input (the
    /// padding, and any rows past it that a window or the stride split reaches, added once), so
    /// that the compiler sees one padded tensor read by every window and can write it once
    /// rather than evaluate the border masks in each of them.
    fn windows(&self, x: &Tensor, pad_value: f64) -> Vec<Tensor> {
        let (kh, kw) = self.kernel;
        // `(before, after)` along one axis: every window inside, the length a stride multiple.
        let reach = |out: usize, s: usize, d: usize, k: usize, p: usize, len: usize| {
            let last = s * (out - 1) + d * (k - 1) + 1;
            let padded = (p + len).max(last).div_ceil(s) * s;
            (p, padded - p - len)
        };
        let rows = reach(self.out.0, self.stride.0, self.dilation.0, kh, self.padding.0, self.input.0);
        let cols = reach(self.out.1, self.stride.1, self.dilation.1, kw, self.padding.1, self.input.1);
        let padded =
            if rows == (0, 0) && cols == (0, 0) { x.clone() } else { x.pad(&[(0, 0), (0, 0), rows, cols], pad_value) };
        let inside = Geometry {
            n: self.n,
            input: (self.input.0 + rows.0 + rows.1, self.input.1 + cols.0 + cols.1),
            padding: (0, 0),
            ..*self
        };
        (0..kh * kw).map(|k| window(&padded, (k / kw, k % kw), &inside, pad_value)).collect()
    }

    /// Whether the windows tile the input: stride = kernel, no padding, no dilation, every window
    /// inside the input. Then they are a reshape of the input: `[N, C, OH, KH, OW, KW]`.
    fn tiles(&self) -> bool {
        let (kh, kw) = self.kernel;
        self.stride == self.kernel
            && self.padding == (0, 0)
            && self.dilation == (1, 1)
            && self.out.0 * kh <= self.input.0
            && self.out.1 * kw <= self.input.1
    }

    /// The windows as `[N, C, OH, KH, OW, KW]` when they tile the input (see [`Geometry::tiles`]).
    fn tiled(&self, x: &Tensor) -> Tensor {
        let (kh, kw) = self.kernel;
        let (oh, ow) = self.out;
        x.narrow(2, 0, (oh * kh) as i64).narrow(3, 0, (ow * kw) as i64).reshape(vec![
            self.n,
            Dim::from(self.c),
            Dim::from(oh),
            Dim::from(kh),
            Dim::from(ow),
            Dim::from(kw),
        ])
    }
}

/// 2-D convolution (PyTorch's `nn.Conv2d`, cross-correlation): `weight` is
/// `[out, in / groups, kh, kw]`. `groups = in = out` is a depthwise convolution.
#[derive(Module)]
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, kh, kw]`.
    #[param]
    pub weight: Tensor,
    /// `[out_channels]`, if the layer has a bias.
    #[param]
    pub bias: Option<Tensor>,
    /// `(sh, sw)`.
    pub stride: (usize, usize),
    /// Zeros added on each side, `(ph, pw)`.
    pub padding: (usize, usize),
    /// Channel groups; `in_channels` and `out_channels` must be multiples of it.
    pub groups: usize,
}

impl Conv2d {
    /// A convolution initialised like PyTorch's (uniform in `+-1/sqrt(fan_in)`).
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        groups: usize,
        bias: bool,
    ) -> Result<Conv2d> {
        if groups == 0 || !in_channels.is_multiple_of(groups) || !out_channels.is_multiple_of(groups) {
            return Err(NnError::Config(format!(
                "in_channels {in_channels} and out_channels {out_channels} must be multiples of groups {groups}"
            )));
        }
        if kernel.0 == 0 || kernel.1 == 0 || stride.0 == 0 || stride.1 == 0 {
            return Err(NnError::Config(format!("kernel {kernel:?} and stride {stride:?} must be positive")));
        }
        let fan_in = in_channels / groups * kernel.0 * kernel.1;
        let bound = 1.0 / (fan_in as f32).sqrt();
        Ok(Conv2d {
            weight: init::uniform(&[out_channels, in_channels / groups, kernel.0, kernel.1], bound),
            bias: bias.then(|| init::uniform(&[out_channels], bound)),
            stride,
            padding,
            groups,
        })
    }
}

/// The padding of a convolution (PyTorch's `padding=`): explicit amounts on both sides, `"same"`
/// (the output as large as the input; stride 1 only; the odd element, if any, after) or
/// `"valid"` (none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding<T> {
    /// The same amount before and after.
    Explicit(T),
    /// `"same"`.
    Same,
    /// `"valid"`: no padding.
    Valid,
}

impl<T: Default> Default for Padding<T> {
    fn default() -> Padding<T> {
        Padding::Explicit(T::default())
    }
}

/// The keyword arguments of [`conv2d`], PyTorch's defaults by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// `(sh, sw)`, default `(1, 1)`.
    pub stride: (usize, usize),
    /// Default `Explicit((0, 0))`.
    pub padding: Padding<(usize, usize)>,
    /// `(dh, dw)`, default `(1, 1)`.
    pub dilation: (usize, usize),
    /// Channel groups, default 1.
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Conv2dOptions {
        Conv2dOptions { stride: (1, 1), padding: Padding::default(), dilation: (1, 1), groups: 1 }
    }
}

/// The keyword arguments of [`conv1d`], PyTorch's defaults by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dOptions {
    /// Default 1.
    pub stride: usize,
    /// Default `Explicit(0)`.
    pub padding: Padding<usize>,
    /// Default 1.
    pub dilation: usize,
    /// Channel groups, default 1.
    pub groups: usize,
}

impl Default for Conv1dOptions {
    fn default() -> Conv1dOptions {
        Conv1dOptions { stride: 1, padding: Padding::default(), dilation: 1, groups: 1 }
    }
}

/// `F.conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)` over
/// `[N, C, H, W]` (cross-correlation): `weight` is `[out, C / groups, kh, kw]`, `bias` `[out]`.
/// One channel and one filter per group (depthwise) is one fused element-wise kernel; a 1x1
/// kernel with stride 1 and no padding a batched matmul on the input; everything else im2col and
/// one GEMM (see the module docs).
#[track_caller]
pub fn conv2d(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, options: Conv2dOptions) -> Tensor {
    let [o, cg, kh, kw] = match weight.dims().as_deref() {
        Ok(&[o, cg, kh, kw]) => [o, cg, kh, kw],
        _ => {
            let message = format!("weight must be [out, in / groups, kh, kw], got {}", show_shape(weight));
            return bad_input(weight, "conv2d", message);
        }
    };
    let Conv2dOptions { stride, padding, dilation, groups: g } = options;
    let padding = match padding {
        Padding::Explicit((ph, pw)) => [(ph, ph), (pw, pw)],
        Padding::Valid => [(0, 0), (0, 0)],
        Padding::Same if stride != (1, 1) => {
            return bad_input(input, "conv2d", format!("padding \"same\" needs stride 1, got {stride:?}"));
        }
        Padding::Same => {
            let same = |k: usize, d: usize| (d * (k.max(1) - 1) / 2, d * (k.max(1) - 1) - d * (k.max(1) - 1) / 2);
            [same(kh, dilation.0), same(kw, dilation.1)]
        }
    };
    let geo = match Geometry::new(input, Window { kernel: (kh, kw), stride, padding, dilation, ceil_mode: false }) {
        Ok(geo) => geo,
        Err(message) => return bad_input(input, "conv2d", message),
    };
    if g == 0 || geo.c != cg * g || o % g != 0 {
        let message = format!(
            "input {} has {} channels, but weight {} with groups {g} takes {} (and needs out channels \
             divisible by groups)",
            show_shape(input),
            geo.c,
            show_shape(weight),
            cg * g
        );
        return bad_input(input, "conv2d", message);
    }
    if let Some(b) = bias
        && b.dims().as_deref() != Ok(&[o][..])
    {
        return bad_input(b, "conv2d", format!("bias must be [{o}], got {}", show_shape(b)));
    }
    if cg == 1 && o == g {
        let y = depthwise(input, weight, &geo);
        return match bias {
            Some(b) => y.add(b.reshape(&[o, 1, 1])),
            None => y,
        };
    }
    if (kh, kw) == (1, 1) && geo.stride == (1, 1) && padding == [(0, 0), (0, 0)] {
        return pointwise(input, weight, bias, g, &geo);
    }
    im2col(input, weight, bias, g, &geo)
}

/// `F.conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)` over
/// `[N, C, L]`: [`conv2d`] on `[N, C, 1, L]` with `weight` `[out, C / groups, k]`.
#[track_caller]
pub fn conv1d(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, options: Conv1dOptions) -> Tensor {
    if input.ndim() != 3 || weight.ndim() != 3 {
        let message = format!(
            "input must be [N, C, L] and weight [out, in / groups, k], got {} and {}",
            show_shape(input),
            show_shape(weight)
        );
        return bad_input(if input.error().is_some() { input } else { weight }, "conv1d", message);
    }
    let padding = match options.padding {
        Padding::Explicit(p) => Padding::Explicit((0, p)),
        Padding::Same => Padding::Same,
        Padding::Valid => Padding::Valid,
    };
    let options2 =
        Conv2dOptions { stride: (1, options.stride), padding, dilation: (1, options.dilation), groups: options.groups };
    let y = conv2d(&input.unsqueeze(2), &weight.unsqueeze(2), bias, options2);
    if y.error().is_some() { y } else { y.squeeze(2) }
}

/// The keyword arguments of [`conv_transpose2d`], PyTorch's defaults by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dOptions {
    /// `(sh, sw)`, default `(1, 1)`.
    pub stride: (usize, usize),
    /// Removed from both sides of the output, `(ph, pw)`, default `(0, 0)`.
    pub padding: (usize, usize),
    /// Added to one side of the output (smaller than the stride or the dilation), default `(0, 0)`.
    pub output_padding: (usize, usize),
    /// Channel groups, default 1.
    pub groups: usize,
    /// `(dh, dw)`, default `(1, 1)`.
    pub dilation: (usize, usize),
}

impl Default for ConvTranspose2dOptions {
    fn default() -> ConvTranspose2dOptions {
        ConvTranspose2dOptions { stride: (1, 1), padding: (0, 0), output_padding: (0, 0), groups: 1, dilation: (1, 1) }
    }
}

/// `F.conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0,
/// groups=1, dilation=1)` over `[N, C, H, W]`, `weight` `[C, out / groups, kh, kw]`: the gradient
/// of [`conv2d`] with respect to its input. Computed as that gradient is defined: the input
/// spread out by the stride (zeros between its elements, a pad of a reshape: views), padded by
/// `dilation * (k - 1) - padding` on each side (`output_padding` more after; a negative amount
/// crops), and convolved at stride 1 with the kernel flipped and its channel axes swapped.
/// Output size `(H - 1) * sh - 2 * ph + dh * (kh - 1) + output_padding + 1`.
#[track_caller]
pub fn conv_transpose2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: ConvTranspose2dOptions,
) -> Tensor {
    let op = "conv_transpose2d";
    let [ci, og, kh, kw] = match weight.dims().as_deref() {
        Ok(&[ci, og, kh, kw]) => [ci, og, kh, kw],
        _ => {
            let message = format!("weight must be [in, out / groups, kh, kw], got {}", show_shape(weight));
            return bad_input(weight, op, message);
        }
    };
    let ConvTranspose2dOptions { stride: (sh, sw), padding: (ph, pw), output_padding: (oph, opw), groups: g, dilation } =
        options;
    let Some((_, c, h, w)) = nchw(input) else {
        let message = format!("input must be [N, C, H, W] with concrete C, H and W, got {}", show_shape(input));
        return bad_input(input, op, message);
    };
    if g == 0 || c != ci || ci % g != 0 {
        let message = format!(
            "input {} has {c} channels, weight {} with groups {g} takes {ci}",
            show_shape(input),
            show_shape(weight)
        );
        return bad_input(input, op, message);
    }
    if sh == 0 || sw == 0 || dilation.0 == 0 || dilation.1 == 0 || kh == 0 || kw == 0 {
        let message = format!("kernel {kh}x{kw}, stride ({sh}, {sw}) and dilation {dilation:?} must be positive");
        return bad_input(input, op, message);
    }
    if oph >= sh.max(dilation.0) || opw >= sw.max(dilation.1) {
        let message = format!(
            "output_padding ({oph}, {opw}) must be smaller than the stride ({sh}, {sw}) or the dilation {dilation:?}"
        );
        return bad_input(input, op, message);
    }
    let (eh, ew) = (dilation.0 * (kh - 1), dilation.1 * (kw - 1));
    let (out_h, out_w) = ((h - 1) * sh + eh + oph + 1, (w - 1) * sw + ew + opw + 1);
    if out_h <= 2 * ph || out_w <= 2 * pw || h == 0 || w == 0 {
        let message = format!("padding ({ph}, {pw}) leaves no output of {out_h}x{out_w}");
        return bad_input(input, op, message);
    }
    // Zeros between the elements: [N, C, H, 1, W, 1] padded to [N, C, H, sh, W, sw], reshaped,
    // and cut after the last element.
    let n = input.shape()[0];
    let spread = input
        .reshape(vec![n, Dim::from(c), Dim::from(h), Dim::from(1), Dim::from(w), Dim::from(1)])
        .pad(&[(0, 0), (0, 0), (0, 0), (0, sh - 1), (0, 0), (0, sw - 1)], 0.0)
        .reshape(vec![n, Dim::from(c), Dim::from(h * sh), Dim::from(w * sw)])
        .narrow(2, 0, ((h - 1) * sh + 1) as i64)
        .narrow(3, 0, ((w - 1) * sw + 1) as i64);
    let amount = |e: usize, p: usize| e as i64 - p as i64;
    let (bh, bw) = (amount(eh, ph), amount(ew, pw));
    let padded = crate::functional::pad(
        &spread,
        &[bw, bw + opw as i64, bh, bh + oph as i64],
        crate::functional::PadMode::Constant,
        0.0,
    );
    // [C, O/g, kh, kw] -> [O, C/g, kh, kw], flipped in both spatial axes.
    let flip = |k: usize| Tensor::from_vec_on((0..k as i64).rev().collect::<Vec<i64>>(), &[k], weight.device());
    let kernel = weight
        .reshape(&[g, ci / g, og, kh, kw])
        .permute(&[0, 2, 1, 3, 4])
        .reshape(&[g * og, ci / g, kh, kw])
        .index_select(2, &flip(kh))
        .index_select(3, &flip(kw));
    let options = Conv2dOptions { stride: (1, 1), padding: Padding::Valid, dilation, groups: g };
    conv2d(&padded, &kernel, bias, options)
}

/// One channel and one filter per group (depthwise): the sum over kernel offsets of each
/// offset's window times its weight, one fused element-wise kernel.
#[track_caller]
fn depthwise(x: &Tensor, weight: &Tensor, geo: &Geometry) -> Tensor {
    let o = weight.shape()[0].as_const().unwrap_or(0) as usize;
    let (kh, kw) = geo.kernel;
    let weight = weight.reshape(&[o, kh * kw]);
    let mut acc: Option<Tensor> = None;
    for (k, win) in geo.windows(x, 0.0).into_iter().enumerate() {
        let term = win.mul(weight.narrow(1, k as i64, 1).reshape(&[o, 1, 1]));
        acc = Some(match acc {
            Some(a) => a.add(term),
            None => term,
        });
    }
    acc.expect("Geometry::new rejects empty kernels")
}

/// A 1x1 convolution with stride 1 and no padding: a batched matmul on the input as it is,
/// `[G, Og, Cg] @ [N, G, Cg, H * W]`.
#[track_caller]
fn pointwise(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, g: usize, geo: &Geometry) -> Tensor {
    let o = weight.shape()[0].as_const().unwrap_or(0) as usize;
    let cg = geo.c / g;
    let (oh, ow) = geo.out;
    let cols = x.reshape(vec![geo.n, Dim::from(g), Dim::from(cg), Dim::from(oh * ow)]);
    let y = weight.reshape(&[g, o / g, cg]).matmul(&cols);
    let y = match bias {
        Some(b) => y.add(b.reshape(&[g, o / g, 1])),
        None => y,
    };
    y.reshape(vec![geo.n, Dim::from(o), Dim::from(oh), Dim::from(ow)])
}

/// im2col: the windows stacked into columns `[G, Cg * KH * KW, N * OH * OW]` (one copy kernel,
/// whose every load is affine with a mask) and one matmul `[G, Og, Cg * K] @ columns`, which
/// the compiler runs as GEMM. The batch sits in the matmul's N dim, so the weight gradient is
/// a plain GEMM too.
#[track_caller]
fn im2col(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, g: usize, geo: &Geometry) -> Tensor {
    let o = weight.shape()[0].as_const().unwrap_or(0) as usize;
    let cg = geo.c / g;
    let (oh, ow) = geo.out;
    let k = geo.kernel.0 * geo.kernel.1;
    // Each window as [C, 1, N, OH, OW], stacked on axis 1: [C, K, N, OH, OW].
    let wins: Vec<Tensor> = geo.windows(x, 0.0).iter().map(|w| w.permute(&[1, 0, 2, 3]).unsqueeze(1)).collect();
    let cols = if k == 1 {
        wins[0].clone()
    } else {
        let refs: Vec<&Tensor> = wins.iter().collect();
        Tensor::cat(&refs, 1)
    };
    let np = geo.n * Dim::from(oh * ow);
    let cols = cols.reshape(vec![Dim::from(g), Dim::from(cg * k), np]);
    let y = weight.reshape(&[g, o / g, cg * k]).matmul(&cols);
    let y = match bias {
        Some(b) => y.add(b.reshape(&[g, o / g, 1])),
        None => y,
    };
    y.reshape(vec![Dim::from(o), geo.n, Dim::from(oh), Dim::from(ow)]).permute(&[1, 0, 2, 3])
}

impl Module for Conv2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        let options = Conv2dOptions {
            stride: self.stride,
            padding: Padding::Explicit(self.padding),
            dilation: (1, 1),
            groups: self.groups,
        };
        conv2d(x, &self.weight, self.bias.as_ref(), options)
    }
}

/// The geometry of the pooling op `op` over `x`, or its error tensor.
#[track_caller]
fn pool_geometry(op: &'static str, x: &Tensor, window: Window) -> std::result::Result<Geometry, Tensor> {
    let [(ph, _), (pw, _)] = window.padding;
    // A `match`, not `map_err`: a closure would lose the caller's line.
    match Geometry::new(x, window).and_then(|geo| geo.check_pool_padding((ph, pw)).map(|()| geo)) {
        Ok(geo) => Ok(geo),
        Err(message) => Err(bad_input(x, op, message)),
    }
}

/// The keyword arguments of [`max_pool2d`], PyTorch's defaults by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaxPool2dOptions {
    /// `(sh, sw)`; `None` (the default) is the kernel size.
    pub stride: Option<(usize, usize)>,
    /// `-inf` added on both sides, `(ph, pw)`: at most half the (dilated) kernel.
    pub padding: (usize, usize),
    /// `(dh, dw)`; `None` (the default) is `(1, 1)`.
    pub dilation: Option<(usize, usize)>,
    /// Counts a last, partial window (PyTorch's `ceil_mode`).
    pub ceil_mode: bool,
}

/// The keyword arguments of [`avg_pool2d`], PyTorch's defaults by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2dOptions {
    /// `(sh, sw)`; `None` (the default) is the kernel size.
    pub stride: Option<(usize, usize)>,
    /// Zeros added on both sides, `(ph, pw)`: at most half the kernel.
    pub padding: (usize, usize),
    /// Counts a last, partial window (PyTorch's `ceil_mode`).
    pub ceil_mode: bool,
    /// Whether the padding counts in each window's divisor (default `true`).
    pub count_include_pad: bool,
    /// Divides every window's sum by this instead.
    pub divisor_override: Option<usize>,
}

impl Default for AvgPool2dOptions {
    fn default() -> AvgPool2dOptions {
        AvgPool2dOptions {
            stride: None,
            padding: (0, 0),
            ceil_mode: false,
            count_include_pad: true,
            divisor_override: None,
        }
    }
}

/// `F.max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False)` over
/// `[N, C, H, W]`. As in PyTorch, each window sends its whole gradient to one position: its first
/// maximum in row-major window order (NaN counts as the maximum), see [`Tensor::max_dim`].
/// Routing the gradient to one element costs two extra reduces; inside `kiln::no_grad`
/// (inference, `predict`) there is no gradient to route, and the same values come from one
/// reduce-max.
#[track_caller]
pub fn max_pool2d(input: &Tensor, kernel_size: (usize, usize), options: MaxPool2dOptions) -> Tensor {
    let (ph, pw) = options.padding;
    let window = Window {
        kernel: kernel_size,
        stride: options.stride.unwrap_or(kernel_size),
        padding: [(ph, ph), (pw, pw)],
        dilation: options.dilation.unwrap_or((1, 1)),
        ceil_mode: options.ceil_mode,
    };
    let geo = match pool_geometry("max_pool2d", input, window) {
        Ok(geo) => geo,
        Err(e) => return e,
    };
    let one_winner = kiln::is_grad_enabled();
    if geo.tiles() {
        let tiled = geo.tiled(input);
        if !one_winner {
            return tiled.max(&[3, 5]);
        }
        // [N, C, OH, KH, OW, KW] -> [N, C, OH, OW, KH * KW], window positions row-major.
        let (kh, kw) = kernel_size;
        let (oh, ow) = geo.out;
        let windows = tiled.permute(&[0, 1, 2, 4, 3, 5]).reshape(vec![
            geo.n,
            Dim::from(geo.c),
            Dim::from(oh),
            Dim::from(ow),
            Dim::from(kh * kw),
        ]);
        return windows.max_dim(4).0;
    }
    // Overlapping windows: stacked on a new axis and reduced, so the backward pass is one
    // reduce-max gradient rather than a chain of pairwise ones.
    let wins: Vec<Tensor> = geo.windows(input, f64::NEG_INFINITY);
    if wins.len() == 1 {
        return wins[0].clone();
    }
    let refs: Vec<&Tensor> = wins.iter().collect();
    let stacked = Tensor::stack(&refs, 2);
    if one_winner { stacked.max_dim(2).0 } else { stacked.max(2) }
}

/// `F.avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
/// count_include_pad=True, divisor_override=None)` over `[N, C, H, W]`: each window's sum over its
/// divisor, which counts the window's elements inside the padded input (or, without
/// `count_include_pad`, inside the input itself), unless `divisor_override` is given.
#[track_caller]
pub fn avg_pool2d(input: &Tensor, kernel_size: (usize, usize), options: AvgPool2dOptions) -> Tensor {
    let (ph, pw) = options.padding;
    let window = Window {
        kernel: kernel_size,
        stride: options.stride.unwrap_or(kernel_size),
        padding: [(ph, ph), (pw, pw)],
        dilation: (1, 1),
        ceil_mode: options.ceil_mode,
    };
    let geo = match pool_geometry("avg_pool2d", input, window) {
        Ok(geo) => geo,
        Err(e) => return e,
    };
    if options.divisor_override == Some(0) {
        return bad_input(input, "avg_pool2d", "divisor_override must be positive");
    }
    if geo.tiles() && options.divisor_override.is_none() {
        // Every window lies inside the input: the divisor is the kernel's size.
        return geo.tiled(input).mean(&[3, 5]);
    }
    // The sum scaled by the divisor's reciprocal, as `mean` does (one reduce with an epilogue
    // when the windows tile the input).
    let sum = if geo.tiles() {
        geo.tiled(input).sum(&[3, 5])
    } else {
        let wins = geo.windows(input, 0.0);
        wins.iter().skip(1).fold(wins[0].clone(), |acc, w| acc.add(w))
    };
    if let Some(d) = options.divisor_override {
        return sum.mul(1.0 / d as f64);
    }
    // The divisor of each output row (and column): how many of its window's positions count.
    let counts = |axis: usize| -> Vec<usize> {
        let (len, k, s, p, out) = [
            (geo.input.0, geo.kernel.0, geo.stride.0, ph, geo.out.0),
            (geo.input.1, geo.kernel.1, geo.stride.1, pw, geo.out.1),
        ][axis];
        (0..out)
            .map(|o| {
                let start = (o * s) as i64 - p as i64;
                let end = (start + k as i64).min((len + p) as i64);
                if options.count_include_pad {
                    (end - start) as usize
                } else {
                    (end.min(len as i64) - start.max(0)) as usize
                }
            })
            .collect()
    };
    let (rows, cols) = (counts(0), counts(1));
    if rows.iter().all(|&r| r == rows[0]) && cols.iter().all(|&c| c == cols[0]) {
        return sum.mul(1.0 / (rows[0] * cols[0]) as f64);
    }
    let scale: Vec<f32> = rows.iter().flat_map(|&r| cols.iter().map(move |&c| 1.0 / (r * c) as f32)).collect();
    let scale = Tensor::from_vec_on(scale, &[geo.out.0, geo.out.1], input.device()).cast(input.dtype());
    sum.mul(scale)
}

/// Max pooling over `kernel` windows (PyTorch's `nn.MaxPool2d`; padding is `-inf`). As in
/// PyTorch, each window sends its whole gradient to one position: its first maximum in row-major
/// window order (NaN counts as the maximum), see [`Tensor::max_dim`]. Routing the gradient
/// to one element costs two extra reduces; inside `kiln::no_grad` (inference, `predict`) there is
/// no gradient to route, and the same values come from one reduce-max.
#[derive(Clone, Copy, Debug, Module)]
pub struct MaxPool2d {
    /// `(kh, kw)`.
    pub kernel: (usize, usize),
    /// `(sh, sw)`.
    pub stride: (usize, usize),
    /// `(ph, pw)`.
    pub padding: (usize, usize),
}

impl MaxPool2d {
    /// Pooling with `stride = kernel` and no padding (PyTorch's default).
    pub fn new(kernel: (usize, usize)) -> MaxPool2d {
        MaxPool2d { kernel, stride: kernel, padding: (0, 0) }
    }
}

impl Module for MaxPool2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        let options = MaxPool2dOptions { stride: Some(self.stride), padding: self.padding, ..Default::default() };
        max_pool2d(x, self.kernel, options)
    }
}

/// Average pooling over `kernel` windows, zero padding counted (PyTorch's `nn.AvgPool2d` with
/// `count_include_pad=True`).
#[derive(Clone, Copy, Debug, Module)]
pub struct AvgPool2d {
    /// `(kh, kw)`.
    pub kernel: (usize, usize),
    /// `(sh, sw)`.
    pub stride: (usize, usize),
    /// `(ph, pw)`.
    pub padding: (usize, usize),
}

impl AvgPool2d {
    /// Pooling with `stride = kernel` and no padding (PyTorch's default).
    pub fn new(kernel: (usize, usize)) -> AvgPool2d {
        AvgPool2d { kernel, stride: kernel, padding: (0, 0) }
    }
}

impl Module for AvgPool2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        let options = AvgPool2dOptions { stride: Some(self.stride), padding: self.padding, ..Default::default() };
        avg_pool2d(x, self.kernel, options)
    }
}

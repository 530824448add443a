//! 2-D convolution and pooling over `[N, C, H, W]`, built from views only.
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
        [n, c, h, w] => Some((n.clone(), c.as_const()? as usize, h.as_const()? as usize, w.as_const()? as usize)),
        _ => None,
    }
}

/// The output size of a window of `kernel` elements with `stride` over `padded` elements (the
/// window fits: `0 < kernel <= padded`, `stride > 0`).
fn out_size(padded: usize, kernel: usize, stride: usize) -> usize {
    (padded - kernel) / stride + 1
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
/// `x[.., sh * oh + i - ph, sw * ow + j - pw]`, `pad_value` outside the input.
fn window(x: &Tensor, offset: (usize, usize), geometry: &Geometry, pad_value: f64) -> Tensor {
    let g = geometry;
    let rows = pick(x, 2, offset.0 as i64 - g.padding.0 as i64, g.stride.0, g.out.0, pad_value);
    pick(&rows, 3, offset.1 as i64 - g.padding.1 as i64, g.stride.1, g.out.1, pad_value)
}

/// The sizes of a sliding-window layer applied to one input.
struct Geometry {
    n: Dim,
    c: usize,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
    out: (usize, usize),
}

impl Geometry {
    /// The geometry of a window layer over `x`, or the message saying, in words, why it does not
    /// apply: `x` is not `[N, C, H, W]` with concrete `C, H, W`, the kernel is empty, or it is
    /// larger than the padded input.
    fn new(
        x: &Tensor,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> std::result::Result<Geometry, String> {
        let Some((n, c, h, w)) = nchw(x) else {
            return Err(format!("input must be [N, C, H, W] with concrete C, H and W, got {}", show_shape(x)));
        };
        let (kh, kw) = kernel;
        if kh == 0 || kw == 0 {
            return Err(format!("kernel {kh}x{kw} is empty"));
        }
        let (hp, wp) = (h + 2 * padding.0, w + 2 * padding.1);
        if kh > hp || kw > wp {
            return Err(if padding == (0, 0) {
                format!("kernel {kh}x{kw} is larger than the input {h}x{w}")
            } else {
                format!("kernel {kh}x{kw} is larger than the padded input {hp}x{wp} (input {h}x{w})")
            });
        }
        let stride = (stride.0.max(1), stride.1.max(1));
        let out = (out_size(hp, kh, stride.0), out_size(wp, kw, stride.1));
        Ok(Geometry { n, c, kernel, stride, padding, out })
    }

    /// For pooling: padding may be at most half the kernel (as PyTorch requires), or some windows
    /// would lie wholly in the padding.
    fn check_pool_padding(&self) -> std::result::Result<(), String> {
        let (kh, kw) = self.kernel;
        let (ph, pw) = self.padding;
        if 2 * ph > kh || 2 * pw > kw {
            return Err(format!("padding ({ph}, {pw}) must be at most half the kernel {kh}x{kw}"));
        }
        Ok(())
    }

    /// Every kernel offset's window, row-major in `(i, j)`.
    fn windows(&self, x: &Tensor, pad_value: f64) -> Vec<Tensor> {
        let (kh, kw) = self.kernel;
        (0..kh * kw).map(|k| window(x, (k / kw, k % kw), self, pad_value)).collect()
    }

    /// Whether the windows tile the input exactly: stride = kernel, no padding. Then they are a
    /// reshape of the input: `[N, C, OH, KH, OW, KW]`.
    fn tiles(&self) -> bool {
        self.stride == self.kernel && self.padding == (0, 0)
    }

    /// The windows as `[N, C, OH, KH, OW, KW]` when they tile the input (see [`Geometry::tiles`]).
    fn tiled(&self, x: &Tensor) -> Tensor {
        let (kh, kw) = self.kernel;
        let (oh, ow) = self.out;
        x.narrow(2, 0, (oh * kh) as i64).narrow(3, 0, (ow * kw) as i64).reshape(vec![
            self.n.clone(),
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

impl Conv2d {
    /// One channel and one filter per group (depthwise): the sum over kernel offsets of each
    /// offset's window times its weight, one fused element-wise kernel.
    #[track_caller]
    fn depthwise(&self, x: &Tensor, geo: &Geometry) -> Tensor {
        let o = self.weight.shape()[0].as_const().unwrap_or(0) as usize;
        let (kh, kw) = geo.kernel;
        let weight = self.weight.reshape(&[o, kh * kw]);
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
    fn pointwise(&self, x: &Tensor, geo: &Geometry) -> Tensor {
        let o = self.weight.shape()[0].as_const().unwrap_or(0) as usize;
        let (g, cg) = (self.groups, geo.c / self.groups);
        let (oh, ow) = geo.out;
        let cols = x.reshape(vec![geo.n.clone(), Dim::from(g), Dim::from(cg), Dim::from(oh * ow)]);
        let y = self.weight.reshape(&[g, o / g, cg]).matmul(&cols);
        let y = match &self.bias {
            Some(b) => y.add(b.reshape(&[g, o / g, 1])),
            None => y,
        };
        y.reshape(vec![geo.n.clone(), Dim::from(o), Dim::from(oh), Dim::from(ow)])
    }

    /// im2col: the windows stacked into columns `[G, Cg * KH * KW, N * OH * OW]` (one copy kernel,
    /// whose every load is affine with a mask) and one matmul `[G, Og, Cg * K] @ columns`, which
    /// the compiler runs as GEMM. The batch sits in the matmul's N dim, so the weight gradient is
    /// a plain GEMM too.
    #[track_caller]
    fn im2col(&self, x: &Tensor, geo: &Geometry) -> Tensor {
        let o = self.weight.shape()[0].as_const().unwrap_or(0) as usize;
        let (g, cg) = (self.groups, geo.c / self.groups);
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
        let np = &geo.n * &Dim::from(oh * ow);
        let cols = cols.reshape(vec![Dim::from(g), Dim::from(cg * k), np]);
        let y = self.weight.reshape(&[g, o / g, cg * k]).matmul(&cols);
        let y = match &self.bias {
            Some(b) => y.add(b.reshape(&[g, o / g, 1])),
            None => y,
        };
        y.reshape(vec![Dim::from(o), geo.n.clone(), Dim::from(oh), Dim::from(ow)]).permute(&[1, 0, 2, 3])
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Tensor {
        let [o, cg, kh, kw] = match self.weight.dims().as_deref() {
            Ok(&[o, cg, kh, kw]) => [o, cg, kh, kw],
            _ => {
                let message = format!("weight must be [out, in / groups, kh, kw], got {}", show_shape(&self.weight));
                return bad_input(&self.weight, "conv2d", message);
            }
        };
        let g = self.groups;
        let geo = match Geometry::new(x, (kh, kw), self.stride, self.padding) {
            Ok(geo) => geo,
            Err(message) => return bad_input(x, "conv2d", message),
        };
        if g == 0 || geo.c != cg * g || o % g != 0 {
            let message = format!(
                "input {} has {} channels, but weight {} with groups {g} takes {} (and needs out channels \
                 divisible by groups)",
                show_shape(x),
                geo.c,
                show_shape(&self.weight),
                cg * g
            );
            return bad_input(x, "conv2d", message);
        }
        if let Some(b) = &self.bias
            && b.dims().as_deref() != Ok(&[o][..])
        {
            return bad_input(b, "conv2d", format!("bias must be [{o}], got {}", show_shape(b)));
        }
        if cg == 1 && o == g {
            let y = self.depthwise(x, &geo);
            return match &self.bias {
                Some(b) => y.add(b.reshape(&[o, 1, 1])),
                None => y,
            };
        }
        if (kh, kw) == (1, 1) && geo.stride == (1, 1) && geo.padding == (0, 0) {
            return self.pointwise(x, &geo);
        }
        self.im2col(x, &geo)
    }
}

/// The geometry of the pooling layer `op` over `x`, or its error tensor.
#[track_caller]
fn pool_geometry(
    op: &'static str,
    x: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> std::result::Result<Geometry, Tensor> {
    // A `match`, not `map_err`: a closure would lose the caller's line.
    match Geometry::new(x, kernel, stride, padding).and_then(|geo| geo.check_pool_padding().map(|()| geo)) {
        Ok(geo) => Ok(geo),
        Err(message) => Err(bad_input(x, op, message)),
    }
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
    fn forward(&self, x: &Tensor) -> Tensor {
        let geo = match pool_geometry("max_pool2d", x, self.kernel, self.stride, self.padding) {
            Ok(geo) => geo,
            Err(e) => return e,
        };
        let one_winner = kiln::is_grad_enabled();
        if geo.tiles() {
            if !one_winner {
                return geo.tiled(x).max(&[3, 5], false);
            }
            // [N, C, OH, KH, OW, KW] -> [N, C, OH, OW, KH * KW], window positions row-major.
            let (kh, kw) = self.kernel;
            let (oh, ow) = geo.out;
            let windows = geo.tiled(x).permute(&[0, 1, 2, 4, 3, 5]).reshape(vec![
                geo.n.clone(),
                Dim::from(geo.c),
                Dim::from(oh),
                Dim::from(ow),
                Dim::from(kh * kw),
            ]);
            return windows.max_dim(4, false).0;
        }
        // Overlapping windows: stacked on a new axis and reduced, so the backward pass is one
        // reduce-max gradient rather than a chain of pairwise ones.
        let wins: Vec<Tensor> = geo.windows(x, f64::NEG_INFINITY);
        if wins.len() == 1 {
            return wins[0].clone();
        }
        let refs: Vec<&Tensor> = wins.iter().collect();
        let stacked = Tensor::stack(&refs, 2);
        if one_winner { stacked.max_dim(2, false).0 } else { stacked.max(2, false) }
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
    fn forward(&self, x: &Tensor) -> Tensor {
        let geo = match pool_geometry("avg_pool2d", x, self.kernel, self.stride, self.padding) {
            Ok(geo) => geo,
            Err(e) => return e,
        };
        if geo.tiles() {
            return geo.tiled(x).mean(&[3, 5], false);
        }
        let wins = geo.windows(x, 0.0);
        let k = wins.len() as f64;
        wins.iter().skip(1).fold(wins[0].clone(), |acc, w| acc.add(w)).div(k)
    }
}

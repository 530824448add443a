//! 2-D convolution and pooling over `[N, C, H, W]`, built from views: pad, strided windows taken
//! with `narrow` + reshape (a stride `s` window is `narrow(s * out)`, reshaped to `[out, s]`, of
//! which index 0 is kept), stacked into columns and contracted with one matmul (im2col).
//!
//! The spatial dims and channels must be concrete; the batch may be symbolic.

use kiln::{Dim, Tensor};

use crate::error::{NnError, Result};
use crate::init;
use crate::module::{Module, ParamKind};

/// An error tensor for an input that is not `[N, C, H, W]` with concrete `C`, `H`, `W`: a reshape
/// to a shape named after what was expected, whose error message shows the input's shape.
pub(crate) fn bad_input(x: &Tensor, expected: &str) -> Tensor {
    x.reshape(vec![Dim::sym(expected)])
}

/// `(n, c, h, w)` of a 4-D input, `n` possibly symbolic.
fn nchw(x: &Tensor) -> Option<(Dim, usize, usize, usize)> {
    match x.shape().as_ref() {
        [n, c, h, w] => Some((n.clone(), c.as_const()? as usize, h.as_const()? as usize, w.as_const()? as usize)),
        _ => None,
    }
}

/// The `[N, C, OH, OW]` windows of `x` for each kernel offset `(i, j)`, row-major in `(i, j)`,
/// after padding with `pad_value`; `None` if the kernel does not fit.
fn windows(
    x: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
    pad_value: f64,
) -> Option<(Vec<Tensor>, usize, usize)> {
    let (n, c, h, w) = nchw(x)?;
    let (kh, kw) = kernel;
    let (sh, sw) = (stride.0.max(1), stride.1.max(1));
    let (hp, wp) = (h + 2 * padding.0, w + 2 * padding.1);
    if kh == 0 || kw == 0 || kh > hp || kw > wp {
        return None;
    }
    let (oh, ow) = ((hp - kh) / sh + 1, (wp - kw) / sw + 1);
    // Extra zeros at the end so every strided window of length `s * out` fits.
    let extra_h = (kh - 1 + sh * oh).saturating_sub(hp);
    let extra_w = (kw - 1 + sw * ow).saturating_sub(wp);
    let padded = if padding == (0, 0) && extra_h == 0 && extra_w == 0 {
        x.clone()
    } else {
        x.pad(&[(0, 0), (0, 0), (padding.0, padding.0 + extra_h), (padding.1, padding.1 + extra_w)], pad_value)
    };
    let mut out = Vec::with_capacity(kh * kw);
    for i in 0..kh {
        for j in 0..kw {
            let win = padded.narrow(2, i as i64, (sh * oh) as i64).narrow(3, j as i64, (sw * ow) as i64);
            let win = if sh == 1 && sw == 1 {
                win
            } else {
                let split = vec![n.clone(), Dim::from(c), Dim::from(oh), Dim::from(sh), Dim::from(ow), Dim::from(sw)];
                win.reshape(split).narrow(3, 0, 1).narrow(5, 0, 1).reshape(vec![
                    n.clone(),
                    Dim::from(c),
                    Dim::from(oh),
                    Dim::from(ow),
                ])
            };
            out.push(win);
        }
    }
    Some((out, oh, ow))
}

/// 2-D convolution (PyTorch's `nn.Conv2d`, cross-correlation): `weight` is
/// `[out, in / groups, kh, kw]`. `groups = in = out` is a depthwise convolution.
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, kh, kw]`.
    pub weight: Tensor,
    /// `[out_channels]`, if the layer has a bias.
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

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Tensor {
        let [o, cg, kh, kw] = match self.weight.dims().as_deref() {
            Ok(&[o, cg, kh, kw]) => [o, cg, kh, kw],
            _ => return bad_input(&self.weight, "conv2d_weight_O_Cg_KH_KW"),
        };
        let g = self.groups;
        let Some((n, c, _, _)) = nchw(x) else { return bad_input(x, "conv2d_input_N_C_H_W") };
        if c != cg * g {
            return bad_input(x, "conv2d_input_channels_mismatch");
        }
        let Some((wins, oh, ow)) = windows(x, (kh, kw), self.stride, self.padding, 0.0) else {
            return bad_input(x, "conv2d_kernel_larger_than_input");
        };
        let k = kh * kw;
        let refs: Vec<&Tensor> = wins.iter().collect();
        let cols = if k == 1 { wins[0].clone() } else { Tensor::stack(&refs, 2) };
        // cols: [N, C, K, OH, OW] -> [N, G, Cg * K, OH * OW]; weight -> [G, Og, Cg * K].
        let cols = cols.reshape(vec![n.clone(), Dim::from(g), Dim::from(cg * k), Dim::from(oh * ow)]);
        let w = self.weight.reshape(&[g, o / g, cg * k]);
        let y = w.matmul(&cols).reshape(vec![n, Dim::from(o), Dim::from(oh), Dim::from(ow)]);
        match &self.bias {
            Some(b) => y.add(b.reshape(&[o, 1, 1])),
            None => y,
        }
    }

    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        f("weight", &self.weight, ParamKind::Weight);
        if let Some(b) = &self.bias {
            f("bias", b, ParamKind::Weight);
        }
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        f("weight", &mut self.weight, ParamKind::Weight);
        if let Some(b) = &mut self.bias {
            f("bias", b, ParamKind::Weight);
        }
    }
}

/// Max pooling over `kernel` windows (PyTorch's `nn.MaxPool2d`; padding is `-inf`). Ties split
/// the gradient evenly (PyTorch gives it to one position).
#[derive(Clone, Copy, Debug)]
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
        match windows(x, self.kernel, self.stride, self.padding, f64::NEG_INFINITY) {
            Some((wins, _, _)) => wins.iter().skip(1).fold(wins[0].clone(), |acc, w| acc.maximum(w)),
            None => bad_input(x, "maxpool2d_input_N_C_H_W_at_least_kernel"),
        }
    }

    fn visit(&self, _f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {}

    fn visit_mut(&mut self, _f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {}
}

/// Average pooling over `kernel` windows, zero padding counted (PyTorch's `nn.AvgPool2d` with
/// `count_include_pad=True`).
#[derive(Clone, Copy, Debug)]
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
        match windows(x, self.kernel, self.stride, self.padding, 0.0) {
            Some((wins, _, _)) => {
                let k = wins.len() as f64;
                wins.iter().skip(1).fold(wins[0].clone(), |acc, w| acc.add(w)).div(k)
            }
            None => bad_input(x, "avgpool2d_input_N_C_H_W_at_least_kernel"),
        }
    }

    fn visit(&self, _f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {}

    fn visit_mut(&mut self, _f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {}
}

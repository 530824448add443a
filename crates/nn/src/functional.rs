//! PyTorch's `torch.nn.functional` (imported as `F`): the layers' computations as functions.
//!
//! The names, argument order and defaults are PyTorch's as far as Rust allows: positional
//! arguments stay positional, an optional tensor is an `Option<&Tensor>`, and where PyTorch has
//! several keyword arguments they are an options struct whose `Default` is PyTorch's defaults
//! ([`SdpaOptions`], [`CrossEntropyOptions`], [`NllLossOptions`], [`BceWithLogitsOptions`]);
//! losses take a [`Reduction`] (`Mean` by default). Every function records lazy ops like the
//! facade's own: invalid arguments (shapes that do not fit, an option out of range) give an
//! error tensor naming the function, the shapes and the caller's source line, which `realize`
//! returns as `Err`. The layer structs with a functional twin (`Linear`, `Embedding`, `Dropout`,
//! `LayerNorm`, `RmsNorm`, `BatchNorm2d`) and the losses at the crate root call these functions, so
//! each computation is written once. The spatial forms ([`pad`], [`interpolate`],
//! [`adaptive_avg_pool2d`], [`batch_norm`]) live in `functional/spatial.rs`.
//!
//! ```
//! use kiln::prelude::*;
//! use kiln_nn::functional as F;
//!
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
//! let w = Tensor::ones(&[4, 3], DType::F32);
//! let y = F::layer_norm(&F::linear(&x, &w, None), &[4], None, None, 1e-5);
//! let target = Tensor::from_vec(vec![0i64, 3], &[2]);
//! let loss = F::cross_entropy(&y, &target, F::CrossEntropyOptions { label_smoothing: 0.1, ..Default::default() });
//! assert_eq!(loss.dims()?, Vec::<usize>::new());
//! # Ok::<(), kiln::Error>(())
//! ```

use kiln::{Axis, DType, Dim, Tensor};

mod spatial;

pub use crate::conv::{
    AvgPool2dOptions, Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions, MaxPool2dOptions, Padding, avg_pool2d,
    conv_transpose2d, conv1d, conv2d, max_pool2d,
};
pub use spatial::{InterpolateMode, InterpolateSize, PadMode, adaptive_avg_pool2d, batch_norm, interpolate, pad};

/// `cond ? a : b`, element-wise: the one place this module names the facade's select.
#[track_caller]
fn select(cond: &Tensor, a: impl kiln::Operand, b: impl kiln::Operand) -> Tensor {
    cond.where_cond(a, b)
}

/// The shape as PyTorch prints it (`[2, 3]`, symbols by name).
fn show(t: &Tensor) -> String {
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

/// The first error among `tensors`, as an error tensor, so a function applied to an error tensor
/// passes that error on (and reports nothing of its own about the placeholder's shape).
fn first_error(tensors: &[Option<&Tensor>]) -> Option<Tensor> {
    tensors.iter().flatten().find(|t| t.error().is_some()).map(|t| (*t).clone())
}

/// How a loss reduces its per-element values (PyTorch's `reduction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The per-element losses, unreduced (`"none"`).
    None,
    /// Their mean (`"mean"`, the default; weighted losses divide by the weights' sum).
    #[default]
    Mean,
    /// Their sum (`"sum"`).
    Sum,
}

impl Reduction {
    /// Applies the reduction to per-element losses (an unweighted mean).
    #[track_caller]
    fn apply(self, loss: &Tensor) -> Tensor {
        match self {
            Reduction::None => loss.clone(),
            Reduction::Mean => loss.mean_all(),
            Reduction::Sum => loss.sum_all(),
        }
    }
}

// ------------------------------------------------------------------------------------ layers

/// `F.linear(input, weight, bias=None)`: `input @ weight^T + bias` over the last axis; `weight`
/// is `[out_features, in_features]`, `bias` `[out_features]`.
#[track_caller]
pub fn linear(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Tensor {
    if let Some(e) = first_error(&[Some(input), Some(weight), bias]) {
        return e;
    }
    if weight.ndim() != 2 {
        return Tensor::op_error("linear", format!("weight must be [out, in], got {}", show(weight)));
    }
    let y = input.matmul(&weight.transpose(0, 1));
    match bias {
        Some(b) => y.add(b),
        None => y,
    }
}

/// `F.embedding(input, weight)`: the rows of `weight` (`[num_embeddings, dim]`) named by the
/// integer ids `input` (`[...]`), shape `[..., dim]`. A gather: O(ids x dim) whatever the number
/// of rows; an id outside `0..num_embeddings` makes the realize fail, as PyTorch raises. The
/// weight's gradient is a scatter-add into the looked-up rows.
#[track_caller]
pub fn embedding(input: &Tensor, weight: &Tensor) -> Tensor {
    if let Some(e) = first_error(&[Some(input), Some(weight)]) {
        return e;
    }
    if weight.ndim() != 2 || !input.dtype().is_int() {
        return Tensor::op_error(
            "embedding",
            format!(
                "needs integer ids and a [num_embeddings, dim] weight, got ids {} {} and weight {}",
                input.dtype(),
                show(input),
                show(weight)
            ),
        );
    }
    let mut out_shape = input.shape().to_vec();
    out_shape.push(weight.shape()[1]);
    weight.index_select(0, &input.reshape(&[-1])).reshape(out_shape)
}

/// `F.dropout(input, p=0.5, training=True)`: in training, zeroes each element with probability
/// `p` and scales the others by `1 / (1 - p)`; otherwise the identity. The mask is drawn on the
/// host from the calling thread's `kiln` generator ([`kiln::manual_seed`]), so it is an input of the graph
/// and a training step's graph keeps its structure from step to step. In training the shape must
/// be concrete (a symbolic shape is an error, never a silent identity); `p` outside `[0, 1]` is
/// an error, as in PyTorch.
#[track_caller]
pub fn dropout(input: &Tensor, p: f64, training: bool) -> Tensor {
    if input.error().is_some() {
        return input.clone();
    }
    if !(0.0..=1.0).contains(&p) {
        return Tensor::op_error("dropout", format!("probability has to be between 0 and 1, but got {p}"));
    }
    if !training || p == 0.0 {
        return input.clone();
    }
    if p == 1.0 {
        return input.zeros_like();
    }
    let dims = match input.dims() {
        Ok(dims) => dims,
        Err(e) => {
            return Tensor::op_error(
                "dropout",
                format!("needs a concrete shape in training, got {}: {e}", show(input)),
            );
        }
    };
    match Tensor::rand(&dims).to_device(input.device()) {
        Ok(draw) => input.mul(draw.ge(p).cast(input.dtype())).mul(1.0 / (1.0 - p)),
        Err(e) => Tensor::op_error("dropout", format!("cannot place the mask on {}: {e}", input.device())),
    }
}

/// `F.softmax(input, dim, dtype=None)`: `exp(x) / sum(exp(x))` along `dim`, computed around the
/// maximum; with `dtype` the input is cast to it first (PyTorch's way to get an `f64` softmax of
/// `f32` data, or a float one of integers).
#[track_caller]
pub fn softmax(input: &Tensor, dim: impl Axis, dtype: Option<DType>) -> Tensor {
    match dtype {
        Some(dtype) => input.cast(dtype).softmax(dim),
        None => input.softmax(dim),
    }
}

/// `F.log_softmax(input, dim, dtype=None)`: `log(softmax(x))` along `dim`, computed stably; with
/// `dtype` the input is cast to it first.
#[track_caller]
pub fn log_softmax(input: &Tensor, dim: impl Axis, dtype: Option<DType>) -> Tensor {
    match dtype {
        Some(dtype) => input.cast(dtype).log_softmax(dim),
        None => input.log_softmax(dim),
    }
}

// ------------------------------------------------------------------------------ normalization

/// The axes of `input` covered by a trailing `normalized_shape`, or an error tensor naming `op`
/// when the shape does not end with it (or a parameter is not shaped like it).
#[track_caller]
fn trailing_axes(
    op: &'static str,
    input: &Tensor,
    normalized_shape: &[usize],
    params: &[Option<&Tensor>],
) -> Result<Vec<isize>, Tensor> {
    let (nd, k) = (input.ndim(), normalized_shape.len());
    let matches = |dims: &[Dim]| {
        dims.len() == k && dims.iter().zip(normalized_shape).all(|(d, &n)| d.as_const() == Some(n as i64))
    };
    if k == 0 || k > nd || !matches(&input.shape()[nd - k..]) {
        return Err(Tensor::op_error(
            op,
            format!("input {} does not end with normalized_shape {normalized_shape:?}", show(input)),
        ));
    }
    for p in params.iter().flatten() {
        if !matches(p.shape()) {
            return Err(Tensor::op_error(
                op,
                format!("weight/bias {} is not normalized_shape {normalized_shape:?}", show(p)),
            ));
        }
    }
    Ok((nd - k..nd).map(|a| a as isize).collect())
}

/// `F.layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5)`: `(x - mean) /
/// sqrt(var + eps) * weight + bias`, the mean and the biased variance taken over the trailing
/// `normalized_shape` axes (any number of them); `weight` and `bias`, when given, are shaped
/// like `normalized_shape`.
#[track_caller]
pub fn layer_norm(
    input: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Tensor {
    if let Some(e) = first_error(&[Some(input), weight, bias]) {
        return e;
    }
    let axes = match trailing_axes("layer_norm", input, normalized_shape, &[weight, bias]) {
        Ok(axes) => axes,
        Err(e) => return e,
    };
    narrowed(affine(standardize(&widened(input), &axes, eps), weight, bias), input)
}

/// `x` widened to `f32` when it is `f16` or `bf16`: a norm computes in `f32` and rounds its
/// result back once ([`narrowed`]), as PyTorch's do (each step in the half dtype would round).
#[track_caller]
fn widened(x: &Tensor) -> Tensor {
    if is_half(x) { x.cast(DType::F32) } else { x.clone() }
}

/// `y` rounded back to `input`'s dtype when that is `f16` or `bf16` (see [`widened`]).
#[track_caller]
fn narrowed(y: Tensor, input: &Tensor) -> Tensor {
    if is_half(input) { y.cast(input.dtype()) } else { y }
}

fn is_half(x: &Tensor) -> bool {
    x.error().is_none() && x.dtype().is_half()
}

/// `(x - mean) / sqrt(var + eps)` over `axes`, with the biased variance.
#[track_caller]
fn standardize(x: &Tensor, axes: &[isize], eps: f64) -> Tensor {
    let centered = x.sub(x.mean_keepdim(axes));
    let var = centered.square().mean_keepdim(axes);
    centered.mul(var.add(eps).rsqrt())
}

/// `y * weight + bias`, each when given.
#[track_caller]
fn affine(y: Tensor, weight: Option<&Tensor>, bias: Option<&Tensor>) -> Tensor {
    let y = match weight {
        Some(w) => y.mul(w),
        None => y,
    };
    match bias {
        Some(b) => y.add(b),
        None => y,
    }
}

/// The machine epsilon of a float dtype (`torch.finfo(dtype).eps`).
fn finfo_eps(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        DType::F16 => 0.000_976_562_5,
        DType::BF16 => 0.007_812_5,
        _ => f32::EPSILON as f64,
    }
}

/// `F.rms_norm(input, normalized_shape, weight=None, eps=None)`: `x / sqrt(mean(x^2) + eps) *
/// weight` over the trailing `normalized_shape` axes; `eps=None` is the input dtype's machine
/// epsilon, as in PyTorch.
#[track_caller]
pub fn rms_norm(input: &Tensor, normalized_shape: &[usize], weight: Option<&Tensor>, eps: Option<f64>) -> Tensor {
    if let Some(e) = first_error(&[Some(input), weight]) {
        return e;
    }
    let axes = match trailing_axes("rms_norm", input, normalized_shape, &[weight]) {
        Ok(axes) => axes,
        Err(e) => return e,
    };
    let eps = eps.unwrap_or_else(|| finfo_eps(input.dtype()));
    let x = widened(input);
    narrowed(affine(x.mul(x.square().mean_keepdim(&axes).add(eps).rsqrt()), weight, None), input)
}

/// `F.group_norm(input, num_groups, weight=None, bias=None, eps=1e-5)`: `input` is `[N, C, *]`;
/// its channels are split into `num_groups` groups, each normalized (mean and biased variance
/// over its channels and every position), then scaled and shifted per channel by `weight` and
/// `bias` (`[C]`). `C` must be concrete and divisible by `num_groups`.
#[track_caller]
pub fn group_norm(
    input: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Tensor {
    if let Some(e) = first_error(&[Some(input), weight, bias]) {
        return e;
    }
    let channels = if input.ndim() >= 2 { input.shape()[1].as_const() } else { None };
    let Some(c) = channels.filter(|&c| num_groups > 0 && c % num_groups as i64 == 0) else {
        return Tensor::op_error(
            "group_norm",
            format!("input {} must be [N, C, *] with C (concrete) divisible by num_groups {num_groups}", show(input)),
        );
    };
    for p in [weight, bias].into_iter().flatten() {
        if p.ndim() != 1 || p.shape()[0].as_const() != Some(c) {
            return Tensor::op_error(
                "group_norm",
                format!("weight/bias {} is not [{c}] for input {}", show(p), show(input)),
            );
        }
    }
    let grouped = widened(input).reshape(vec![input.shape()[0], Dim::from(num_groups), Dim::Const(-1)]);
    let y = standardize(&grouped, &[-1], eps).reshape(input.shape().to_vec());
    let mut per_channel = vec![Dim::Const(-1)];
    per_channel.extend((2..input.ndim()).map(|_| Dim::Const(1)));
    let per_channel = |t: &Tensor| t.reshape(per_channel.clone());
    narrowed(affine(y, weight.map(per_channel).as_ref(), bias.map(per_channel).as_ref()), input)
}

// ---------------------------------------------------------------------------------- attention

/// The keyword arguments of [`scaled_dot_product_attention`], PyTorch's defaults by default.
#[derive(Clone, Debug, Default)]
pub struct SdpaOptions {
    /// Broadcastable to `[..., L, S]`: a bool mask (`true` = attend, as PyTorch) or a float mask
    /// added to the scores (`-inf` to block). Default none.
    pub attn_mask: Option<Tensor>,
    /// Dropout on the attention weights (always applied when positive, as in `F`'s form).
    pub dropout_p: f64,
    /// A causal mask: query `i` attends to keys `j <= i` (top-left aligned, PyTorch's
    /// `tril`). Cannot be combined with `attn_mask`.
    pub is_causal: bool,
    /// The factor on `q k^T`; `None` is `1 / sqrt(E)`.
    pub scale: Option<f64>,
    /// Grouped-query attention: when `k`/`v` have fewer heads (axis -3) than `q`, each of them
    /// serves `Hq / Hkv` consecutive query heads (PyTorch's `repeat_interleave`).
    pub enable_gqa: bool,
}

/// `t` with axis -3 repeated `groups` times per entry (`repeat_interleave(groups, dim=-3)`).
#[track_caller]
fn repeat_heads(t: &Tensor, groups: usize) -> Tensor {
    let nd = t.ndim();
    let mut expanded: Vec<Dim> = vec![Dim::Const(-1); nd + 1];
    expanded[nd - 2] = Dim::from(groups);
    let mut merged: Vec<Dim> = t.shape().to_vec();
    merged[nd - 3] = merged[nd - 3] * Dim::from(groups);
    t.unsqueeze(nd as isize - 2).expand(expanded).reshape(merged)
}

/// `F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
/// is_causal=False, scale=None, enable_gqa=False)`: `softmax(q k^T * scale + mask) v` for `q`
/// `[..., L, E]`, `k` `[..., S, E]`, `v` `[..., S, Ev]` (leading axes broadcast), shape
/// `[..., L, Ev]`. See [`SdpaOptions`]. A causal mask needs concrete `L` and `S`.
#[track_caller]
pub fn scaled_dot_product_attention(query: &Tensor, key: &Tensor, value: &Tensor, options: SdpaOptions) -> Tensor {
    const OP: &str = "scaled_dot_product_attention";
    if let Some(e) = first_error(&[Some(query), Some(key), Some(value), options.attn_mask.as_ref()]) {
        return e;
    }
    let shapes = || format!("query {}, key {}, value {}", show(query), show(key), show(value));
    if query.ndim() < 2 || key.ndim() < 2 || value.ndim() < 2 {
        return Tensor::op_error(OP, format!("needs [..., L, E] inputs, got {}", shapes()));
    }
    if !(0.0..=1.0).contains(&options.dropout_p) {
        return Tensor::op_error(OP, format!("dropout_p must be in [0, 1], got {}", options.dropout_p));
    }
    if options.is_causal && options.attn_mask.is_some() {
        return Tensor::op_error(OP, "is_causal and attn_mask cannot both be set");
    }
    let (mut key, mut value) = (key.clone(), value.clone());
    if options.enable_gqa && query.ndim() >= 3 && key.ndim() >= 3 && value.ndim() >= 3 {
        let heads = |t: &Tensor| t.shape()[t.ndim() - 3].as_const();
        let (Some(hq), Some(hk), Some(hv)) = (heads(query), heads(&key), heads(&value)) else {
            return Tensor::op_error(OP, format!("enable_gqa needs concrete head counts (axis -3), got {}", shapes()));
        };
        if hk == 0 || hv == 0 || hq % hk != 0 || hq % hv != 0 {
            return Tensor::op_error(
                OP,
                format!("query heads must be a multiple of key/value heads, got {}", shapes()),
            );
        }
        key = repeat_heads(&key, (hq / hk) as usize);
        value = repeat_heads(&value, (hq / hv) as usize);
    }
    let scale = match options.scale {
        Some(s) => s,
        None => match query.shape()[query.ndim() - 1].as_const() {
            Some(e) => 1.0 / (e as f64).sqrt(),
            None => return Tensor::op_error(OP, format!("the default scale needs a concrete E, got {}", shapes())),
        },
    };
    let mut scores = query.matmul(&key.transpose(-2, -1)).mul(scale);
    let mask = if options.is_causal {
        let (l, s) = (query.shape()[query.ndim() - 2].as_const(), key.shape()[key.ndim() - 2].as_const());
        let (Some(l), Some(s)) = (l, s) else {
            return Tensor::op_error(OP, format!("is_causal needs concrete L and S, got {}", shapes()));
        };
        let rows = Tensor::arange_on(0.0, l as f64, 1.0, query.device()).reshape(&[-1, 1]);
        let cols = Tensor::arange_on(0.0, s as f64, 1.0, query.device()).reshape(&[1, -1]);
        Some(rows.ge(&cols))
    } else {
        options.attn_mask.clone()
    };
    if let Some(mask) = mask {
        scores = if mask.dtype().is_bool() { select(&mask, &scores, f64::NEG_INFINITY) } else { scores.add(&mask) };
    }
    let weights = dropout(&scores.softmax(-1), options.dropout_p, true);
    weights.matmul(&value)
}

// -------------------------------------------------------------------------------------- losses

/// `input` (`[C]`, `[N, C]` or `[N, C, d1, ...]`, classes on axis 1 as in PyTorch) as `[M, C]`
/// rows, with the shape of one loss per row (`[]`, `[N]`, `[N, d1, ...]`).
#[track_caller]
fn class_rows(input: &Tensor) -> (Tensor, Vec<Dim>) {
    let shape = input.shape().to_vec();
    match shape.len() {
        1 => (input.reshape(vec![Dim::Const(1), shape[0]]), vec![]),
        2 => (input.clone(), vec![shape[0]]),
        n => {
            let mut perm: Vec<isize> = vec![0];
            perm.extend(2..n as isize);
            perm.push(1);
            let rows = input.permute(perm).reshape(vec![Dim::Const(-1), shape[1]]);
            let mut sample = vec![shape[0]];
            sample.extend(shape[2..].iter().cloned());
            (rows, sample)
        }
    }
}

/// Checks a class-index loss's arguments: `input` has a class axis of concrete size `C`,
/// `target` is integer with the shape of one loss per sample, `weight` is `[C]`. Returns `C`.
#[track_caller]
fn check_class_args(
    op: &'static str,
    input: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    sample: &[Dim],
) -> Result<i64, Tensor> {
    let classes = match input.ndim() {
        0 => None,
        1 => input.shape()[0].as_const(),
        _ => input.shape()[1].as_const(),
    };
    let Some(c) = classes else {
        return Err(Tensor::op_error(
            op,
            format!("input {} needs a concrete class axis (axis 1, or 0 for [C])", show(input)),
        ));
    };
    if !target.dtype().is_int() || target.shape().as_ref() != sample {
        return Err(Tensor::op_error(
            op,
            format!(
                "target must hold integer class ids shaped like input {} without its class axis, got {} {}",
                show(input),
                target.dtype(),
                show(target)
            ),
        ));
    }
    if let Some(w) = weight
        && (w.ndim() != 1 || w.shape()[0].as_const() != Some(c))
    {
        return Err(Tensor::op_error(op, format!("weight {} must be [{c}] (one per class)", show(w))));
    }
    Ok(c)
}

/// The parts of a class-index loss over rows `[M, C]` of log-probabilities: the per-row losses
/// `-weight[t] * log_probs[t]` (0 where ignored; ignored rows read class 0, then are masked),
/// the mean's denominator (the kept rows' weights, or their count) and the kept-row mask.
struct Picked {
    losses: Tensor,
    denominator: Tensor,
    keep: Option<Tensor>,
}

#[track_caller]
fn pick_targets(log_probs: &Tensor, target: &Tensor, weight: Option<&Tensor>, ignore_index: Option<i64>) -> Picked {
    let t = target.reshape(&[-1, 1]);
    let (keep, safe) = match ignore_index {
        Some(i) => {
            let keep = t.ne(i);
            let safe = select(&keep, &t, t.zeros_like());
            (Some(keep), safe)
        }
        None => (None, t),
    };
    let mut losses = log_probs.gather(1, &safe).neg();
    let weights = weight.map(|w| w.index_select(0, &safe.reshape(&[-1])).reshape(&[-1, 1]));
    if let Some(w) = &weights {
        losses = losses.mul(w);
    }
    let kept = |x: Tensor| match &keep {
        Some(k) => select(k, &x, 0.0),
        None => x,
    };
    let losses = kept(losses);
    let denominator = match &weights {
        Some(w) => kept(w.clone()).sum_all(),
        None => kept(losses.ones_like()).sum_all(),
    };
    Picked { losses: losses.reshape(&[-1]), denominator, keep }
}

/// Reduces per-row losses: `None` reshapes them to `sample`, `Sum` adds them, `Mean` divides the
/// sum by `denominator`.
#[track_caller]
fn reduce_rows(losses: &Tensor, reduction: Reduction, denominator: &Tensor, sample: &[Dim]) -> Tensor {
    match reduction {
        Reduction::None => losses.reshape(sample.to_vec()),
        Reduction::Sum => losses.sum_all(),
        Reduction::Mean => losses.sum_all().div(denominator),
    }
}

/// The keyword arguments of [`nll_loss`], PyTorch's defaults by default.
#[derive(Clone, Debug)]
pub struct NllLossOptions {
    /// A rescaling weight per class (`[C]`); the mean then divides by the kept targets' weights.
    pub weight: Option<Tensor>,
    /// Targets equal to this contribute nothing (and get no gradient); the mean runs over the
    /// others, so a batch whose targets are all ignored gives NaN. PyTorch's `-100` by default;
    /// `None` ignores nothing.
    pub ignore_index: Option<i64>,
    /// How the per-sample losses are reduced.
    pub reduction: Reduction,
}

impl Default for NllLossOptions {
    fn default() -> NllLossOptions {
        NllLossOptions { weight: None, ignore_index: Some(-100), reduction: Reduction::Mean }
    }
}

/// `F.nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean")`: `-weight[t] *
/// input[t]` per sample, for log-probabilities `input` (`[C]`, `[N, C]` or `[N, C, d1, ...]`) and
/// integer (`i64` or `i32`) class ids `target` (`[]`, `[N]`, `[N, d1, ...]`). A target outside
/// `0..C` (other than the ignored value) makes the realize fail, as in PyTorch.
#[track_caller]
pub fn nll_loss(input: &Tensor, target: &Tensor, options: NllLossOptions) -> Tensor {
    if let Some(e) = first_error(&[Some(input), Some(target), options.weight.as_ref()]) {
        return e;
    }
    let (rows, sample) = class_rows(input);
    if let Err(e) = check_class_args("nll_loss", input, target, options.weight.as_ref(), &sample) {
        return e;
    }
    let picked = pick_targets(&rows, target, options.weight.as_ref(), options.ignore_index);
    reduce_rows(&picked.losses, options.reduction, &picked.denominator, &sample)
}

/// The keyword arguments of [`cross_entropy`], PyTorch's defaults by default.
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    /// A rescaling weight per class (`[C]`).
    pub weight: Option<Tensor>,
    /// As [`NllLossOptions::ignore_index`] (class-index targets only): `-100` by default.
    pub ignore_index: Option<i64>,
    /// How the per-sample losses are reduced.
    pub reduction: Reduction,
    /// In `[0, 1]`: the target becomes `(1 - label_smoothing)` on the class plus
    /// `label_smoothing / C` on every class.
    pub label_smoothing: f64,
}

impl Default for CrossEntropyOptions {
    fn default() -> CrossEntropyOptions {
        CrossEntropyOptions { weight: None, ignore_index: Some(-100), reduction: Reduction::Mean, label_smoothing: 0.0 }
    }
}

/// `F.cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
/// label_smoothing=0.0)`: `nll_loss(log_softmax(input, 1), target)` for logits `input` (`[C]`,
/// `[N, C]` or `[N, C, d1, ...]`). `target` holds either integer class ids (`i64` or `i32`,
/// shaped like `input` without axis 1) or class probabilities (float, shaped like `input`; then
/// `ignore_index` does not apply and the mean divides by the number of samples). With class ids
/// the mean divides by the kept targets' weights (their count without `weight`), and label
/// smoothing adds `label_smoothing / C` times the weighted sum of every class's `-log p`, as
/// PyTorch computes it. Computed from `log_softmax`, so large logits do not overflow.
#[track_caller]
pub fn cross_entropy(input: &Tensor, target: &Tensor, options: CrossEntropyOptions) -> Tensor {
    const OP: &str = "cross_entropy";
    if let Some(e) = first_error(&[Some(input), Some(target), options.weight.as_ref()]) {
        return e;
    }
    let ls = options.label_smoothing;
    if !(0.0..=1.0).contains(&ls) {
        return Tensor::op_error(OP, format!("label_smoothing must be in [0, 1], got {ls}"));
    }
    let (rows, sample) = class_rows(input);
    let weight = options.weight.as_ref();
    let log_probs = rows.log_softmax(-1);
    if target.dtype().is_float() {
        // Class probabilities.
        let classes =
            if input.ndim() == 1 { input.shape()[0].as_const() } else { input.shape().get(1).and_then(Dim::as_const) };
        let Some(c) = classes.filter(|_| target.shape() == input.shape()) else {
            return Tensor::op_error(
                OP,
                format!(
                    "probability target {} must be shaped like input {} (concrete classes)",
                    show(target),
                    show(input)
                ),
            );
        };
        if let Some(w) = weight
            && (w.ndim() != 1 || w.shape()[0].as_const() != Some(c))
        {
            return Tensor::op_error(OP, format!("weight {} must be [{c}] (one per class)", show(w)));
        }
        let (probs, _) = class_rows(target);
        let probs = if ls > 0.0 { probs.mul(1.0 - ls).add(ls / c as f64) } else { probs };
        let mut terms = log_probs.mul(&probs);
        if let Some(w) = weight {
            terms = terms.mul(w);
        }
        let losses = terms.sum(-1).neg();
        let count = losses.ones_like().sum_all();
        return reduce_rows(&losses, options.reduction, &count, &sample);
    }
    let c = match check_class_args(OP, input, target, weight, &sample) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let picked = pick_targets(&log_probs, target, weight, options.ignore_index);
    let nll = reduce_rows(&picked.losses, options.reduction, &picked.denominator, &sample);
    if ls == 0.0 {
        return nll;
    }
    let mut every = log_probs.neg();
    if let Some(w) = weight {
        every = every.mul(w);
    }
    let mut smooth = every.sum(-1);
    if let Some(k) = &picked.keep {
        smooth = select(&k.reshape(&[-1]), &smooth, 0.0);
    }
    // PyTorch divides the smoothing term's sum by the same denominator as the nll term.
    let smooth = reduce_rows(&smooth, options.reduction, &picked.denominator, &sample);
    nll.mul(1.0 - ls).add(smooth.mul(ls / c as f64))
}

/// `F.mse_loss(input, target, reduction="mean")`: `(input - target)^2` per element.
#[track_caller]
pub fn mse_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    reduction.apply(&input.sub(target).square())
}

/// `F.l1_loss(input, target, reduction="mean")`: `|input - target|` per element.
#[track_caller]
pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    reduction.apply(&input.sub(target).abs())
}

/// `F.smooth_l1_loss(input, target, reduction="mean", beta=1.0)`: per element, with
/// `d = |input - target|`, `0.5 d^2 / beta` where `d < beta` and `d - 0.5 beta` elsewhere (`beta = 0` is the
/// L1 loss). A negative `beta` is an error, as in PyTorch.
#[track_caller]
pub fn smooth_l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction, beta: f64) -> Tensor {
    if beta < 0.0 || beta.is_nan() {
        return Tensor::op_error("smooth_l1_loss", format!("beta must be >= 0, got {beta}"));
    }
    let d = input.sub(target).abs();
    if beta == 0.0 {
        return reduction.apply(&d);
    }
    let quadratic = d.square().mul(0.5 / beta);
    let linear = d.sub(0.5 * beta);
    reduction.apply(&select(&d.lt(beta), &quadratic, &linear))
}

/// `F.binary_cross_entropy(input, target, weight=None, reduction="mean")`: `-weight * (t log x +
/// (1 - t) log(1 - x))` per element for probabilities `input`, each log clamped at `-100` as
/// PyTorch does (so `x = 0` or `1` gives a finite loss). `target` must be shaped like `input`;
/// `weight` broadcasts to it.
#[track_caller]
pub fn binary_cross_entropy(input: &Tensor, target: &Tensor, weight: Option<&Tensor>, reduction: Reduction) -> Tensor {
    if let Some(e) = first_error(&[Some(input), Some(target), weight]) {
        return e;
    }
    if target.shape() != input.shape() {
        return Tensor::op_error(
            "binary_cross_entropy",
            format!("target {} must be shaped like input {}", show(target), show(input)),
        );
    }
    let log_x = input.log().clamp_min(-100.0);
    let log_1mx = input.neg().add(1.0).log().clamp_min(-100.0);
    let positive = target.mul(&log_x);
    let negative = target.neg().add(1.0).mul(&log_1mx);
    let loss = positive.add(&negative).neg();
    reduction.apply(&affine(loss, weight, None))
}

/// The keyword arguments of [`binary_cross_entropy_with_logits`], PyTorch's defaults by default.
#[derive(Clone, Debug, Default)]
pub struct BceWithLogitsOptions {
    /// A weight per element, broadcast to the input.
    pub weight: Option<Tensor>,
    /// How the per-element losses are reduced.
    pub reduction: Reduction,
    /// A weight of the positive term, broadcast along the last axis (one per class).
    pub pos_weight: Option<Tensor>,
}

/// `F.binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean",
/// pos_weight=None)`: `-weight * (pos_weight * t * log sigmoid(x) + (1 - t) * log(1 -
/// sigmoid(x)))` per element, computed from logits without overflow
/// (`log sigmoid(x) = -(max(-x, 0) + log(1 + exp(-|x|)))`). `target` must be shaped like `input`.
#[track_caller]
pub fn binary_cross_entropy_with_logits(input: &Tensor, target: &Tensor, options: BceWithLogitsOptions) -> Tensor {
    if let Some(e) = first_error(&[Some(input), Some(target), options.weight.as_ref(), options.pos_weight.as_ref()]) {
        return e;
    }
    if target.shape() != input.shape() {
        return Tensor::op_error(
            "binary_cross_entropy_with_logits",
            format!("target {} must be shaped like input {}", show(target), show(input)),
        );
    }
    // -log sigmoid(x), and -log(1 - sigmoid(x)) = x - log sigmoid(x).
    let neg_log_sigmoid = input.neg().clamp_min(0.0).add(input.abs().neg().exp().add(1.0).log());
    let positive = match &options.pos_weight {
        Some(pw) => target.mul(pw),
        None => target.clone(),
    };
    let negative = target.neg().add(1.0);
    let loss = positive.mul(&neg_log_sigmoid).add(negative.mul(input.add(&neg_log_sigmoid)));
    options.reduction.apply(&affine(loss, options.weight.as_ref(), None))
}

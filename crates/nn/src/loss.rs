//! Losses: mean squared error and cross-entropy from logits.

use kiln::Tensor;

/// The mean of `(prediction - target)^2` over every element (PyTorch's `mse_loss`), shape `[]`.
#[track_caller]
pub fn mse_loss(prediction: &Tensor, target: &Tensor) -> Tensor {
    prediction.sub(target).square().mean_all()
}

/// Options of [`cross_entropy_with`] and [`nll_loss_with`], PyTorch's defaults by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassLossOptions {
    /// Targets equal to this value contribute nothing, and the mean runs over the other targets
    /// only (PyTorch's `ignore_index`, default `-100`). `None` ignores nothing.
    pub ignore_index: Option<i64>,
}

impl Default for ClassLossOptions {
    fn default() -> ClassLossOptions {
        ClassLossOptions { ignore_index: Some(-100) }
    }
}

/// The mean over samples of `-log softmax(logits)[target]` (PyTorch's `cross_entropy` with class
/// indices and its defaults: targets equal to `-100` are ignored), shape `[]`. `logits` is
/// `[..., classes]` and `targets` holds integer class ids of shape `[...]`. Computed from
/// `log_softmax`, which subtracts the row maximum, so large logits do not overflow. A target
/// outside `0..classes` (other than the ignored value) makes the realize fail, as in PyTorch.
#[track_caller]
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Tensor {
    cross_entropy_with(logits, targets, ClassLossOptions::default())
}

/// [`cross_entropy`] with explicit options (see [`ClassLossOptions`]).
#[track_caller]
pub fn cross_entropy_with(logits: &Tensor, targets: &Tensor, options: ClassLossOptions) -> Tensor {
    let classes = logits.shape().last().cloned().unwrap_or(kiln::Dim::Const(1));
    let flat = logits.reshape(vec![kiln::Dim::Const(-1), classes]);
    nll_loss_with(&flat.log_softmax(-1), targets, options)
}

/// The mean over samples of `-log_probs[sample, target]` (PyTorch's `nll_loss` with its
/// defaults: targets equal to `-100` are ignored), shape `[]`. `log_probs` is `[samples,
/// classes]` and `targets` holds `samples` integer class ids (any shape).
#[track_caller]
pub fn nll_loss(log_probs: &Tensor, targets: &Tensor) -> Tensor {
    nll_loss_with(log_probs, targets, ClassLossOptions::default())
}

/// [`nll_loss`] with explicit options. With an `ignore_index`, ignored samples contribute
/// nothing (and get no gradient) and the mean divides by the number of the other samples, so a
/// batch whose targets are all ignored gives NaN, as in PyTorch.
#[track_caller]
pub fn nll_loss_with(log_probs: &Tensor, targets: &Tensor, options: ClassLossOptions) -> Tensor {
    let targets = targets.reshape(&[-1, 1]);
    let Some(ignore) = options.ignore_index else {
        return log_probs.gather(1, &targets).mean_all().neg();
    };
    let keep = targets.ne(ignore);
    // Ignored targets read class 0 (a valid index) and are then masked out.
    let safe = keep.where_(&targets, targets.zeros_like());
    let picked = log_probs.gather(1, &safe);
    let total = keep.where_(&picked, picked.zeros_like()).sum_all();
    let count = keep.cast(log_probs.dtype()).sum_all();
    total.div(&count).neg()
}

/// A loss function, chosen by name so that a training loop can hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// [`mse_loss`].
    Mse,
    /// [`cross_entropy`].
    CrossEntropy,
}

impl Loss {
    /// The loss of `prediction` against `target`.
    #[track_caller]
    pub fn compute(self, prediction: &Tensor, target: &Tensor) -> Tensor {
        match self {
            Loss::Mse => mse_loss(prediction, target),
            Loss::CrossEntropy => cross_entropy(prediction, target),
        }
    }
}

//! Losses at the crate root: the forms that take `[..., classes]` logits, thin wrappers over
//! [`crate::functional`]'s PyTorch forms (one implementation), and [`Loss`] for a training loop.

use kiln::Tensor;

use crate::functional::{self, CrossEntropyOptions, NllLossOptions, Reduction};

/// The mean of `(prediction - target)^2` over every element (PyTorch's `mse_loss`), shape `[]`:
/// [`functional::mse_loss`] with `Reduction::Mean`.
#[track_caller]
pub fn mse_loss(prediction: &Tensor, target: &Tensor) -> Tensor {
    functional::mse_loss(prediction, target, Reduction::Mean)
}

/// Options of [`cross_entropy_with`] and [`nll_loss_with`], PyTorch's defaults by default (the
/// functional forms' options, [`CrossEntropyOptions`] and [`NllLossOptions`], have them all).
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
/// `[..., classes]` (classes last, where [`functional::cross_entropy`] takes them on axis one)
/// and `targets` holds integer class ids of shape `[...]`. Computed from `log_softmax`, which
/// subtracts the row maximum, so large logits do not overflow. A target outside `0..classes`
/// (other than the ignored value) makes the realize fail, as in PyTorch.
#[track_caller]
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Tensor {
    cross_entropy_with(logits, targets, ClassLossOptions::default())
}

/// [`cross_entropy`] with explicit options (see [`ClassLossOptions`]): the rows of `logits` and
/// the flattened targets through [`functional::cross_entropy`].
#[track_caller]
pub fn cross_entropy_with(logits: &Tensor, targets: &Tensor, options: ClassLossOptions) -> Tensor {
    let classes = logits.shape().last().cloned().unwrap_or(kiln::Dim::Const(1));
    let rows = logits.reshape(vec![kiln::Dim::Const(-1), classes]);
    let options = CrossEntropyOptions { ignore_index: options.ignore_index, ..Default::default() };
    functional::cross_entropy(&rows, &targets.reshape(&[-1]), options)
}

/// The mean over samples of `-log_probs[sample, target]` (PyTorch's `nll_loss` with its
/// defaults: targets equal to `-100` are ignored), shape `[]`. `log_probs` is `[samples,
/// classes]` and `targets` holds `samples` integer class ids (any shape).
#[track_caller]
pub fn nll_loss(log_probs: &Tensor, targets: &Tensor) -> Tensor {
    nll_loss_with(log_probs, targets, ClassLossOptions::default())
}

/// [`nll_loss`] with explicit options: [`functional::nll_loss`] on the flattened targets. With an
/// `ignore_index`, ignored samples contribute nothing (and get no gradient) and the mean divides
/// by the number of the other samples, so a batch whose targets are all ignored gives NaN, as in
/// PyTorch.
#[track_caller]
pub fn nll_loss_with(log_probs: &Tensor, targets: &Tensor, options: ClassLossOptions) -> Tensor {
    let options = NllLossOptions { ignore_index: options.ignore_index, ..Default::default() };
    functional::nll_loss(log_probs, &targets.reshape(&[-1]), options)
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

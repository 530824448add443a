//! Losses: mean squared error and cross-entropy from logits.

use kiln::Tensor;

/// The mean of `(prediction - target)^2` over every element (PyTorch's `mse_loss`), shape `[]`.
pub fn mse_loss(prediction: &Tensor, target: &Tensor) -> Tensor {
    prediction.sub(target).square().mean_all()
}

/// The mean over samples of `-log softmax(logits)[target]` (PyTorch's `cross_entropy` with class
/// indices), shape `[]`. `logits` is `[..., classes]` and `targets` holds integer class ids of
/// shape `[...]`. Computed from `log_softmax`, which subtracts the row maximum, so large logits
/// do not overflow.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Tensor {
    let classes = logits.shape().last().cloned().unwrap_or(kiln::Dim::Const(1));
    let flat = logits.reshape(vec![kiln::Dim::Const(-1), classes]);
    let log_probs = flat.log_softmax(-1);
    log_probs.gather(1, &targets.reshape(&[-1, 1])).mean_all().neg()
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
    pub fn compute(self, prediction: &Tensor, target: &Tensor) -> Tensor {
        match self {
            Loss::Mse => mse_loss(prediction, target),
            Loss::CrossEntropy => cross_entropy(prediction, target),
        }
    }
}

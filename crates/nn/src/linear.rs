//! `Linear` and `Embedding`, with PyTorch's parameter layout and names.

use kiln::Tensor;

use crate::Module;
use crate::functional;
use crate::init;

/// `y = x W^T + b` over the last axis (PyTorch's `nn.Linear`): `weight` is `[out, in]`, `bias`
/// is `[out]`. The forward is [`functional::linear`].
#[derive(Module)]
pub struct Linear {
    /// `[out_features, in_features]`.
    #[param]
    pub weight: Tensor,
    /// `[out_features]`, if the layer has a bias.
    #[param]
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer initialised like PyTorch's: uniform in `+-1/sqrt(in_features)`.
    pub fn new(in_features: usize, out_features: usize, bias: bool) -> Linear {
        let bound = 1.0 / (in_features.max(1) as f32).sqrt();
        let weight = init::uniform(&[out_features, in_features], bound);
        let bias = bias.then(|| init::uniform(&[out_features], bound));
        Linear { weight, bias }
    }
}

impl Module for Linear {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        functional::linear(x, &self.weight, self.bias.as_ref())
    }
}

/// A lookup table (PyTorch's `nn.Embedding`): integer ids `[...]` give rows `[..., dim]` of
/// `weight` (`[num_embeddings, dim]`). A lookup is a gather: it costs O(ids x dim) whatever the
/// number of rows, and reads only the rows it names (an `inf` in one row touches no other). An id
/// outside `0..num_embeddings` makes the realize fail, as PyTorch raises an error. The weight's
/// gradient is a scatter-add of the output gradient into the looked-up rows. The forward is
/// [`functional::embedding`].
#[derive(Module)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`.
    #[param]
    pub weight: Tensor,
}

impl Embedding {
    /// A table initialised from the standard normal distribution, like PyTorch's.
    pub fn new(num_embeddings: usize, embedding_dim: usize) -> Embedding {
        Embedding { weight: init::normal(&[num_embeddings, embedding_dim], 1.0) }
    }
}

impl Module for Embedding {
    #[track_caller]
    fn forward(&self, ids: &Tensor) -> Tensor {
        functional::embedding(ids, &self.weight)
    }
}

//! `Linear` and `Embedding`, with PyTorch's parameter layout and names.

use kiln::Tensor;

use crate::Module;
use crate::init;

/// `y = x W^T + b` over the last axis (PyTorch's `nn.Linear`): `weight` is `[out, in]`, `bias`
/// is `[out]`.
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
    fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.matmul(&self.weight.transpose(0, 1));
        match &self.bias {
            Some(b) => y.add(b),
            None => y,
        }
    }
}

/// A lookup table (PyTorch's `nn.Embedding`): integer ids `[...]` give rows `[..., dim]` of
/// `weight` (`[num_embeddings, dim]`). A lookup is a gather: it costs O(ids x dim) whatever the
/// number of rows, and reads only the rows it names (an `inf` in one row touches no other). An id
/// outside `0..num_embeddings` makes the realize fail, as PyTorch raises an error. The weight's
/// gradient is a scatter-add of the output gradient into the looked-up rows.
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
    fn forward(&self, ids: &Tensor) -> Tensor {
        let mut out_shape = ids.shape().to_vec();
        let dim = self.weight.shape().get(1).cloned().unwrap_or(kiln::Dim::Const(0));
        out_shape.push(dim);
        self.weight.index_select(0, &ids.reshape(&[-1])).reshape(out_shape)
    }
}

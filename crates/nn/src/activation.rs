//! Parameter-free layers: activations, `Dropout` and `Flatten`.

use kiln::{GeluApprox, Tensor};

use crate::Module;
use crate::functional;

/// An element-wise activation as a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Module)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// Exact GELU (`0.5 x (1 + erf(x / sqrt 2))`).
    Gelu,
    /// GELU with the tanh approximation (GPT-2's).
    GeluTanh,
    /// `x * sigmoid(x)`.
    Silu,
    /// `tanh(x)`.
    Tanh,
    /// `sigmoid(x)`.
    Sigmoid,
    /// `x`.
    Identity,
}

impl Activation {
    /// Applies the activation.
    pub fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu_with(GeluApprox::None),
            Activation::GeluTanh => x.gelu_with(GeluApprox::Tanh),
            Activation::Silu => x.silu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Identity => x.clone(),
        }
    }
}

impl Module for Activation {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.apply(x)
    }
}

/// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)` in training mode;
/// the identity at inference (the default mode). The mask is drawn on the host from the calling
/// thread's `kiln` generator, so it is an input of the step's graph and the graph's structure does not
/// change from step to step. Needs a concrete shape in training mode (a symbolic shape is an
/// error). The forward is [`functional::dropout`].
#[derive(Module)]
pub struct Dropout {
    /// The probability of zeroing an element.
    pub p: f64,
    /// Whether the layer is in training mode.
    #[training]
    pub training: bool,
}

impl Dropout {
    /// A dropout layer with probability `p`, in inference mode.
    pub fn new(p: f64) -> Dropout {
        Dropout { p, training: false }
    }
}

impl Module for Dropout {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        functional::dropout(x, self.p, self.training)
    }
}

/// Flattens every axis after the first: `[N, ...] -> [N, prod(...)]` (PyTorch's `nn.Flatten`).
#[derive(Clone, Copy, Debug, Default, Module)]
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Tensor {
        x.flatten(1, -1)
    }
}

//! Normalisation layers: `LayerNorm`, `RmsNorm` (over the last axis) and `BatchNorm2d`
//! (inference form, over the channel axis of `[N, C, H, W]`), each a call of its functional form.

use kiln::Tensor;

use crate::Module;
use crate::functional;
use crate::init;

/// The normalized shape of a norm layer: its weight's (concrete) dims. A weight with a symbolic
/// dim gives `[]`, which the functional form reports as an error naming the input's shape.
fn normalized_shape(weight: &Tensor) -> Vec<usize> {
    weight.dims().unwrap_or_default()
}

/// `(x - mean) / sqrt(var + eps) * weight + bias` over the trailing axes shaped like `weight`
/// (the last axis for [`LayerNorm::new`]), with the biased variance (PyTorch's `nn.LayerNorm`).
/// The forward is [`functional::layer_norm`].
#[derive(Module)]
pub struct LayerNorm {
    /// `[dim]`, initially ones.
    #[param]
    pub weight: Tensor,
    /// `[dim]`, initially zeros.
    #[param]
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A layer over a last axis of size `dim`.
    pub fn new(dim: usize, eps: f64) -> LayerNorm {
        LayerNorm { weight: init::filled(&[dim], 1.0), bias: init::filled(&[dim], 0.0), eps }
    }
}

impl Module for LayerNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        functional::layer_norm(x, &normalized_shape(&self.weight), Some(&self.weight), Some(&self.bias), self.eps)
    }
}

/// `x / sqrt(mean(x^2) + eps) * weight` over the trailing axes shaped like `weight` (the last axis
/// for [`RmsNorm::new`]; PyTorch's `nn.RMSNorm`). The forward is [`functional::rms_norm`].
#[derive(Module)]
pub struct RmsNorm {
    /// `[dim]`, initially ones.
    #[param]
    pub weight: Tensor,
    /// Added to the mean square.
    pub eps: f64,
}

impl RmsNorm {
    /// A layer over a last axis of size `dim`.
    pub fn new(dim: usize, eps: f64) -> RmsNorm {
        RmsNorm { weight: init::filled(&[dim], 1.0), eps }
    }
}

impl Module for RmsNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        functional::rms_norm(x, &normalized_shape(&self.weight), Some(&self.weight), Some(self.eps))
    }
}

/// Batch normalisation of `[N, C, H, W]` with the running statistics (PyTorch's
/// `nn.BatchNorm2d` in `eval()` mode): `(x - running_mean) / sqrt(running_var + eps) * weight +
/// bias` per channel. The statistics are buffers: saved and loaded, never trained. Training mode
/// also uses them (a frozen BatchNorm): `Module::forward` takes `&self`, so the layer cannot
/// update its running statistics; training with batch statistics is [`functional::batch_norm`]
/// with `training = true`, which replaces the running statistics it is lent.
#[derive(Module)]
pub struct BatchNorm2d {
    /// `[C]`, initially ones.
    #[param]
    pub weight: Tensor,
    /// `[C]`, initially zeros.
    #[param]
    pub bias: Tensor,
    /// `[C]` buffer, initially zeros.
    #[buffer]
    pub running_mean: Tensor,
    /// `[C]` buffer, initially ones.
    #[buffer]
    pub running_var: Tensor,
    /// Added to the variance.
    pub eps: f64,
}

impl BatchNorm2d {
    /// A layer over `channels` channels.
    pub fn new(channels: usize, eps: f64) -> BatchNorm2d {
        BatchNorm2d {
            weight: init::filled(&[channels], 1.0),
            bias: init::filled(&[channels], 0.0),
            running_mean: init::filled_buffer(&[channels], 0.0),
            running_var: init::filled_buffer(&[channels], 1.0),
            eps,
        }
    }
}

impl Module for BatchNorm2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        let (mut mean, mut var) = (self.running_mean.clone(), self.running_var.clone());
        functional::batch_norm(
            x,
            Some(&mut mean),
            Some(&mut var),
            Some(&self.weight),
            Some(&self.bias),
            false,
            0.1,
            self.eps,
        )
    }
}

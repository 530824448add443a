//! Normalisation layers: `LayerNorm`, `RmsNorm` (over the last axis) and `BatchNorm2d` (over
//! the channel axis of `[N, C, H, W]`, batch statistics in training mode), each a call of its
//! functional form.

use std::cell::RefCell;

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

/// Batch normalisation of `[N, C, H, W]` per channel, PyTorch's `nn.BatchNorm2d`:
/// [`functional::batch_norm`] with the layer's affine parameters and running statistics.
///
/// In training mode (`set_training(true)`; a new layer starts in eval mode, like every Kiln
/// layer, [`Trainer`] turns training on, [`predict`] and [`Predictor`] off) the batch's mean and biased variance normalize,
/// and every forward replaces the running statistics by `(1 - momentum) * running + momentum *
/// batch` (unbiased variance, no gradient). `forward` takes `&self`, so the statistics sit in a
/// `RefCell`; they are buffers (saved, loaded, never trained), and a training step compiled by
/// [`Trainer`] returns their new values from the same program. In eval mode the running statistics
/// normalize, folded into one scale and one shift per channel.
///
/// [`Trainer`]: crate::Trainer
/// [`predict`]: crate::predict
/// [`Predictor`]: crate::Predictor
#[derive(Module)]
pub struct BatchNorm2d {
    /// `[C]`, initially ones.
    #[param]
    pub weight: Tensor,
    /// `[C]`, initially zeros.
    #[param]
    pub bias: Tensor,
    /// `[C]` buffer, initially zeros; updated by a training-mode forward.
    #[buffer]
    pub running_mean: RefCell<Tensor>,
    /// `[C]` buffer, initially ones; updated by a training-mode forward.
    #[buffer]
    pub running_var: RefCell<Tensor>,
    /// Added to the variance.
    pub eps: f64,
    /// The weight of the batch's statistics in the running ones (PyTorch's default 0.1).
    pub momentum: f64,
    /// Batch statistics (and running-statistics updates) when true, running statistics when false.
    #[training]
    pub training: bool,
}

impl BatchNorm2d {
    /// A layer over `channels` channels, in eval mode, momentum 0.1.
    pub fn new(channels: usize, eps: f64) -> BatchNorm2d {
        BatchNorm2d {
            weight: init::filled(&[channels], 1.0),
            bias: init::filled(&[channels], 0.0),
            running_mean: RefCell::new(init::filled_buffer(&[channels], 0.0)),
            running_var: RefCell::new(init::filled_buffer(&[channels], 1.0)),
            eps,
            momentum: 0.1,
            training: false,
        }
    }
}

impl Module for BatchNorm2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor {
        let (mut mean, mut var) = (self.running_mean.borrow().clone(), self.running_var.borrow().clone());
        let y = functional::batch_norm(
            x,
            Some(&mut mean),
            Some(&mut var),
            Some(&self.weight),
            Some(&self.bias),
            self.training,
            self.momentum,
            self.eps,
        );
        if self.training && y.error().is_none() {
            *self.running_mean.borrow_mut() = mean;
            *self.running_var.borrow_mut() = var;
        }
        y
    }
}

//! Optimizers: SGD with momentum, Adam and AdamW, with PyTorch's update rules.
//!
//! An optimizer turns parameters and their gradients into *lazy* updated parameters, and keeps
//! its state (momentum buffers, moments) as tensors too; the caller realizes the new parameters
//! and [`Optimizer::state`] together with the loss, so a whole training step is one graph. The
//! state starts as tensors that hold zeros (not lazy constants), and values that change every step
//! (Adam's bias corrections) enter as one-element input tensors, not constants: every step's graph
//! then has the same structure and a device compiles it once.

use kiln::Tensor;

use crate::error::{NnError, Result};

/// A gradient-based optimizer.
pub trait Optimizer {
    /// The updated parameters (lazy) for `params` and their `grads`, in the same order. Also
    /// replaces the optimizer's state by its lazy next value (see [`Optimizer::state`]). The
    /// parameter list must be the same (same count, same shapes) every step.
    fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>>;

    /// The state tensors to realize together with the step's parameters.
    fn state(&self) -> Vec<Tensor>;

    /// The learning rate.
    fn learning_rate(&self) -> f64;

    /// Changes the learning rate (it enters each step's graph as an input, so this recompiles
    /// nothing).
    fn set_learning_rate(&mut self, lr: f64);
}

/// A tensor that holds zeros like `p` (data, so that it is an input of the step graph).
fn zeros_like(p: &Tensor) -> Result<Tensor> {
    let dims = p.dims()?;
    Ok(Tensor::from_vec(vec![0f32; dims.iter().product()], &dims).to_device(p.device())?)
}

/// A one-element `f32` input tensor on the device of `like` (or the default device).
fn scalar(value: f64, like: Option<&Tensor>) -> Result<Tensor> {
    let t = Tensor::scalar(value as f32);
    Ok(match like {
        Some(p) => t.to_device(p.device())?,
        None => t,
    })
}

fn check_lengths(params: &[Tensor], grads: &[Tensor], state: usize) -> Result<()> {
    if params.len() != grads.len() {
        return Err(NnError::Config(format!("{} parameters but {} gradients", params.len(), grads.len())));
    }
    if state != 0 && state != params.len() {
        return Err(NnError::Config(format!("the optimizer holds state for {state} parameters, got {}", params.len())));
    }
    Ok(())
}

/// Stochastic gradient descent with momentum, dampening 0 and optional Nesterov momentum and L2
/// weight decay (PyTorch's `optim.SGD`): `g += wd * p; buf = momentum * buf + g;
/// p -= lr * (nesterov ? g + momentum * buf : buf)`.
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0 disables the buffer).
    pub momentum: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    buffers: Vec<Tensor>,
}

impl Sgd {
    /// Plain SGD with momentum `momentum`.
    pub fn new(lr: f64, momentum: f64) -> Sgd {
        Sgd { lr, momentum, weight_decay: 0.0, nesterov: false, buffers: Vec::new() }
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>> {
        check_lengths(params, grads, self.buffers.len())?;
        if self.momentum != 0.0 && self.buffers.is_empty() {
            self.buffers = params.iter().map(zeros_like).collect::<Result<_>>()?;
        }
        let lr = scalar(self.lr, params.first())?;
        let mut out = Vec::with_capacity(params.len());
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let g = if self.weight_decay != 0.0 { g.add(p.mul(self.weight_decay)) } else { g.clone() };
            let direction = if self.momentum != 0.0 {
                let buf = self.buffers[i].mul(self.momentum).add(&g);
                self.buffers[i] = buf.clone();
                if self.nesterov { g.add(buf.mul(self.momentum)) } else { buf }
            } else {
                g
            };
            out.push(p.sub(direction.mul(&lr)));
        }
        Ok(out)
    }

    fn state(&self) -> Vec<Tensor> {
        self.buffers.clone()
    }

    fn learning_rate(&self) -> f64 {
        self.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.lr = lr;
    }
}

/// Adam (PyTorch's `optim.Adam`, no amsgrad), with decoupled weight decay when
/// `decoupled` (AdamW) and L2 decay added to the gradient otherwise.
struct AdamCore {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    decoupled: bool,
    steps: u64,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl AdamCore {
    fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>> {
        check_lengths(params, grads, self.m.len())?;
        if self.m.is_empty() {
            self.m = params.iter().map(zeros_like).collect::<Result<_>>()?;
            self.v = params.iter().map(zeros_like).collect::<Result<_>>()?;
        }
        self.steps += 1;
        let (b1, b2) = self.betas;
        let t = self.steps as i32;
        let bias_correction1 = 1.0 - b1.powi(t);
        let bias_correction2 = 1.0 - b2.powi(t);
        // Step-dependent values are inputs, so the graph is the same every step.
        let step_size = scalar(self.lr / bias_correction1, params.first())?;
        let bias_correction2_sqrt = scalar(bias_correction2.sqrt(), params.first())?;
        let decay = scalar(1.0 - self.lr * self.weight_decay, params.first())?;
        let mut out = Vec::with_capacity(params.len());
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let mut p = p.clone();
            let mut g = g.clone();
            if self.weight_decay != 0.0 {
                if self.decoupled {
                    p = p.mul(&decay);
                } else {
                    g = g.add(p.mul(self.weight_decay));
                }
            }
            // PyTorch: m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, value = 1 - b2).
            let m = self.m[i].add(g.sub(&self.m[i]).mul(1.0 - b1));
            let v = self.v[i].mul(b2).add(g.mul(&g).mul(1.0 - b2));
            let denom = v.sqrt().div(&bias_correction2_sqrt).add(self.eps);
            out.push(p.sub(m.div(denom).mul(&step_size)));
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(out)
    }

    fn state(&self) -> Vec<Tensor> {
        self.m.iter().chain(&self.v).cloned().collect()
    }
}

/// Adam with L2 weight decay added to the gradient (PyTorch's `optim.Adam`).
pub struct Adam(AdamCore);

impl Adam {
    /// Adam with learning rate `lr`, betas `(0.9, 0.999)`, eps `1e-8`, no weight decay.
    pub fn new(lr: f64) -> Adam {
        Adam::with(lr, (0.9, 0.999), 1e-8, 0.0)
    }

    /// Adam with every hyperparameter given.
    pub fn with(lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64) -> Adam {
        Adam(AdamCore { lr, betas, eps, weight_decay, decoupled: false, steps: 0, m: Vec::new(), v: Vec::new() })
    }

    /// How many steps have been taken.
    pub fn steps(&self) -> u64 {
        self.0.steps
    }
}

/// Adam with decoupled weight decay, `p *= 1 - lr * wd` before the Adam update (PyTorch's
/// `optim.AdamW`).
pub struct AdamW(AdamCore);

impl AdamW {
    /// AdamW with learning rate `lr`, betas `(0.9, 0.999)`, eps `1e-8` and weight decay `0.01`
    /// (PyTorch's defaults).
    pub fn new(lr: f64) -> AdamW {
        AdamW::with(lr, (0.9, 0.999), 1e-8, 0.01)
    }

    /// AdamW with every hyperparameter given.
    pub fn with(lr: f64, betas: (f64, f64), eps: f64, weight_decay: f64) -> AdamW {
        AdamW(AdamCore { lr, betas, eps, weight_decay, decoupled: true, steps: 0, m: Vec::new(), v: Vec::new() })
    }

    /// How many steps have been taken.
    pub fn steps(&self) -> u64 {
        self.0.steps
    }
}

macro_rules! adam_optimizer {
    ($t:ty) => {
        impl Optimizer for $t {
            fn step(&mut self, params: &[Tensor], grads: &[Tensor]) -> Result<Vec<Tensor>> {
                self.0.step(params, grads)
            }
            fn state(&self) -> Vec<Tensor> {
                self.0.state()
            }
            fn learning_rate(&self) -> f64 {
                self.0.lr
            }
            fn set_learning_rate(&mut self, lr: f64) {
                self.0.lr = lr;
            }
        }
    };
}
adam_optimizer!(Adam);
adam_optimizer!(AdamW);

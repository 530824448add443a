//! Optimizers: SGD with momentum, Adam and AdamW, with PyTorch's update rules.
//!
//! An optimizer owns its state (momentum buffers, moments). [`Optimizer::step`] builds the new
//! parameters and the new state lazily and realizes them *together*, with whatever else the
//! caller passes (the loss), as one program; only then does the optimizer keep the new state.
//! There is no way to take a step and leave the state lazy, which would chain every step's update
//! onto the last one: the graph would grow each step and recompile every time. The state starts
//! as tensors that hold zeros (not lazy constants), and values that change every step (Adam's
//! bias corrections, the learning rate) enter as one-element input tensors, not constants: every
//! step's graph then has the same structure and a device compiles it once.

use kiln::Tensor;

use crate::error::{NnError, Result};

/// How a step's tensors are computed: all of them as one program, returned realized and in
/// order. [`Optimizer::step`] uses `kiln::realize`; a caller with its own device (a benchmark
/// runner) passes its own with [`Optimizer::step_with`].
pub type Realize<'a> = dyn FnMut(&[&Tensor]) -> Result<Vec<Tensor>> + 'a;

/// What a step produced: the new parameters and the extra outputs, all realized.
#[derive(Debug)]
pub struct Step {
    /// The updated parameters, in the order of the `params` given to the step.
    pub params: Vec<Tensor>,
    /// The `outputs` given to the step (the loss), realized in the same program.
    pub outputs: Vec<Tensor>,
}

/// What one step of an optimizer reads besides the parameters and gradients: its state (momentum
/// buffers, moments; realized) and the per-step scalars (learning rate, bias corrections), each a
/// one-element `f32` tensor that holds data, so that every step's graph has the same structure.
#[derive(Debug, Clone)]
pub struct StepInputs {
    /// The state tensors, in the optimizer's order (what [`Optimizer::state`] returns after the
    /// step).
    pub state: Vec<Tensor>,
    /// The per-step scalars.
    pub scalars: Vec<Tensor>,
}

/// A gradient-based optimizer that owns its state.
///
/// A step is functional underneath: [`Optimizer::inputs`] gives the state and the step's
/// scalars, [`Optimizer::update`] builds the new parameters and state lazily from tensors only
/// (so a compiled training step, `nn::Trainer`'s, can trace it on placeholders), and
/// [`Optimizer::commit`] keeps the realized new state. [`Optimizer::step`] does the three.
pub trait Optimizer {
    /// The state and scalars of the next step for `params` (the state starts as zeros on the
    /// first step).
    fn inputs(&self, params: &[Tensor]) -> Result<StepInputs>;

    /// The lazy new parameters and new state of one step from the parameters, their gradients
    /// (same order) and the step's inputs (or stand-ins of the same types).
    fn update(&self, params: &[Tensor], grads: &[Tensor], inputs: &StepInputs) -> Result<(Vec<Tensor>, Vec<Tensor>)>;

    /// Keeps the realized new state of a step that ran, and counts the step.
    fn commit(&mut self, state: Vec<Tensor>);

    /// One update of `params` with their `grads` (lazy, same order): realizes the new parameters,
    /// the optimizer's new state and `outputs` (typically the loss those gradients come from) as
    /// one program, keeps the new state, and returns the new parameters and realized outputs. The
    /// parameter list must be the same (same count, same shapes) every step. On an error the
    /// optimizer's state is unchanged.
    fn step(&mut self, params: &[Tensor], grads: &[Tensor], outputs: &[&Tensor]) -> Result<Step> {
        self.step_with(params, grads, outputs, &mut |tensors: &[&Tensor]| {
            kiln::realize(tensors)?;
            Ok(tensors.iter().map(|t| (*t).clone()).collect())
        })
    }

    /// [`Optimizer::step`] with the program run by `realize`.
    fn step_with(
        &mut self,
        params: &[Tensor],
        grads: &[Tensor],
        outputs: &[&Tensor],
        realize: &mut Realize<'_>,
    ) -> Result<Step> {
        let inputs = self.inputs(params)?;
        let (new_params, new_state) = self.update(params, grads, &inputs)?;
        let (step, state) = run_step(new_params, new_state, outputs, realize)?;
        self.commit(state);
        Ok(step)
    }

    /// The optimizer's state tensors (realized; empty before the first step).
    fn state(&self) -> Vec<Tensor>;

    /// Replaces the state with `state` (what [`Optimizer::state`] returned) and the count of
    /// steps taken with `steps`: resuming from a checkpoint. An error if `state` cannot be this
    /// optimizer's (a wrong number of tensors); the optimizer is then unchanged.
    fn restore(&mut self, state: Vec<Tensor>, steps: u64) -> Result<()>;

    /// The learning rate.
    fn learning_rate(&self) -> f64;

    /// Changes the learning rate (it enters each step's graph as an input, so this recompiles
    /// nothing).
    fn set_learning_rate(&mut self, lr: f64);
}

/// Realizes `new_params`, `new_state` and `outputs` as one program with `realize`, and splits the
/// realized tensors back into `(step, state)`.
fn run_step(
    new_params: Vec<Tensor>,
    new_state: Vec<Tensor>,
    outputs: &[&Tensor],
    realize: &mut Realize<'_>,
) -> Result<(Step, Vec<Tensor>)> {
    let mut all: Vec<&Tensor> = Vec::with_capacity(new_params.len() + new_state.len() + outputs.len());
    all.extend(outputs.iter().copied());
    all.extend(new_params.iter());
    all.extend(new_state.iter());
    let expected = all.len();
    // Without gradient tracking, as PyTorch's `optimizer.step()`: parameters marked
    // `requires_grad_` would otherwise make the new ones keep the step's graph (and through it every
    // older parameter) for a `backward` that never comes.
    let realized = kiln::no_grad(|| realize(&all))?;
    if realized.len() != expected {
        return Err(NnError::Config(format!("realize returned {} tensors for {expected}", realized.len())));
    }
    let mut realized = realized.into_iter();
    let outputs = realized.by_ref().take(outputs.len()).collect();
    let params = realized.by_ref().take(new_params.len()).collect();
    let state = realized.collect();
    Ok((Step { params, outputs }, state))
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
    /// State: the momentum buffers (none without momentum). Scalars: the learning rate.
    fn inputs(&self, params: &[Tensor]) -> Result<StepInputs> {
        let state = if self.momentum != 0.0 && self.buffers.is_empty() {
            params.iter().map(zeros_like).collect::<Result<_>>()?
        } else {
            self.buffers.clone()
        };
        Ok(StepInputs { state, scalars: vec![scalar(self.lr, params.first())?] })
    }

    fn update(&self, params: &[Tensor], grads: &[Tensor], inputs: &StepInputs) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        let buffers = &inputs.state;
        check_lengths(params, grads, buffers.len())?;
        let lr = scalar_input(inputs, 0)?;
        let mut out = Vec::with_capacity(params.len());
        let mut next = Vec::with_capacity(buffers.len());
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let g = if self.weight_decay != 0.0 { g.add(p.mul(self.weight_decay)) } else { g.clone() };
            let direction = if self.momentum != 0.0 {
                let buf = buffers[i].mul(self.momentum).add(&g);
                next.push(buf.clone());
                if self.nesterov { g.add(buf.mul(self.momentum)) } else { buf }
            } else {
                g
            };
            out.push(p.sub(direction.mul(lr)));
        }
        Ok((out, next))
    }

    fn commit(&mut self, state: Vec<Tensor>) {
        self.buffers = state;
    }

    fn state(&self) -> Vec<Tensor> {
        self.buffers.clone()
    }

    /// SGD's update does not depend on the step count: `steps` is not kept.
    fn restore(&mut self, state: Vec<Tensor>, _steps: u64) -> Result<()> {
        if self.momentum == 0.0 && !state.is_empty() {
            return Err(NnError::Config(format!("SGD without momentum has no state, got {} tensors", state.len())));
        }
        self.buffers = state;
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.lr = lr;
    }
}

/// Scalar `i` of a step's inputs.
fn scalar_input(inputs: &StepInputs, i: usize) -> Result<&Tensor> {
    inputs
        .scalars
        .get(i)
        .ok_or_else(|| NnError::Config(format!("the step has {} scalars, not {}", inputs.scalars.len(), i + 1)))
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
    /// State: `m` then `v`. Scalars: the step size `lr / (1 - b1^t)`, `sqrt(1 - b2^t)` and the
    /// decoupled decay factor `1 - lr * wd`, for step `t = steps + 1`.
    fn inputs(&self, params: &[Tensor]) -> Result<StepInputs> {
        let state = if self.m.is_empty() {
            let zeros = || params.iter().map(zeros_like).collect::<Result<Vec<_>>>();
            let mut state = zeros()?;
            state.extend(zeros()?);
            state
        } else {
            self.state()
        };
        let (b1, b2) = self.betas;
        let t = i32::try_from(self.steps + 1).unwrap_or(i32::MAX);
        let bias_correction1 = 1.0 - b1.powi(t);
        let bias_correction2 = 1.0 - b2.powi(t);
        let like = params.first();
        let scalars = vec![
            scalar(self.lr / bias_correction1, like)?,
            scalar(bias_correction2.sqrt(), like)?,
            scalar(1.0 - self.lr * self.weight_decay, like)?,
        ];
        Ok(StepInputs { state, scalars })
    }

    /// The lazy new parameters and moments (`m` then `v`).
    fn update(&self, params: &[Tensor], grads: &[Tensor], inputs: &StepInputs) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        if inputs.state.len() != 2 * params.len() {
            return Err(NnError::Config(format!(
                "Adam's state holds {} tensors for {} parameters",
                inputs.state.len(),
                params.len()
            )));
        }
        let (m_old, v_old) = inputs.state.split_at(params.len());
        check_lengths(params, grads, m_old.len())?;
        let (b1, b2) = self.betas;
        let step_size = scalar_input(inputs, 0)?;
        let bias_correction2_sqrt = scalar_input(inputs, 1)?;
        let decay = scalar_input(inputs, 2)?;
        let mut out = Vec::with_capacity(params.len());
        let (mut m_new, mut v_new) = (Vec::with_capacity(params.len()), Vec::with_capacity(params.len()));
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let mut p = p.clone();
            let mut g = g.clone();
            if self.weight_decay != 0.0 {
                if self.decoupled {
                    p = p.mul(decay);
                } else {
                    g = g.add(p.mul(self.weight_decay));
                }
            }
            // PyTorch: m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, value = 1 - b2).
            let m = m_old[i].add(g.sub(&m_old[i]).mul(1.0 - b1));
            let v = v_old[i].mul(b2).add(g.mul(&g).mul(1.0 - b2));
            let denom = v.sqrt().div(bias_correction2_sqrt).add(self.eps);
            out.push(p.sub(m.div(denom).mul(step_size)));
            m_new.push(m);
            v_new.push(v);
        }
        m_new.extend(v_new);
        Ok((out, m_new))
    }

    fn commit(&mut self, mut state: Vec<Tensor>) {
        self.v = state.split_off(state.len() / 2);
        self.m = state;
        self.steps += 1;
    }

    fn state(&self) -> Vec<Tensor> {
        self.m.iter().chain(&self.v).cloned().collect()
    }

    fn restore(&mut self, mut state: Vec<Tensor>, steps: u64) -> Result<()> {
        if !state.len().is_multiple_of(2) {
            return Err(NnError::Config(format!("Adam's state is m then v, not {} tensors", state.len())));
        }
        self.v = state.split_off(state.len() / 2);
        self.m = state;
        self.steps = steps;
        Ok(())
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
            fn inputs(&self, params: &[Tensor]) -> Result<StepInputs> {
                self.0.inputs(params)
            }
            fn update(
                &self,
                params: &[Tensor],
                grads: &[Tensor],
                inputs: &StepInputs,
            ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
                self.0.update(params, grads, inputs)
            }
            fn commit(&mut self, state: Vec<Tensor>) {
                self.0.commit(state)
            }
            fn state(&self) -> Vec<Tensor> {
                self.0.state()
            }
            fn restore(&mut self, state: Vec<Tensor>, steps: u64) -> Result<()> {
                self.0.restore(state, steps)
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

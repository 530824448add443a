//! Training and inference loops: [`Trainer`] (one compiled program per step), [`Predictor`] (a
//! compiled forward pass) and [`predict`] (one forward pass, realized).
//!
//! A step builds, lazily, `loss = loss_fn(model(x), y)` (a built-in [`Loss`] or any closure, see
//! [`LossFn`]), the gradients `kiln::grad(loss, params)` and the optimizer's update
//! ([`Optimizer::update`]), and returns the loss, the new parameters and the optimizer's new
//! state from one `kiln::jit` function: forward, backward and update run as one program, the
//! forward pass runs once, and the step is traced and compiled once per batch shape. The
//! parameters, buffers, optimizer state and per-step scalars are the function's arguments, so
//! nothing it reads is a stale constant.

use kiln::{JitCache, Tensor};

use crate::error::{NnError, Result};
use crate::loss::Loss;
use crate::module::{Module, ModuleParams, ParamKind};
use crate::optim::{Optimizer, StepInputs};

/// A training loss: `(prediction, target) -> loss`, a one-element float tensor. Implemented by
/// [`Loss`] and by every closure `FnMut(&Tensor, &Tensor) -> Tensor`.
pub trait LossFn {
    /// The loss of `prediction` against `target` (lazy).
    fn loss(&mut self, prediction: &Tensor, target: &Tensor) -> Tensor;
}

impl LossFn for Loss {
    fn loss(&mut self, prediction: &Tensor, target: &Tensor) -> Tensor {
        self.compute(prediction, target)
    }
}

impl<F: FnMut(&Tensor, &Tensor) -> Tensor> LossFn for F {
    fn loss(&mut self, prediction: &Tensor, target: &Tensor) -> Tensor {
        self(prediction, target)
    }
}

/// The model's output for `x`, realized, with gradients disabled and dropout off for the call.
/// Traces and compiles on every call it is not cached for; a loop that predicts again and again
/// uses a [`Predictor`], which runs the compiled forward pass directly.
pub fn predict(model: &mut dyn Module, x: &Tensor) -> Result<Tensor> {
    model.set_training(false);
    let y = kiln::no_grad(|| model.forward(x));
    y.realize()?;
    Ok(y)
}

/// Every parameter and buffer of `model`, in visit order.
pub(crate) fn model_tensors<M: ModuleParams + ?Sized>(model: &M) -> Vec<Tensor> {
    let mut tensors = Vec::new();
    model.visit_tensors(&mut |t, _| tensors.push(t.clone()));
    tensors
}

/// Runs `f` with the parameters and buffers of `model` replaced by `tensors` (in visit order,
/// stand-ins of the same types: the placeholders of a `kiln::jit` trace), then puts the model's
/// own tensors back. This is how a compiled forward pass takes the weights as arguments.
pub(crate) fn with_tensors<M: ModuleParams + ?Sized, R>(
    model: &mut M,
    tensors: &[Tensor],
    f: impl FnOnce(&M) -> R,
) -> Result<R> {
    let mut own = Vec::with_capacity(tensors.len());
    let mut given = tensors.iter();
    model.visit_mut(&mut |_, t, _| {
        if let Some(g) = given.next() {
            own.push(std::mem::replace(t, g.clone()));
        }
    });
    let result = if own.len() == tensors.len() && given.next().is_none() {
        Ok(f(&*model))
    } else {
        Err(NnError::Config(format!("the model has {} tensors, not {}", own.len(), tensors.len())))
    };
    let mut own = own.into_iter();
    model.visit_mut(&mut |_, t, _| {
        if let Some(o) = own.next() {
            *t = o;
        }
    });
    result
}

/// [`with_tensors`], also returning the buffers `f` replaced (a training-mode BatchNorm's running
/// statistics): their positions in visit order and their new values, which a compiled step
/// returns as outputs so that the update is not lost when the model's own tensors come back.
pub(crate) fn with_tensors_updating<M: ModuleParams + ?Sized, R>(
    model: &mut M,
    tensors: &[Tensor],
    f: impl FnOnce(&M) -> R,
) -> Result<(R, Vec<(usize, Tensor)>)> {
    with_tensors(model, tensors, |m| {
        let result = f(m);
        let mut updated = Vec::new();
        let mut i = 0;
        m.visit(&mut |_, t, kind| {
            if kind == ParamKind::Buffer && tensors.get(i).is_some_and(|given| !Tensor::ptr_eq(given, t)) {
                updated.push((i, t.clone()));
            }
            i += 1;
        });
        (result, updated)
    })
}

/// Writes `values` into the model's tensors at the visit positions `at` (the buffers a compiled
/// step updated, see [`with_tensors_updating`]).
pub(crate) fn set_tensors<M: ModuleParams + ?Sized>(model: &mut M, at: &[usize], values: Vec<Tensor>) {
    let mut values = at.iter().copied().zip(values).peekable();
    let mut i = 0;
    model.visit_mut(&mut |_, t, _| {
        if let Some((_, v)) = values.next_if(|(at, _)| *at == i) {
            *t = v;
        }
        i += 1;
    });
}

/// A model's forward pass compiled once per input signature (`kiln::jit`): the model's
/// parameters and buffers are arguments of the compiled function, not constants, so predicting
/// after the weights changed (training, `load`) uses the new weights without tracing again.
/// A call costs the run plus a few microseconds, whatever the size of the model's graph.
#[derive(Default)]
pub struct Predictor {
    jit: JitCache,
}

impl Predictor {
    /// A predictor with nothing compiled yet.
    pub fn new() -> Predictor {
        Predictor::default()
    }

    /// [`predict`]: the model's output for `x`, realized, gradients disabled and dropout off.
    pub fn predict(&mut self, model: &mut dyn Module, x: &Tensor) -> Result<Tensor> {
        model.set_training(false);
        let tensors = model_tensors(model);
        let mut args: Vec<&Tensor> = Vec::with_capacity(1 + tensors.len());
        args.push(x);
        args.extend(&tensors);
        let out = self.jit.call(&args, |a: &[Tensor]| -> Result<Tensor> {
            with_tensors(model, &a[1..], |m| kiln::no_grad(|| m.forward(&a[0])))
        })?;
        out.into_iter().next().ok_or_else(|| NnError::Config("the compiled forward pass returned nothing".into()))
    }

    /// How many times the forward pass was traced (once per input signature).
    pub fn traces(&self) -> usize {
        self.jit.traces()
    }
}

/// A model, an optimizer and a loss, trained step by step.
///
/// A step (forward, loss, `kiln::grad`, the optimizer's update) is one compiled function
/// (`kiln::jit`) of the batch, the parameters, the buffers and the optimizer's state and scalars:
/// traced on the first step with a given batch shape, then run directly, so a step costs the
/// program's run and a few microseconds, and the new parameters and state are written into the
/// storage of the ones two steps back (nothing is allocated in the steady state).
pub struct Trainer<M: Module, O: Optimizer> {
    /// The model being trained (its parameters are replaced after every step).
    pub model: M,
    /// The optimizer (its state is realized with every step).
    pub optimizer: O,
    loss: Box<dyn LossFn>,
    steps: u64,
    jit: JitCache,
    /// Visit positions of the buffers the step updates (found when the step is traced).
    updated_buffers: Vec<usize>,
}

impl<M: Module, O: Optimizer> Trainer<M, O> {
    /// A trainer with the loss `loss`: a [`Loss`] or any closure `(prediction, target) -> loss`.
    /// The model is put in training mode.
    pub fn new(mut model: M, optimizer: O, loss: impl LossFn + 'static) -> Trainer<M, O> {
        model.set_training(true);
        Trainer { model, optimizer, loss: Box::new(loss), steps: 0, jit: JitCache::new(), updated_buffers: Vec::new() }
    }

    /// How many structurally different step graphs have been compiled: 1 when every step reused
    /// the first step's program (a new batch shape traces the step again).
    pub fn distinct_step_graphs(&self) -> usize {
        self.jit.traces()
    }

    /// The number of nodes in the last step's graph: the same every step when nothing leaks from
    /// one step into the next.
    pub fn last_step_nodes(&self) -> usize {
        self.jit.last_graph_nodes()
    }

    /// How many steps have been taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One training step on the batch `(x, y)`: returns the loss before the update.
    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<f32> {
        let tensors = model_tensors(&self.model);
        let mut kinds = Vec::with_capacity(tensors.len());
        self.model.visit(&mut |_, _, kind| kinds.push(kind));
        let params: Vec<Tensor> =
            tensors.iter().zip(&kinds).filter(|(_, k)| **k == ParamKind::Weight).map(|(t, _)| t.clone()).collect();
        let inputs = self.optimizer.inputs(&params)?;
        let (n_tensors, n_state) = (tensors.len(), inputs.state.len());
        let mut args: Vec<&Tensor> = vec![x, y];
        args.extend(&tensors);
        args.extend(&inputs.state);
        args.extend(&inputs.scalars);
        let (model, optimizer, loss_fn) = (&mut self.model, &self.optimizer, &mut self.loss);
        let updated_buffers = &mut self.updated_buffers;
        let out = self.jit.call(&args, |a: &[Tensor]| -> Result<Vec<Tensor>> {
            let (x, y) = (&a[0], &a[1]);
            let stand_ins = &a[2..2 + n_tensors];
            let step = StepInputs {
                state: a[2 + n_tensors..2 + n_tensors + n_state].to_vec(),
                scalars: a[2 + n_tensors + n_state..].to_vec(),
            };
            let params: Vec<Tensor> = stand_ins
                .iter()
                .zip(&kinds)
                .filter(|(_, k)| **k == ParamKind::Weight)
                .map(|(t, _)| t.clone())
                .collect();
            let (loss, buffers) = with_tensors_updating(model, stand_ins, |m| loss_fn.loss(&m.forward(x), y))?;
            let refs: Vec<&Tensor> = params.iter().collect();
            let grads = kiln::grad(&loss, &refs)?;
            let (new_params, new_state) = optimizer.update(&params, &grads, &step)?;
            let mut out = Vec::with_capacity(1 + new_params.len() + new_state.len() + buffers.len());
            out.push(loss);
            out.extend(new_params);
            out.extend(new_state);
            *updated_buffers = buffers.iter().map(|(i, _)| *i).collect();
            out.extend(buffers.into_iter().map(|(_, t)| t));
            Ok(out)
        })?;
        if out.len() != 1 + params.len() + n_state + self.updated_buffers.len() {
            return Err(NnError::Config("the model's parameter list changed during a step".into()));
        }
        let mut out = out.into_iter();
        let loss = out.next().expect("length checked above");
        let mut new_params = out.by_ref().take(params.len());
        self.model.visit_mut(&mut |_, t, kind| {
            if kind == ParamKind::Weight
                && let Some(p) = new_params.next()
            {
                *t = p.requires_grad_();
            }
        });
        self.optimizer.commit(out.by_ref().take(n_state).collect());
        set_tensors(&mut self.model, &self.updated_buffers, out.collect());
        self.steps += 1;
        Ok(loss.item::<f32>()?)
    }

    /// `epochs` passes over `batches`; returns every step's loss.
    pub fn fit(&mut self, batches: &[(Tensor, Tensor)], epochs: usize) -> Result<Vec<f32>> {
        let mut losses = Vec::with_capacity(batches.len() * epochs);
        for _ in 0..epochs {
            for (x, y) in batches {
                losses.push(self.step(x, y)?);
            }
        }
        Ok(losses)
    }
}

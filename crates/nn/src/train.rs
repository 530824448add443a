//! Training and inference loops: [`Trainer`] (one realized graph per step) and [`predict`].
//!
//! A step builds, lazily, `loss = loss_fn(model(x), y)` (a built-in [`Loss`] or any closure, see
//! [`LossFn`]) and the gradients `kiln::grad(loss, params)`, and hands them to
//! [`Optimizer::step`], which realizes the loss, the new parameters and the optimizer's new state
//! with one `kiln::realize`: forward, backward and update run as one graph and the forward pass
//! runs once.
//! The new parameters are realized tensors, so the next step's graph reads them as inputs and has
//! the same structure as this one: a device with a program cache compiles the training step once.

use std::collections::HashSet;

use kiln::{GraphKey, Tensor};

use crate::error::{NnError, Result};
use crate::loss::Loss;
use crate::module::{Module, ParamKind};
use crate::optim::Optimizer;

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
pub fn predict(model: &mut dyn Module, x: &Tensor) -> Result<Tensor> {
    model.set_training(false);
    let y = kiln::no_grad(|| model.forward(x));
    y.realize()?;
    Ok(y)
}

/// A model, an optimizer and a loss, trained step by step.
pub struct Trainer<M: Module, O: Optimizer> {
    /// The model being trained (its parameters are replaced after every step).
    pub model: M,
    /// The optimizer (its state is realized with every step).
    pub optimizer: O,
    loss: Box<dyn LossFn>,
    steps: u64,
    last_step_nodes: usize,
    track_graphs: bool,
    structures: HashSet<GraphKey>,
}

impl<M: Module, O: Optimizer> Trainer<M, O> {
    /// A trainer with the loss `loss`: a [`Loss`] or any closure `(prediction, target) -> loss`.
    /// The model is put in training mode.
    pub fn new(mut model: M, optimizer: O, loss: impl LossFn + 'static) -> Trainer<M, O> {
        model.set_training(true);
        Trainer {
            model,
            optimizer,
            loss: Box::new(loss),
            steps: 0,
            last_step_nodes: 0,
            track_graphs: false,
            structures: HashSet::new(),
        }
    }

    /// Records the structural key (`kiln::GraphKey`, what a device's program cache is keyed by) and
    /// the node count of every step's graph (see
    /// [`Trainer::distinct_step_graphs`] and [`Trainer::last_step_nodes`]). Costs one extra trace
    /// per step.
    pub fn track_graphs(&mut self, on: bool) {
        self.track_graphs = on;
    }

    /// How many structurally different step graphs have run since tracking was switched on: 1
    /// when every step reused the first step's program.
    pub fn distinct_step_graphs(&self) -> usize {
        self.structures.len()
    }

    /// The number of nodes in the last step's graph (0 unless [`Trainer::track_graphs`] is on):
    /// the same every step when nothing leaks from one step into the next.
    pub fn last_step_nodes(&self) -> usize {
        self.last_step_nodes
    }

    /// How many steps have been taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One training step on the batch `(x, y)`: returns the loss before the update.
    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<f32> {
        let params = self.model.parameters();
        let loss = self.loss.loss(&self.model.forward(x), y);
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = kiln::grad(&loss, &refs)?;
        let track = self.track_graphs;
        let (structures, nodes) = (&mut self.structures, &mut self.last_step_nodes);
        let step = self.optimizer.step_with(&params, &grads, &[&loss], &mut |tensors: &[&Tensor]| {
            if track {
                let program = kiln::trace(tensors)?;
                *nodes = program.graph.len();
                structures.insert(GraphKey::of(&program.graph));
            }
            kiln::realize(tensors)?;
            Ok(tensors.iter().map(|t| (*t).clone()).collect())
        })?;
        let mut next = step.params.into_iter();
        let mut missing = false;
        self.model.visit_mut(&mut |_, t, kind| {
            if kind == ParamKind::Weight {
                match next.next() {
                    Some(p) => *t = p.requires_grad_(),
                    None => missing = true,
                }
            }
        });
        if missing || next.next().is_some() {
            return Err(NnError::Config("the model's parameter list changed during a step".into()));
        }
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

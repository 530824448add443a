//! Training and inference loops: [`Trainer`] (one realized graph per step) and [`predict`].
//!
//! A step builds, lazily, `loss = loss_fn(model(x), y)`, the gradients `kiln::grad(loss,
//! params)`, and the optimizer's new parameters and state, then realizes all of them with one
//! `kiln::realize`: forward, backward and update run as one graph and the forward pass runs once.
//! The new parameters are realized tensors, so the next step's graph reads them as inputs and has
//! the same structure as this one: a device with a program cache compiles the training step once.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use kiln::Tensor;

use crate::error::{NnError, Result};
use crate::loss::Loss;
use crate::module::{Module, ParamKind};
use crate::optim::Optimizer;

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
    /// The loss function.
    pub loss: Loss,
    steps: u64,
    track_graphs: bool,
    structures: HashSet<u64>,
}

impl<M: Module, O: Optimizer> Trainer<M, O> {
    /// A trainer; the model is put in training mode.
    pub fn new(mut model: M, optimizer: O, loss: Loss) -> Trainer<M, O> {
        model.set_training(true);
        Trainer { model, optimizer, loss, steps: 0, track_graphs: false, structures: HashSet::new() }
    }

    /// Records a structural hash of every step's graph (see [`Trainer::distinct_step_graphs`]).
    /// Costs one extra trace per step.
    pub fn track_graphs(&mut self, on: bool) {
        self.track_graphs = on;
    }

    /// How many structurally different step graphs have run since tracking was switched on: 1
    /// when every step reused the first step's program.
    pub fn distinct_step_graphs(&self) -> usize {
        self.structures.len()
    }

    /// How many steps have been taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One training step on the batch `(x, y)`: returns the loss before the update.
    pub fn step(&mut self, x: &Tensor, y: &Tensor) -> Result<f32> {
        let params = self.model.parameters();
        let loss = self.loss.compute(&self.model.forward(x), y);
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = kiln::grad(&loss, &refs)?;
        let new_params = self.optimizer.step(&params, &grads)?;
        let state = self.optimizer.state();
        let mut outputs: Vec<&Tensor> = vec![&loss];
        outputs.extend(new_params.iter());
        outputs.extend(state.iter());
        if self.track_graphs {
            self.structures.insert(structure_hash(&kiln::trace(&outputs)?));
        }
        kiln::realize(&outputs)?;
        let mut next = new_params.into_iter();
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

/// A hash of a graph's structure: ops, types and wiring in topological order, outputs by
/// position; node ids and input data do not enter (the same key a program cache uses).
fn structure_hash(program: &kiln::Program) -> u64 {
    let graph = &program.graph;
    let order = graph.topo_order();
    let mut position = std::collections::HashMap::with_capacity(order.len());
    let mut h = DefaultHasher::new();
    for (i, &id) in order.iter().enumerate() {
        position.insert(id, i);
        let node = graph.node(id);
        node.op.hash(&mut h);
        node.ty.hash(&mut h);
        for input in &node.inputs {
            position[input].hash(&mut h);
        }
    }
    for o in graph.outputs() {
        position[o].hash(&mut h);
    }
    h.finish()
}

//! The [`Module`] trait: a forward function plus a tree of named parameters.
//!
//! A module lists its own tensors and its children's under dotted names (`q.weight`, and
//! `blocks.0.attn.q.weight` from the model's root), in a fixed order: the order in which
//! `visit` reports them is the order optimizers keep their state in, so it must not depend on
//! anything but the module's structure.

use kiln::Tensor;

/// What a named tensor of a module is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A trainable parameter: optimizers update it, gradients are taken with respect to it.
    Weight,
    /// State that is saved and loaded but not trained (BatchNorm's running statistics).
    Buffer,
}

/// A layer or model.
pub trait Module {
    /// The output for input `x` (lazy: nothing runs until the result is realized). Shape and dtype
    /// errors come back as an error tensor, as with every `kiln` op.
    fn forward(&self, x: &Tensor) -> Tensor;

    /// Calls `f` with the name, tensor and kind of every parameter and buffer, children first in
    /// declaration order, names relative to this module.
    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind));

    /// Like [`Module::visit`], with mutable access to replace tensors (same order, same names).
    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind));

    /// Switches training behaviour (dropout) on or off. Containers pass it on to their children.
    fn set_training(&mut self, training: bool) {
        let _ = training;
    }

    /// Every trainable parameter with its name, in visit order.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.visit(&mut |name, t, kind| {
            if kind == ParamKind::Weight {
                out.push((name.to_string(), t.clone()));
            }
        });
        out
    }

    /// The trainable parameters, in visit order.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// The trainable parameters as a [`kiln::Tree`] keyed by their dotted names, so that tree ops
    /// (`map`, `zip_with`, lifted tensor ops) apply to every parameter at once and realize as one
    /// program: `model.parameter_tree()?.get("blocks.0.attn.q.weight")`.
    fn parameter_tree(&self) -> kiln::Result<kiln::Tree<Tensor>> {
        kiln::Tree::from_pairs(self.named_parameters())
    }

    /// Every parameter and buffer with its name and kind (what a weights file holds).
    fn state_dict(&self) -> Vec<(String, Tensor, ParamKind)> {
        let mut out = Vec::new();
        self.visit(&mut |name, t, kind| out.push((name.to_string(), t.clone(), kind)));
        out
    }

    /// Moves every parameter and buffer to `device` (their data is shared, not copied, where the
    /// device allows). All-or-nothing: on an error the module is unchanged.
    fn to_device(&mut self, device: kiln::Device) -> kiln::Result<()> {
        let mut moved = Vec::new();
        for (_, t, _) in self.state_dict() {
            moved.push(t.to_device(device)?);
        }
        let mut moved = moved.into_iter();
        self.visit_mut(&mut |_, t, kind| {
            if let Some(m) = moved.next() {
                *t = if kind == ParamKind::Weight { m.requires_grad_() } else { m };
            }
        });
        Ok(())
    }

    /// The number of trainable scalars (symbolic dims count as 0).
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|t| t.numel().ok().and_then(|n| n.as_const()).unwrap_or(0) as usize).sum()
    }
}

/// `prefix.name`, or `name` when `prefix` is empty.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") }
}

/// Visits `child`'s tensors under `prefix`.
pub(crate) fn visit_child(child: &dyn Module, prefix: &str, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
    child.visit(&mut |name, t, kind| f(&join(prefix, name), t, kind));
}

/// Visits `child`'s tensors mutably under `prefix`.
pub(crate) fn visit_child_mut(child: &mut dyn Module, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
    child.visit_mut(&mut |name, t, kind| f(&join(prefix, name), t, kind));
}

/// Modules applied one after another; children are named `0`, `1`, ... like PyTorch's
/// `nn.Sequential`.
#[derive(Default)]
pub struct Sequential {
    /// The layers, in order.
    pub layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty sequence.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends `layer`.
    pub fn push(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.layers.iter().fold(x.clone(), |x, layer| layer.forward(&x))
    }

    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        for (i, layer) in self.layers.iter().enumerate() {
            visit_child(layer.as_ref(), &i.to_string(), f);
        }
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        for (i, layer) in self.layers.iter_mut().enumerate() {
            visit_child_mut(layer.as_mut(), &i.to_string(), f);
        }
    }

    fn set_training(&mut self, training: bool) {
        for layer in &mut self.layers {
            layer.set_training(training);
        }
    }
}

//! The [`Module`] trait: a forward function plus a tree of named parameters.
//!
//! A module lists its own tensors and its children's under dotted names (`q.weight`, and
//! `blocks.0.attn.q.weight` from the model's root), in a fixed order: the order in which
//! `visit` reports them is the order optimizers keep their state in, so it must not depend on
//! anything but the module's structure.
//!
//! The tree is [`ModuleParams`], which a layer derives with `#[derive(Module)]` from attributes
//! on its fields (`#[param]`, `#[buffer]`, `#[module]`, `#[training]`; see `kiln-nn-derive`), so
//! each parameter is declared once; [`Module`] adds `forward` and everything built on the tree.

use kiln::Tensor;
use kiln_nn_derive::Module;

/// What a named tensor of a module is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A trainable parameter: optimizers update it, gradients are taken with respect to it.
    Weight,
    /// State that is saved and loaded but not trained (BatchNorm's running statistics).
    Buffer,
}

/// The named parameters and buffers of a module, and its training switch: what
/// `#[derive(Module)]` writes from the struct's field attributes.
pub trait ModuleParams {
    /// Calls `f` with the name, tensor and kind of every parameter and buffer, children first in
    /// declaration order, names relative to this module.
    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind));

    /// Like [`ModuleParams::visit`], with mutable access to replace tensors (same order, same
    /// names).
    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind));

    /// Like [`ModuleParams::visit`] without the names (same tensors, same order): what a
    /// compiled forward needs on every call, without building ~200 dotted names per call (25 us
    /// of a GPT-2-sized decoding step's host time did that). The derive writes it; the default
    /// goes through `visit`.
    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor, ParamKind)) {
        self.visit(&mut |_, t, kind| f(t, kind));
    }

    /// Switches training behaviour (dropout) on or off. Containers pass it on to their children.
    fn set_training(&mut self, training: bool) {
        let _ = training;
    }
}

/// A list of children, named `0`, `1`, ... under the field that holds it.
impl<T: ModuleParams> ModuleParams for Vec<T> {
    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        for (i, child) in self.iter().enumerate() {
            visit_child(child, &i.to_string(), f);
        }
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        for (i, child) in self.iter_mut().enumerate() {
            visit_child_mut(child, &i.to_string(), f);
        }
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor, ParamKind)) {
        self.iter().for_each(|child| child.visit_tensors(f));
    }

    fn set_training(&mut self, training: bool) {
        for child in self {
            child.set_training(training);
        }
    }
}

/// An optional child: nothing when absent.
impl<T: ModuleParams> ModuleParams for Option<T> {
    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        if let Some(child) = self {
            child.visit(f);
        }
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        if let Some(child) = self {
            child.visit_mut(f);
        }
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor, ParamKind)) {
        if let Some(child) = self {
            child.visit_tensors(f);
        }
    }

    fn set_training(&mut self, training: bool) {
        if let Some(child) = self {
            child.set_training(training);
        }
    }
}

/// A boxed child (`Box<dyn Module>`), visited as what it holds.
impl<T: ModuleParams + ?Sized> ModuleParams for Box<T> {
    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        self.as_ref().visit(f);
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        self.as_mut().visit_mut(f);
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor, ParamKind)) {
        self.as_ref().visit_tensors(f);
    }

    fn set_training(&mut self, training: bool) {
        self.as_mut().set_training(training);
    }
}

/// A layer or model: a forward function over its [`ModuleParams`].
pub trait Module: ModuleParams {
    /// The output for input `x` (lazy: nothing runs until the result is realized). Shape and dtype
    /// errors come back as an error tensor, as with every `kiln` op, naming the line that called
    /// `forward`: the method is `#[track_caller]` in every implementation (the attribute here
    /// applies to them all), so an op called directly in a `forward` body reports its caller's
    /// caller. Code inside a closure does not; helpers it calls must be `#[track_caller]` too.
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Tensor;

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

/// A boxed module (`Box<dyn Module>`) runs what it holds, so a trainer can own one.
impl<T: Module + ?Sized> Module for Box<T> {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.as_ref().forward(x)
    }
}

/// `prefix.name`, or `name` when `prefix` is empty.
/// Visits `child`'s tensors under `prefix` (none when `prefix` is empty).
pub fn visit_child(child: &(impl ModuleParams + ?Sized), prefix: &str, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
    // One name buffer per child, reused for each of its tensors (a compiled forward visits the
    // model on every call).
    let mut full = String::new();
    child.visit(&mut |name, t, kind| f(join_into(&mut full, prefix, name), t, kind));
}

/// `prefix.name` (or `name` alone) written into `buf`.
fn join_into<'a>(buf: &'a mut String, prefix: &str, name: &str) -> &'a str {
    buf.clear();
    if !prefix.is_empty() {
        buf.push_str(prefix);
        buf.push('.');
    }
    buf.push_str(name);
    buf
}

/// Visits `child`'s tensors mutably under `prefix` (none when `prefix` is empty).
pub fn visit_child_mut(
    child: &mut (impl ModuleParams + ?Sized),
    prefix: &str,
    f: &mut dyn FnMut(&str, &mut Tensor, ParamKind),
) {
    let mut full = String::new();
    child.visit_mut(&mut |name, t, kind| f(join_into(&mut full, prefix, name), t, kind));
}

/// What the code `#[derive(Module)]` generates calls; not an API of its own.
#[doc(hidden)]
pub mod __derive {
    use super::ParamKind;
    pub use super::{visit_child, visit_child_mut};
    pub use kiln::Tensor;

    /// A field holding a parameter or buffer: a tensor, or an optional one (visited when present).
    pub trait ParamSlot {
        /// Calls `f` with the tensor under `name`, if there is one.
        fn visit_slot(&self, name: &str, kind: ParamKind, f: &mut dyn FnMut(&str, &Tensor, ParamKind));
        /// Calls `f` with the tensor under `name` mutably, if there is one.
        fn visit_slot_mut(&mut self, name: &str, kind: ParamKind, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind));
        /// Calls `f` with the tensor, if there is one (no name).
        fn visit_slot_tensor(&self, kind: ParamKind, f: &mut dyn FnMut(&Tensor, ParamKind)) {
            self.visit_slot("", kind, &mut |_, t, kind| f(t, kind));
        }
    }

    impl ParamSlot for Tensor {
        fn visit_slot(&self, name: &str, kind: ParamKind, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
            f(name, self, kind);
        }

        fn visit_slot_tensor(&self, kind: ParamKind, f: &mut dyn FnMut(&Tensor, ParamKind)) {
            f(self, kind);
        }

        fn visit_slot_mut(&mut self, name: &str, kind: ParamKind, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
            f(name, self, kind);
        }
    }

    /// A buffer a `&self` forward updates (BatchNorm's running statistics).
    impl ParamSlot for std::cell::RefCell<Tensor> {
        fn visit_slot(&self, name: &str, kind: ParamKind, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
            f(name, &self.borrow(), kind);
        }

        fn visit_slot_mut(&mut self, name: &str, kind: ParamKind, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
            f(name, self.get_mut(), kind);
        }
    }

    impl ParamSlot for Option<Tensor> {
        fn visit_slot(&self, name: &str, kind: ParamKind, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
            if let Some(t) = self {
                f(name, t, kind);
            }
        }

        fn visit_slot_mut(&mut self, name: &str, kind: ParamKind, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
            if let Some(t) = self {
                f(name, t, kind);
            }
        }
    }
}

/// Modules applied one after another; children are named `0`, `1`, ... like PyTorch's
/// `nn.Sequential`.
#[derive(Default, Module)]
pub struct Sequential {
    /// The layers, in order.
    #[module(flatten)]
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
        // A loop, not `fold`: the closure would lose the caller's line.
        let mut x = x.clone();
        for layer in &self.layers {
            x = layer.forward(&x);
        }
        x
    }
}

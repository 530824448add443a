//! The lazy [`Tensor`] handle: an `Arc` to an immutable DAG node, plus the primitives every op
//! is built from.
//!
//! A node records an air [`Op`], its input tensors and its [`TensorType`]; nothing computes until
//! `realize`. A node that holds data (a source tensor, or a computed one after `realize`) keeps it
//! in a `OnceLock` and becomes an `Input` of any later graph. A computed node drops its inputs once
//! it is realized, so a long-running loop (`w = w - lr * g`) does not keep every old value alive
//! (a tensor computed from one marked `requires_grad_`, which `backward` may still need, keeps
//! them: see `autograd`).

use std::fmt;
use std::panic::Location;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use air::{Bindings, DType, Dim, HostTensor, Op, Scalar, Shape, TensorType};
use smallvec::SmallVec;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::shape::{concrete, show};

/// A lazy tensor: a cheap-to-clone handle to a node of a computation DAG.
///
/// Building ops only records nodes; [`Tensor::realize`], [`Tensor::to_vec`], [`Tensor::item`] and
/// [`Tensor::to_host`] compute. Ops never return `Result`: invalid inputs give an *error tensor*
/// (see [`Tensor::error`]) whose error `realize` returns.
#[must_use = "tensors are lazy: an unused tensor is never computed"]
#[derive(Clone)]
pub struct Tensor {
    pub(crate) inner: Arc<Inner>,
}

/// Data a realized node holds, with the symbol values its shape was evaluated with.
pub(crate) struct Realized {
    pub(crate) host: HostTensor,
    pub(crate) bindings: Bindings,
}

pub(crate) struct Inner {
    pub(crate) op: Op,
    /// The input tensors; emptied once the node is realized. Inline: no op has more than three,
    /// so recording a node allocates only its `Arc`.
    pub(crate) inputs: Mutex<Inputs>,
    pub(crate) ty: TensorType,
    pub(crate) device: Device,
    pub(crate) data: OnceLock<Realized>,
    /// Set on error tensors only; such a node has no inputs and a placeholder type.
    pub(crate) error: Option<Error>,
    /// The op the user called to build this node and where (`None` for sources and error
    /// tensors): `trace` keeps it per air node, so that a shape condition that fails only when
    /// the program runs still names the caller's line.
    pub(crate) site: Option<Site>,
    /// Set on an output of a call of a recorded function ([`crate::record`]): the call and which
    /// of the recording's outputs this is. Such a node's `inputs` are the call's arguments, and
    /// `op`, `ty` and `site` are those of the recorded output.
    pub(crate) call: Option<crate::record::Call>,
}

/// Constants remembered per thread by [`Tensor::const_operand`].
const CONST_SLOTS: usize = 64;

thread_local! {
    static CONSTS: std::cell::RefCell<Vec<Option<Tensor>>> = std::cell::RefCell::new(vec![None; CONST_SLOTS]);
}

/// A node's input tensors.
pub(crate) type Inputs = SmallVec<[Tensor; 3]>;

impl Drop for Inner {
    /// Drops the input DAG iteratively: a recursive drop of a chain of a million nodes would
    /// overflow the stack.
    fn drop(&mut self) {
        let inputs = std::mem::take(self.inputs.get_mut().unwrap_or_else(PoisonError::into_inner));
        if inputs.is_empty() {
            return;
        }
        let mut stack: SmallVec<[Tensor; 8]> = SmallVec::new();
        stack.extend(inputs);
        while let Some(mut t) = stack.pop() {
            // The last handle: its inputs move to the stack, and the node then drops in place
            // with none (no recursion, and the node is not moved out of its allocation). A node
            // the autograd registry also points to (weakly) is moved out instead.
            if let Some(inner) = Arc::get_mut(&mut t.inner) {
                stack.extend(std::mem::take(inner.inputs.get_mut().unwrap_or_else(PoisonError::into_inner)));
            } else if let Ok(mut inner) = Arc::try_unwrap(t.inner) {
                stack.extend(std::mem::take(inner.inputs.get_mut().unwrap_or_else(PoisonError::into_inner)));
            }
        }
    }
}

/// The op name and the caller's location, threaded through the primitives that build an op so
/// that an error names the op the user called and where.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Site {
    pub(crate) name: &'static str,
    pub(crate) loc: &'static Location<'static>,
}

impl Site {
    #[track_caller]
    pub(crate) fn here(name: &'static str) -> Site {
        Site { name, loc: Location::caller() }
    }

    pub(crate) fn error(self, message: impl Into<String>) -> Error {
        Error::op(self.name, message, self.loc)
    }

    /// An error tensor carrying `message`.
    pub(crate) fn fail(self, message: impl Into<String>) -> Tensor {
        Tensor::failed(self.error(message))
    }
}

impl Tensor {
    pub(crate) fn new_node(inner: Inner) -> Tensor {
        Tensor { inner: Arc::new(inner) }
    }

    /// An error tensor.
    pub(crate) fn failed(error: Error) -> Tensor {
        Tensor::new_node(Inner {
            op: Op::Const(air::op::Const { value: Scalar::Float(0.0) }),
            inputs: Mutex::new(Inputs::new()),
            ty: TensorType::new(DType::F32, Shape::new()),
            device: Device::default(),
            data: OnceLock::new(),
            error: Some(error),
            site: None,
            call: None,
        })
    }

    /// An error tensor from a library built on Kiln (a layer, a functional op): realizing it (or
    /// anything built from it) returns an [`Error::Op`] naming `op`, `message` and the caller's
    /// line, as Kiln's own ops do. Mark the function that calls this `#[track_caller]` so that
    /// the line is its caller's.
    #[track_caller]
    pub fn op_error(op: &'static str, message: impl Into<String>) -> Tensor {
        Site::here(op).fail(message)
    }

    /// A source tensor holding `host`, typed with `shape` (constant or symbolic dims that
    /// `bindings` evaluate to `host.shape`).
    pub(crate) fn source(host: HostTensor, shape: Shape, bindings: Bindings, device: Device) -> Tensor {
        let ty = TensorType::new(host.dtype(), shape);
        let data = OnceLock::new();
        let _ = data.set(Realized { host, bindings });
        Tensor::new_node(Inner {
            op: Op::Input(air::op::Input { slot: 0 }),
            inputs: Mutex::new(Inputs::new()),
            ty,
            device,
            data,
            error: None,
            site: None,
            call: None,
        })
    }

    /// [`Tensor::source`] in the allocation of `shell`, a source tensor whose data was taken
    /// (`kiln::jit` gives an array updated in place back in the handle it was given in, rather
    /// than allocating a node per call and freeing another); a new node when `shell` is shared
    /// or of another type or device.
    pub(crate) fn refill(
        mut shell: Tensor,
        host: HostTensor,
        shape: Shape,
        bindings: Bindings,
        device: Device,
    ) -> Tensor {
        let ty = TensorType::new(host.dtype(), shape);
        if let Some(inner) = Arc::get_mut(&mut shell.inner)
            && matches!(inner.op, Op::Input(_))
            && inner.data.get().is_none()
            && inner.error.is_none()
            && inner.device == device
            && inner.ty == ty
        {
            inner.site = None;
            let _ = inner.data.set(Realized { host, bindings });
            return shell;
        }
        Tensor::source(host, ty.shape, bindings, device)
    }

    /// A stand-in of type `ty` for an argument of a `kiln::jit` function while it is traced: an
    /// `Input` node without data. Ops on it record nodes as usual; realizing anything built from
    /// it outside its trace is an error.
    pub(crate) fn placeholder(ty: TensorType, device: Device) -> Tensor {
        Tensor::new_node(Inner {
            op: Op::Input(air::op::Input { slot: 0 }),
            inputs: Mutex::new(Inputs::new()),
            ty,
            device,
            data: OnceLock::new(),
            error: None,
            site: None,
            call: None,
        })
    }

    /// Whether this is a `kiln::jit` placeholder (see [`Tensor::placeholder`]).
    pub(crate) fn is_placeholder(&self) -> bool {
        matches!(self.inner.op, Op::Input(_)) && self.inner.data.get().is_none()
    }

    /// A leaf (`const` or `iota`) of type `ty`.
    pub(crate) fn leaf(site: Site, op: Op, ty: TensorType, device: Device) -> Tensor {
        if let Err(message) = op.check_leaf(&ty).and_then(|()| ty.checked_numel().map(drop)) {
            return site.fail(message);
        }
        Tensor::new_node(Inner {
            op,
            inputs: Mutex::new(Inputs::new()),
            ty,
            device,
            data: OnceLock::new(),
            error: None,
            site: Some(site),
            call: None,
        })
    }

    /// A constant tensor of `shape` filled with `value` (converted to `dtype`).
    pub(crate) fn constant(site: Site, value: Scalar, dtype: DType, shape: Shape, device: Device) -> Tensor {
        let op = Op::Const(air::op::Const { value: value.cast(dtype) });
        Tensor::leaf(site, op, TensorType::new(dtype, shape), device)
    }

    /// Applies the primitive `op` to `inputs`: passes on the first input error, rejects mixed
    /// devices, and turns a failed type rule into an error tensor naming `site`.
    pub(crate) fn apply(site: Site, op: Op, inputs: &[&Tensor]) -> Tensor {
        for t in inputs {
            if t.inner.error.is_some() {
                return (*t).clone();
            }
        }
        let device = inputs.first().map_or_else(Device::default, |t| t.device());
        if let Some(other) = inputs.iter().find(|t| t.device() != device) {
            return site.fail(format!("tensors are on different devices ({device} and {})", other.device()));
        }
        let types: SmallVec<[&TensorType; 3]> = inputs.iter().map(|t| &t.inner.ty).collect();
        // A result whose size overflows is an error here, where the shape is concrete; a
        // symbolic one is checked again once its symbols are bound, at realize.
        // The site names the op already: a primitive of the same name is not named twice.
        let inferred = op.infer(&types).map_err(|e| if e.op.name() == site.name { e.message } else { e.to_string() });
        match inferred.and_then(|ty| ty.checked_numel().map(|_| ty)) {
            Ok(ty) => Tensor::new_node(Inner {
                op,
                inputs: Mutex::new(inputs.iter().map(|t| (*t).clone()).collect()),
                ty,
                device,
                data: OnceLock::new(),
                error: None,
                site: Some(site),
                call: None,
            }),
            Err(message) => site.fail(message),
        }
    }

    // ----- accessors -----

    /// The shape; dims may be symbolic (`[seq, 64]`). An error tensor has shape `[]`.
    pub fn shape(&self) -> &Shape {
        &self.inner.ty.shape
    }

    /// The concrete dims. A symbolic dim is known only once the tensor holds data; before that
    /// this is an [`Error::Shape`]. An error tensor returns its error.
    pub fn dims(&self) -> Result<Vec<usize>> {
        self.check()?;
        if let Some(r) = self.inner.data.get() {
            if concrete(self.shape()).is_none() {
                // The values of symbols, which the tensor's type does not hold.
                crate::record::impure();
            }
            return Ok(r.host.shape.clone());
        }
        concrete(self.shape()).ok_or_else(|| {
            Error::Shape(format!("shape {} is symbolic; realize the tensor to learn it", show(self.shape())))
        })
    }

    /// Dim `axis` of the shape (negative counts from the end), or `None` if out of range.
    pub fn dim(&self, axis: isize) -> Option<&Dim> {
        crate::shape::normalize_axis(axis, self.ndim()).ok().map(|a| &self.shape()[a])
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.inner.ty.shape.len()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.inner.ty.dtype
    }

    /// The dtype and shape together.
    pub fn ty(&self) -> &TensorType {
        &self.inner.ty
    }

    /// The device this tensor's program runs on.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// The number of elements, as a (possibly symbolic) dim; an error tensor returns its error.
    ///
    /// Never a wrapped-around count: an op whose result has more elements than `i64` counts, or
    /// more bytes than any allocation can hold, gives an error tensor instead of a tensor (so
    /// `Tensor::ones(&[1 << 32, 1 << 32], DType::F32).numel()` is that error). A symbolic count
    /// is checked for its values when the tensor is realized.
    pub fn numel(&self) -> Result<Dim> {
        self.check()?;
        Ok(self.inner.ty.numel())
    }

    /// Whether this tensor holds data (a source tensor, or a computed one after `realize`).
    pub fn is_realized(&self) -> bool {
        self.inner.data.get().is_some()
    }

    /// The error this tensor carries, if an op that built it had invalid inputs.
    pub fn error(&self) -> Option<&Error> {
        self.inner.error.as_ref()
    }

    /// `Err` with this tensor's error, if it has one. Computes nothing.
    pub fn check(&self) -> Result<()> {
        match &self.inner.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Whether two handles point to the same node.
    pub fn ptr_eq(a: &Tensor, b: &Tensor) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }

    /// The symbol values recorded for this tensor's data (empty when it has none).
    pub fn bindings(&self) -> Bindings {
        let bindings = self.inner.data.get().map(|r| r.bindings.clone()).unwrap_or_default();
        if !bindings.is_empty() {
            crate::record::impure();
        }
        bindings
    }

    /// The input tensors of this node (empty for sources, leaves and realized tensors).
    pub(crate) fn inputs(&self) -> Inputs {
        self.inner.inputs.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The primitive op this node records (`Input` for source tensors).
    pub fn op(&self) -> &Op {
        &self.inner.op
    }

    // ----- primitives: one air op each, without any shortcut -----

    pub(crate) fn p_unary(&self, site: Site, op: air::UnaryOp) -> Tensor {
        Tensor::apply(site, Op::Unary(op), &[self])
    }

    pub(crate) fn p_binary(&self, site: Site, op: air::BinaryOp, rhs: &Tensor) -> Tensor {
        Tensor::apply(site, Op::Binary(op), &[self, rhs])
    }

    pub(crate) fn p_where(site: Site, cond: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
        Tensor::apply(site, Op::Where, &[cond, a, b])
    }

    /// A cast, or `self` when the dtype already matches.
    pub(crate) fn p_cast(&self, site: Site, to: DType) -> Tensor {
        if self.dtype() == to {
            return self.clone();
        }
        Tensor::apply(site, Op::Cast(air::op::Cast { to }), &[self])
    }

    pub(crate) fn p_reduce(&self, site: Site, op: air::ReduceOp, axes: SmallVec<[usize; 4]>) -> Tensor {
        Tensor::apply(site, Op::Reduce(air::op::Reduce { op, axes }), &[self])
    }

    pub(crate) fn p_reshape(&self, site: Site, shape: Shape) -> Tensor {
        Tensor::apply(site, Op::Reshape(air::op::Reshape { shape }), &[self])
    }

    pub(crate) fn p_permute(&self, site: Site, perm: SmallVec<[usize; 4]>) -> Tensor {
        Tensor::apply(site, Op::Permute(air::op::Permute { perm }), &[self])
    }

    pub(crate) fn p_expand(&self, site: Site, shape: Shape) -> Tensor {
        Tensor::apply(site, Op::Expand(air::op::Expand { shape }), &[self])
    }

    pub(crate) fn p_pad(&self, site: Site, padding: Vec<(Dim, Dim)>, value: Scalar) -> Tensor {
        Tensor::apply(site, Op::Pad(air::op::Pad { padding, value }), &[self])
    }

    pub(crate) fn p_shrink(&self, site: Site, ranges: Vec<(Dim, Dim)>) -> Tensor {
        Tensor::apply(site, Op::Shrink(air::op::Shrink { ranges }), &[self])
    }

    /// A reshape, or `self` when the shape already matches.
    pub(crate) fn reshape_to(&self, site: Site, shape: Shape) -> Tensor {
        if *self.shape() == shape {
            return self.clone();
        }
        // A reshape of a reshape reads the first's input: one node fewer.
        if let Op::Reshape(_) = self.op()
            && let Some(src) = self.view_source()
        {
            return src.reshape_to(site, shape);
        }
        self.p_reshape(site, shape)
    }

    /// A permute (`perm` valid for `self`), or `self` when `perm` keeps every axis in place. A
    /// permute of a permute is one permute of the first's input, or that input itself when they
    /// cancel (as `Linear`'s transposed weight transposed back by `matmul` does): fewer nodes to
    /// record, trace and rewrite.
    pub(crate) fn permute_to(&self, site: Site, perm: SmallVec<[usize; 4]>) -> Tensor {
        let identity = |p: &[usize]| p.iter().enumerate().all(|(i, &a)| i == a);
        if identity(&perm) {
            return self.clone();
        }
        if let Op::Permute(first) = self.op()
            && let Some(src) = self.view_source()
        {
            let composed: SmallVec<[usize; 4]> = perm.iter().map(|&a| first.perm[a]).collect();
            return if identity(&composed) { src } else { src.p_permute(site, composed) };
        }
        self.p_permute(site, perm)
    }

    /// The one input of this view node when a view op may read it directly instead (composing
    /// two views into one): the node is lazy, without error, and not an entry of the autograd
    /// registry (a marked tensor, or one whose gradient is kept, must stay in the graph).
    pub(crate) fn view_source(&self) -> Option<Tensor> {
        if self.error().is_some() || self.is_realized() || crate::autograd::has_entry(self) {
            return None;
        }
        match self.inputs().as_slice() {
            [src] => Some(src.clone()),
            _ => None,
        }
    }

    /// A constant of `self`'s device with the given dtype and shape.
    pub(crate) fn const_like(&self, site: Site, value: Scalar, dtype: DType, shape: Shape) -> Tensor {
        Tensor::constant(site, value, dtype, shape, self.device())
    }

    /// [`Tensor::const_like`] for a scalar operand of an op (`x * 0.5`, `x + 1e-5`): the same
    /// node for the same value, dtype, shape and device while it is among the last
    /// [`CONST_SLOTS`] made on this thread. A model's layers repeat their constants (a layer
    /// norm's `1/n` and `eps`, a softmax's scale): shared here, they are recorded, traced,
    /// verified and merged by CSE once instead of once per layer. Only operands: no caller gets
    /// the node itself, so nobody can mark it or realize it alone (an entry in the autodiff
    /// registry is checked all the same, and keeps a node out of sharing).
    pub(crate) fn const_operand(&self, site: Site, value: Scalar, dtype: DType, shape: Shape) -> Tensor {
        use std::hash::{Hash, Hasher};
        let device = self.device();
        let value = value.cast(dtype);
        let slot = {
            let mut h = rustc_hash::FxHasher::default();
            (value, dtype, &shape, device).hash(&mut h);
            // The top bits after one more multiply: FxHash's own top bits mix a float's
            // exponent poorly (0.5 and 1.0 of one shape shared a slot).
            (h.finish().wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % CONST_SLOTS
        };
        let same = |t: &Tensor| {
            matches!(&t.inner.op, Op::Const(c) if c.value == value)
                && t.inner.ty.dtype == dtype
                && t.inner.ty.shape == shape
                && t.inner.device == device
                && !t.is_realized()
        };
        let hit = CONSTS.with_borrow(|c| c[slot].as_ref().filter(|t| same(t)).cloned());
        if let Some(t) = hit.filter(|t| !crate::autograd::has_entry(t)) {
            return t;
        }
        let t = Tensor::constant(site, value, dtype, shape, device);
        if t.error().is_none() {
            let old = CONSTS.with_borrow_mut(|c| c[slot].replace(t.clone()));
            drop(old);
        }
        t
    }

    /// An `iota` along `axis` of `self`'s device.
    pub(crate) fn iota_like(&self, site: Site, axis: usize, dtype: DType, shape: Shape) -> Tensor {
        Tensor::leaf(site, Op::Iota(air::op::Iota { axis }), TensorType::new(dtype, shape), self.device())
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = &self.inner.error {
            return write!(f, "Tensor(error: {e})");
        }
        let state = if self.is_realized() { "realized" } else { "lazy" };
        write!(f, "Tensor({} {}, {}, {state})", self.inner.op.mnemonic(), self.inner.ty, self.inner.device)
    }
}

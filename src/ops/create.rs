//! Constructors: tensors from host data (zero-copy), constants, `arange`. Each has a form ending
//! in `_on` that takes its device; the plain form uses [`Device::default_device`].

use air::dim::shape_of;
use air::{Bindings, DType, Dim, Element, HostData, HostTensor, Op, Scalar, Shape, TensorType};

use crate::device::Device;
use crate::realize::bind;
use crate::scalar::IntoScalar;
use crate::shape::{IntoShape, concrete, show};
use crate::tensor::{Site, Tensor};

/// Checks that `dims` are non-negative (symbolic dims pass).
fn check_dims(site: Site, dims: &[Dim]) -> Result<Shape, Tensor> {
    if dims.iter().any(|d| d.as_const().is_some_and(|c| c < 0)) {
        return Err(site.fail(format!("negative dim in shape {}", show(dims))));
    }
    Ok(dims.iter().cloned().collect())
}

/// `device`, or else the default device; an error tensor carries why there is none.
pub(crate) fn place(device: Option<Device>) -> Result<Device, Tensor> {
    match device {
        Some(device) => Ok(device),
        None => Device::default_device().map_err(Tensor::failed),
    }
}

impl Tensor {
    /// A tensor holding `data` (row-major) with the given shape, on the default device. The `Vec`
    /// is moved into the tensor without a copy; `into_vec` on the untouched tensor gives the same
    /// `Vec` back.
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl IntoShape) -> Tensor {
        Tensor::from_vec_in(data, shape, None)
    }

    /// [`Tensor::from_vec`] on `device`.
    #[track_caller]
    pub fn from_vec_on<T: Element>(data: Vec<T>, shape: impl IntoShape, device: Device) -> Tensor {
        Tensor::from_vec_in(data, shape, Some(device))
    }

    #[track_caller]
    fn from_vec_in<T: Element>(data: Vec<T>, shape: impl IntoShape, device: Option<Device>) -> Tensor {
        let site = Site::here("from_vec");
        let dims = shape.into_dims();
        let Some(dims) = concrete(&dims) else {
            return site.fail(format!(
                "shape {} must be concrete and non-negative (use from_host_symbolic for symbols)",
                show(&dims)
            ));
        };
        if let Err(message) = air::dim::checked_size(&shape_of(&dims), T::DTYPE.size_bytes()) {
            return site.fail(message);
        }
        let n: usize = dims.iter().product();
        if data.len() != n {
            return site.fail(format!("{} elements do not fill shape {:?} ({n} elements)", data.len(), dims));
        }
        match HostTensor::from_vec(data, dims) {
            Ok(host) => Tensor::from_host_in(host, device),
            Err(message) => site.fail(message),
        }
    }

    /// A tensor holding a copy of `data` with the given shape.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: impl IntoShape) -> Tensor {
        Tensor::from_vec(data.to_vec(), shape)
    }

    /// A rank-0 tensor holding `value`.
    #[track_caller]
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Tensor::from_vec(vec![value], &[0usize; 0])
    }

    /// A tensor holding `host` (shared, no copy) on the default device.
    pub fn from_host(host: HostTensor) -> Tensor {
        Tensor::from_host_in(host, None)
    }

    /// A tensor holding `host` (shared, no copy) on `device`.
    pub fn from_host_on(host: HostTensor, device: Device) -> Tensor {
        Tensor::from_host_in(host, Some(device))
    }

    /// [`Tensor::from_host`] on `device`, or on the default device when it is `None`.
    pub(crate) fn from_host_in(host: HostTensor, device: Option<Device>) -> Tensor {
        let device = match place(device) {
            Ok(d) => d,
            Err(e) => return e,
        };
        let shape = host.shape.iter().map(|&d| Dim::from(d)).collect();
        Tensor::source(host, shape, Bindings::new(), device)
    }

    /// A tensor holding `host` whose type uses `dims`, some of them symbolic
    /// (`[Dim::sym("seq"), 64.into()]`). The symbols' values are read off the host shape and used
    /// when the tensor's programs run; the programs themselves keep the symbols, so one program
    /// serves every value. A symbol may appear in several dims (with equal sizes); a dim that is
    /// an expression (`2*seq`) must be implied by plain-symbol dims of the same tensor.
    #[track_caller]
    pub fn from_host_symbolic(host: HostTensor, dims: impl IntoShape) -> Tensor {
        Tensor::from_host(host).with_dims(dims)
    }

    /// A tensor with no elements whose type, `[name, 0]` (`i32`), carries the value of the
    /// symbol `name`: given to a [`crate::jit`] function, it binds `name` to `value` for the call,
    /// so the function can use `args[i].shape()[0]` (the symbolic dim `name`) as a position
    /// (`narrow`, `slice_scatter` at `start_pos`) while one compiled program serves every value.
    #[track_caller]
    pub fn symbol(name: &str, value: usize) -> Tensor {
        let dim = Dim::sym(name);
        let (Some(symbol), Ok(host)) = (dim.as_symbol(), HostTensor::new(HostData::I32(Vec::new()), vec![value, 0]))
        else {
            return Site::here("symbol").fail(format!("`{name}` is not a symbol of {value} positions"));
        };
        let bindings = Bindings::from([(symbol.clone(), value as i64)]);
        Tensor::source(host, smallvec::smallvec![dim, Dim::Const(0)], bindings, Device::default())
    }

    /// This source tensor with some dims declared symbolic (see [`Tensor::from_host_symbolic`]).
    /// Only tensors that hold data can be given symbolic dims.
    #[track_caller]
    pub fn with_dims(&self, dims: impl IntoShape) -> Tensor {
        let site = Site::here("with_dims");
        if self.error().is_some() {
            return self.clone();
        }
        let dims = dims.into_dims();
        let Some(realized) = self.inner.data.get() else {
            return site.fail("only a tensor that holds data can be given symbolic dims (realize it first)");
        };
        let host = &realized.host;
        if dims.len() != host.shape.len() {
            return site.fail(format!("dims {} do not match the rank of shape {:?}", show(&dims), host.shape));
        }
        let mut bindings = self.bindings();
        // Plain symbols first: they give the values.
        for (d, &size) in dims.iter().zip(&host.shape) {
            if let Some(symbol) = d.as_symbol()
                && let Err(e) = bind(&mut bindings, symbol, size as i64)
            {
                return site.fail(e.to_string());
            }
        }
        // Then every dim must evaluate to the host size.
        for (d, &size) in dims.iter().zip(&host.shape) {
            match d.eval(&bindings) {
                Ok(v) if v == size as i64 => {}
                Ok(v) => {
                    return site
                        .fail(format!("dim {d} is {v} but the data has {size} along it (shape {:?})", host.shape));
                }
                Err(e) => return site.fail(format!("dim {d}: {e}")),
            }
        }
        let shape = dims.into_iter().collect();
        Tensor::source(host.clone(), shape, bindings, self.device())
    }

    /// A tensor of `shape` filled with `value` (converted to `dtype`), on the default device. Lazy:
    /// a single `const` node, no memory until realized.
    #[track_caller]
    pub fn full(shape: impl IntoShape, value: impl IntoScalar, dtype: DType) -> Tensor {
        Tensor::full_in(shape, value.into_scalar(), dtype, None)
    }

    /// [`Tensor::full`] on `device`.
    #[track_caller]
    pub fn full_on(shape: impl IntoShape, value: impl IntoScalar, dtype: DType, device: Device) -> Tensor {
        Tensor::full_in(shape, value.into_scalar(), dtype, Some(device))
    }

    #[track_caller]
    fn full_in(shape: impl IntoShape, value: Scalar, dtype: DType, device: Option<Device>) -> Tensor {
        let site = Site::here("full");
        let shape = match check_dims(site, &shape.into_dims()) {
            Ok(s) => s,
            Err(e) => return e,
        };
        let device = match place(device) {
            Ok(d) => d,
            Err(e) => return e,
        };
        Tensor::constant(site, value, dtype, shape, device)
    }

    /// A tensor of `shape` filled with zeros, on the default device.
    #[track_caller]
    pub fn zeros(shape: impl IntoShape, dtype: DType) -> Tensor {
        Tensor::full_in(shape, Scalar::Int(0), dtype, None)
    }

    /// [`Tensor::zeros`] on `device`.
    #[track_caller]
    pub fn zeros_on(shape: impl IntoShape, dtype: DType, device: Device) -> Tensor {
        Tensor::full_in(shape, Scalar::Int(0), dtype, Some(device))
    }

    /// A tensor of `shape` filled with ones, on the default device.
    #[track_caller]
    pub fn ones(shape: impl IntoShape, dtype: DType) -> Tensor {
        Tensor::full_in(shape, Scalar::Int(1), dtype, None)
    }

    /// [`Tensor::ones`] on `device`.
    #[track_caller]
    pub fn ones_on(shape: impl IntoShape, dtype: DType, device: Device) -> Tensor {
        Tensor::full_in(shape, Scalar::Int(1), dtype, Some(device))
    }

    /// A tensor like `self` (shape, dtype, device) filled with `value`.
    #[track_caller]
    pub fn full_like(&self, value: impl IntoScalar) -> Tensor {
        let site = Site::here("full_like");
        if self.error().is_some() {
            return self.clone();
        }
        self.const_like(site, value.into_scalar(), self.dtype(), self.shape().clone())
    }

    /// Zeros like `self`.
    #[track_caller]
    pub fn zeros_like(&self) -> Tensor {
        self.full_like(Scalar::Int(0))
    }

    /// Ones like `self`.
    #[track_caller]
    pub fn ones_like(&self) -> Tensor {
        self.full_like(Scalar::Int(1))
    }

    /// `[start, start + step, ...]` up to (excluding) `end`, like `torch.arange`: `i64` when all
    /// three are integers, else `f32`. Built from an `iota`: `start + iota * step`. On the default
    /// device.
    #[track_caller]
    pub fn arange(start: impl IntoScalar, end: impl IntoScalar, step: impl IntoScalar) -> Tensor {
        Tensor::arange_in((start.into_scalar(), end.into_scalar(), step.into_scalar()), None)
    }

    /// [`Tensor::arange`] on `device`.
    #[track_caller]
    pub fn arange_on(start: impl IntoScalar, end: impl IntoScalar, step: impl IntoScalar, device: Device) -> Tensor {
        Tensor::arange_in((start.into_scalar(), end.into_scalar(), step.into_scalar()), Some(device))
    }

    /// `[0, 1, ..., len - 1]` as `dtype` on `device`, where `len` may be symbolic (a sequence
    /// length bound when the program runs): `arange(0, len, 1)` for a length known only by name.
    #[track_caller]
    pub fn iota_on(len: impl Into<Dim>, dtype: DType, device: Device) -> Tensor {
        let site = Site::here("iota");
        let len = len.into();
        if len.as_const().is_some_and(|n| n < 0) {
            return site.fail(format!("negative length {len}"));
        }
        Tensor::leaf(
            site,
            Op::Iota(air::op::Iota { axis: 0 }),
            TensorType::new(dtype, smallvec::smallvec![len]),
            device,
        )
    }

    #[track_caller]
    fn arange_in((start, end, step): (Scalar, Scalar, Scalar), device: Option<Device>) -> Tensor {
        let site = Site::here("arange");
        let is_float = [start, end, step].iter().any(|s| matches!(s, Scalar::Float(_)));
        let dtype = if is_float { DType::F32 } else { DType::I64 };
        let (a, b, s) = (start.as_f64(), end.as_f64(), step.as_f64());
        if s == 0.0 || !s.is_finite() || !a.is_finite() || !b.is_finite() {
            return site.fail(format!("invalid range {start}..{end} step {step}"));
        }
        let n = if is_float {
            ((b - a) / s).ceil().max(0.0) as i64
        } else {
            // In i128, so that no span of two i64s overflows; a count past i64 is an error.
            let (a, b, s) = (start.as_i64() as i128, end.as_i64() as i128, step.as_i64() as i128);
            let span = if s > 0 { b - a } else { a - b };
            let n = if span <= 0 { 0 } else { (span + s.abs() - 1) / s.abs() };
            match i64::try_from(n) {
                Ok(n) => n,
                Err(_) => return site.fail(format!("range {start}..{end} step {step} has {n} elements, past i64")),
            }
        };
        let device = match place(device) {
            Ok(d) => d,
            Err(e) => return e,
        };
        let shape: Shape = smallvec::smallvec![Dim::Const(n)];
        let mut t =
            Tensor::leaf(site, Op::Iota(air::op::Iota { axis: 0 }), TensorType::new(dtype, shape.clone()), device);
        if s != 1.0 {
            let c = Tensor::constant(site, step, dtype, shape.clone(), device);
            t = t.p_binary(site, air::BinaryOp::Mul, &c);
        }
        if a != 0.0 {
            let c = Tensor::constant(site, start, dtype, shape, device);
            t = t.p_binary(site, air::BinaryOp::Add, &c);
        }
        t
    }
}

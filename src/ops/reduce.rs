//! Reductions over axes (`sum`, `max`, `min`, `mean`), `softmax`, `log_softmax`, `logsumexp`,
//! `argmax` and `argmin`.
//!
//! Axes may be negative; an empty axis list reduces every axis (as PyTorch's `dim=[]` does).
//! As in PyTorch, where `keepdim` defaults to false, `x.sum(axes)` removes the reduced axes and
//! `x.sum_keepdim(axes)` keeps them with size 1 (`keepdim=True`); every reduction comes in both
//! forms. Removing is a reshape after the air `reduce`, which always keeps them.
//!
//! # Empty reductions (as PyTorch)
//!
//! `sum` over an empty axis is 0 and `mean` is NaN (`0 / 0`). `max`, `min`, `argmax` and `argmin`
//! have no identity element, so reducing over an axis of extent 0 (or, for the `_all` forms, a
//! tensor with no elements) is an error tensor naming the op, the shape and the caller's line.
//! The check needs the extent: a *symbolic* reduced extent that is bound to 0 at realize is not
//! caught here and gives the air identity (`-inf`, or the integer minimum; see `air::interp`).
//! `softmax` and `log_softmax` over an empty axis give an empty result (nothing to compute), and
//! `logsumexp` gives `-inf` (`log 0`), as in PyTorch.
//!
//! # Gradients at ties (as PyTorch)
//!
//! `max`/`min` (and the `_all` forms) split the gradient evenly among tied extremes, like
//! `torch.amax`/`torch.amin` and the full `torch.max()`. [`Tensor::max_dim`] and
//! [`Tensor::min_dim`] are `torch.max(x, dim)`/`torch.min(x, dim)`: values and indices, with the
//! whole gradient sent to the position of the returned index.

use air::{BinaryOp, DType, Dim, ReduceOp, Scalar, Shape, UnaryOp};
use smallvec::SmallVec;

use crate::shape::{Axes, Axis, normalize_axes, normalize_axis};
use crate::tensor::{Site, Tensor};

type AxisList = SmallVec<[usize; 4]>;

/// The normalized, sorted axes to reduce; empty means all.
fn reduce_axes(site: Site, t: &Tensor, axes: &[isize]) -> Result<AxisList, Tensor> {
    if t.error().is_some() {
        return Err(t.clone());
    }
    if axes.is_empty() {
        return Ok((0..t.ndim()).collect());
    }
    normalize_axes(axes, t.ndim()).map_err(|m| site.fail(format!("{m} (shape {})", crate::shape::show(t.shape()))))
}

/// An error tensor if `axes` of `t` cover no element, for `site`, a reduction without an
/// identity element (PyTorch raises for these too). Only concrete extents are checked.
fn check_nonempty(site: Site, t: &Tensor, axes: &AxisList) -> Result<(), Tensor> {
    let Some(&axis) = axes.iter().find(|&&a| t.shape()[a].as_const() == Some(0)) else {
        return Ok(());
    };
    Err(site.fail(format!(
        "cannot reduce over an empty axis: axis {axis} of shape {} has extent 0, and {} has no identity \
         element (reduce a non-empty tensor or check its size first)",
        crate::shape::show(t.shape()),
        site.name
    )))
}

/// Drops the reduced (size-1) axes unless `keepdim`.
fn finish(site: Site, t: Tensor, axes: &AxisList, keepdim: bool) -> Tensor {
    if keepdim || axes.is_empty() {
        return t;
    }
    let shape: Shape = t.shape().iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| *d).collect();
    t.p_reshape(site, shape)
}

/// The maximum over `axes`, kept; bools reduce as `i32`.
fn max_kept(site: Site, t: &Tensor, axes: &AxisList) -> Tensor {
    if t.dtype().is_bool() {
        return t.p_cast(site, DType::I32).p_reduce(site, ReduceOp::Max, axes.clone()).p_cast(site, DType::Bool);
    }
    t.p_reduce(site, ReduceOp::Max, axes.clone())
}

/// The minimum over `axes`, kept: `-max(-x)` for floats, `!max(!x)` for integers (bitwise not
/// reverses the order without overflow).
fn min_kept(site: Site, t: &Tensor, axes: &AxisList) -> Tensor {
    if t.dtype().is_bool() {
        return min_kept(site, &t.p_cast(site, DType::I32), axes).p_cast(site, DType::Bool);
    }
    let flip = if t.dtype().is_float() { UnaryOp::Neg } else { UnaryOp::Not };
    t.p_unary(site, flip).p_reduce(site, ReduceOp::Max, axes.clone()).p_unary(site, flip)
}

/// `max`/`min` (and their PyTorch names `amax`/`amin`) over `axes`: `kept` reduces with the
/// axes kept, then `finish` drops them unless `keepdim`. Reducing an empty axis is an error.
fn extreme(
    site: Site,
    t: &Tensor,
    axes: &[isize],
    keepdim: bool,
    kept: fn(Site, &Tensor, &AxisList) -> Tensor,
) -> Tensor {
    match reduce_axes(site, t, axes).and_then(|a| check_nonempty(site, t, &a).map(|()| a)) {
        Ok(axes) => finish(site, kept(site, t, &axes), &axes, keepdim),
        Err(e) => e,
    }
}

/// The number of elements the axes cover, as a dim.
fn count(t: &Tensor, axes: &AxisList) -> Dim {
    axes.iter().fold(Dim::Const(1), |acc, &a| acc * t.shape()[a])
}

/// `sum` over `axes`, the reduced axes kept or removed.
fn sum(site: Site, t: &Tensor, axes: &[isize], keepdim: bool) -> Tensor {
    let axes = match reduce_axes(site, t, axes) {
        Ok(a) => a,
        Err(e) => return e,
    };
    let x = if t.dtype().is_float() { t.clone() } else { t.p_cast(site, DType::I64) };
    finish(site, x.p_reduce(site, ReduceOp::Sum, axes.clone()), &axes, keepdim)
}

/// `mean` over `axes`, the reduced axes kept or removed.
fn mean(site: Site, t: &Tensor, axes: &[isize], keepdim: bool) -> Tensor {
    let axes = match reduce_axes(site, t, axes) {
        Ok(a) => a,
        Err(e) => return e,
    };
    let (x, dtype) = t.opmath(site);
    let sum = x.p_reduce(site, ReduceOp::Sum, axes.clone());
    let mean = match count(&x, &axes).as_const() {
        // `0 * (1 / 0)` is NaN, but a GPU compiler may fold `0 * inf` to 0: say NaN directly.
        Some(0) => sum.const_like(site, Scalar::Float(f64::NAN), sum.dtype(), sum.shape().clone()),
        Some(n) => sum.p_binary(site, BinaryOp::Mul, &sum.splat(site, 1.0 / n as f64)),
        None => {
            let n = x.splat(site, 1.0).p_reduce(site, ReduceOp::Sum, axes.clone());
            sum.p_binary(site, BinaryOp::Div, &n)
        }
    };
    finish(site, mean.p_cast(site, dtype), &axes, keepdim)
}

/// `logsumexp` over `axes`, the reduced axes kept or removed.
fn logsumexp(site: Site, t: &Tensor, axes: &[isize], keepdim: bool) -> Tensor {
    let (x, dtype) = t.opmath(site);
    let axes = match reduce_axes(site, &x, axes) {
        Ok(a) => a,
        Err(e) => return e,
    };
    let m = max_kept(site, &x, &axes);
    // An infinite maximum would give inf - inf = NaN; shift by 0 there instead.
    let finite = m.abs().lt(f64::INFINITY);
    let m = finite.where_cond(&m, 0.0);
    let lse = x.sub(&m).exp().p_reduce(site, ReduceOp::Sum, axes.clone()).log().add(&m);
    finish(site, lse.p_cast(site, dtype), &axes, keepdim)
}

impl Tensor {
    /// Sum over `axes` (negative allowed; empty = all), removing them (`torch.sum(x, dim)`).
    /// Integers and bools sum as `i64`, as in PyTorch.
    #[track_caller]
    pub fn sum(&self, axes: impl Axes) -> Tensor {
        sum(Site::here("sum"), self, &axes.to_axes(), false)
    }

    /// [`Tensor::sum`] keeping the reduced axes with size 1 (`keepdim=True`).
    #[track_caller]
    pub fn sum_keepdim(&self, axes: impl Axes) -> Tensor {
        sum(Site::here("sum"), self, &axes.to_axes(), true)
    }

    /// Maximum over `axes`, removing them (values only; see [`Tensor::max_dim`] for values and
    /// indices), like `torch.amax`: tied maxima share the gradient evenly. Reducing an empty axis
    /// is an error.
    #[track_caller]
    pub fn max(&self, axes: impl Axes) -> Tensor {
        extreme(Site::here("max"), self, &axes.to_axes(), false, max_kept)
    }

    /// [`Tensor::max`] keeping the reduced axes with size 1.
    #[track_caller]
    pub fn max_keepdim(&self, axes: impl Axes) -> Tensor {
        extreme(Site::here("max"), self, &axes.to_axes(), true, max_kept)
    }

    /// Minimum over `axes`, removing them (values only), like `torch.amin`: tied minima share the
    /// gradient evenly. Reducing an empty axis is an error.
    #[track_caller]
    pub fn min(&self, axes: impl Axes) -> Tensor {
        extreme(Site::here("min"), self, &axes.to_axes(), false, min_kept)
    }

    /// [`Tensor::min`] keeping the reduced axes with size 1.
    #[track_caller]
    pub fn min_keepdim(&self, axes: impl Axes) -> Tensor {
        extreme(Site::here("min"), self, &axes.to_axes(), true, min_kept)
    }

    /// PyTorch's name for [`Tensor::max`] over axes (`torch.amax(x, dim)`): the maximum values,
    /// tied maxima sharing the gradient evenly. Reducing an empty axis is an error.
    #[track_caller]
    pub fn amax(&self, axes: impl Axes) -> Tensor {
        extreme(Site::here("amax"), self, &axes.to_axes(), false, max_kept)
    }

    /// [`Tensor::amax`] keeping the reduced axes with size 1.
    #[track_caller]
    pub fn amax_keepdim(&self, axes: impl Axes) -> Tensor {
        extreme(Site::here("amax"), self, &axes.to_axes(), true, max_kept)
    }

    /// PyTorch's name for [`Tensor::min`] over axes (`torch.amin(x, dim)`): the minimum values,
    /// tied minima sharing the gradient evenly. Reducing an empty axis is an error.
    #[track_caller]
    pub fn amin(&self, axes: impl Axes) -> Tensor {
        extreme(Site::here("amin"), self, &axes.to_axes(), false, min_kept)
    }

    /// [`Tensor::amin`] keeping the reduced axes with size 1.
    #[track_caller]
    pub fn amin_keepdim(&self, axes: impl Axes) -> Tensor {
        extreme(Site::here("amin"), self, &axes.to_axes(), true, min_kept)
    }

    /// Mean over `axes`, removing them: `sum * (1 / n)`. Integers become `f32` first. With
    /// symbolic dims `n` is itself computed as a sum of ones. Over an empty axis the mean is NaN
    /// (`0 / 0`), as in PyTorch.
    #[track_caller]
    pub fn mean(&self, axes: impl Axes) -> Tensor {
        mean(Site::here("mean"), self, &axes.to_axes(), false)
    }

    /// [`Tensor::mean`] keeping the reduced axes with size 1.
    #[track_caller]
    pub fn mean_keepdim(&self, axes: impl Axes) -> Tensor {
        mean(Site::here("mean"), self, &axes.to_axes(), true)
    }

    /// Sum of every element, shape `[]`.
    #[track_caller]
    pub fn sum_all(&self) -> Tensor {
        self.sum(&[0usize; 0])
    }

    /// Maximum of every element, shape `[]`.
    #[track_caller]
    pub fn max_all(&self) -> Tensor {
        self.max(&[0usize; 0])
    }

    /// Minimum of every element, shape `[]`.
    #[track_caller]
    pub fn min_all(&self) -> Tensor {
        self.min(&[0usize; 0])
    }

    /// Mean of every element, shape `[]`.
    #[track_caller]
    pub fn mean_all(&self) -> Tensor {
        self.mean(&[0usize; 0])
    }

    /// `exp(x) / sum(exp(x))` along `dim`, computed stably: `e = exp(x - max)`, then
    /// `e * (1 / sum(e))`, as PyTorch's CPU kernel does. The reciprocal is the epilogue of the sum's
    /// kernel (once per row) and the per-element work is a multiply, which vectorizes where a
    /// divide would cost several times more; the result differs from `e / sum(e)` by at most one
    /// rounding.
    #[track_caller]
    pub fn softmax(&self, dim: impl Axis) -> Tensor {
        let site = Site::here("softmax");
        let (x, dtype) = self.opmath(site);
        let axes = match reduce_axes(site, &x, &[dim.to_isize()]) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let shifted = x.sub(max_kept(site, &x, &axes));
        let e = shifted.exp();
        e.mul(e.p_reduce(site, ReduceOp::Sum, axes).p_unary(site, UnaryOp::Recip)).p_cast(site, dtype)
    }

    /// `log(softmax(x))` along `dim`, computed stably: `(x - max) - log(sum(exp(x - max)))`.
    #[track_caller]
    pub fn log_softmax(&self, dim: impl Axis) -> Tensor {
        let site = Site::here("log_softmax");
        let (x, dtype) = self.opmath(site);
        let axes = match reduce_axes(site, &x, &[dim.to_isize()]) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let shifted = x.sub(max_kept(site, &x, &axes));
        shifted.sub(shifted.exp().p_reduce(site, ReduceOp::Sum, axes).log()).p_cast(site, dtype)
    }

    /// `log(sum(exp(x)))` over `axes`, removing them, computed stably around the maximum.
    #[track_caller]
    pub fn logsumexp(&self, axes: impl Axes) -> Tensor {
        logsumexp(Site::here("logsumexp"), self, &axes.to_axes(), false)
    }

    /// [`Tensor::logsumexp`] keeping the reduced axes with size 1.
    #[track_caller]
    pub fn logsumexp_keepdim(&self, axes: impl Axes) -> Tensor {
        logsumexp(Site::here("logsumexp"), self, &axes.to_axes(), true)
    }

    /// Index (`i64`) of the maximum along `dim`, removing it; the first one on ties and NaN
    /// counts as the maximum, as in PyTorch. Built as `min(where(x == max(x), iota, i64::MAX))`.
    #[track_caller]
    pub fn argmax(&self, dim: impl Axis) -> Tensor {
        arg_extreme(Site::here("argmax"), self, dim.to_isize(), false, false)
    }

    /// [`Tensor::argmax`] keeping `dim` with size 1.
    #[track_caller]
    pub fn argmax_keepdim(&self, dim: impl Axis) -> Tensor {
        arg_extreme(Site::here("argmax"), self, dim.to_isize(), true, false)
    }

    /// Index (`i64`) of the minimum along `dim`, removing it; the first one on ties.
    #[track_caller]
    pub fn argmin(&self, dim: impl Axis) -> Tensor {
        arg_extreme(Site::here("argmin"), self, dim.to_isize(), false, true)
    }

    /// [`Tensor::argmin`] keeping `dim` with size 1.
    #[track_caller]
    pub fn argmin_keepdim(&self, dim: impl Axis) -> Tensor {
        arg_extreme(Site::here("argmin"), self, dim.to_isize(), true, true)
    }

    /// The maximum along `dim` and its index (`i64`), removing `dim`, like `torch.max(x, dim)`:
    /// the index is the first maximum (NaN counts as the maximum), and the whole gradient of the
    /// values goes to the element at that index (where [`Tensor::max`] splits it among ties). An
    /// empty `dim` is an error.
    #[track_caller]
    pub fn max_dim(&self, dim: impl Axis) -> (Tensor, Tensor) {
        extreme_at_index(Site::here("max_dim"), self, dim.to_isize(), false, false)
    }

    /// [`Tensor::max_dim`] keeping `dim` with size 1.
    #[track_caller]
    pub fn max_dim_keepdim(&self, dim: impl Axis) -> (Tensor, Tensor) {
        extreme_at_index(Site::here("max_dim"), self, dim.to_isize(), true, false)
    }

    /// The minimum along `dim` and its index (`i64`), removing `dim`, like `torch.min(x, dim)`;
    /// see [`Tensor::max_dim`].
    #[track_caller]
    pub fn min_dim(&self, dim: impl Axis) -> (Tensor, Tensor) {
        extreme_at_index(Site::here("min_dim"), self, dim.to_isize(), false, true)
    }

    /// [`Tensor::min_dim`] keeping `dim` with size 1.
    #[track_caller]
    pub fn min_dim_keepdim(&self, dim: impl Axis) -> (Tensor, Tensor) {
        extreme_at_index(Site::here("min_dim"), self, dim.to_isize(), true, true)
    }

    /// Index of the maximum of the flattened tensor, shape `[]` (PyTorch's `argmax()`).
    #[track_caller]
    pub fn argmax_all(&self) -> Tensor {
        self.flatten(0, -1).argmax(0)
    }

    /// Index of the minimum of the flattened tensor, shape `[]`.
    #[track_caller]
    pub fn argmin_all(&self) -> Tensor {
        self.flatten(0, -1).argmin(0)
    }
}

/// The index (`index_dtype`) of the first extreme along `dim`: `min(where(hit, iota, MAX))`.
fn arg_extreme(site: Site, t: &Tensor, dim: isize, keepdim: bool, min: bool) -> Tensor {
    arg_extreme_as(site, t, dim, keepdim, min, DType::I64)
}

fn arg_extreme_as(site: Site, t: &Tensor, dim: isize, keepdim: bool, min: bool, index_dtype: DType) -> Tensor {
    if t.error().is_some() {
        return t.clone();
    }
    let axis = match normalize_axis(dim, t.ndim()) {
        Ok(a) => a,
        Err(m) => return site.fail(format!("{m} (shape {})", crate::shape::show(t.shape()))),
    };
    let axes: AxisList = smallvec::smallvec![axis];
    if let Err(e) = check_nonempty(site, t, &axes) {
        return e;
    }
    let x = if t.dtype().is_bool() { t.p_cast(site, DType::I32) } else { t.clone() };
    let best = if min { min_kept(site, &x, &axes) } else { max_kept(site, &x, &axes) };
    let best = crate::ops::elementwise::broadcast_to(site, &best, x.shape());
    let mut hit = x.p_binary(site, BinaryOp::CmpEq, &best);
    if x.dtype().is_float() {
        let nan = x.p_binary(site, BinaryOp::CmpNe, &x);
        hit = hit.p_binary(site, BinaryOp::Or, &nan);
    }
    let index = x.iota_like(site, axis, index_dtype, x.shape().clone());
    let largest = if index_dtype == DType::I32 { i64::from(i32::MAX) } else { i64::MAX };
    let none = index.splat(site, Scalar::Int(largest));
    let candidates = Tensor::p_where(site, &hit, &index, &none);
    finish(site, min_kept(site, &candidates, &axes), &axes, keepdim)
}

/// `(values, indices)` of the extreme along `dim`: the indices from [`arg_extreme`], the values
/// picked at those indices (a sum over a one-hot selection, so the gradient reaches that one
/// element only). The selection uses `i32` indices when the axis fits, which are native where
/// 64-bit integers are emulated (wgpu).
fn extreme_at_index(site: Site, t: &Tensor, dim: isize, keepdim: bool, min: bool) -> (Tensor, Tensor) {
    let index = arg_extreme(site, t, dim, true, min);
    if index.error().is_some() {
        return (index.clone(), index);
    }
    let axis = normalize_axis(dim, t.ndim()).expect("arg_extreme checked the axis");
    let axes: AxisList = smallvec::smallvec![axis];
    let values = if t.dtype().is_float() {
        let fits_i32 = t.shape()[axis].as_const().is_some_and(|n| n <= i64::from(i32::MAX));
        let (select_index, dtype) = if fits_i32 {
            (arg_extreme_as(site, t, dim, true, min, DType::I32), DType::I32)
        } else {
            (index.clone(), DType::I64)
        };
        let position = t.iota_like(site, axis, dtype, t.shape().clone());
        let wide = crate::ops::elementwise::broadcast_to(site, &select_index, t.shape());
        let picked = position.p_binary(site, BinaryOp::CmpEq, &wide);
        let zero = t.splat(site, 0.0);
        Tensor::p_where(site, &picked, t, &zero).p_reduce(site, ReduceOp::Sum, axes.clone())
    } else if min {
        min_kept(site, t, &axes)
    } else {
        max_kept(site, t, &axes)
    };
    (finish(site, values, &axes, keepdim), finish(site, index, &axes, keepdim))
}

//! Joining and indexing: `cat`, `stack`, `gather`, `index_select`, all built from primitives.
//!
//! `cat` pads every input with zeros to the full size along the axis and adds them (`or` for
//! bools). `gather` and `index_select` compare the index with an `iota` to make a one-hot mask,
//! select with `where` and sum the mask axis away.

use air::{BinaryOp, DType, Dim, ReduceOp, Scalar, Shape};
use smallvec::SmallVec;

use crate::shape::{Axis, normalize_axis, show};
use crate::tensor::{Site, Tensor};

impl Tensor {
    /// Concatenates `tensors` along `dim` (`torch.cat`). All must have the same rank and equal
    /// dims except along `dim`; dtypes are promoted.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: impl Axis) -> Tensor {
        cat_impl(Site::here("cat"), tensors, dim.to_isize())
    }

    /// Stacks `tensors` (all of one shape) along a new axis `dim` (`torch.stack`): `unsqueeze`
    /// each, then `cat`.
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: impl Axis) -> Tensor {
        let site = Site::here("stack");
        let Some(first) = tensors.first() else {
            return site.fail("needs at least one tensor");
        };
        if let Some(e) = tensors.iter().find(|t| t.error().is_some()) {
            return (*e).clone();
        }
        for t in tensors {
            if t.shape() != first.shape() {
                return site.fail(format!("shapes {} and {} differ", show(first.shape()), show(t.shape())));
            }
        }
        let axis = match normalize_axis(dim.to_isize(), first.ndim() + 1) {
            Ok(a) => a,
            Err(m) => return site.fail(format!("{m} (shape {})", show(first.shape()))),
        };
        let mut parts = Vec::with_capacity(tensors.len());
        for t in tensors {
            let mut shape = t.shape().clone();
            shape.insert(axis, Dim::Const(1));
            parts.push(t.p_reshape(site, shape));
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        cat_impl(site, &refs, axis as isize)
    }

    /// `out[i][j][k] = self[index[i][j][k]][j][k]` for `dim = 0`, and so on (`torch.gather`).
    /// `index` is an integer tensor of the same rank; along the other axes it may be smaller than
    /// `self`. An out-of-range index gives 0 (PyTorch raises an error instead).
    #[track_caller]
    pub fn gather(&self, dim: impl Axis, index: &Tensor) -> Tensor {
        let site = Site::here("gather");
        for t in [self, index] {
            if t.error().is_some() {
                return t.clone();
            }
        }
        let r = self.ndim();
        let ax = match normalize_axis(dim.to_isize(), r) {
            Ok(a) => a,
            Err(m) => return site.fail(format!("{m} (shape {})", show(self.shape()))),
        };
        if !index.dtype().is_int() {
            return site.fail(format!("index must be an integer tensor, got {}", index.dtype()));
        }
        if index.ndim() != r {
            return site.fail(format!(
                "index shape {} must have the rank of shape {}",
                show(index.shape()),
                show(self.shape())
            ));
        }
        let (s, i) = (self.shape(), index.shape());
        for d in (0..r).filter(|&d| d != ax) {
            let fits = match (i[d].as_const(), s[d].as_const()) {
                (Some(a), Some(b)) => a <= b,
                _ => i[d] == s[d],
            };
            if !fits {
                return site.fail(format!("index shape {} exceeds shape {} along dim {d}", show(i), show(s)));
            }
        }
        // Cut `self` down to the index's size on the other axes.
        let mut x = self.clone();
        if (0..r).any(|d| d != ax && i[d] != s[d]) {
            let ranges = (0..r).map(|d| (Dim::Const(0), if d == ax { s[d].clone() } else { i[d].clone() })).collect();
            x = x.p_shrink(site, ranges);
        }
        // Move the gathered axis last, then put a 1 where it was and expand to the index shape.
        let mut perm: SmallVec<[usize; 4]> = (0..r).filter(|&d| d != ax).collect();
        perm.push(ax);
        let mut moved: Shape = x.shape().iter().enumerate().filter(|&(d, _)| d != ax).map(|(_, d)| d.clone()).collect();
        moved.insert(ax, Dim::Const(1));
        moved.push(s[ax].clone());
        let values = if ax + 1 != r { x.p_permute(site, perm) } else { x };
        let values = values.p_reshape(site, moved);
        let mut index_shape = i.clone();
        index_shape.push(Dim::Const(1));
        let index = index.p_reshape(site, index_shape);
        one_hot_select(site, &values, &index, i.clone(), s[ax].clone())
    }

    /// The entries of `self` at positions `index` (1-D, integer) along `dim`
    /// (`torch.index_select`; an embedding lookup is `table.index_select(0, &ids)`).
    /// An out-of-range index gives 0.
    #[track_caller]
    pub fn index_select(&self, dim: impl Axis, index: &Tensor) -> Tensor {
        let site = Site::here("index_select");
        for t in [self, index] {
            if t.error().is_some() {
                return t.clone();
            }
        }
        let r = self.ndim();
        let ax = match normalize_axis(dim.to_isize(), r) {
            Ok(a) => a,
            Err(m) => return site.fail(format!("{m} (shape {})", show(self.shape()))),
        };
        if !index.dtype().is_int() || index.ndim() != 1 {
            return site.fail(format!("index must be a 1-D integer tensor, got {}", index.ty()));
        }
        let s = self.shape();
        let m = index.shape()[0].clone();
        let mut out = s.clone();
        out[ax] = m.clone();
        let mut perm: SmallVec<[usize; 4]> = (0..r).filter(|&d| d != ax).collect();
        perm.push(ax);
        let mut moved: Shape = s.iter().enumerate().filter(|&(d, _)| d != ax).map(|(_, d)| d.clone()).collect();
        moved.insert(ax, Dim::Const(1));
        moved.push(s[ax].clone());
        let values = if ax + 1 != r { self.p_permute(site, perm) } else { self.clone() };
        let values = values.p_reshape(site, moved);
        let mut index_shape: Shape = std::iter::repeat_n(Dim::Const(1), r + 1).collect();
        index_shape[ax] = m;
        let index = index.p_reshape(site, index_shape);
        one_hot_select(site, &values, &index, out, s[ax].clone())
    }
}

impl Tensor {
    /// `torch.nn.functional.one_hot`: a new last axis of `num_classes` entries, 1 where the
    /// entry's position equals the index and 0 elsewhere (i64, like PyTorch). Out-of-range
    /// indices give an all-zero row. `ids.one_hot(v).cast(f32).matmul(&table)` is an embedding
    /// lookup that the compiler runs as one GEMM (and whose gradient is one GEMM too).
    #[track_caller]
    pub fn one_hot(&self, num_classes: impl Into<Dim>) -> Tensor {
        let site = Site::here("one_hot");
        if self.error().is_some() {
            return self.clone();
        }
        if !self.dtype().is_int() {
            return site.fail(format!("indices must be integers, got {}", self.ty()));
        }
        let n: Dim = num_classes.into();
        let mut expanded: Shape = self.shape().clone();
        expanded.push(Dim::Const(1));
        let mut full = self.shape().clone();
        full.push(n);
        let last = full.len() - 1;
        let index = self.p_reshape(site, expanded);
        let index = crate::ops::elementwise::broadcast_to(site, &index, &full);
        let positions = index.iota_like(site, last, index.dtype(), full);
        index.p_binary(site, BinaryOp::CmpEq, &positions).p_cast(site, DType::I64)
    }
}

/// `values: [.., n]` and `index: [.., 1]` (both broadcastable to `out + [n]`): picks
/// `values[.., index]` by a one-hot mask over the last axis, giving shape `out`.
fn one_hot_select(site: Site, values: &Tensor, index: &Tensor, out: Shape, n: Dim) -> Tensor {
    let mut full = out.clone();
    full.push(n);
    let last = full.len() - 1;
    let is_bool = values.dtype().is_bool();
    let values = if is_bool { values.p_cast(site, DType::I32) } else { values.clone() };
    let values = crate::ops::elementwise::broadcast_to(site, &values, &full);
    let index = crate::ops::elementwise::broadcast_to(site, index, &full);
    let positions = index.iota_like(site, last, index.dtype(), full.clone());
    let hot = index.p_binary(site, BinaryOp::CmpEq, &positions);
    let zero = values.const_like(site, Scalar::Int(0), values.dtype(), full);
    let picked = Tensor::p_where(site, &hot, &values, &zero).p_reduce(site, ReduceOp::Sum, smallvec::smallvec![last]);
    let picked = picked.p_reshape(site, out);
    if is_bool { picked.p_cast(site, DType::Bool) } else { picked }
}

fn cat_impl(site: Site, tensors: &[&Tensor], dim: isize) -> Tensor {
    let Some(first) = tensors.first() else {
        return site.fail("needs at least one tensor");
    };
    if let Some(e) = tensors.iter().find(|t| t.error().is_some()) {
        return (*e).clone();
    }
    let r = first.ndim();
    let ax = match normalize_axis(dim, r) {
        Ok(a) => a,
        Err(m) => return site.fail(format!("{m} (shape {})", show(first.shape()))),
    };
    let mut dtype = first.dtype();
    let mut total = Dim::Const(0);
    for t in tensors {
        let same = t.ndim() == r && (0..r).all(|d| d == ax || t.shape()[d] == first.shape()[d]);
        if !same {
            return site.fail(format!(
                "shapes {} and {} differ outside dim {ax}",
                show(first.shape()),
                show(t.shape())
            ));
        }
        dtype = DType::promote(dtype, t.dtype());
        total = &total + &t.shape()[ax];
    }
    if tensors.len() == 1 {
        return first.p_cast(site, dtype);
    }
    let combine = if dtype.is_bool() { BinaryOp::Or } else { BinaryOp::Add };
    let zero = Scalar::Int(0).cast(dtype);
    let mut offset = Dim::Const(0);
    let mut acc: Option<Tensor> = None;
    for t in tensors {
        let size = t.shape()[ax].clone();
        let after = &(&total - &offset) - &size;
        let padding = (0..r)
            .map(|d| if d == ax { (offset.clone(), after.clone()) } else { (Dim::Const(0), Dim::Const(0)) })
            .collect();
        let padded = t.p_cast(site, dtype).p_pad(site, padding, zero);
        acc = Some(match acc {
            None => padded,
            Some(a) => a.p_binary(site, combine, &padded),
        });
        offset = &offset + &size;
    }
    acc.unwrap_or_else(|| (*first).clone())
}

/// Concatenates `tensors` along `dim` (`torch.cat`); see [`Tensor::cat`].
#[track_caller]
pub fn cat(tensors: &[&Tensor], dim: impl Axis) -> Tensor {
    cat_impl(Site::here("cat"), tensors, dim.to_isize())
}

/// Stacks `tensors` along a new axis `dim` (`torch.stack`); see [`Tensor::stack`].
#[track_caller]
pub fn stack(tensors: &[&Tensor], dim: impl Axis) -> Tensor {
    Tensor::stack(tensors, dim)
}

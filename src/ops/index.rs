//! Joining and indexing: `cat`, `stack`, `gather`, `index_select`, all built from primitives.
//!
//! `cat` pads every input with zeros to the full size along the axis and adds them (`or` for
//! bools). `gather` is the `gather` primitive, and `index_select` is a `gather` with the 1-D index
//! broadcast over the other axes: a direct read per output element, whatever the size of the
//! indexed axis. Their out-of-range (or negative) indices make the realize fail with an error
//! naming the op and the index, as PyTorch raises one; the gradient is a `scatter_add`.

use air::op::{Gather, ScatterAdd};
use air::{BinaryOp, DType, Dim, Op, Scalar, Shape};

use crate::shape::{Axis, normalize_axis, show};
use crate::tensor::{Site, Tensor};

impl Tensor {
    /// Concatenates `tensors` along `dim` (`torch.cat`). All must have the same rank and equal
    /// dims except along `dim`; dtypes are promoted.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: impl Axis) -> Tensor {
        cat_impl(Site::here("cat"), tensors, dim.to_isize())
    }

    /// `self` with `src` written over positions `[start, start + src.shape[dim])` of axis `dim`
    /// (`torch.slice_scatter`): a KV cache update. `start` may be symbolic (`Dim::sym("pos")`);
    /// a range past the end is an error when the program runs, never a write out of bounds.
    /// `src` must have `self`'s dtype and its shape off `dim`.
    ///
    /// Recorded as a concatenation of `self`'s part before the range, `src` and `self`'s part
    /// after it. When `self` is a compiled function's argument that nothing else reads and the
    /// result is an output, the program writes only `src`, in place over the argument's array
    /// (see [`crate::JitCache::call_owned`]).
    #[track_caller]
    pub fn slice_scatter(&self, src: &Tensor, dim: impl Axis, start: impl Into<Dim>) -> Tensor {
        let site = Site::here("slice_scatter");
        let r = self.ndim();
        let ax = match two_operand_axis(site, self, src, dim.to_isize()) {
            Ok(a) => a,
            Err(e) => return e,
        };
        if src.dtype() != self.dtype() {
            return site.fail(format!("src is {} but self is {}", src.dtype(), self.dtype()));
        }
        if src.ndim() != r || (0..r).any(|d| d != ax && src.shape()[d] != self.shape()[d]) {
            return site.fail(format!(
                "src shape {} differs from shape {} outside dim {ax}",
                show(src.shape()),
                show(self.shape())
            ));
        }
        let start = start.into();
        let len = src.shape()[ax];
        let end = start + len;
        if let (Some(s), Some(e), Some(n)) = (start.as_const(), end.as_const(), self.shape()[ax].as_const())
            && (s < 0 || e > n)
        {
            return site.fail(format!("range {s}..{e} of dim {ax} out of bounds for shape {}", show(self.shape())));
        }
        let window = |lo: &Dim, hi: &Dim| {
            let ranges = (0..r).map(|d| if d == ax { (*lo, *hi) } else { (Dim::Const(0), self.shape()[d]) });
            self.p_shrink(site, ranges.collect())
        };
        let before = window(&Dim::Const(0), &start);
        let after = window(&end, &self.shape()[ax]);
        // Pieces known to be empty are left out (a concatenation tiles its axis with non-empty
        // ranges).
        let pieces: Vec<&Tensor> =
            [&before, src, &after].into_iter().filter(|t| t.shape()[ax].as_const() != Some(0)).collect();
        cat_impl(site, &pieces, ax as isize)
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
    /// `self`. An index outside `0..self.shape[dim]` (negative ones too, like PyTorch) makes the
    /// realize fail with "index 7 out of range for size 4 in gather".
    #[track_caller]
    pub fn gather(&self, dim: impl Axis, index: &Tensor) -> Tensor {
        let site = Site::here("gather");
        let r = self.ndim();
        let ax = match two_operand_axis(site, self, index, dim.to_isize()) {
            Ok(a) => a,
            Err(e) => return e,
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
        Tensor::apply(site, Op::Gather(Gather { axis: ax }), &[self, index])
    }

    /// `self` with `src` added at the positions `index` names along `dim`
    /// (`torch.Tensor.scatter_add`): for `dim = 0`, `out[index[i][j]][j] += src[i][j]`.
    /// `index` (integer) and `src` have one shape and `self`'s rank; along the other axes they
    /// may be smaller than `self`. Duplicate indices add up. An index outside `0..self.shape[dim]`
    /// makes the realize fail, as in [`Tensor::gather`]. `i32`, `i64`, `f32` and `f64` values.
    #[track_caller]
    pub fn scatter_add(&self, dim: impl Axis, index: &Tensor, src: &Tensor) -> Tensor {
        let site = Site::here("scatter_add");
        if let Some(e) = [self, index, src].into_iter().find(|t| t.error().is_some()) {
            return e.clone();
        }
        let r = self.ndim();
        let ax = match normalize_axis(dim.to_isize(), r) {
            Ok(a) => a,
            Err(m) => return site.fail(format!("{m} (shape {})", show(self.shape()))),
        };
        if !index.dtype().is_int() {
            return site.fail(format!("index must be an integer tensor, got {}", index.dtype()));
        }
        if src.dtype() != self.dtype() || !matches!(self.dtype(), DType::I32 | DType::I64 | DType::F32 | DType::F64) {
            return site.fail(format!(
                "src ({}) must have self's dtype ({}), one of i32, i64, f32, f64",
                src.dtype(),
                self.dtype()
            ));
        }
        if index.shape() != src.shape() || index.ndim() != r {
            return site.fail(format!(
                "index {} and src {} must have one shape of the rank of self {}",
                show(index.shape()),
                show(src.shape()),
                show(self.shape())
            ));
        }
        // Along the other axes the op takes the output's size: smaller operands are padded with
        // index 0 and value 0, which add nothing.
        let mut padding = vec![(0usize, 0usize); r];
        for d in (0..r).filter(|&d| d != ax) {
            let (i, s) = (index.shape()[d], self.shape()[d]);
            match (i.as_const(), s.as_const()) {
                _ if i == s => {}
                (Some(a), Some(b)) if a <= b => padding[d] = (0, (b - a) as usize),
                _ => {
                    return site.fail(format!(
                        "index shape {} exceeds shape {} along dim {d}",
                        show(index.shape()),
                        show(self.shape())
                    ));
                }
            }
        }
        let (index, src) = if padding.iter().any(|&(_, after)| after > 0) {
            (index.pad(&padding, 0i64), src.pad(&padding, 0.0))
        } else {
            (index.clone(), src.clone())
        };
        let op = Op::ScatterAdd(Box::new(ScatterAdd { axis: ax, shape: self.shape().clone() }));
        self.add(Tensor::apply(site, op, &[&index, &src]))
    }

    /// The entries of `self` at positions `index` (1-D, integer) along `dim`
    /// (`torch.index_select`; an embedding lookup is `table.index_select(0, &ids)`). An index
    /// outside `0..self.shape[dim]` makes the realize fail, as in [`Tensor::gather`].
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
        // The index along `dim`, broadcast over the other axes (a view: no copy).
        let mut out = self.shape().clone();
        out[ax] = index.shape()[0];
        let mut index_shape: Shape = std::iter::repeat_n(Dim::Const(1), r).collect();
        index_shape[ax] = out[ax];
        let index = index.p_reshape(site, index_shape).p_expand(site, out);
        Tensor::apply(site, Op::Gather(Gather { axis: ax }), &[self, &index])
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

/// The axis `dim` of `t` for an op of `t` and `other`, or the tensor the op returns instead: the
/// first operand's error, or an error naming the bad axis.
fn two_operand_axis(site: Site, t: &Tensor, other: &Tensor, dim: isize) -> Result<usize, Tensor> {
    for x in [t, other] {
        if x.error().is_some() {
            return Err(x.clone());
        }
    }
    normalize_axis(dim, t.ndim()).map_err(|m| site.fail(format!("{m} (shape {})", show(t.shape()))))
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
        total = total + t.shape()[ax];
    }
    if tensors.len() == 1 {
        return first.p_cast(site, dtype);
    }
    let combine = if dtype.is_bool() { BinaryOp::Or } else { BinaryOp::Add };
    let zero = Scalar::Int(0).cast(dtype);
    let mut offset = Dim::Const(0);
    let mut acc: Option<Tensor> = None;
    for t in tensors {
        let size = t.shape()[ax];
        let after = (total - offset) - size;
        let padding = (0..r).map(|d| if d == ax { (offset, after) } else { (Dim::Const(0), Dim::Const(0)) }).collect();
        let padded = t.p_cast(site, dtype).p_pad(site, padding, zero);
        acc = Some(match acc {
            None => padded,
            Some(a) => a.p_binary(site, combine, &padded),
        });
        offset = offset + size;
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

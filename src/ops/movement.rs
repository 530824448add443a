//! Movement ops (views): `reshape`, `permute`, `transpose`, `expand`, `squeeze`, `unsqueeze`,
//! `flatten`, `narrow`, `slice`, `pad`. Each lowers to one air movement primitive (or none, when it
//! would change nothing).

use air::{Dim, Scalar, Shape};
use smallvec::SmallVec;

use crate::scalar::IntoScalar;
use crate::shape::{Axis, IntoShape, normalize_axis, show};
use crate::tensor::{Site, Tensor};

/// `Err(error tensor)` when `t` is an error tensor.
fn live(t: &Tensor) -> Result<(), Tensor> {
    if t.error().is_some() { Err(t.clone()) } else { Ok(()) }
}

fn axis(site: Site, t: &Tensor, a: isize) -> Result<usize, Tensor> {
    // An error tensor keeps its own error (its placeholder shape would misreport the axis).
    live(t)?;
    normalize_axis(a, t.ndim()).map_err(|m| site.fail(format!("{m} (shape {})", show(t.shape()))))
}

/// The `-1` at `skip` of a reshape of `shape` to `target` by cancelling the symbolic dims the two
/// share: `[batch, seq, 32]` to `[batch, seq, -1, 8]` leaves `32 / 8`. `None` when a symbolic
/// target dim is not one of `shape`'s or the constants do not divide.
fn cancel_common_dims(shape: &[Dim], target: &[Dim], skip: usize) -> Option<Dim> {
    let mut rest: Vec<&Dim> = shape.iter().collect();
    let mut known = 1i64;
    for (_, d) in target.iter().enumerate().filter(|&(j, _)| j != skip) {
        match d.as_const() {
            Some(v) => known = known.checked_mul(v)?,
            None => {
                let at = rest.iter().position(|r| *r == d)?;
                rest.remove(at);
            }
        }
    }
    let (consts, symbolic): (Vec<&Dim>, Vec<&Dim>) = rest.into_iter().partition(|d| d.is_const());
    let c = consts.iter().try_fold(1i64, |acc, d| acc.checked_mul(d.as_const()?))?;
    if known <= 0 || c % known != 0 {
        return None;
    }
    Some(symbolic.into_iter().fold(Dim::Const(c / known), |acc, d| &acc * d))
}

impl Tensor {
    /// The same elements (row-major) in a new shape; one dim may be `-1` (inferred).
    #[track_caller]
    pub fn reshape(&self, shape: impl IntoShape) -> Tensor {
        let site = Site::here("reshape");
        match self.reshape_shape(site, shape.into_dims()) {
            Ok(shape) => self.reshape_to(site, shape),
            Err(e) => e,
        }
    }

    /// Resolves a `-1` in a reshape target.
    fn reshape_shape(&self, site: Site, dims: Vec<Dim>) -> Result<Shape, Tensor> {
        live(self)?;
        let infer: Vec<usize> = (0..dims.len()).filter(|&i| dims[i].as_const().is_some_and(|c| c < 0)).collect();
        let bad = || site.fail(format!("cannot reshape {} to {}", show(self.shape()), show(&dims)));
        match infer.as_slice() {
            [] => Ok(dims.into_iter().collect()),
            [i] if dims[*i] == Dim::Const(-1) => {
                let known = dims.iter().enumerate().filter(|(j, _)| j != i).fold(Dim::Const(1), |acc, (_, d)| &acc * d);
                let total = self.ty().numel();
                let inferred = match known.as_const() {
                    Some(0) => None,
                    Some(k) => total.exact_div(k),
                    None if known == total => Some(Dim::Const(1)),
                    None => total
                        .exact_div_dim(&known)
                        .or_else(|| cancel_common_dims(self.shape(), &dims, *i))
                        .or_else(|| {
                            // Symbolic by symbolic: look for a product of some of this tensor's dims
                            // that completes the known part (rank is small, so 2^rank is cheap).
                            let shape = self.shape();
                            (shape.len() <= 12)
                                .then(|| {
                                    (0u32..1 << shape.len()).find_map(|mask| {
                                        let q = (0..shape.len())
                                            .filter(|i| mask & (1 << i) != 0)
                                            .fold(Dim::Const(1), |acc, i| acc * shape[i]);
                                        (q * known == total).then_some(q)
                                    })
                                })
                                .flatten()
                        }),
                };
                let Some(inferred) = inferred else { return Err(bad()) };
                let mut out: Shape = dims.into_iter().collect();
                out[*i] = inferred;
                Ok(out)
            }
            _ => Err(bad()),
        }
    }

    /// Reorders axes: output axis `i` is input axis `perm[i]` (negative allowed).
    #[track_caller]
    pub fn permute(&self, perm: impl crate::shape::Axes) -> Tensor {
        let site = Site::here("permute");
        if let Err(e) = live(self) {
            return e;
        }
        let given = perm.to_axes();
        let mut norm: SmallVec<[usize; 4]> = SmallVec::new();
        for &a in &given {
            match axis(site, self, a) {
                Ok(a) => norm.push(a),
                Err(e) => return e,
            }
        }
        let mut seen = vec![false; self.ndim()];
        if norm.len() != self.ndim() || norm.iter().any(|&a| std::mem::replace(&mut seen[a], true)) {
            return site.fail(format!(
                "{:?} is not a permutation of the axes of shape {}",
                given.as_slice(),
                show(self.shape())
            ));
        }
        self.permute_to(site, norm)
    }

    /// Swaps two axes.
    #[track_caller]
    pub fn transpose(&self, dim0: impl Axis, dim1: impl Axis) -> Tensor {
        let site = Site::here("transpose");
        let (a, b) = match (axis(site, self, dim0.to_isize()), axis(site, self, dim1.to_isize())) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return e,
        };
        let mut perm: SmallVec<[usize; 4]> = (0..self.ndim()).collect();
        perm.swap(a, b);
        self.permute_to(site, perm)
    }

    /// Broadcasts size-1 axes (and new leading axes) to `shape`; `-1` keeps a dim.
    #[track_caller]
    pub fn expand(&self, shape: impl IntoShape) -> Tensor {
        let site = Site::here("expand");
        if let Err(e) = live(self) {
            return e;
        }
        let dims = shape.into_dims();
        if dims.len() < self.ndim() {
            return site.fail(format!("cannot expand {} to {} (fewer dims)", show(self.shape()), show(&dims)));
        }
        let lead = dims.len() - self.ndim();
        let mut target = Shape::with_capacity(dims.len());
        for (i, d) in dims.iter().enumerate() {
            if *d == Dim::Const(-1) {
                if i < lead {
                    return site.fail(format!(
                        "-1 is not allowed for a new leading dim (expanding {} to {})",
                        show(self.shape()),
                        show(&dims)
                    ));
                }
                target.push(self.shape()[i - lead]);
            } else {
                let ok = i < lead || self.shape()[i - lead] == *d || self.shape()[i - lead] == Dim::Const(1);
                if !ok || d.as_const().is_some_and(|c| c < 0) {
                    return site.fail(format!("cannot expand {} to {}", show(self.shape()), show(&dims)));
                }
                target.push(*d);
            }
        }
        crate::ops::elementwise::broadcast_to(site, self, &target)
    }

    /// The same as [`Tensor::expand`] without `-1` (numpy's `broadcast_to`).
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl IntoShape) -> Tensor {
        self.expand(shape)
    }

    /// Removes axis `dim` if it has size 1 (otherwise returns `self`, as PyTorch does).
    #[track_caller]
    pub fn squeeze(&self, dim: impl Axis) -> Tensor {
        let site = Site::here("squeeze");
        let a = match axis(site, self, dim.to_isize()) {
            Ok(a) => a,
            Err(e) => return e,
        };
        if self.shape()[a] != Dim::Const(1) {
            return self.clone();
        }
        let mut shape = self.shape().clone();
        shape.remove(a);
        self.p_reshape(site, shape)
    }

    /// Removes every axis of size 1.
    #[track_caller]
    pub fn squeeze_all(&self) -> Tensor {
        let site = Site::here("squeeze");
        if let Err(e) = live(self) {
            return e;
        }
        let shape: Shape = self.shape().iter().filter(|d| **d != Dim::Const(1)).cloned().collect();
        self.reshape_to(site, shape)
    }

    /// Inserts an axis of size 1 at `dim` (`-1` appends, as in PyTorch).
    #[track_caller]
    pub fn unsqueeze(&self, dim: impl Axis) -> Tensor {
        let site = Site::here("unsqueeze");
        if let Err(e) = live(self) {
            return e;
        }
        let a = match normalize_axis(dim.to_isize(), self.ndim() + 1) {
            Ok(a) => a,
            Err(m) => return site.fail(format!("{m} (shape {})", show(self.shape()))),
        };
        let mut shape = self.shape().clone();
        shape.insert(a, Dim::Const(1));
        self.p_reshape(site, shape)
    }

    /// Merges axes `start_dim..=end_dim` into one (negative allowed). A rank-0 tensor becomes `[1]`.
    #[track_caller]
    pub fn flatten(&self, start_dim: impl Axis, end_dim: impl Axis) -> Tensor {
        let site = Site::here("flatten");
        if let Err(e) = live(self) {
            return e;
        }
        if self.ndim() == 0 {
            return self.p_reshape(site, smallvec::smallvec![Dim::Const(1)]);
        }
        let (a, b) = match (axis(site, self, start_dim.to_isize()), axis(site, self, end_dim.to_isize())) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return e,
        };
        if a > b {
            return site.fail(format!("start dim {a} comes after end dim {b} (shape {})", show(self.shape())));
        }
        let s = self.shape();
        let merged = s[a..=b].iter().fold(Dim::Const(1), |acc, d| &acc * d);
        let shape: Shape =
            s[..a].iter().cloned().chain(std::iter::once(merged)).chain(s[b + 1..].iter().cloned()).collect();
        self.reshape_to(site, shape)
    }

    /// `length` elements of axis `dim` starting at `start` (an air `shrink`). Start and length may
    /// be symbolic.
    #[track_caller]
    pub fn narrow(&self, dim: impl Axis, start: impl Into<Dim>, length: impl Into<Dim>) -> Tensor {
        let site = Site::here("narrow");
        let a = match axis(site, self, dim.to_isize()) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let (start, length) = (start.into(), length.into());
        let end = start + length;
        let size = &self.shape()[a];
        let out_of_range = match (start.as_const(), length.as_const(), size.as_const()) {
            (Some(s), Some(l), Some(n)) => s < 0 || l < 0 || s + l > n,
            (Some(s), Some(l), None) => s < 0 || l < 0,
            _ => false,
        };
        if out_of_range {
            return site.fail(format!(
                "start {start} + length {length} out of range for dim {a} of shape {}",
                show(self.shape())
            ));
        }
        let ranges = self
            .shape()
            .iter()
            .enumerate()
            .map(|(i, d)| if i == a { (start, end) } else { (Dim::Const(0), *d) })
            .collect();
        self.p_shrink(site, ranges)
    }

    /// Elements `start..end` of axis `dim`, Python-style: negative indices count from the end and
    /// out-of-range bounds are clamped (the dim must be concrete). Step 1 only.
    #[track_caller]
    pub fn slice(&self, dim: impl Axis, start: isize, end: isize) -> Tensor {
        let site = Site::here("slice");
        let a = match axis(site, self, dim.to_isize()) {
            Ok(a) => a,
            Err(e) => return e,
        };
        let Some(n) = self.shape()[a].as_const() else {
            return site.fail(format!("dim {a} of shape {} is symbolic; use narrow", show(self.shape())));
        };
        let n = n as isize;
        let clamp = |i: isize| if i < 0 { (i + n).max(0) } else { i.min(n) };
        let (s, e) = (clamp(start), clamp(end));
        let e = e.max(s);
        let ranges = self
            .shape()
            .iter()
            .enumerate()
            .map(|(i, d)| if i == a { (Dim::Const(s as i64), Dim::Const(e as i64)) } else { (Dim::Const(0), *d) })
            .collect();
        self.p_shrink(site, ranges)
    }

    /// Pads every axis with `(before, after)` elements of `value`: one pair per axis, first axis
    /// first (unlike `torch.nn.functional.pad`, which lists pairs from the last axis).
    #[track_caller]
    pub fn pad(&self, padding: &[(usize, usize)], value: impl IntoScalar) -> Tensor {
        let site = Site::here("pad");
        if let Err(e) = live(self) {
            return e;
        }
        if padding.len() != self.ndim() {
            return site.fail(format!(
                "{} (before, after) pairs for shape {} of rank {}",
                padding.len(),
                show(self.shape()),
                self.ndim()
            ));
        }
        let pairs = padding.iter().map(|&(b, a)| (Dim::from(b), Dim::from(a))).collect();
        let value: Scalar = value.into_scalar().cast(self.dtype());
        self.p_pad(site, pairs, value)
    }

    /// Returns `self`: every Kiln tensor is logically contiguous (layouts are the compiler's job).
    pub fn contiguous(&self) -> Tensor {
        self.clone()
    }

    /// The same values with no gradient flowing back through them (PyTorch's `detach`).
    #[track_caller]
    pub fn detach(&self) -> Tensor {
        self.stop_gradient()
    }
}

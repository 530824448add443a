//! Arguments that describe shapes and axes, and the numpy broadcasting rule.
//!
//! Shapes are accepted as borrowed arrays or slices, or vectors, of `usize`, `i32`, `i64` or
//! [`Dim`]: `t.reshape(&[2, -1])`, `Tensor::zeros(&[2, 3], DType::F32)`,
//! `t.reshape(vec![Dim::sym("seq"), Dim::from(4)])`. Arrays are taken only by reference, so there
//! is one spelling (`&[2, 3]`, as in tch) and clippy never calls the borrow needless. Axes are
//! `i32`, `i64`, `isize` or `usize`; negative axes count from the end as in PyTorch.

use air::dim::ShapeDisplay;
use air::{Dim, Shape};
use smallvec::SmallVec;

/// Something that lists dims: borrowed arrays, slices and vectors of integers or [`Dim`]s, or a
/// [`Shape`].
///
/// Negative integers are kept as negative constants; only `reshape` and `expand` give `-1` a
/// meaning (infer, keep), everywhere else a negative dim is an error.
pub trait IntoShape {
    /// The dims, in order.
    fn into_dims(self) -> Vec<Dim>;
}

macro_rules! int_shapes {
    ($($t:ty),*) => {$(
        impl IntoShape for &[$t] {
            fn into_dims(self) -> Vec<Dim> {
                self.iter().map(|&d| Dim::Const(d as i64)).collect()
            }
        }
        impl<const N: usize> IntoShape for &[$t; N] {
            fn into_dims(self) -> Vec<Dim> {
                self.as_slice().into_dims()
            }
        }
        impl IntoShape for Vec<$t> {
            fn into_dims(self) -> Vec<Dim> {
                self.as_slice().into_dims()
            }
        }
        impl IntoShape for &Vec<$t> {
            fn into_dims(self) -> Vec<Dim> {
                self.as_slice().into_dims()
            }
        }
    )*};
}
int_shapes!(usize, i32, i64);

impl IntoShape for &[Dim] {
    fn into_dims(self) -> Vec<Dim> {
        self.to_vec()
    }
}
impl<const N: usize> IntoShape for &[Dim; N] {
    fn into_dims(self) -> Vec<Dim> {
        self.to_vec()
    }
}
impl IntoShape for Vec<Dim> {
    fn into_dims(self) -> Vec<Dim> {
        self
    }
}
impl IntoShape for &Vec<Dim> {
    fn into_dims(self) -> Vec<Dim> {
        self.clone()
    }
}
impl IntoShape for Shape {
    fn into_dims(self) -> Vec<Dim> {
        self.into_vec()
    }
}
impl IntoShape for &Shape {
    fn into_dims(self) -> Vec<Dim> {
        self.to_vec()
    }
}

/// One axis: `i32`, `i64`, `isize` or `usize`; negative values count from the end.
pub trait Axis: Copy {
    /// The axis as a signed index.
    fn to_isize(self) -> isize;
}

/// A list of axes: one [`Axis`] (`x.sum_keepdim(1)`), a borrowed array or slice
/// (`x.sum(&[0, -1])`) or a vector. Arrays are accepted only borrowed, so the PyTorch-like
/// spelling `&[1]` is the one spelling (and clippy has no borrow to call needless).
pub trait Axes {
    /// The axes, in the order given.
    fn to_axes(&self) -> SmallVec<[isize; 4]>;
}

macro_rules! axis_types {
    ($($t:ty),*) => {$(
        impl Axis for $t {
            fn to_isize(self) -> isize {
                self as isize
            }
        }
        impl Axes for $t {
            fn to_axes(&self) -> SmallVec<[isize; 4]> {
                smallvec::smallvec![*self as isize]
            }
        }
        impl Axes for &[$t] {
            fn to_axes(&self) -> SmallVec<[isize; 4]> {
                self.iter().map(|&a| a as isize).collect()
            }
        }
        impl<const N: usize> Axes for &[$t; N] {
            fn to_axes(&self) -> SmallVec<[isize; 4]> {
                self.iter().map(|&a| a as isize).collect()
            }
        }
        impl Axes for Vec<$t> {
            fn to_axes(&self) -> SmallVec<[isize; 4]> {
                self.iter().map(|&a| a as isize).collect()
            }
        }
        impl Axes for &Vec<$t> {
            fn to_axes(&self) -> SmallVec<[isize; 4]> {
                self.iter().map(|&a| a as isize).collect()
            }
        }
    )*};
}
axis_types!(i32, i64, isize, usize);

/// `axis` as an index into a shape of rank `rank` (`-1` is the last axis).
pub(crate) fn normalize_axis(axis: isize, rank: usize) -> Result<usize, String> {
    let r = rank as isize;
    if axis < -r || axis >= r {
        return Err(format!("dim {axis} out of range for rank {rank} (expected {} to {})", -r, r - 1));
    }
    Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
}

/// Normalizes and sorts `axes`, rejecting repeats.
pub(crate) fn normalize_axes(axes: &[isize], rank: usize) -> Result<SmallVec<[usize; 4]>, String> {
    let mut out: SmallVec<[usize; 4]> = SmallVec::new();
    for &a in axes {
        out.push(normalize_axis(a, rank)?);
    }
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("dims {axes:?} repeat an axis"));
    }
    Ok(out)
}

/// The numpy broadcast of two shapes: align from the right, a dim of 1 stretches.
pub(crate) fn broadcast_shapes(a: &[Dim], b: &[Dim]) -> Result<Shape, String> {
    let rank = a.len().max(b.len());
    let one = Dim::Const(1);
    let mut out = Shape::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank { &a[i + a.len() - rank] } else { &one };
        let db = if i + b.len() >= rank { &b[i + b.len() - rank] } else { &one };
        let d = if da == db || *db == one {
            *da
        } else if *da == one {
            *db
        } else {
            return Err(format!(
                "shapes {} and {} cannot be broadcast together (dim {da} vs {db})",
                ShapeDisplay(a),
                ShapeDisplay(b)
            ));
        };
        out.push(d);
    }
    Ok(out)
}

/// `shape` printed as `[2, seq]`.
pub(crate) fn show(shape: &[Dim]) -> String {
    ShapeDisplay(shape).to_string()
}

/// Concrete dims, or `None` when a dim is symbolic or negative.
pub(crate) fn concrete(shape: &[Dim]) -> Option<Vec<usize>> {
    shape.iter().map(|d| d.as_const().filter(|&c| c >= 0).map(|c| c as usize)).collect()
}

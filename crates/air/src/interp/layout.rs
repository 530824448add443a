//! Index arithmetic of the interpreter: a strided view over a row-major buffer, and the movement
//! and reduce ops written with it.
//!
//! Every tensor the interpreter holds is contiguous and row-major. A movement op describes where
//! each output element lives in its input as a `View` and gathers (or, for `pad`, scatters) the
//! elements through it; `reshape` needs no view at all.

use std::sync::Arc;

use crate::host::{Element, HostData, HostTensor};
use crate::op::ReduceOp;
use crate::with_host_data;

use super::elementwise::{fill, floats_to};
use crate::dtype::Scalar;
use crate::scalar::{Int, float_max};

/// The element count of `shape`, or an error if it overflows or could not be allocated (more than
/// `isize::MAX` bytes at 8 bytes an element), so that absurd sizes fail cleanly instead of panicking.
pub(super) fn checked_numel(shape: &[usize]) -> Result<usize, String> {
    let limit = isize::MAX as usize / 8;
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d).filter(|&n| n <= limit))
        .ok_or_else(|| format!("shape {shape:?} has too many elements"))
}

/// Below this many bytes an output is allocated without the check of [`check_allocation`].
const CHECKED_ALLOCATION_BYTES: usize = 1 << 20;

/// Fails, instead of letting the process abort, when `numel` elements of `elem_bytes` bytes cannot
/// be allocated: a large output's bytes are reserved once, fallibly, and released before the op
/// allocates its value as usual. A request the allocator refuses outright (more than the
/// machine's memory, with Linux's default overcommit) is an error here, not an abort there.
pub(super) fn check_allocation(numel: usize, elem_bytes: usize) -> Result<(), String> {
    let bytes = numel.checked_mul(elem_bytes).ok_or_else(|| format!("{numel} elements overflow the address space"))?;
    if bytes < CHECKED_ALLOCATION_BYTES {
        return Ok(());
    }
    let mut probe: Vec<u8> = Vec::new();
    probe.try_reserve_exact(bytes).map_err(|_| format!("out of memory: could not allocate {bytes} bytes"))
}

/// Row-major strides of `shape`, in elements.
pub(super) fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut step = 1;
    for k in (0..shape.len()).rev() {
        strides[k] = step;
        step *= shape[k];
    }
    strides
}

/// A strided view: the element at multi-index `idx` (in `shape`) lives at buffer position
/// `offset + sum(idx[k] * strides[k])`. A stride of 0 repeats an element (broadcast).
#[derive(Clone, Debug)]
pub(super) struct View {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl View {
    /// The buffer positions of every element, with multi-indices in row-major order.
    pub fn offsets(&self) -> Offsets<'_> {
        let empty = self.shape.contains(&0);
        Offsets { view: self, index: vec![0; self.shape.len()], next: if empty { None } else { Some(self.offset) } }
    }
}

/// Walks a view like an odometer: the last axis moves fastest.
pub(super) struct Offsets<'a> {
    view: &'a View,
    index: Vec<usize>,
    next: Option<usize>,
}

impl Iterator for Offsets<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let current = self.next?;
        let mut position = current;
        for k in (0..self.index.len()).rev() {
            self.index[k] += 1;
            position += self.view.strides[k];
            if self.index[k] < self.view.shape[k] {
                self.next = Some(position);
                return Some(current);
            }
            // This axis wrapped around: back to index 0, carry into the axis before it.
            position -= self.view.strides[k] * self.view.shape[k];
            self.index[k] = 0;
        }
        self.next = None;
        Some(current)
    }
}

fn gather_vec<T: Copy>(src: &[T], view: &View) -> Vec<T> {
    view.offsets().map(|o| src[o]).collect()
}

/// The elements of `view` over `data`, in row-major order of the view's shape.
fn gather(data: &HostData, view: &View) -> HostData {
    with_host_data!(data, v => Element::wrap(gather_vec(v, view)))
}

fn tensor(data: HostData, shape: Vec<usize>) -> HostTensor {
    HostTensor { data: Arc::new(data), shape }
}

/// Same elements, new shape of equal element count. Shares the buffer.
pub(super) fn reshape(x: &HostTensor, shape: Vec<usize>) -> Result<HostTensor, String> {
    let numel = checked_numel(&shape)?;
    if numel != x.numel() {
        return Err(format!("cannot reshape {:?} ({} elements) to {:?} ({numel} elements)", x.shape, x.numel(), shape));
    }
    Ok(HostTensor { data: x.data.clone(), shape })
}

/// Output axis `i` is input axis `perm[i]`.
pub(super) fn permute(x: &HostTensor, perm: &[usize]) -> Result<HostTensor, String> {
    let rank = x.shape.len();
    let mut seen = vec![false; rank];
    for &a in perm {
        if a >= rank || seen[a] {
            return Err(format!("{perm:?} is not a permutation of the axes of {:?}", x.shape));
        }
        seen[a] = true;
    }
    if perm.len() != rank {
        return Err(format!("{perm:?} is not a permutation of the axes of {:?}", x.shape));
    }
    let strides = row_major_strides(&x.shape);
    let view = View {
        shape: perm.iter().map(|&a| x.shape[a]).collect(),
        strides: perm.iter().map(|&a| strides[a]).collect(),
        offset: 0,
    };
    Ok(tensor(gather(&x.data, &view), view.shape.clone()))
}

/// Broadcasts size-1 axes to `shape` (same rank).
pub(super) fn expand(x: &HostTensor, shape: Vec<usize>) -> Result<HostTensor, String> {
    if shape.len() != x.shape.len() {
        return Err(format!("cannot expand {:?} to {shape:?}", x.shape));
    }
    let strides = row_major_strides(&x.shape);
    let mut view_strides = Vec::with_capacity(shape.len());
    for k in 0..shape.len() {
        if x.shape[k] == shape[k] {
            view_strides.push(strides[k]);
        } else if x.shape[k] == 1 {
            view_strides.push(0);
        } else {
            return Err(format!("cannot expand {:?} to {shape:?}", x.shape));
        }
    }
    checked_numel(&shape)?;
    let view = View { shape, strides: view_strides, offset: 0 };
    Ok(tensor(gather(&x.data, &view), view.shape.clone()))
}

/// Keeps `start..end` of each axis.
pub(super) fn shrink(x: &HostTensor, ranges: &[(usize, usize)]) -> Result<HostTensor, String> {
    if ranges.len() != x.shape.len() || ranges.iter().zip(&x.shape).any(|(&(start, end), &n)| start > end || end > n) {
        return Err(format!("ranges {ranges:?} do not fit shape {:?}", x.shape));
    }
    let strides = row_major_strides(&x.shape);
    let view = View {
        shape: ranges.iter().map(|&(start, end)| end - start).collect(),
        offset: ranges.iter().zip(&strides).map(|(&(start, _), &s)| start * s).sum(),
        strides,
    };
    Ok(tensor(gather(&x.data, &view), view.shape.clone()))
}

fn scatter_vec<T: Copy>(dst: &mut [T], src: &[T], view: &View) {
    for (&x, o) in src.iter().zip(view.offsets()) {
        dst[o] = x;
    }
}

/// Adds `(before, after)` elements of `value` around each axis.
pub(super) fn pad(x: &HostTensor, padding: &[(usize, usize)], value: Scalar) -> Result<HostTensor, String> {
    if padding.len() != x.shape.len() {
        return Err(format!("{} padding pairs for shape {:?}", padding.len(), x.shape));
    }
    let mut shape = Vec::with_capacity(padding.len());
    for (&n, &(before, after)) in x.shape.iter().zip(padding) {
        let padded = n.checked_add(before).and_then(|m| m.checked_add(after));
        shape.push(padded.ok_or_else(|| format!("padding {padding:?} of shape {:?} overflows", x.shape))?);
    }
    let numel = checked_numel(&shape)?;
    let strides = row_major_strides(&shape);
    // Where the input lands inside the padded output.
    let inner = View {
        shape: x.shape.clone(),
        offset: padding.iter().zip(&strides).map(|(&(before, _), &s)| before * s).sum(),
        strides,
    };
    let mut out = fill(x.dtype(), numel, value);
    match (&mut out, &*x.data) {
        (HostData::Bool(d), HostData::Bool(s)) => scatter_vec(d, s, &inner),
        (HostData::I32(d), HostData::I32(s)) => scatter_vec(d, s, &inner),
        (HostData::I64(d), HostData::I64(s)) => scatter_vec(d, s, &inner),
        (HostData::F16(d), HostData::F16(s)) => scatter_vec(d, s, &inner),
        (HostData::BF16(d), HostData::BF16(s)) => scatter_vec(d, s, &inner),
        (HostData::F32(d), HostData::F32(s)) => scatter_vec(d, s, &inner),
        (HostData::F64(d), HostData::F64(s)) => scatter_vec(d, s, &inner),
        _ => return Err("pad: fill has another dtype than the input".into()),
    }
    Ok(tensor(out, shape))
}

/// For every input element in row-major order, the position of the output element it reduces
/// into.
fn reduce_targets(in_shape: &[usize], axes: &[usize]) -> (Vec<usize>, View) {
    let mut out_shape = in_shape.to_vec();
    for &a in axes {
        out_shape[a] = 1;
    }
    let mut strides = row_major_strides(&out_shape);
    for &a in axes {
        strides[a] = 0;
    }
    (out_shape, View { shape: in_shape.to_vec(), strides, offset: 0 })
}

fn reduce_int<T: Int>(v: &[T], op: ReduceOp, out_len: usize, targets: &View) -> Vec<T> {
    let (init, f): (T, fn(T, T) -> T) = match op {
        ReduceOp::Sum => (T::ZERO, T::wrapping_add),
        ReduceOp::Max => (T::MIN, |a, b| a.max(b)),
    };
    let mut acc = vec![init; out_len];
    for (&x, o) in v.iter().zip(targets.offsets()) {
        acc[o] = f(acc[o], x);
    }
    acc
}

fn reduce_float(v: impl Iterator<Item = f64>, op: ReduceOp, out_len: usize, targets: &View) -> Vec<f64> {
    let (init, f): (f64, fn(f64, f64) -> f64) = match op {
        ReduceOp::Sum => (0.0, |a, b| a + b),
        ReduceOp::Max => (f64::NEG_INFINITY, float_max),
    };
    let mut acc = vec![init; out_len];
    for (x, o) in v.zip(targets.offsets()) {
        acc[o] = f(acc[o], x);
    }
    acc
}

/// Reduces `axes` (sorted, unique), keeping them with size 1.
pub(super) fn reduce(x: &HostTensor, op: ReduceOp, axes: &[usize]) -> Result<HostTensor, String> {
    let rank = x.shape.len();
    if axes.iter().any(|&a| a >= rank) || axes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("axes {axes:?} invalid for shape {:?} (need sorted, unique, in range)", x.shape));
    }
    let (out_shape, targets) = reduce_targets(&x.shape, axes);
    let n: usize = out_shape.iter().product();
    let floats = |acc: Vec<f64>| floats_to(acc.into_iter(), x.dtype());
    let out = match &*x.data {
        HostData::Bool(_) => return Err(format!("reduce {} does not support dtype bool", op.name())),
        HostData::I32(v) => HostData::I32(reduce_int(v, op, n, &targets)),
        HostData::I64(v) => HostData::I64(reduce_int(v, op, n, &targets)),
        HostData::F16(v) => floats(reduce_float(v.iter().map(|x| x.to_f64()), op, n, &targets)),
        HostData::BF16(v) => floats(reduce_float(v.iter().map(|x| x.to_f64()), op, n, &targets)),
        HostData::F32(v) => floats(reduce_float(v.iter().map(|&x| x as f64), op, n, &targets)),
        HostData::F64(v) => floats(reduce_float(v.iter().copied(), op, n, &targets)),
    };
    Ok(tensor(out, out_shape))
}

/// The index along `axis` of every element of `shape`, in row-major order.
pub(super) fn iota_indices(shape: &[usize], axis: usize) -> impl Iterator<Item = i64> {
    let numel: usize = shape.iter().product();
    let stride = row_major_strides(shape)[axis];
    let size = shape[axis];
    (0..numel).map(move |p| ((p / stride) % size) as i64)
}

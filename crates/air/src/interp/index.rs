//! `gather` and `scatter_add` in the interpreter: reads and writes at positions taken from data,
//! with every index checked against the size of its axis.

use std::sync::Arc;

use crate::host::{HostData, HostTensor};

use super::layout::{checked_numel, row_major_strides};

/// The index values as `i64`, or an error if the index is not an integer array.
fn index_values(index: &HostData) -> Result<Vec<i64>, String> {
    match index {
        HostData::I32(v) => Ok(v.iter().map(|&i| i as i64).collect()),
        HostData::I64(v) => Ok(v.clone()),
        other => Err(format!("index must be i32 or i64, got {}", other.dtype())),
    }
}

/// The message of an index outside `0..size` (shared wording with the compiled backends).
pub fn index_error(op: &str, value: i64, size: i64) -> String {
    format!("index {value} out of range for size {size} in {op}")
}

/// For every position of `index_shape` in row-major order, the row-major position in `shape`
/// with coordinate `axis` replaced by that position's index value (checked against
/// `shape[axis]`). `index_shape` is no larger than `shape` along the other axes.
fn positions(
    op: &str,
    shape: &[usize],
    index_shape: &[usize],
    axis: usize,
    index: &[i64],
) -> Result<Vec<usize>, String> {
    let rank = shape.len();
    if index_shape.len() != rank || axis >= rank || (0..rank).any(|d| d != axis && index_shape[d] > shape[d]) {
        return Err(format!("index shape {index_shape:?} does not fit shape {shape:?} along axis {axis}"));
    }
    if checked_numel(index_shape)? != index.len() {
        return Err(format!("index shape {index_shape:?} does not match its {} elements", index.len()));
    }
    let strides = row_major_strides(shape);
    let size = shape[axis];
    let mut coord = vec![0usize; rank];
    let mut out = Vec::with_capacity(index.len());
    for &i in index {
        if i < 0 || i as u64 >= size as u64 {
            return Err(index_error(op, i, size as i64));
        }
        let mut pos = 0;
        for d in 0..rank {
            let c = if d == axis { i as usize } else { coord[d] };
            pos += c * strides[d];
        }
        out.push(pos);
        // Advance the odometer over `index_shape`, last axis fastest.
        for d in (0..rank).rev() {
            coord[d] += 1;
            if coord[d] < index_shape[d] {
                break;
            }
            coord[d] = 0;
        }
    }
    Ok(out)
}

/// `out[p] = src[p with coordinate axis replaced by index[p]]`.
pub(super) fn gather(src: &HostTensor, index: &HostTensor, axis: usize) -> Result<HostTensor, String> {
    let idx = index_values(&index.data)?;
    let pos = positions("gather", &src.shape, &index.shape, axis, &idx)?;
    let data = crate::with_host_data!(&*src.data, v => crate::host::Element::wrap(pos.iter().map(|&p| v[p]).collect()));
    Ok(HostTensor { data: Arc::new(data), shape: index.shape.clone() })
}

/// Zeros of `shape`, then `out[p with coordinate axis replaced by index[p]] += values[p]` for every
/// position `p` in row-major order, adding in the values' dtype (ints wrap).
pub(super) fn scatter_add(
    index: &HostTensor,
    values: &HostTensor,
    axis: usize,
    shape: Vec<usize>,
) -> Result<HostTensor, String> {
    if values.shape != index.shape {
        return Err(format!("values shape {:?} differs from index shape {:?}", values.shape, index.shape));
    }
    if (0..shape.len()).any(|d| d != axis && shape.get(d) != index.shape.get(d)) {
        return Err(format!("index shape {:?} differs from shape {shape:?} off axis {axis}", index.shape));
    }
    let idx = index_values(&index.data)?;
    let pos = positions("scatter_add", &shape, &index.shape, axis, &idx)?;
    let n = checked_numel(&shape)?;
    let data = match &*values.data {
        HostData::I32(v) => {
            let mut out = vec![0i32; n];
            pos.iter().zip(v).for_each(|(&p, &x)| out[p] = out[p].wrapping_add(x));
            HostData::I32(out)
        }
        HostData::I64(v) => {
            let mut out = vec![0i64; n];
            pos.iter().zip(v).for_each(|(&p, &x)| out[p] = out[p].wrapping_add(x));
            HostData::I64(out)
        }
        HostData::F32(v) => {
            let mut out = vec![0f32; n];
            pos.iter().zip(v).for_each(|(&p, &x)| out[p] += x);
            HostData::F32(out)
        }
        HostData::F64(v) => {
            let mut out = vec![0f64; n];
            pos.iter().zip(v).for_each(|(&p, &x)| out[p] += x);
            HostData::F64(out)
        }
        other => return Err(format!("scatter_add does not support dtype {}", other.dtype())),
    };
    Ok(HostTensor { data: Arc::new(data), shape })
}

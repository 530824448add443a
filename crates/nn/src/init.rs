//! Parameter initialisation on the host, from the calling thread's `kiln` generator (so `kiln::manual_seed`
//! makes models reproducible). Initial values follow PyTorch's defaults.

use kiln::Tensor;

/// A trainable parameter: a source tensor holding `data`, marked `requires_grad`.
pub(crate) fn param(data: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(data, shape).requires_grad_()
}

/// A buffer (not trainable): a source tensor holding `data`.
pub(crate) fn buffer(data: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(data, shape)
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn host_samples(shape: &[usize], normal: bool) -> Vec<f32> {
    let t = if normal { Tensor::randn(&[numel(shape)]) } else { Tensor::rand(&[numel(shape)]) };
    // A source tensor already holds its data: `to_vec` runs nothing.
    t.to_vec::<f32>().unwrap_or_else(|_| vec![0.0; numel(shape)])
}

/// Uniform in `[-bound, bound)` (PyTorch's `Linear`/`Conv` default with `bound = 1/sqrt(fan_in)`).
pub(crate) fn uniform(shape: &[usize], bound: f32) -> Tensor {
    let data = host_samples(shape, false).into_iter().map(|u| (2.0 * u - 1.0) * bound).collect();
    param(data, shape)
}

/// Standard normal times `std` (PyTorch's `Embedding` default with `std = 1`).
pub(crate) fn normal(shape: &[usize], std: f32) -> Tensor {
    let data = host_samples(shape, true).into_iter().map(|u| u * std).collect();
    param(data, shape)
}

/// A trainable parameter filled with `value`.
pub(crate) fn filled(shape: &[usize], value: f32) -> Tensor {
    param(vec![value; numel(shape)], shape)
}

/// A buffer filled with `value`.
pub(crate) fn filled_buffer(shape: &[usize], value: f32) -> Tensor {
    buffer(vec![value; numel(shape)], shape)
}

//! `f32` matmuls of the anchors' shapes, `(512x1024)@(1024x2048)` and `1024^3`, from one input
//! generator (the lowering turns each into one GEMM launch).

use kiln::Tensor;

/// `(m, k, n)` of each product.
pub const SHAPES: [(usize, usize, usize); 2] = [(512, 1024, 2048), (1024, 1024, 1024)];

/// A `rows x cols` operand (host data: values in `[-0.8, 0.8]`, varied by `seed`).
pub fn operand(rows: usize, cols: usize, seed: usize) -> Tensor {
    let data: Vec<f32> = (0..rows * cols).map(|i| (((i * 13 + seed) % 53) as f32 - 26.0) / 32.0).collect();
    Tensor::from_vec(data, &[rows, cols])
}

/// The two operands of `(m x k) @ (k x n)`.
pub fn operands(m: usize, k: usize, n: usize) -> (Tensor, Tensor) {
    (operand(m, k, 1), operand(k, n, 2))
}

/// The floating-point operations of one `(m x k) @ (k x n)` product.
pub fn flops(m: usize, k: usize, n: usize) -> u64 {
    2 * (m * k * n) as u64
}

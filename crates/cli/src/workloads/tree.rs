//! A tree of matmuls: [`Shape::pairs`] independent `(m x k) @ (k x n)` `f32` products (by
//! default 32 of `(128x256)@(256x512)`, 1.07 GFLOP, what the anchor `bench_tree_matmul.py`
//! measures), three ways: a loop of single products, `kiln::Tree`s of the operands multiplied
//! leaf by leaf (one program; equal-shape matmuls become one grouped launch), and one batched
//! matmul of the pre-stacked operands.

use kiln::{Tensor, Tree};

/// The sizes of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Independent products.
    pub pairs: usize,
    /// Rows of each left operand.
    pub m: usize,
    /// Columns of each left operand, rows of each right one.
    pub k: usize,
    /// Columns of each right operand.
    pub n: usize,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape { pairs: 32, m: 128, k: 256, n: 512 }
    }
}

impl Shape {
    /// The floating-point operations of all products.
    pub fn flops(&self) -> u64 {
        2 * (self.pairs * self.m * self.k * self.n) as u64
    }
}

/// A `rows x cols` operand (host data: values in `[-0.47, 0.47]`, varied by `seed`).
pub fn operand(rows: usize, cols: usize, seed: usize) -> Tensor {
    let data: Vec<f32> = (0..rows * cols).map(|i| (((i * 31 + seed * 17) % 61) as f32 - 30.0) / 64.0).collect();
    Tensor::from_vec(data, &[rows, cols])
}

/// The left and right operands of every product (pair `i` has seeds `2i` and `2i + 1`).
pub fn operands(shape: Shape) -> (Vec<Tensor>, Vec<Tensor>) {
    let Shape { pairs, m, k, n } = shape;
    let a = (0..pairs).map(|i| operand(m, k, 2 * i)).collect();
    let b = (0..pairs).map(|i| operand(k, n, 2 * i + 1)).collect();
    (a, b)
}

/// The operands as a tree with leaves `node0`, `node1`, ...
pub fn tree_of(tensors: &[Tensor]) -> kiln::Result<Tree<Tensor>> {
    Tree::from_pairs(tensors.iter().enumerate().map(|(i, t)| (format!("node{i}"), t.clone())))
}

/// The operands stacked on a new first axis, for the batched matmul.
pub fn stacked(tensors: &[Tensor]) -> Tensor {
    let refs: Vec<&Tensor> = tensors.iter().collect();
    kiln::stack(&refs, 0)
}

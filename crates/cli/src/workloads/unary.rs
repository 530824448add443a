//! `neg` and `sigmoid` on 1-D `f32` tensors of the anchor sizes, three ways: one op realized
//! (`single`), a chain of [`CHAIN`] ops realized after every op (`eager`), and the same chain
//! recorded lazily and realized once (`lazy`, which the compiler fuses into one kernel).
//!
//! `neg` chains of even length fold away (rule `neg-neg`), so the lazy `neg` chain measures what
//! the rewriter saves rather than a kernel's speed.

use kiln::Tensor;

/// The anchor sizes (powers of three).
pub const SIZES: [usize; 7] = [1, 729, 2187, 59049, 177147, 531441, 1594323];

/// Ops in each chain.
pub const CHAIN: usize = 8;

/// The op of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
}

impl UnaryOp {
    /// Both ops, in the order the suite reports them.
    pub const ALL: [UnaryOp; 2] = [UnaryOp::Neg, UnaryOp::Sigmoid];

    /// The op's name in tables and bench ids.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Sigmoid => "sigmoid",
        }
    }

    /// Records the op on `x`.
    pub fn apply(self, x: &Tensor) -> Tensor {
        match self {
            UnaryOp::Neg => x.neg(),
            UnaryOp::Sigmoid => x.sigmoid(),
        }
    }
}

/// The input of `n` elements (host data: values in `[-3, 3]` with a period of 97).
pub fn input(n: usize) -> Tensor {
    let data: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 16.0).collect();
    Tensor::from_vec(data, &[n])
}

/// The lazy chain: [`CHAIN`] applications of `op` to `x`, recorded, nothing realized.
pub fn lazy_chain(op: UnaryOp, x: &Tensor) -> Tensor {
    (0..CHAIN).fold(x.clone(), |y, _| op.apply(&y))
}

/// The eager chain: [`CHAIN`] applications of `op` to `x`, each realized by `realize` (which
/// returns the realized tensor) before the next reads it.
pub fn eager_chain<E>(
    op: UnaryOp,
    x: &Tensor,
    mut realize: impl FnMut(Tensor) -> Result<Tensor, E>,
) -> Result<Tensor, E> {
    let mut y = x.clone();
    for _ in 0..CHAIN {
        y = realize(op.apply(&y))?;
    }
    Ok(y)
}

//! Helpers shared by lower's test binaries: seeded inputs for a graph's input nodes, and the
//! seeded generator the random-graph tests draw from.

use air::{Bindings, DType, Graph, HostData, HostTensor};
use proptest::prelude::{Rng as _, RngExt as _};
use proptest::test_runner::{RngAlgorithm, TestRng};

/// Deterministic pseudo-random inputs for every input node of `g` (shapes evaluated under
/// `bindings`): floats in [-1, 1), integers that value times `int_scale` (truncated), bools
/// where it is positive.
pub fn inputs_for(g: &Graph, bindings: &Bindings, seed: u64, int_scale: f64) -> Vec<HostTensor> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
    };
    g.input_nodes()
        .into_iter()
        .map(|(_, n)| {
            let ty = g.ty(n);
            let shape = air::dim::eval_shape(&ty.shape, bindings).unwrap();
            let numel: usize = shape.iter().product();
            let vals: Vec<f64> = (0..numel).map(|_| next()).collect();
            let data = match ty.dtype {
                DType::F32 => HostData::F32(vals.iter().map(|&v| v as f32).collect()),
                DType::F64 => HostData::F64(vals),
                DType::I32 => HostData::I32(vals.iter().map(|&v| (v * int_scale) as i32).collect()),
                DType::I64 => HostData::I64(vals.iter().map(|&v| (v * int_scale) as i64).collect()),
                DType::Bool => HostData::Bool(vals.iter().map(|&v| v > 0.0).collect()),
                DType::F16 => HostData::F16(vals.iter().map(|&v| half::f16::from_f64(v)).collect()),
                DType::BF16 => HostData::BF16(vals.iter().map(|&v| half::bf16::from_f64(v)).collect()),
            };
            HostTensor::new(data, shape).unwrap()
        })
        .collect()
}

/// Draws for the random-graph tests from proptest's seeded generator (`TestRng`, XorShift), so
/// that a failing seed replays exactly.
pub struct Rng(TestRng);

#[allow(dead_code)] // each test binary uses some of the draws
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(TestRng::from_seed(RngAlgorithm::XorShift, &[seed.to_le_bytes(), (!seed).to_le_bytes()].concat()))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Below `n` (0 where `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n.max(1))
    }

    pub fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())].clone()
    }

    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0.random_range(lo..hi)
    }
}

//! Row reduces (`lower`'s row fusion: a reduce over a symbolic trailing axis computed per row by
//! the kernels that read it broadcast) on random graphs: each graph compiled once on the CPU
//! device, under the quick tier and the optimising one, and run at several row lengths (one
//! element, a vector's, a vector's and a tail), against the reference interpreter.

use crate::common::*;

use air::{BinaryOp, Bindings, DType, Dim, Graph, NodeId, Op, ReduceOp, Symbol, UnaryOp};
use kiln_runtime::{CpuDevice, JitMode};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng};

/// One of `xs`, drawn by `rng`.
fn pick<T: Copy>(rng: &mut TestRng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

fn unary(g: &mut Graph, op: UnaryOp, x: NodeId) -> NodeId {
    g.add(Op::Unary(op), &[x]).unwrap()
}

fn binary(g: &mut Graph, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
    g.add(Op::Binary(op), &[a, b]).unwrap()
}

/// A graph over `x: f32[lead.., seq]` (and a second input of its shape) of element-wise ops,
/// reduces over the row (`seq`) broadcast back and combined with the pool (optionally through an
/// epilogue), reduces over a leading axis broadcast back, and a row reduce read at its own shape
/// as a second output. Returns the graph and its inputs' shapes for a row length.
fn row_graph(seed: u64) -> (Graph, Vec<usize>) {
    // The graph is a function of the seed.
    let mut rng = TestRng::from_seed(RngAlgorithm::XorShift, &[seed.to_le_bytes(), (!seed).to_le_bytes()].concat());
    let lead: Vec<usize> = (0..1 + rng.random_range(0..2)).map(|_| pick(&mut rng, &[1, 2, 3])).collect();
    let mut shape: Vec<Dim> = lead.iter().map(|&d| Dim::Const(d as i64)).collect();
    shape.push(Dim::sym("seq"));
    let last = shape.len() - 1;
    let mut g = Graph::new();
    let mut pool = vec![input(&mut g, 0, DType::F32, &shape), input(&mut g, 1, DType::F32, &shape)];
    let mut extra = None;
    for _ in 0..2 + rng.random_range(0..6) {
        let x = pick(&mut rng, &pool);
        let y = match rng.random_range(0..6) {
            0 => unary(&mut g, pick(&mut rng, &[UnaryOp::Neg, UnaryOp::Sin, UnaryOp::Exp2]), x),
            1 => {
                let other = pick(&mut rng, &pool);
                binary(&mut g, pick(&mut rng, &[BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max]), x, other)
            }
            2..=4 => {
                // Over the row, or (one time in three) over the first axis.
                let axis = if rng.random_range(0..3) == 0 { 0 } else { last };
                let mut r = reduce(&mut g, pick(&mut rng, &[ReduceOp::Sum, ReduceOp::Max]), x, &[axis]);
                if rng.random_range(0..2) == 0 {
                    r = unary(&mut g, pick(&mut rng, &[UnaryOp::Neg, UnaryOp::Sin]), r);
                }
                if extra.is_none() && rng.random_range(0..4) == 0 {
                    extra = Some(r);
                }
                let wide = expand_dims(&mut g, r, &shape);
                let other = pick(&mut rng, &pool);
                binary(&mut g, pick(&mut rng, &[BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Add]), other, wide)
            }
            _ => {
                // A row's values scaled into a softmax's range, then one.
                let m = reduce(&mut g, ReduceOp::Max, x, &[last]);
                let m = expand_dims(&mut g, m, &shape);
                let d = binary(&mut g, BinaryOp::Sub, x, m);
                let e = unary(&mut g, UnaryOp::Exp2, d);
                let s = reduce(&mut g, ReduceOp::Sum, e, &[last]);
                let r = unary(&mut g, UnaryOp::Recip, s);
                let r = expand_dims(&mut g, r, &shape);
                binary(&mut g, BinaryOp::Mul, e, r)
            }
        };
        pool.push(y);
    }
    g.add_output(*pool.last().unwrap());
    if let Some(r) = extra {
        g.add_output(r);
    }
    (g, lead)
}

fn check_rows(seed: u64) {
    let (g, lead) = row_graph(seed);
    for mode in [JitMode::Quick, JitMode::Optimized] {
        let dev = CpuDevice::with_jit_mode(mode).unwrap();
        for seq in [1usize, 4, 9] {
            let mut shape = lead.clone();
            shape.push(seq);
            let inputs = [tensor(&shape, seed), tensor(&shape, seed ^ 1)];
            let bindings = Bindings::from([(Symbol::new("seq"), seq as i64)]);
            check_with(&dev, &g, &inputs, &bindings, 1e-4);
        }
        assert_eq!(dev.stats().programs_compiled, 1, "one program for every row length");
    }
}

/// A softmax over a symbolic row is one launch on the CPU (both row reduces computed per row in
/// it), compiled once for every length.
#[test]
fn a_softmax_over_a_symbolic_row_is_one_launch() {
    let shape = [Dim::Const(3), Dim::sym("seq")];
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, &shape);
    let m = reduce(&mut g, ReduceOp::Max, x, &[1]);
    let m = expand_dims(&mut g, m, &shape);
    let d = binary(&mut g, BinaryOp::Sub, x, m);
    let e = unary(&mut g, UnaryOp::Exp2, d);
    let s = reduce(&mut g, ReduceOp::Sum, e, &[1]);
    let r = unary(&mut g, UnaryOp::Recip, s);
    let r = expand_dims(&mut g, r, &shape);
    let y = binary(&mut g, BinaryOp::Mul, e, r);
    g.add_output(y);
    let dev = CpuDevice::new().unwrap();
    assert_eq!(dev.compile(&g).unwrap().launches(), 1);
    for seq in [1usize, 5, 16, 33] {
        let bindings = Bindings::from([(Symbol::new("seq"), seq as i64)]);
        check_with(&dev, &g, &[tensor(&[3, seq], seq as u64)], &bindings, 1e-5);
    }
    assert_eq!(dev.stats().programs_compiled, 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn row_reduces_match_the_interpreter(seed in any::<u64>()) {
        check_rows(seed);
    }
}

/// A row maximum that a matmul reads as an operand (`sum_b x[b, s] * max_s' x[b, s']`, a
/// contraction over the leading axis) keeps its buffer: the matmul reads operands from buffers,
/// not through a reading kernel. Row fusion took it once, and the compile failed ("matmul operand
/// has no buffer"); found by `row_reduces_match_the_interpreter` at 1,500 cases.
#[test]
fn a_row_reduce_read_by_a_matmul_keeps_its_buffer() {
    let shape = [Dim::Const(2), Dim::Const(1), Dim::sym("seq")];
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, &shape);
    let m = reduce(&mut g, ReduceOp::Max, x, &[2]);
    let m = expand_dims(&mut g, m, &shape);
    let p = binary(&mut g, BinaryOp::Mul, x, m);
    let s = reduce(&mut g, ReduceOp::Sum, p, &[0]);
    g.add_output(s);
    g.add_output(p);
    for mode in [JitMode::Quick, JitMode::Optimized] {
        let dev = CpuDevice::with_jit_mode(mode).unwrap();
        for seq in [9usize, 1, 4] {
            let bindings = Bindings::from([(Symbol::new("seq"), seq as i64)]);
            check_with(&dev, &g, &[tensor(&[2, 1, seq], seq as u64)], &bindings, 1e-5);
        }
    }
}

//! Property test: random graphs of element-wise, reduce and movement ops run on the CPU device
//! agree with the reference interpreter.

mod common;

use std::sync::OnceLock;

use air::{BinaryOp, Bindings, Graph, NodeId, Op, ReduceOp, UnaryOp};
use common::*;
use kiln_runtime::CpuDevice;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Unary(usize, UnaryOp),
    Binary(usize, usize, BinaryOp),
    /// Reduce over axis 1 and expand back.
    Reduce(usize, ReduceOp),
    /// Transpose and reshape back to `[R, C]`.
    Transpose(usize),
    /// `where(a < b, a, c)`.
    Select(usize, usize, usize),
}

fn step() -> impl Strategy<Value = Step> {
    let unary = prop::sample::select(vec![UnaryOp::Neg, UnaryOp::Exp2, UnaryOp::Sin, UnaryOp::Sqrt, UnaryOp::Trunc]);
    let binary = prop::sample::select(vec![BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Min]);
    let reduce = prop::sample::select(vec![ReduceOp::Sum, ReduceOp::Max]);
    prop_oneof![
        (any::<usize>(), unary).prop_map(|(a, op)| Step::Unary(a, op)),
        (any::<usize>(), any::<usize>(), binary).prop_map(|(a, b, op)| Step::Binary(a, b, op)),
        (any::<usize>(), reduce).prop_map(|(a, op)| Step::Reduce(a, op)),
        any::<usize>().prop_map(Step::Transpose),
        (any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(a, b, c)| Step::Select(a, b, c)),
    ]
}

fn build(rows: usize, cols: usize, steps: &[Step], extra_output: usize) -> Graph {
    let mut g = Graph::new();
    let mut nodes: Vec<NodeId> = vec![input_f32(&mut g, 0, &[rows, cols]), input_f32(&mut g, 1, &[rows, cols])];
    for s in steps {
        let pick = |i: usize| nodes[i % nodes.len()];
        let n = match *s {
            Step::Unary(a, op) => g.add(Op::Unary(op), &[pick(a)]).unwrap(),
            Step::Binary(a, b, op) => g.add(Op::Binary(op), &[pick(a), pick(b)]).unwrap(),
            Step::Reduce(a, op) => {
                let r = reduce(&mut g, op, pick(a), &[1]);
                expand(&mut g, r, &[rows, cols])
            }
            Step::Transpose(a) => {
                let t = permute(&mut g, pick(a), &[1, 0]);
                reshape(&mut g, t, &[rows, cols])
            }
            Step::Select(a, b, c) => {
                let lt = g.add(Op::Binary(BinaryOp::CmpLt), &[pick(a), pick(b)]).unwrap();
                g.add(Op::Where, &[lt, pick(a), pick(c)]).unwrap()
            }
        };
        nodes.push(n);
    }
    g.add_output(*nodes.last().unwrap());
    g.add_output(nodes[extra_output % nodes.len()]);
    g
}

fn device() -> &'static CpuDevice {
    static DEV: OnceLock<CpuDevice> = OnceLock::new();
    DEV.get_or_init(|| CpuDevice::new().unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn cpu_matches_interpreter(
        rows in 1usize..6,
        cols in 1usize..7,
        steps in prop::collection::vec(step(), 1..9),
        extra in any::<usize>(),
        seed in any::<u64>(),
    ) {
        let g = build(rows, cols, &steps, extra);
        let inputs = [tensor(&[rows, cols], seed), tensor(&[rows, cols], seed ^ 0xabcdef)];
        check_with(device(), &g, &inputs, &Bindings::new(), 1e-4);
    }
}

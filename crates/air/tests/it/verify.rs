//! Verifier tests: hand-written wrong graphs (text form, or nodes added unchecked) and the full list
//! of problems the verifier reports for each, every one at once.

use expect_test::{Expect, expect};
use kiln_air::graph::Node;
use kiln_air::op::{Const, Input, Iota, Reduce};
use kiln_air::{AirError, BinaryOp, DType, Dim, Graph, Op, ReduceOp, Scalar, TensorType, UnaryOp, parse};
use smallvec::smallvec;

/// Parses `input` and compares the verifier's verdict (`ok` or one problem per line) with `expect`.
fn check(input: &str, expect: Expect) {
    let graph = parse(input).unwrap_or_else(|e| panic!("{e}"));
    expect.assert_eq(&verdict(&graph));
}

fn verdict(graph: &Graph) -> String {
    match graph.verify() {
        Ok(()) => "ok".to_string(),
        Err(AirError::Verify(problems)) => problems.join("\n"),
        Err(other) => format!("unexpected error: {other}"),
    }
}

fn f32s(dims: &[i64]) -> TensorType {
    TensorType::new(DType::F32, dims.iter().map(|&d| Dim::from(d)).collect::<kiln_air::Shape>())
}

#[test]
fn a_correct_graph_passes() {
    check(
        "graph {
          n0 = input 0 : f32[4, seq]
          n1 = reduce max axes=[1] n0 : f32[4, 1]
          n2 = expand [4, seq] n1 : f32[4, seq]
          n3 = sub n0, n2 : f32[4, seq]
          n4 = exp2 n3 : f32[4, seq]
          return n4
        }",
        expect!["ok"],
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    check(
        "graph {
          n0 = input 0 : f32[4]
          n1 = input 1 : f32[5]
          n2 = add n0, n1 : f32[4]
          n3 = neg n0 : f32[5]
          n4 = reduce sum axes=[1] n0 : f32[1]
          n5 = exp2 n0, n1 : f32[4]
          n6 = cmplt n0, n0 : f32[4]
          n7 = not n0 : f32[4]
          n8 = reshape [3] n0 : f32[3]
          n9 = permute [0, 0] n0 : f32[4]
          n10 = where n0, n0, n0 : f32[4]
          n11 = pad [(0, 1)] value=0 n0 : f32[5]
          n12 = shrink [(2, 9)] n0 : f32[7]
          n13 = expand [4, 2] n0 : f32[4, 2]
          n14 = cast i32 n0 : f32[4]
          return n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14
        }",
        expect![[r#"
            n2: add: operands must have equal types, got f32[4], f32[5]
            n3: neg: stored type f32[5] but its inputs give f32[4]
            n4: reduce: axes [1] invalid for rank 1 (need sorted, unique, in range)
            n5: exp2: expects 1 inputs, got 2
            n6: cmplt: stored type f32[4] but its inputs give bool[4]
            n7: not: unsupported dtype f32
            n8: reshape: cannot reshape f32[4] to [3] (element counts differ)
            n9: permute: [0, 0] is not a permutation of the axes of f32[4]
            n10: where: needs (bool, T, T) of one shape, got f32[4], f32[4], f32[4]
            n11: pad: value 0 does not fit dtype f32
            n12: shrink: range 2..9 out of bounds for f32[4]
            n13: expand: cannot expand f32[4] to [4, 2]
            n14: cast: stored type f32[4] but its inputs give i32[4]"#]],
    );
}

#[test]
fn bad_leaves_and_cycles() {
    let mut g = Graph::new();
    let x = g.add_leaf(Op::Input(Input { slot: 0 }), f32s(&[3])).unwrap();
    // Leaves whose attributes do not fit their type, added unchecked (the parser rejects them).
    let bad_const = g.add_unchecked(Node {
        op: Op::Const(Const { value: Scalar::Int(1) }),
        inputs: Default::default(),
        ty: f32s(&[3]),
    });
    let bad_iota = g.add_unchecked(Node { op: Op::Iota(Iota { axis: 0 }), inputs: Default::default(), ty: f32s(&[]) });
    let leaf_with_input =
        g.add_unchecked(Node { op: Op::Input(Input { slot: 1 }), inputs: smallvec![x], ty: f32s(&[3]) });
    // A two-node cycle, made through `set_inputs_unchecked` (`set_inputs` rejects it).
    let a = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    let b = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
    let c = g.add(Op::Binary(BinaryOp::Add), &[b, b]).unwrap();
    g.set_inputs_unchecked(a, &[b]);
    g.set_outputs(vec![c, bad_const, bad_iota, leaf_with_input]);
    expect![[r#"
        n1: const: value 1 does not fit dtype f32
        n2: iota: axis 0 out of range for shape []
        n3: input: a leaf takes no inputs, got 1
        cycle: nodes [n4, n5, n6] are on or behind a cycle"#]]
    .assert_eq(&verdict(&g));
}

#[test]
fn graphs_built_through_add_verify() {
    let mut g = Graph::new();
    let x = g
        .add_leaf(Op::Input(Input { slot: 0 }), TensorType::new(DType::I64, smallvec![Dim::sym("n"), 2.into()]))
        .unwrap();
    let s = g.add(Op::Reduce(Reduce { op: ReduceOp::Sum, axes: smallvec![0, 1] }), &[x]).unwrap();
    g.add_output(s);
    assert_eq!(verdict(&g), "ok");
}

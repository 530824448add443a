//! Golden tests of the text form: graphs built through the API print as expected, hand-written text
//! parses and prints back canonically, and bad text fails with the right line and message.

use expect_test::{Expect, expect};
use kiln_air::op::{Cast, Const, Expand, Input, Iota, Pad, Permute, Reduce, Reshape, Shrink};
use kiln_air::{
    AirError, BinaryOp, DType, Dim, Graph, Op, PrintOptions, ReduceOp, Scalar, TensorType, UnaryOp, parse,
    print_renumbered,
};
use smallvec::smallvec;

/// Parses `input`, checks that printing is a fixed point, and compares the print with `expect`.
fn check(input: &str, expect: Expect) {
    let graph = parse(input).unwrap_or_else(|e| panic!("{e}"));
    let printed = print_renumbered(&graph);
    let again = parse(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
    assert_eq!(print_renumbered(&again), printed, "print -> parse -> print changed the text");
    expect.assert_eq(&printed);
}

/// Parses `input`, which must fail; compares the error with `expect`.
fn check_error(input: &str, expect: Expect) {
    match parse(input) {
        Ok(g) => panic!("parsed a bad graph:\n{g}"),
        Err(e) => expect.assert_eq(&e.to_string()),
    }
}

fn shape(dims: &[Dim]) -> TensorType {
    TensorType::new(DType::F32, dims.iter().cloned().collect::<kiln_air::Shape>())
}

#[test]
fn graph_built_through_the_api() {
    let seq = Dim::sym("seq");
    let mut g = Graph::new();
    let x = g.add_leaf(Op::Input(Input { slot: 0 }), shape(&[4.into(), seq])).unwrap();
    let one = g.add_leaf(Op::Const(Const { value: Scalar::Float(1.0) }), shape(&[4.into(), seq])).unwrap();
    let sum = g.add(Op::Binary(BinaryOp::Add), &[x, one]).unwrap();
    let red = g.add(Op::Reduce(Reduce { op: ReduceOp::Sum, axes: smallvec![1] }), &[sum]).unwrap();
    let resh = g.add(Op::Reshape(Reshape { shape: [2.into(), &seq * 2].into_iter().collect() }), &[sum]).unwrap();
    let pad = Pad { padding: vec![(0.into(), 1.into()), (2.into(), seq)], value: Scalar::Float(0.0) };
    let padded = g.add(Op::Pad(pad), &[red]).unwrap();
    let perm = g.add(Op::Permute(Permute { perm: smallvec![1, 0] }), &[padded]).unwrap();
    let exp = g.add(Op::Expand(Expand { shape: [4.into(), seq].into_iter().collect() }), &[red]).unwrap();
    let shr = g.add(Op::Shrink(Shrink { ranges: vec![(1.into(), 3.into()), (0.into(), &seq - 1)] }), &[exp]).unwrap();
    let idx = g.add_leaf(Op::Iota(Iota { axis: 1 }), TensorType::new(DType::I32, smallvec![4.into(), seq])).unwrap();
    let idx_f = g.add(Op::Cast(Cast { to: DType::F32 }), &[idx]).unwrap();
    let lt = g.add(Op::Binary(BinaryOp::CmpLt), &[idx_f, x]).unwrap();
    let pick = g.add(Op::Where, &[lt, x, exp]).unwrap();
    let neg = g.add(Op::Unary(UnaryOp::Neg), &[pick]).unwrap();
    g.set_outputs(vec![red, resh, perm, shr, neg]);
    g.verify().unwrap();
    let golden = expect![[r#"
        graph {
          n0 = input 0 : f32[4, seq]
          n1 = const 1.0 : f32[4, seq]
          n2 = add n0, n1 : f32[4, seq]
          n3 = reduce sum axes=[1] n2 : f32[4, 1]
          n4 = reshape [2, 2*seq] n2 : f32[2, 2*seq]
          n5 = pad [(0, 1), (2, seq)] value=0.0 n3 : f32[5, seq + 3]
          n6 = permute [1, 0] n5 : f32[seq + 3, 5]
          n7 = expand [4, seq] n3 : f32[4, seq]
          n8 = shrink [(1, 3), (0, seq - 1)] n7 : f32[2, seq - 1]
          n9 = iota axis=1 : i32[4, seq]
          n10 = cast f32 n9 : f32[4, seq]
          n11 = cmplt n10, n0 : bool[4, seq]
          n12 = where n11, n0, n7 : f32[4, seq]
          n13 = neg n12 : f32[4, seq]
          return n3, n4, n6, n8, n13
        }
    "#]];
    golden.assert_eq(&print_renumbered(&g));
    // A graph built front to back has slot order = print order, so slot names equal renumbered ones.
    assert_eq!(g.to_text(), print_renumbered(&g));
    assert_eq!(g.text(PrintOptions { renumber: true }).to_string(), print_renumbered(&g));
}

#[test]
fn slot_names_after_edits_and_renumbering() {
    let t = TensorType::new(DType::F32, smallvec![Dim::from(3)]);
    let mut g = Graph::new();
    let a = g.add_leaf(Op::Input(Input { slot: 0 }), t.clone()).unwrap();
    let b = g.add(Op::Unary(UnaryOp::Exp2), &[a]).unwrap();
    let c = g.add(Op::Unary(UnaryOp::Log2), &[b]).unwrap();
    let d = g.add_leaf(Op::Input(Input { slot: 1 }), t).unwrap();
    let e = g.add(Op::Binary(BinaryOp::Mul), &[d, d]).unwrap();
    g.replace_all_uses(a, e).unwrap();
    g.add_output(c);
    g.remove_dead();
    expect![[r#"
        graph {
          n3 = input 1 : f32[3]
          n4 = mul n3, n3 : f32[3]
          n1 = exp2 n4 : f32[3]
          n2 = log2 n1 : f32[3]
          return n2
        }
    "#]]
    .assert_eq(&g.to_text());
    expect![[r#"
        graph {
          n0 = input 1 : f32[3]
          n1 = mul n0, n0 : f32[3]
          n2 = exp2 n1 : f32[3]
          n3 = log2 n2 : f32[3]
          return n3
        }
    "#]]
    .assert_eq(&print_renumbered(&g));
}

#[test]
fn symbolic_dims_and_scalars() {
    check(
        r#"
        // Comments and blank lines are fine.
        graph {
          x = input 3 : f64[batch*seq + 1, (seq+1)*2]   // canonicalised on print
          c = const -0.0 : f64[batch*seq + 1, 2*seq + 2]
          m = max x, c : f64[batch*seq + 1, 2*seq + 2]
          s = shrink [(0, 1), (seq, 2*seq)] m : f64[1, seq]
          p = pad [((1), 0), (0, 0)] value=-inf s : f64[2, seq]
          q = pad [(0, 0), (0, 1)] value=nan(0x7ff8000000000001) p : f64[2, seq + 1]
          k = const 1e-300 : f64[]
          i = const -9223372036854775808 : i64[2]
          b = const true : bool[1]
          r = reshape [] k : f64[]
          return q, r, i, b, x
        }
        "#,
        expect![[r#"
            graph {
              n0 = input 3 : f64[batch*seq + 1, 2*seq + 2]
              n1 = const -0.0 : f64[batch*seq + 1, 2*seq + 2]
              n2 = max n0, n1 : f64[batch*seq + 1, 2*seq + 2]
              n3 = shrink [(0, 1), (seq, 2*seq)] n2 : f64[1, seq]
              n4 = pad [(1, 0), (0, 0)] value=-inf n3 : f64[2, seq]
              n5 = pad [(0, 0), (0, 1)] value=nan(0x7ff8000000000001) n4 : f64[2, seq + 1]
              n6 = const 1e-300 : f64[]
              n7 = const -9223372036854775808 : i64[2]
              n8 = const true : bool[1]
              n9 = reshape [] n6 : f64[]
              return n5, n9, n7, n8, n0
            }
        "#]],
    );
}

#[test]
fn every_unary_and_binary_op() {
    check(
        "graph {
          a = input 0 : f16[2]
          b = input 1 : f16[2]
          i = input 2 : i32[2]
          u0 = neg a : f16[2]
          u1 = exp2 u0 : f16[2]
          u2 = log2 u1 : f16[2]
          u3 = sin u2 : f16[2]
          u4 = sqrt u3 : f16[2]
          u5 = recip u4 : f16[2]
          u6 = erf u5 : f16[2]
          u7 = trunc u6 : f16[2]
          u8 = not i : i32[2]
          b0 = sub a, b : f16[2]
          b1 = mul b0, b : f16[2]
          b2 = div b1, b : f16[2]
          b3 = min b2, b : f16[2]
          b4 = mod b3, b : f16[2]
          b5 = pow b4, b : f16[2]
          b6 = cmpeq b5, u7 : bool[2]
          b7 = cmpne b5, u7 : bool[2]
          b8 = and b6, b7 : bool[2]
          b9 = or i, u8 : i32[2]
          r = reduce max axes=[0] b5 : f16[1]
          return b8, b9, r
        }",
        expect![[r#"
            graph {
              n0 = input 0 : f16[2]
              n1 = input 1 : f16[2]
              n2 = input 2 : i32[2]
              n3 = neg n0 : f16[2]
              n4 = exp2 n3 : f16[2]
              n5 = log2 n4 : f16[2]
              n6 = sin n5 : f16[2]
              n7 = sqrt n6 : f16[2]
              n8 = recip n7 : f16[2]
              n9 = erf n8 : f16[2]
              n10 = trunc n9 : f16[2]
              n11 = not n2 : i32[2]
              n12 = sub n0, n1 : f16[2]
              n13 = mul n12, n1 : f16[2]
              n14 = div n13, n1 : f16[2]
              n15 = min n14, n1 : f16[2]
              n16 = mod n15, n1 : f16[2]
              n17 = pow n16, n1 : f16[2]
              n18 = cmpeq n17, n10 : bool[2]
              n19 = cmpne n17, n10 : bool[2]
              n20 = and n18, n19 : bool[2]
              n21 = or n2, n11 : i32[2]
              n22 = reduce max axes=[0] n17 : f16[1]
              return n20, n21, n22
            }
        "#]],
    );
}

#[test]
fn parse_accepts_wrong_types_for_the_verifier() {
    let g = parse(
        "graph {
          n0 = input 0 : f32[4]
          n1 = neg n0 : f32[5]
          return n1
        }",
    )
    .unwrap();
    expect![[r#"graph failed verification:
n1: neg: stored type f32[5] but its inputs give f32[4]"#]]
    .assert_eq(&g.verify().unwrap_err().to_string());
}

#[test]
fn parse_errors_name_the_line() {
    check_error("", expect!["parse error at line 1: expected `graph {`, found end of input"]);
    check_error("graph", expect!["parse error at line 1: expected `graph {`, found `graph`"]);
    check_error(
        "graph {\n  n0 = input 0 : f32[4]\n",
        expect!["parse error at line 2: expected `}`, found end of input"],
    );
    check_error("graph {\n}", expect!["parse error at line 2: expected a `return` line before `}`"]);
    check_error(
        "graph {\n  return\n  n0 = input 0 : f32[4]\n}",
        expect!["parse error at line 3: expected `}` after the `return` line, found `n0 = input 0 : f32[4]`"],
    );
    check_error("graph {\n  return\n}\n}", expect!["parse error at line 4: unexpected `}` after the closing `}`"]);
    check_error(
        "graph {\n  n0 = input 0 : f32[4]\n  n1 = frob n0 : f32[4]\n  return n1\n}",
        expect!["parse error at line 3: unknown op `frob`"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[4]\n  n1 = neg n9 : f32[4]\n  return n1\n}",
        expect!["parse error at line 3: unknown node `n9`"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[4]\n  n0 = input 1 : f32[4]\n  return n0\n}",
        expect!["parse error at line 3: node `n0` is defined twice"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[4\n  return n0\n}",
        expect!["parse error at line 2: unterminated dim `4`"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f33[4]\n  return n0\n}",
        expect!["parse error at line 2: unknown dtype `f33`"],
    );
    check_error(
        "graph {\n  n0 = input -1 : f32[4]\n  return n0\n}",
        expect!["parse error at line 2: input: bad slot `-1`"],
    );
    check_error(
        "graph {\n\n  n0 = const 1 : f32[4]\n  return n0\n}",
        expect!["parse error at line 3: const: value 1 does not fit dtype f32"],
    );
    check_error(
        "graph {\n  n0 = iota axis=2 : i32[4]\n  return n0\n}",
        expect!["parse error at line 2: iota: axis 2 out of range for shape [4]"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[4]\n  n1 = input 1 n0 : f32[4]\n  return n1\n}",
        expect!["parse error at line 3: input: a leaf takes no operands, got 1"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[4]\n  n1 = reduce sum axis=[0] n0 : f32[1]\n  return n1\n}",
        expect!["parse error at line 3: expected `axes=`, found `axis=[0] n0 : f32[1]`"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[4]\n  n1 = pad [(0, 1] value=0.0 n0 : f32[5]\n  return n1\n}",
        expect!["parse error at line 3: unterminated dim `1] value=0.0 n0 : f32[5]`"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[4]\n  n1 = reshape [2, 2 $] n0 : f32[2, 2]\n  return n1\n}",
        expect!["parse error at line 3: unexpected `$` in dim `2 $`"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[9223372036854775807 + 1]\n  return n0\n}",
        expect!["parse error at line 2: dim expression overflowed i64"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[4] extra\n  return n0\n}",
        expect!["parse error at line 2: unexpected `extra` at end of line"],
    );
    check_error(
        "graph {\n  n0 = const 1.0.0 : f32[4]\n  return n0\n}",
        expect!["parse error at line 2: bad scalar `1.0.0`"],
    );
    check_error(
        "graph {\n  n0 = input 0 : f32[4]\n  return n0, nope\n}",
        expect!["parse error at line 3: unknown node `nope`"],
    );
}

#[test]
fn parse_never_panics_on_mangled_text() {
    let text = "graph {\n  n0 = input 0 : f32[4, seq]\n  n1 = pad [(0, 1), (2, seq)] value=0.0 n0 : f32[5, seq + 2]\n  \
                n2 = reduce sum axes=[0, 1] n1 : f32[1, 1]\n  n3 = cast i64 n2 : i64[1, 1]\n  return n3, n2\n}\n";
    assert!(parse(text).is_ok());
    // Every prefix, and every single-byte deletion, must give Ok or a parse error.
    for cut in 0..=text.len() {
        let _ = parse(&text[..cut]);
        let mut deleted = text.to_string();
        deleted.remove(cut.min(text.len() - 1));
        match parse(&deleted) {
            Ok(_) | Err(AirError::Parse { .. }) => {}
            Err(e) => panic!("non-parse error {e}"),
        }
    }
    for junk in
        ["graph {\n n0 = input 0 : f32[é]\n return\n}", "graph {\n ünï = input 0 : f32[1]\n}", "\u{feff}graph {"]
    {
        assert!(matches!(parse(junk), Err(AirError::Parse { .. })), "{junk}");
    }
    let deep = format!("graph {{\n n0 = input 0 : f32[{}1{}]\n return\n}}", "(".repeat(10_000), ")".repeat(10_000));
    assert!(matches!(parse(&deep), Err(AirError::Parse { line: 2, .. })));
}

#[test]
fn dot_export() {
    let g = parse(
        "graph {
          n0 = input 0 : f32[2]
          n1 = add n0, n0 : f32[2]
          n2 = reduce sum axes=[0] n1 : f32[1]
          return n2
        }",
    )
    .unwrap();
    expect![[r#"
        digraph air {
          rankdir=TB;
          node [shape=box, fontname="monospace"];
          n0 [label="n0 = input 0\nf32[2]"];
          n1 [label="n1 = add\nf32[2]"];
          n2 [label="n2 = reduce sum axes=[0]\nf32[1]", style="bold,filled", fillcolor="lightyellow"];
          n0 -> n1 [label="0"];
          n0 -> n1 [label="1"];
          n1 -> n2;
          return0 [label="return 0", shape=plaintext];
          n2 -> return0 [style=bold];
        }
    "#]]
    .assert_eq(&g.to_dot());
}

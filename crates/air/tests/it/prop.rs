//! Property tests over random graphs of 1-30 ops (every op kind, shapes with size-1 and symbolic
//! dims) built through `Graph::add`: the text form round-trips, the verifier accepts them, and shape
//! inference agrees with shapes computed independently on concrete numbers.

use kiln_air::dim::eval_shape;
use kiln_air::op::{Cast, Const, Expand, Input, Iota, Pad, Permute, Reduce, Reshape, Shrink};
use kiln_air::{
    BinaryOp, Bindings, DType, Dim, Graph, NodeId, Op, ReduceOp, Scalar, Shape, Symbol, TensorType, UnaryOp, parse,
    print_renumbered,
};
use proptest::prelude::*;

/// The type an op should produce, as a dtype and concrete dims; `None` if `add` must refuse it.
type Expected = Option<(DType, Vec<i64>)>;

/// One step of a recipe: an op kind and three numbers that choose operands and attributes.
type Step = (u8, u32, u32, u32);

const DTYPES: [DType; 8] =
    [DType::F32, DType::F32, DType::F16, DType::F64, DType::I32, DType::I64, DType::Bool, DType::BF16];

fn pick<T: Clone>(items: &[T], seed: u32) -> T {
    items[seed as usize % items.len()].clone()
}

/// The dims random shapes are made of: size 1 often, small constants, and symbolic dims.
fn dim_pool() -> Vec<Dim> {
    let seq = Dim::sym("seq");
    vec![Dim::from(1), Dim::from(1), Dim::from(2), Dim::from(3), seq, Dim::sym("batch"), &seq * 2, &seq + 1]
}

/// The symbol values under which expected shapes are computed on plain integers.
fn bindings() -> Bindings {
    [(Symbol::new("seq"), 5), (Symbol::new("batch"), 3)].into_iter().collect()
}

fn random_shape(seed: u32) -> Shape {
    let pool = dim_pool();
    let rank = seed % 5;
    (0..rank).map(|i| pick(&pool, seed.rotate_right(3 + 5 * i))).collect()
}

fn value_for(dtype: DType, seed: u32) -> Scalar {
    let floats = [0.0, -0.0, 1.5, -2.25, 1e-7, 3.0e38, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.1];
    if dtype.is_float() {
        Scalar::Float(pick(&floats, seed))
    } else if dtype.is_int() {
        Scalar::Int(i64::from(seed as i32) - 7)
    } else {
        Scalar::Bool(seed.is_multiple_of(2))
    }
}

/// The concrete value of a dim under `bindings()`.
fn eval1(d: &Dim) -> i64 {
    d.eval(&bindings()).unwrap_or(i64::MIN)
}

/// Concrete values of a shape under `bindings()`.
fn concrete(shape: &[Dim]) -> Vec<i64> {
    shape.iter().map(eval1).collect()
}

/// A built graph plus every disagreement between inference and the independent computation.
struct Built {
    graph: Graph,
    mismatches: Vec<String>,
}

fn build(steps: &[Step], outputs: &[u32]) -> Built {
    let mut g = Graph::new();
    let mut nodes: Vec<NodeId> = Vec::new();
    let mut mismatches = Vec::new();
    let first =
        g.add_leaf(Op::Input(Input { slot: 0 }), TensorType::new(DType::F32, random_shape(steps[0].1))).unwrap();
    nodes.push(first);
    for (index, &(kind, s1, s2, s3)) in steps.iter().enumerate() {
        let a = nodes[s1 as usize % nodes.len()];
        let ta = g.ty(a).clone();
        let rank = ta.rank();
        let in_dims = concrete(&ta.shape);
        // Either a leaf (op, type) or an op with operands and the independently expected type.
        let (op, inputs, expected): (Op, Vec<NodeId>, Expected) = match kind % 13 {
            0..=2 => {
                let dtype = pick(&DTYPES, s2);
                let ty = TensorType::new(dtype, random_shape(s3));
                let op = match kind % 13 {
                    0 => Op::Input(Input { slot: index as u32 + 1 }),
                    1 => Op::Const(Const { value: value_for(dtype, s2 >> 8) }),
                    _ => Op::Iota(Iota { axis: (s2 >> 8) as usize % ty.rank().max(1) }),
                };
                if let Ok(id) = g.add_leaf(op, ty) {
                    nodes.push(id);
                }
                continue;
            }
            3 => (Op::Unary(pick(UnaryOp::ALL, s2)), vec![a], Some((ta.dtype, in_dims))),
            4 => {
                let op = pick(BinaryOp::ALL, s2);
                let b = same_type(&g, &nodes, a, s3);
                let dtype = if op.is_comparison() { DType::Bool } else { ta.dtype };
                (Op::Binary(op), vec![a, b], Some((dtype, in_dims)))
            }
            5 => {
                let b = same_type(&g, &nodes, a, s3);
                let Some(cond) = (0..nodes.len())
                    .map(|i| nodes[(i + s2 as usize) % nodes.len()])
                    .find(|&n| g.ty(n).dtype == DType::Bool && g.ty(n).shape == ta.shape)
                else {
                    continue;
                };
                (Op::Where, vec![cond, a, b], Some((ta.dtype, in_dims)))
            }
            6 => {
                let to = pick(&DTYPES, s2);
                (Op::Cast(Cast { to }), vec![a], Some((to, in_dims)))
            }
            7 => {
                let axes: Vec<usize> = (0..rank).filter(|i| s2 >> i & 1 == 1).collect();
                let mut dims = in_dims;
                for &x in &axes {
                    dims[x] = 1;
                }
                let op = pick(&[ReduceOp::Sum, ReduceOp::Max], s3);
                (Op::Reduce(Reduce { op, axes: axes.into_iter().collect() }), vec![a], Some((ta.dtype, dims)))
            }
            8 => {
                let shape = reshape_target(&ta.shape, s2);
                let dims = concrete(&shape);
                let ok = dims.iter().product::<i64>() == in_dims.iter().product::<i64>();
                (Op::Reshape(Reshape { shape }), vec![a], ok.then_some((ta.dtype, dims)))
            }
            9 => {
                let perm = permutation(rank, s2);
                let dims = perm.iter().map(|&p| in_dims[p]).collect();
                (Op::Permute(Permute { perm: perm.into_iter().collect() }), vec![a], Some((ta.dtype, dims)))
            }
            10 => {
                let pool = dim_pool();
                let shape: Shape = ta
                    .shape
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        let seed = s2.rotate_right(4 * i as u32);
                        if *d == Dim::from(1) && seed % 2 == 0 { pick(&pool, seed >> 1) } else { *d }
                    })
                    .collect();
                let dims = concrete(&shape);
                (Op::Expand(Expand { shape }), vec![a], Some((ta.dtype, dims)))
            }
            11 => {
                let amounts = [Dim::from(0), Dim::from(1), Dim::from(2), Dim::sym("seq")];
                let padding: Vec<(Dim, Dim)> = (0..rank)
                    .map(|i| {
                        let seed = s2.rotate_right(4 * i as u32);
                        (pick(&amounts, seed), pick(&amounts, seed >> 2))
                    })
                    .collect();
                let dims = in_dims.iter().zip(&padding).map(|(n, (lo, hi))| n + eval1(lo) + eval1(hi)).collect();
                let value = value_for(ta.dtype, s3);
                (Op::Pad(Pad { padding, value }), vec![a], Some((ta.dtype, dims)))
            }
            _ => {
                let ranges: Vec<(Dim, Dim)> =
                    ta.shape.iter().enumerate().map(|(i, d)| shrink_range(d, s2.rotate_right(5 * i as u32))).collect();
                let dims = ranges.iter().map(|(lo, hi)| eval1(hi) - eval1(lo)).collect();
                (Op::Shrink(Shrink { ranges }), vec![a], Some((ta.dtype, dims)))
            }
        };
        let Ok(id) = g.add(op.clone(), &inputs) else { continue };
        nodes.push(id);
        let got = g.ty(id);
        let got_dims = eval_shape(&got.shape, &bindings()).map(|v| v.into_iter().map(|x| x as i64).collect::<Vec<_>>());
        match expected {
            Some((dtype, dims)) if got.dtype != dtype || got_dims.as_ref().ok() != Some(&dims) => {
                mismatches.push(format!("{op:?} on {ta}: inferred {got}, expected {dtype} {dims:?}"));
            }
            None => mismatches.push(format!("{op:?} on {ta}: inferred {got}, but element counts differ")),
            Some(_) => {}
        }
    }
    let outs: Vec<NodeId> = outputs.iter().map(|&o| nodes[o as usize % nodes.len()]).collect();
    g.set_outputs(outs);
    Built { graph: g, mismatches }
}

/// A node with the same type as `a`, searched from a random place (`a` itself qualifies).
fn same_type(g: &Graph, nodes: &[NodeId], a: NodeId, seed: u32) -> NodeId {
    (0..nodes.len()).map(|i| nodes[(i + seed as usize) % nodes.len()]).find(|&n| g.ty(n) == g.ty(a)).unwrap_or(a)
}

/// A new shape with the same element count: flattened, reversed, with size-1 axes added or
/// dropped, or (when a constant dim is even) split in two.
fn reshape_target(shape: &[Dim], seed: u32) -> Shape {
    let numel = shape.iter().fold(Dim::from(1), |acc, d| &acc * d);
    match seed % 5 {
        0 => [numel].into_iter().collect(),
        1 => shape.iter().rev().cloned().collect(),
        2 => shape.iter().filter(|d| **d != Dim::from(1)).cloned().collect(),
        3 => {
            let mut s: Shape = shape.iter().cloned().collect();
            s.insert((seed as usize >> 3) % (s.len() + 1), Dim::from(1));
            s
        }
        _ => match shape.iter().position(|d| d.as_const().is_some_and(|c| c % 2 == 0)) {
            Some(i) => {
                let mut s: Shape = shape.iter().cloned().collect();
                let half = s[i].as_const().unwrap_or(2) / 2;
                s[i] = Dim::from(half);
                s.insert(i, Dim::from(2));
                s
            }
            // A wrong target (one element too many): `add` must refuse it.
            None => [&numel + 1].into_iter().collect(),
        },
    }
}

fn permutation(rank: usize, seed: u32) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..rank).collect();
    let mut s = seed;
    for i in (1..rank).rev() {
        perm.swap(i, s as usize % (i + 1));
        s = s.rotate_right(7) ^ 0x9e37_79b9;
    }
    perm
}

fn shrink_range(d: &Dim, seed: u32) -> (Dim, Dim) {
    match d.as_const() {
        Some(n) => {
            let start = i64::from(seed % 7) % (n + 1);
            let end = start + i64::from((seed >> 3) % 7) % (n - start + 1);
            (Dim::from(start), Dim::from(end))
        }
        None => match seed % 3 {
            0 => (Dim::from(0), *d),
            1 => (Dim::from(1), *d),
            _ => (Dim::from(0), d - 1),
        },
    }
}

fn recipe() -> impl Strategy<Value = (Vec<Step>, Vec<u32>)> {
    (
        prop::collection::vec((any::<u8>(), any::<u32>(), any::<u32>(), any::<u32>()), 1..=30),
        prop::collection::vec(any::<u32>(), 0..4),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn text_round_trips((steps, outputs) in recipe()) {
        let built = build(&steps, &outputs);
        let text = print_renumbered(&built.graph);
        let parsed = parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(print_renumbered(&parsed), text.clone());
        // Built front to back, slot order is print order, so slot names match the renumbering;
        // and a parsed graph prints with slot names exactly as it was read.
        prop_assert_eq!(built.graph.to_text(), text.clone());
        prop_assert_eq!(parsed.to_text(), text);
    }

    #[test]
    fn verifier_accepts_graphs_built_with_add((steps, outputs) in recipe()) {
        let mut built = build(&steps, &outputs);
        prop_assert_eq!(built.graph.verify(), Ok(()));
        built.graph.remove_dead();
        prop_assert_eq!(built.graph.verify(), Ok(()));
        let parsed = parse(&built.graph.to_text()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(parsed.verify(), Ok(()));
    }

    #[test]
    fn remove_dead_keeps_exactly_what_the_outputs_read((steps, outputs) in recipe()) {
        let mut g = build(&steps, &outputs).graph;
        // The reference: a walk from the outputs over the inputs.
        let mut live = std::collections::HashSet::new();
        let mut stack: Vec<_> = g.outputs().to_vec();
        while let Some(id) = stack.pop() {
            if live.insert(id) {
                stack.extend(g.inputs(id).iter().copied());
            }
        }
        let order = g.live_order();
        let expected: Vec<_> = g.topo_order().iter().copied().filter(|id| live.contains(id)).collect();
        prop_assert_eq!(&order, &expected);
        let before = g.len();
        prop_assert_eq!(g.remove_dead(), before - live.len());
        prop_assert_eq!(g.len(), live.len());
        prop_assert!(live.iter().all(|&id| g.contains(id)));
        prop_assert_eq!(g.live_order(), g.topo_order().to_vec());
        prop_assert_eq!(g.live_order(), expected);
        prop_assert_eq!(g.verify(), Ok(()));
    }

    #[test]
    fn mangled_text_never_panics((steps, outputs) in recipe(), edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut text = print_renumbered(&build(&steps, &outputs).graph).into_bytes();
        let alphabet = b" ,:=()[]{}-+*0123456789naxsequif.\n";
        for (at, byte) in edits {
            let at = at % text.len();
            match byte % 3 {
                0 => { text.remove(at); }
                1 => text.insert(at, alphabet[byte as usize % alphabet.len()]),
                _ => text[at] = alphabet[byte as usize % alphabet.len()],
            }
        }
        let text = String::from_utf8_lossy(&text);
        match parse(&text) {
            // Whatever parses can be verified and printed without a panic.
            Ok(g) => {
                let _ = g.verify();
                let _ = g.to_text();
                let _ = g.to_dot();
            }
            Err(e) => prop_assert!(matches!(e, kiln_air::AirError::Parse { .. }), "{}", e),
        }
    }

    #[test]
    fn inference_matches_concrete_shapes((steps, outputs) in recipe()) {
        let built = build(&steps, &outputs);
        prop_assert!(built.mismatches.is_empty(), "{:#?}", built.mismatches);
    }
}

/// Guards the generator itself: over a fixed sample of recipes, every op kind gets built, so the
/// properties above really cover views, reductions, `where` and symbolic dims.
#[test]
fn generator_reaches_every_op_kind() {
    use proptest::strategy::ValueTree;
    use std::collections::BTreeMap;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut symbolic = 0;
    let mut nodes = 0;
    for _ in 0..192 {
        let (steps, outputs) = recipe().new_tree(&mut runner).map(|t| t.current()).unwrap_or_default();
        if steps.is_empty() {
            continue;
        }
        let g = build(&steps, &outputs).graph;
        nodes += g.len();
        for (_, node) in g.iter() {
            *counts.entry(node.op.mnemonic()).or_default() += 1;
            symbolic += usize::from(node.ty.shape.iter().any(|d| !d.is_const()));
        }
    }
    let expected = [
        "input", "const", "iota", "neg", "add", "where", "cast", "reduce", "reshape", "permute", "expand", "pad",
        "shrink",
    ];
    for kind in expected {
        assert!(counts.get(kind).copied().unwrap_or(0) >= 3, "{kind} built too rarely: {counts:?}");
    }
    assert!(symbolic * 4 >= nodes, "too few symbolic shapes: {symbolic} of {nodes}");
    println!("{nodes} nodes, {symbolic} symbolic: {counts:?}");
}

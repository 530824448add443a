//! Measured wins of equality saturation: graphs where `OptLevel::O2`/`O3` (greedy + saturation)
//! compile to a cheaper program than `OptLevel::O1` (greedy alone). Each test asserts the
//! structure found (matmul launches and their FLOPs, where scales and slices sit) and that the
//! saturated graph and the compiled program agree with `air::interp` on the original graph.

use crate::common;

use std::time::Duration;

use air::op::{Const, Input, Permute};
use air::testing::{Tol, check_host};
use air::{BinaryOp, Bindings, DType, Dim, Graph, NodeId, Op, Scalar, TensorType};
use kiln_lower::kir::Kernel;
use kiln_lower::saturate::lang::expand_matmul;
use kiln_lower::saturate::{SaturateOptions, saturate};
use kiln_lower::{CompileOptions, OptLevel, Program, compile, exec};

/// Builds graphs tersely.
struct B {
    g: Graph,
    slots: u32,
    dtype: DType,
}

impl B {
    fn new(dtype: DType) -> B {
        B { g: Graph::new(), slots: 0, dtype }
    }
    fn input(&mut self, shape: &[i64]) -> NodeId {
        let ty = TensorType::new(self.dtype, shape.iter().map(|&d| Dim::Const(d)).collect::<Vec<_>>());
        let n = self.g.add_leaf(Op::Input(Input { slot: self.slots }), ty).unwrap();
        self.slots += 1;
        n
    }
    fn mm(&mut self, a: NodeId, b: NodeId) -> NodeId {
        expand_matmul(&mut self.g, a, b).unwrap()
    }
    fn t(&mut self, x: NodeId) -> NodeId {
        let r = self.g.ty(x).shape.len();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.g.add(Op::Permute(Permute { perm: perm.into() }), &[x]).unwrap()
    }
    fn scale(&mut self, x: NodeId, k: f64) -> NodeId {
        let ty = self.g.ty(x).clone();
        let value = if ty.dtype.is_float() { Scalar::Float(k) } else { Scalar::Int(k as i64) };
        let c = self.g.add_leaf(Op::Const(Const { value }), ty).unwrap();
        self.g.add(Op::Binary(BinaryOp::Mul), &[x, c]).unwrap()
    }
    fn out(mut self, outs: &[NodeId]) -> Graph {
        for &o in outs {
            self.g.add_output(o);
        }
        self.g
    }
}

fn level(l: OptLevel) -> CompileOptions {
    CompileOptions { level: l, ..CompileOptions::default() }
}

/// Matmul launches of a program and their multiply-adds (times two: FLOPs).
fn matmul_flops(p: &Program) -> (usize, i64) {
    let mut launches = 0;
    let mut flops = 0;
    for s in &p.steps {
        if let Kernel::Matmul(k) = &p.kernels[s.kernel as usize] {
            launches += 1;
            let dims = [&k.batch, &k.m, &k.n, &k.k].map(|e| e.as_const().expect("constant shapes in these tests"));
            flops += 2 * dims.iter().product::<i64>();
        }
    }
    (launches, flops)
}

/// Twice the elements of every product summed by a reduce in `g`: a contraction's FLOPs.
fn contraction_flops(g: &Graph) -> i64 {
    g.live_order()
        .into_iter()
        .filter(|&n| matches!(g.op(n), Op::Reduce(_)))
        .map(|n| 2 * g.ty(g.inputs(n)[0]).shape.iter().map(|d| d.as_const().unwrap()).product::<i64>())
        .sum()
}

/// Nodes of `g` (live) whose op satisfies `f`.
fn count(g: &Graph, f: impl Fn(&Op) -> bool) -> usize {
    g.live_order().into_iter().filter(|&n| f(g.op(n))).count()
}

/// What a test checks after saturating: the saturated graph, and the programs at O1 and at `l`.
struct Outcome {
    graph: Graph,
    greedy: Program,
    saturated: Program,
}

/// Saturates `g` at `l`, asserts that it changed the graph and lowered the modelled cost, and
/// that the saturated graph (through `air::interp`) and the compiled program (through
/// `lower::exec`) both agree with `air::interp` on `g` within `tol`.
fn run(g: &Graph, l: OptLevel, tol: Tol) -> Outcome {
    let mut opt = g.clone();
    kiln_lower::rewrite::optimize(&mut opt);
    // A generous time limit: debug builds on a loaded machine are slow, and the test is about
    // what saturation finds, not how fast.
    let budget = SaturateOptions { time_limit: Duration::from_secs(20), ..l.saturation().expect("a saturating level") };
    let stats = saturate(&mut opt, &budget);
    assert!(stats.changed, "saturation found nothing cheaper: {stats}");
    assert!(stats.cost_after < stats.cost_before, "{stats}");
    kiln_lower::rewrite::optimize(&mut opt);
    air::verify(&opt).unwrap();
    // What `compile` at `l` does after saturating: the greedy rules again, then fusion.
    let greedy = compile(g, &level(OptLevel::O1)).unwrap();
    let saturated = compile(&opt, &level(OptLevel::O1)).unwrap();
    for seed in [1, 2] {
        let inputs = common::inputs_for(g, &Bindings::new(), seed, 3.5);
        let want = air::eval(g, &inputs, &Bindings::new()).unwrap();
        let got = air::eval(&opt, &inputs, &Bindings::new()).unwrap();
        let ran = exec::run(&saturated, &inputs, &Bindings::new()).unwrap();
        assert_eq!(want.len(), got.len());
        for (w, (o, r)) in want.iter().zip(got.iter().zip(&ran)) {
            check_host(o, w, tol).unwrap_or_else(|e| panic!("saturated graph: {e}"));
            check_host(r, w, Tol::both(1e-4)).unwrap_or_else(|e| panic!("compiled program: {e}"));
        }
    }
    Outcome { graph: opt, greedy, saturated }
}

const F32_TOL: Tol = Tol { atol: 1e-5, rtol: 1e-5 };

#[test]
fn matrix_matrix_vector_chain_reassociates_to_two_matvecs() {
    let mut b = B::new(DType::F32);
    let (a, m, v) = (b.input(&[96, 96]), b.input(&[96, 96]), b.input(&[96, 1]));
    let am = b.mm(a, m);
    let y = b.mm(am, v);
    let o = run(&b.out(&[y]), OptLevel::O3, F32_TOL);
    assert_eq!(matmul_flops(&o.greedy), (2, 2 * 96 * 96 * 96 + 2 * 96 * 96));
    assert_eq!(matmul_flops(&o.saturated), (2, 2 * (2 * 96 * 96)));
}

#[test]
fn row_vector_chain_reassociates_left() {
    let mut b = B::new(DType::F32);
    let (u, a, m) = (b.input(&[1, 80]), b.input(&[80, 80]), b.input(&[80, 80]));
    let am = b.mm(a, m);
    let y = b.mm(u, am);
    let o = run(&b.out(&[y]), OptLevel::O3, F32_TOL);
    assert_eq!(matmul_flops(&o.greedy).1, 2 * 80 * 80 * 80 + 2 * 80 * 80);
    assert_eq!(matmul_flops(&o.saturated), (2, 2 * (2 * 80 * 80)));
}

#[test]
fn four_matrix_chain_becomes_three_matvecs() {
    let mut b = B::new(DType::F32);
    let (a, m, c, v) = (b.input(&[48, 48]), b.input(&[48, 48]), b.input(&[48, 48]), b.input(&[48, 1]));
    let am = b.mm(a, m);
    let amc = b.mm(am, c);
    let y = b.mm(amc, v);
    let o = run(&b.out(&[y]), OptLevel::O3, F32_TOL);
    assert_eq!(matmul_flops(&o.greedy).1, 2 * (2 * 48 * 48 * 48) + 2 * 48 * 48);
    assert_eq!(matmul_flops(&o.saturated), (3, 3 * (2 * 48 * 48)));
}

#[test]
fn thin_middle_dimension_chain_reassociates_right() {
    // (A B) C with A: [128, 4], B: [4, 128], C: [128, 128]: A (B C) never builds the 128x128
    // product of A and B.
    let mut b = B::new(DType::F32);
    let (a, m, c) = (b.input(&[128, 4]), b.input(&[4, 128]), b.input(&[128, 128]));
    let am = b.mm(a, m);
    let y = b.mm(am, c);
    let o = run(&b.out(&[y]), OptLevel::O3, F32_TOL);
    assert_eq!(matmul_flops(&o.greedy).1, 2 * 128 * 128 * 4 + 2 * 128 * 128 * 128);
    assert_eq!(matmul_flops(&o.saturated).1, 2 * 4 * 128 * 128 + 2 * 128 * 4 * 128);
}

#[test]
fn batched_chain_reassociates() {
    let mut b = B::new(DType::F32);
    let (a, m, v) = (b.input(&[4, 64, 64]), b.input(&[4, 64, 64]), b.input(&[4, 64, 1]));
    let am = b.mm(a, m);
    let y = b.mm(am, v);
    let o = run(&b.out(&[y]), OptLevel::O3, F32_TOL);
    assert_eq!(matmul_flops(&o.greedy).1, 4 * (2 * 64 * 64 * 64 + 2 * 64 * 64));
    assert_eq!(matmul_flops(&o.saturated), (2, 2 * 4 * (2 * 64 * 64)));
}

#[test]
fn integer_chain_reassociates_exactly_at_o2() {
    let mut b = B::new(DType::I32);
    let (a, m, v) = (b.input(&[64, 64]), b.input(&[64, 64]), b.input(&[64, 1]));
    let am = b.mm(a, m);
    let y = b.mm(am, v);
    let o = run(&b.out(&[y]), OptLevel::O2, Tol::EXACT);
    // Integer products are loop kernels (matmul kernels are f32): count the contractions' work.
    assert_eq!(contraction_flops(&o.graph), 2 * (2 * 64 * 64));
    // Floats are not reassociated at O2: rounding would change.
    let mut f = B::new(DType::F32);
    let (a, m, v) = (f.input(&[64, 64]), f.input(&[64, 64]), f.input(&[64, 1]));
    let am = f.mm(a, m);
    let y = f.mm(am, v);
    let mut g = f.out(&[y]);
    let stats = saturate(&mut g, &SaturateOptions::default());
    assert!(!stats.changed, "{stats}");
}

/// The shape of the (only) `mul` by a const in `g`.
fn scaled_shape(g: &Graph) -> Vec<Dim> {
    let muls: Vec<NodeId> = g
        .live_order()
        .into_iter()
        .filter(|&n| {
            matches!(g.op(n), Op::Binary(BinaryOp::Mul)) && g.inputs(n).iter().any(|&i| matches!(g.op(i), Op::Const(_)))
        })
        .collect();
    assert_eq!(muls.len(), 1, "{}", air::print(g));
    g.ty(muls[0]).shape.to_vec()
}

#[test]
fn scale_moves_after_a_narrowing_matmul() {
    let mut b = B::new(DType::F32);
    let (x, w) = (b.input(&[256, 128]), b.input(&[128, 4]));
    let xs = b.scale(x, 0.125);
    let y = b.mm(xs, w);
    let o = run(&b.out(&[y]), OptLevel::O3, F32_TOL);
    assert_eq!(scaled_shape(&o.graph), vec![Dim::Const(256), Dim::Const(4)]);
}

#[test]
fn scales_of_both_operands_move_after_the_matmul_exactly_for_integers() {
    let mut b = B::new(DType::I32);
    let (x, w) = (b.input(&[128, 128]), b.input(&[128, 2]));
    let xs = b.scale(x, 3.0);
    let ws = b.scale(w, 2.0);
    let y = b.mm(xs, ws);
    let o = run(&b.out(&[y]), OptLevel::O2, Tol::EXACT);
    let big_muls = count(&o.graph, |op| matches!(op, Op::Binary(BinaryOp::Mul)));
    // The matmul's own product, and the two scales, now on [128, 2] results.
    assert_eq!(big_muls, 3, "{}", air::print(&o.graph));
    for n in o.graph.live_order() {
        let g = &o.graph;
        if matches!(g.op(n), Op::Binary(BinaryOp::Mul)) && g.inputs(n).iter().any(|&i| matches!(g.op(i), Op::Const(_)))
        {
            assert_eq!(g.ty(n).shape.to_vec(), vec![Dim::Const(128), Dim::Const(2)]);
        }
    }
}

#[test]
fn three_projections_of_one_input_merge_into_one_gemm() {
    // Attention's Q, K and V projections of a long sequence.
    let mut b = B::new(DType::F32);
    let x = b.input(&[512, 32]);
    let (wq, wk, wv) = (b.input(&[32, 32]), b.input(&[32, 32]), b.input(&[32, 32]));
    let q = b.mm(x, wq);
    let k = b.mm(x, wk);
    let v = b.mm(x, wv);
    let o = run(&b.out(&[q, k, v]), OptLevel::O2, F32_TOL);
    assert_eq!(matmul_flops(&o.greedy), (3, 3 * 2 * 512 * 32 * 32));
    assert_eq!(matmul_flops(&o.saturated), (1, 2 * 512 * 96 * 32));
    assert_eq!(count(&o.graph, |op| matches!(op, Op::Shrink(_))), 3);
}

/// `layers` layers of `h + (q + k + v) / 20`, each with its own Q, K and V projections of `h`.
fn projection_layers(layers: usize) -> Graph {
    let mut b = B::new(DType::F32);
    let mut h = b.input(&[512, 32]);
    for _ in 0..layers {
        let (wq, wk, wv) = (b.input(&[32, 32]), b.input(&[32, 32]), b.input(&[32, 32]));
        let (q, k, v) = (b.mm(h, wq), b.mm(h, wk), b.mm(h, wv));
        let qk = b.g.add(Op::Binary(BinaryOp::Add), &[q, k]).unwrap();
        let qkv = b.g.add(Op::Binary(BinaryOp::Add), &[qk, v]).unwrap();
        // Scaled so that values stay near 1 through the layers.
        let small = b.scale(qkv, 0.05);
        h = b.g.add(Op::Binary(BinaryOp::Add), &[h, small]).unwrap();
    }
    b.out(&[h])
}

#[test]
fn identical_layers_are_saturated_once_and_each_merges_its_projections() {
    // The first layer reads a graph input and the last writes the output, so three regions are
    // distinct whatever the depth: the saturation work is flat in depth.
    for layers in [4, 8] {
        let g = projection_layers(layers);
        let mut opt = g.clone();
        kiln_lower::rewrite::optimize(&mut opt);
        let budget = SaturateOptions { time_limit: Duration::from_secs(20), ..SaturateOptions::default() };
        let stats = saturate(&mut opt, &budget);
        assert_eq!((stats.regions, stats.distinct), (layers, 3), "{stats}");
        assert_eq!(stats.matmuls, 3 * layers, "{stats}");
        assert!(stats.changed, "{stats}");
    }
    let o = run(&projection_layers(4), OptLevel::O2, F32_TOL);
    assert_eq!(matmul_flops(&o.greedy), (12, 12 * 2 * 512 * 32 * 32));
    assert_eq!(matmul_flops(&o.saturated), (4, 4 * 2 * 512 * 96 * 32));
}

#[test]
fn regions_without_repetition_are_saturated_whole() {
    // One layer and a chain: nothing repeats, so the graph is one region and the chain may
    // reassociate across what would have been a cut.
    let g = projection_layers(1);
    let mut opt = g.clone();
    kiln_lower::rewrite::optimize(&mut opt);
    let stats =
        saturate(&mut opt, &SaturateOptions { time_limit: Duration::from_secs(20), ..SaturateOptions::default() });
    assert_eq!((stats.regions, stats.distinct), (1, 1), "{stats}");
    assert!(stats.changed, "{stats}");
}

#[test]
fn a_matmul_chain_is_one_region() {
    // Identical links would repeat as regions if a cut could fall inside a matmul's pattern
    // (between its product and its sum), leaving regions that hold half a matmul.
    let mut b = B::new(DType::I32);
    let xs: Vec<NodeId> = (0..6).map(|_| b.input(&[16, 16])).collect();
    let y = xs[1..].iter().fold(xs[0], |y, &x| b.mm(y, x));
    let g = b.out(&[y]);
    assert_eq!(kiln_lower::saturate::blocks::regions(&g).len(), 1);
}

#[test]
fn two_heads_of_different_widths_merge() {
    let mut b = B::new(DType::F32);
    let x = b.input(&[4, 512, 16]);
    let (w1, w2) = (b.input(&[16, 24]), b.input(&[16, 8]));
    let y1 = b.mm(x, w1);
    let y2 = b.mm(x, w2);
    let o = run(&b.out(&[y1, y2]), OptLevel::O2, F32_TOL);
    assert_eq!(matmul_flops(&o.greedy).0, 2);
    assert_eq!(matmul_flops(&o.saturated), (1, 2 * 4 * 512 * 32 * 16));
}

#[test]
fn transposes_through_a_matmul_expose_a_cheaper_association() {
    // (A^T B^T)^T v = (B A) v = B (A v): only visible once the transposes move through the
    // product.
    let mut b = B::new(DType::F32);
    let (a, m, v) = (b.input(&[64, 64]), b.input(&[64, 64]), b.input(&[64, 1]));
    let (at, mt) = (b.t(a), b.t(m));
    let p = b.mm(at, mt);
    let pt = b.t(p);
    let y = b.mm(pt, v);
    let o = run(&b.out(&[y]), OptLevel::O3, F32_TOL);
    assert_eq!(matmul_flops(&o.greedy), (2, 2 * 64 * 64 * 64 + 2 * 64 * 64));
    assert_eq!(matmul_flops(&o.saturated), (2, 2 * (2 * 64 * 64)));
    assert_eq!(count(&o.graph, |op| matches!(op, Op::Permute(_))), 2, "{}", air::print(&o.graph));
}

#[test]
fn graphs_without_matmuls_are_left_alone() {
    let mut b = B::new(DType::F32);
    let x = b.input(&[8, 8]);
    let y = b.scale(x, 2.0);
    let mut g = b.out(&[y]);
    let before = air::print(&g);
    let stats = saturate(&mut g, &SaturateOptions::default());
    assert_eq!(stats.stop, "no-matmul");
    assert!(!stats.changed);
    assert_eq!(air::print(&g), before);
}

#[test]
fn small_projections_are_not_merged_when_launches_do_not_pay() {
    // One row: the weight concatenation costs more than the two launches it saves.
    let mut b = B::new(DType::F32);
    let x = b.input(&[1, 64]);
    let (w1, w2) = (b.input(&[64, 64]), b.input(&[64, 64]));
    let y1 = b.mm(x, w1);
    let y2 = b.mm(x, w2);
    let mut g = b.out(&[y1, y2]);
    let stats = saturate(&mut g, &SaturateOptions::default());
    assert!(!stats.changed, "{stats}");
}

#[test]
fn budget_limits_stop_saturation() {
    let mut b = B::new(DType::I32);
    let xs: Vec<NodeId> = (0..6).map(|_| b.input(&[16, 16])).collect();
    let mut y = xs[0];
    for &x in &xs[1..] {
        y = b.mm(y, x);
    }
    let mut g = b.out(&[y]);
    let stats = saturate(&mut g, &SaturateOptions { iter_limit: 1, ..SaturateOptions::default() });
    assert_eq!(stats.iterations, 1);
    assert_eq!(stats.stop, "iter-limit");
    let stats = saturate(&mut g, &SaturateOptions { node_limit: 10, ..SaturateOptions::default() });
    assert_eq!(stats.stop, "node-limit");
}

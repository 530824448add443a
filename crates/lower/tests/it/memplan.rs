//! Memory planner tests: a long unfused chain fits in two buffers' worth of arena, live buffers
//! never share bytes, and random lifetimes always place without overlap within the naive size.

use air::op::Input;
use air::{Bindings, DType, Dim, Graph, HostTensor, Op, TensorType, UnaryOp};
use kiln_lower::memplan::{self, ALIGN, MemoryPlan, MemoryStats};
use kiln_lower::{CompileOptions, compile, exec};
use proptest::prelude::*;

/// Every pair of buffers whose lifetimes intersect occupies disjoint bytes.
fn assert_disjoint(plan: &MemoryPlan) {
    let n = plan.sizes.len();
    for i in 0..n {
        for j in i + 1..n {
            let (Some((a0, a1)), Some((b0, b1))) = (plan.intervals[i], plan.intervals[j]) else { continue };
            if a1 < b0 || b1 < a0 || plan.sizes[i] == 0 || plan.sizes[j] == 0 {
                continue;
            }
            let (oi, oj) = (plan.offsets[i].unwrap(), plan.offsets[j].unwrap());
            assert!(
                oi + plan.sizes[i] <= oj || oj + plan.sizes[j] <= oi,
                "buf{i} [{oi}, +{}) and buf{j} [{oj}, +{}) overlap while both live",
                plan.sizes[i],
                plan.sizes[j]
            );
        }
    }
    for (i, o) in plan.offsets.iter().enumerate() {
        if let Some(o) = o {
            assert_eq!(o % ALIGN, 0);
            assert!(o + plan.sizes[i] <= plan.stats.arena_bytes);
        }
    }
}

fn chain(len: usize, numel: i64) -> Graph {
    let mut g = Graph::new();
    let ty = TensorType::new(DType::F32, vec![Dim::Const(numel)]);
    let mut x = g.add_leaf(Op::Input(Input { slot: 0 }), ty).unwrap();
    for i in 0..len {
        let op = if i % 2 == 0 { UnaryOp::Neg } else { UnaryOp::Sin };
        x = g.add(Op::Unary(op), &[x]).unwrap();
    }
    g.add_output(x);
    g
}

#[test]
fn unfused_chain_of_100_ops_needs_two_buffers() {
    let g = chain(100, 100);
    let p = compile(&g, &CompileOptions { fuse: false, optimize: false, ..CompileOptions::default() }).unwrap();
    assert_eq!(p.steps.len(), 100);
    let plan = memplan::plan(&p, &Bindings::new()).unwrap();
    assert_disjoint(&plan);
    // 99 temps of 400 bytes, each 448 once aligned: two slots.
    assert_eq!(plan.stats.naive_bytes, 99 * 448);
    assert_eq!(plan.stats.arena_bytes, 2 * 448);
    assert_eq!(plan.stats.peak_live_bytes, 800);

    let x = HostTensor::from_vec((0..100).map(|i| i as f32 / 50.0 - 1.0).collect(), vec![100]).unwrap();
    let want = air::eval(&g, std::slice::from_ref(&x), &Bindings::new()).unwrap();
    let got = exec::run(&p, &[x], &Bindings::new()).unwrap();
    assert_eq!(want, got);
}

#[test]
fn concurrent_groups_extend_lifetimes() {
    let g = chain(4, 16);
    let p = compile(&g, &CompileOptions { fuse: false, optimize: false, ..CompileOptions::default() }).unwrap();
    let seq = memplan::plan(&p, &Bindings::new()).unwrap();
    let together = memplan::plan_with_groups(&p, &Bindings::new(), &[vec![0, 1, 2, 3]]).unwrap();
    assert_disjoint(&together);
    assert_eq!(seq.stats.arena_bytes, 2 * ALIGN);
    assert_eq!(together.stats.arena_bytes, 3 * ALIGN);
    assert!(memplan::plan_with_groups(&p, &Bindings::new(), &[vec![0, 1], vec![1, 2, 3]]).is_err());
}

#[test]
fn symbolic_sizes_plan_per_binding() {
    let mut g = Graph::new();
    let ty = TensorType::new(DType::F32, vec![Dim::sym("seq"), Dim::Const(3)]);
    let x = g.add_leaf(Op::Input(Input { slot: 0 }), ty).unwrap();
    let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    let z = g.add(Op::Unary(UnaryOp::Exp2), &[y]).unwrap();
    let w = g.add(Op::Unary(UnaryOp::Neg), &[z]).unwrap();
    g.add_output(w);
    let p = compile(&g, &CompileOptions { fuse: false, optimize: false, ..CompileOptions::default() }).unwrap();
    let small = memplan::plan(&p, &Bindings::from([(air::Symbol::new("seq"), 2)])).unwrap();
    let big = memplan::plan(&p, &Bindings::from([(air::Symbol::new("seq"), 100)])).unwrap();
    assert_eq!(small.stats.arena_bytes, 2 * ALIGN);
    assert_eq!(big.stats.arena_bytes, 2 * 1216);
    assert!(memplan::plan(&p, &Bindings::new()).is_err());
}

proptest! {
    #[test]
    fn random_lifetimes_never_overlap(
        bufs in proptest::collection::vec((0usize..5000, 0usize..40, 0usize..10), 0..60)
    ) {
        let sizes: Vec<usize> = bufs.iter().map(|b| b.0).collect();
        let intervals: Vec<Option<(usize, usize)>> = bufs.iter().map(|&(_, s, len)| Some((s, s + len))).collect();
        let (offsets, arena_bytes) = memplan::place(&sizes, &intervals);
        let naive_bytes: usize = sizes.iter().map(|s| s.div_ceil(ALIGN) * ALIGN).sum();
        let peak_live_bytes = memplan::peak_live(&sizes, &intervals);
        let plan = MemoryPlan { offsets, sizes, intervals, stats: MemoryStats { arena_bytes, naive_bytes, peak_live_bytes } };
        assert_disjoint(&plan);
        prop_assert!(plan.stats.arena_bytes <= plan.stats.naive_bytes);
        prop_assert!(plan.stats.arena_bytes >= plan.stats.peak_live_bytes);
    }
}

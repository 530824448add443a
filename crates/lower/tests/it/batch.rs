//! Dependency levels and grouped matmuls (`lower::batch`): equal independent matmuls form one
//! grouped launch, levels respect every dependency, running level by level (steps of a level in
//! any order) gives the in-order results bit for bit, and under the level memory plan no two
//! steps of a level touch overlapping bytes where one of them writes.

use air::op::{Const, Expand, Input, Permute, Reduce, Reshape};
use air::{BinaryOp, Bindings, DType, Graph, HostData, HostTensor, NodeId, Op, ReduceOp, Scalar, TensorType};
use air::{UnaryOp, dim::shape_of};
use expect_test::expect;
use kiln_lower::batch::{self, Launch};
use kiln_lower::kir::Access;
use kiln_lower::memplan;
use kiln_lower::{BufferKind, CompileOptions, Program, compile, exec};

use crate::common::Rng;

#[derive(Default)]
struct B {
    g: Graph,
    slots: u32,
}

impl B {
    fn input(&mut self, shape: &[usize]) -> NodeId {
        let ty = TensorType::new(DType::F32, shape_of(shape));
        let n = self.g.add_leaf(Op::Input(Input { slot: self.slots }), ty).unwrap();
        self.slots += 1;
        n
    }
    fn op(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        self.g.add(op, inputs).unwrap()
    }
    fn dims(&self, x: NodeId) -> Vec<usize> {
        self.g.ty(x).shape.iter().map(|d| d.as_const().unwrap() as usize).collect()
    }
    /// `a[m, k] @ b[k, n]` as the front end builds it (expand-mul-sum).
    fn matmul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        let (m, k, n) = (self.dims(a)[0], self.dims(a)[1], self.dims(b)[1]);
        let a = self.op(Op::Reshape(Reshape { shape: shape_of(&[m, 1, k]) }), &[a]);
        let a = self.op(Op::Expand(Expand { shape: shape_of(&[m, n, k]) }), &[a]);
        let b = self.op(Op::Permute(Permute { perm: [1usize, 0].into_iter().collect() }), &[b]);
        let b = self.op(Op::Reshape(Reshape { shape: shape_of(&[1, n, k]) }), &[b]);
        let b = self.op(Op::Expand(Expand { shape: shape_of(&[m, n, k]) }), &[b]);
        let p = self.op(Op::Binary(BinaryOp::Mul), &[a, b]);
        let s = self.op(Op::Reduce(Reduce { op: ReduceOp::Sum, axes: [2usize].into_iter().collect() }), &[p]);
        self.op(Op::Reshape(Reshape { shape: shape_of(&[m, n]) }), &[s])
    }
    fn out(mut self, outs: &[NodeId]) -> Graph {
        for &o in outs {
            self.g.add_output(o);
        }
        self.g
    }
}

fn inputs_for(g: &Graph, seed: u64) -> Vec<HostTensor> {
    let mut state = seed.wrapping_mul(6364136223846793005) | 1;
    g.input_nodes()
        .into_iter()
        .map(|(_, n)| {
            let shape: Vec<usize> = g.ty(n).shape.iter().map(|d| d.as_const().unwrap() as usize).collect();
            let vals: Vec<f32> = (0..shape.iter().product::<usize>())
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
                })
                .collect();
            HostTensor::new(HostData::F32(vals), shape).unwrap()
        })
        .collect()
}

fn bits(outs: &[HostTensor]) -> Vec<Vec<u64>> {
    outs.iter().map(|t| t.data.to_f64_vec().iter().map(|x| x.to_bits()).collect()).collect()
}

/// Checks every invariant of the levels of `p` and that running by levels (each level reversed)
/// gives the in-order results bit for bit.
fn check_levels(g: &Graph, p: &Program, seed: u64) {
    let deps = p.deps().unwrap();
    for (t, preds) in deps.preds.iter().enumerate() {
        for &s in preds {
            assert!((s as usize) < t, "step {t} depends on a later step {s}");
            assert!(deps.level[s as usize] < deps.level[t], "step {t} is not above its dependency {s}");
        }
    }
    let levels = p.levels().unwrap();
    assert_eq!(levels.iter().map(Vec::len).sum::<usize>(), p.steps.len());
    let bindings = Bindings::new();
    let plan = memplan::plan_with_groups(p, &bindings, &levels).unwrap();
    assert_level_safe(p, &levels, &plan);

    let inputs = inputs_for(g, seed);
    let want = exec::run(p, &inputs, &bindings).unwrap();
    let reversed: Vec<Vec<usize>> = levels.iter().map(|l| l.iter().rev().copied().collect()).collect();
    let got = exec::run_grouped(p, &inputs, &bindings, &reversed).unwrap();
    assert_eq!(bits(&got), bits(&want), "running by levels changed the results\n{p}");
}

/// A byte range a step touches, `((space, start, end), written)`.
type Touch = ((usize, usize, usize), bool);

/// The bytes each step of a level touches: a step's written bytes overlap no other step's
/// touched bytes in that level (what makes running the level's steps at the same time safe).
fn assert_level_safe(p: &Program, levels: &[Vec<usize>], plan: &memplan::MemoryPlan) {
    // A region: (space, start, end) with space 0 = arena, else 1 + buffer id (own allocations).
    let region = |b: usize| -> (usize, usize, usize) {
        match p.buffers[b].kind {
            BufferKind::Temp => {
                let o = plan.offsets[b].unwrap();
                (0, o, o + plan.sizes[b])
            }
            _ => (1 + b, 0, plan.sizes[b]),
        }
    };
    for level in levels {
        let touched: Vec<Vec<Touch>> = level
            .iter()
            .map(|&s| {
                let step = &p.steps[s];
                let params = p.kernels[step.kernel as usize].params();
                params
                    .iter()
                    .zip(&step.args)
                    .map(|(pa, b)| (region(b.0 as usize), pa.access == Access::Write))
                    .collect()
            })
            .collect();
        for i in 0..level.len() {
            for j in 0..level.len() {
                if i == j {
                    continue;
                }
                for &((sa, a0, a1), write) in &touched[i] {
                    if !write || a0 == a1 {
                        continue;
                    }
                    for &((sb, b0, b1), _) in &touched[j] {
                        assert!(
                            sa != sb || b0 == b1 || a1 <= b0 || b1 <= a0,
                            "steps {} and {} of one level overlap: [{a0}, {a1}) written, [{b0}, {b1}) touched",
                            level[i],
                            level[j]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn equal_independent_matmuls_are_one_grouped_launch() {
    let mut b = B::default();
    let mut outs = Vec::new();
    for _ in 0..6 {
        let (x, y) = (b.input(&[3, 4]), b.input(&[4, 5]));
        outs.push(b.matmul(x, y));
    }
    // Two of another shape (another kernel), and one product that depends on two others.
    for _ in 0..2 {
        let (x, y) = (b.input(&[2, 4]), b.input(&[4, 5]));
        outs.push(b.matmul(x, y));
    }
    let sum = b.op(Op::Binary(BinaryOp::Add), &[outs[0], outs[1]]);
    let sum = b.op(Op::Unary(UnaryOp::Sin), &[sum]);
    let w = b.input(&[5, 5]);
    outs.push(b.matmul(sum, w));
    let g = b.out(&outs);
    let p = compile(&g, &CompileOptions::default()).unwrap();
    expect![[r#"
        level 0: {k0: s0 s1 s2 s3 s4 s5} {k1: s6 s7}
        level 1: s8
        level 2: s9
    "#]]
    .assert_eq(&batch::describe(&p).unwrap());
    let launches = batch::batched_levels(&p).unwrap();
    assert_eq!(launches[0][0], Launch::Grouped { kernel: 0, steps: vec![0, 1, 2, 3, 4, 5] });
    assert_eq!(launches[0][1].steps(), [6, 7]);
    check_levels(&g, &p, 1);
}

#[test]
fn a_matmul_with_bias_waits_for_the_bias_and_readers_wait_for_writers() {
    let mut b = B::default();
    let (x, w, bias) = (b.input(&[4, 3]), b.input(&[3, 5]), b.input(&[4, 5]));
    let y = b.matmul(x, w);
    let y = b.op(Op::Binary(BinaryOp::Add), &[y, bias]);
    let r = b.op(Op::Unary(UnaryOp::Sqrt), &[y]);
    let g = b.out(&[r, y]);
    let p = compile(&g, &CompileOptions::default()).unwrap();
    let deps = p.deps().unwrap();
    // The bias is written into the output, the matmul accumulates onto it, then the sqrt reads it.
    assert_eq!(deps.level, (0..p.steps.len() as u32).collect::<Vec<_>>(), "{p}");
    check_levels(&g, &p, 2);
}

/// A random wide DAG: element-wise ops and matmuls over `[4, 4]` tensors, many outputs.
fn random_dag(seed: u64) -> Graph {
    let mut rng = Rng::new(seed);
    let mut b = B::default();
    let mut pool: Vec<NodeId> = (0..2 + rng.below(4)).map(|_| b.input(&[4, 4])).collect();
    let half =
        b.g.add_leaf(Op::Const(Const { value: Scalar::Float(0.5) }), TensorType::new(DType::F32, shape_of(&[4, 4])));
    pool.push(half.unwrap());
    for _ in 0..6 + rng.below(20) {
        let x = pool[rng.below(pool.len())];
        let y = pool[rng.below(pool.len())];
        let n = match rng.below(6) {
            0 => b.op(Op::Unary(UnaryOp::Sin), &[x]),
            1 => b.op(Op::Unary(UnaryOp::Neg), &[x]),
            2 => b.op(Op::Binary(BinaryOp::Add), &[x, y]),
            3 => b.op(Op::Binary(BinaryOp::Mul), &[x, y]),
            _ => b.matmul(x, y),
        };
        pool.push(n);
    }
    let mut outs: Vec<NodeId> = pool.iter().rev().take(1 + rng.below(6)).copied().collect();
    outs.push(pool[rng.below(pool.len())]);
    b.out(&outs)
}

#[test]
fn random_dags_run_by_levels_as_in_order() {
    for seed in 0..60 {
        let g = random_dag(seed);
        for options in [
            CompileOptions::default(),
            CompileOptions { fuse: false, optimize: false, ..CompileOptions::default() },
            CompileOptions { optimize: false, ..CompileOptions::default() },
        ] {
            let p = compile(&g, &options).unwrap();
            check_levels(&g, &p, seed);
            for level in batch::batched_levels(&p).unwrap() {
                let mut steps: Vec<usize> = level.iter().flat_map(|l| l.steps().to_vec()).collect();
                steps.sort();
                steps.dedup();
                assert_eq!(steps.len(), level.iter().map(|l| l.steps().len()).sum::<usize>());
            }
        }
    }
}

#[test]
fn grouped_planning_keeps_a_level_apart_but_reuses_across_levels() {
    // Eight independent unfused chains: a level holds one op of each chain.
    let mut b = B::default();
    let mut outs = Vec::new();
    for _ in 0..8 {
        let mut x = b.input(&[64]);
        for _ in 0..4 {
            x = b.op(Op::Unary(UnaryOp::Sin), &[x]);
        }
        outs.push(x);
    }
    let g = b.out(&outs);
    let p = compile(&g, &CompileOptions { fuse: false, optimize: false, ..CompileOptions::default() }).unwrap();
    let levels = p.levels().unwrap();
    assert_eq!(levels.len(), 4);
    assert!(levels.iter().all(|l| l.len() == 8));
    let bindings = Bindings::new();
    let in_order = memplan::plan(&p, &bindings).unwrap();
    let grouped = memplan::plan_with_groups(&p, &bindings, &levels).unwrap();
    // In order, a chain needs two temps at a time; by levels all eight chains are live together.
    assert_eq!(in_order.stats.arena_bytes, 2 * 256);
    assert_eq!(grouped.stats.arena_bytes, 16 * 256);
    check_levels(&g, &p, 7);
}

#[test]
fn a_bias_copy_waits_below_its_product_rather_than_at_level_zero() {
    // Three `Linear`s in a row: each bias is broadcast into its product's output by a step that
    // reads only the bias (an input), then the product accumulates onto it.
    let mut b = B::default();
    let mut h = b.input(&[4, 8]);
    for _ in 0..3 {
        let (w, bias) = (b.input(&[8, 8]), b.input(&[8]));
        let y = b.matmul(h, w);
        let bias = b.op(Op::Reshape(Reshape { shape: shape_of(&[1, 8]) }), &[bias]);
        let bias = b.op(Op::Expand(Expand { shape: shape_of(&[4, 8]) }), &[bias]);
        h = b.op(Op::Binary(BinaryOp::Add), &[y, bias]);
    }
    let g = b.out(&[h]);
    let p = compile(&g, &CompileOptions::default()).unwrap();
    let deps = p.deps().unwrap();
    let is_matmul = |s: usize| matches!(p.kernels[p.steps[s].kernel as usize], kiln_lower::kir::Kernel::Matmul(_));
    let matmuls: Vec<usize> = (0..p.steps.len()).filter(|&s| is_matmul(s)).collect();
    assert_eq!(matmuls.len(), 3, "{p}");
    for &m in &matmuls {
        // The matmul's one dependency that reads nothing computed: the bias copy, one level below.
        let copies: Vec<u32> = deps.preds[m].iter().copied().filter(|&q| deps.preds[q as usize].is_empty()).collect();
        assert!(!copies.is_empty(), "step {m} has no source step\n{p}");
        for q in copies {
            assert_eq!(deps.level[q as usize] + 1, deps.level[m], "bias copy {q} of step {m}\n{p}");
        }
    }
    // By levels, a copy's output lives from the level before its product, so the three copies
    // are never alive together: the arena is no larger than in order.
    let bindings = Bindings::new();
    let levels = p.levels().unwrap();
    let in_order = memplan::plan(&p, &bindings).unwrap();
    let grouped = memplan::plan_with_groups(&p, &bindings, &levels).unwrap();
    assert!(
        grouped.stats.arena_bytes <= in_order.stats.arena_bytes,
        "{} > {}",
        grouped.stats.arena_bytes,
        in_order.stats.arena_bytes
    );
    check_levels(&g, &p, 11);
}

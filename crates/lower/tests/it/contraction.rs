//! Contraction recognition: every `reduce sum` of a product of two affine views whose axes split
//! into batch, M, N and K groups becomes a `Kernel::Matmul` (matmul gradients, einsum-style
//! layouts, reductions over a middle or the first axis), and agrees with the interpreter.

use crate::common;

use air::op::{Expand, Input, Permute, Reduce, Reshape};
use air::{BinaryOp, Bindings, DType, Dim, Graph, NodeId, Op, ReduceOp, TensorType, UnaryOp};
use expect_test::{Expect, expect};
use kiln_lower::kir::{Inst, Kernel, Stmt};
use kiln_lower::{CompileOptions, Program, compile, exec, grad_with_seed};
use proptest::prelude::*;

/// Builds graphs tersely.
#[derive(Default)]
struct B {
    g: Graph,
    slots: u32,
}

fn dims(v: &[i64]) -> Vec<Dim> {
    v.iter().map(|&d| Dim::Const(d)).collect()
}

impl B {
    fn f32(&mut self, shape: &[i64]) -> NodeId {
        let ty = TensorType::new(DType::F32, dims(shape));
        let n = self.g.add_leaf(Op::Input(Input { slot: self.slots }), ty).unwrap();
        self.slots += 1;
        n
    }
    fn op(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        self.g.add(op, inputs).unwrap()
    }
    fn shape(&self, x: NodeId) -> Vec<Dim> {
        self.g.ty(x).shape.to_vec()
    }
    fn mul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.op(Op::Binary(BinaryOp::Mul), &[a, b])
    }
    fn sum(&mut self, x: NodeId, axes: &[usize]) -> NodeId {
        self.op(Op::Reduce(Reduce { op: ReduceOp::Sum, axes: axes.into() }), &[x])
    }
    fn reshape(&mut self, x: NodeId, shape: &[Dim]) -> NodeId {
        self.op(Op::Reshape(Reshape { shape: shape.into() }), &[x])
    }
    fn permute(&mut self, x: NodeId, perm: &[usize]) -> NodeId {
        self.op(Op::Permute(Permute { perm: perm.into() }), &[x])
    }
    fn expand(&mut self, x: NodeId, shape: &[Dim]) -> NodeId {
        self.op(Op::Expand(Expand { shape: shape.into() }), &[x])
    }
    /// The front end's canonical matmul: expand-mul-sum over `[..., M, N, K]`.
    fn matmul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        let (sa, sb) = (self.shape(a), self.shape(b));
        let r = sa.len();
        let (m, k, n) = (sa[r - 2], sa[r - 1], sb[r - 1]);
        let batch = &sa[..r - 2];
        let with = |tail: &[Dim]| -> Vec<Dim> { batch.iter().chain(tail).cloned().collect() };
        let a1 = self.reshape(a, &with(&[m, Dim::Const(1), k]));
        let a2 = self.expand(a1, &with(&[m, n, k]));
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        let bt = self.permute(b, &perm);
        let b1 = self.reshape(bt, &with(&[Dim::Const(1), n, k]));
        let b2 = self.expand(b1, &with(&[m, n, k]));
        let p = self.mul(a2, b2);
        let s = self.sum(p, &[r]);
        self.reshape(s, &with(&[m, n]))
    }
    fn out(mut self, outs: &[NodeId]) -> Graph {
        for &o in outs {
            self.g.add_output(o);
        }
        self.g
    }
}

fn options(optimize: bool) -> CompileOptions {
    CompileOptions { optimize, ..CompileOptions::default() }
}

/// Compares `exec::run(program)` with `air::interp::eval(g)`.
fn agree(g: &Graph, program: &Program, seed: u64) -> Result<(), String> {
    let inputs = common::inputs_for(g, &Bindings::new(), seed, 10.0);
    let want = air::eval(g, &inputs, &Bindings::new()).map_err(|e| format!("interp: {e}"))?;
    let got = exec::run(program, &inputs, &Bindings::new()).map_err(|e| format!("exec: {e}\n{program}"))?;
    if want.len() != got.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
        if w.shape != o.shape {
            return Err(format!("output {i}: shape {:?} vs {:?}", o.shape, w.shape));
        }
        for (e, (x, y)) in w.data.to_f64_vec().iter().zip(&o.data.to_f64_vec()).enumerate() {
            if (x - y).abs() > 1e-4 * (1.0 + x.abs().max(y.abs())) {
                return Err(format!("output {i}[{e}]: got {y}, expected {x}\n{}\n{program}", air::print(g)));
            }
        }
    }
    Ok(())
}

/// The number of launched matmul kernels.
fn matmuls(p: &Program) -> usize {
    p.steps.iter().filter(|s| matches!(p.kernels[s.kernel as usize], Kernel::Matmul(_))).count()
}

/// The largest constant extent of a reduce loop (a loop between an `AccInit` and its update)
/// whose body multiplies: a naive contraction left as a loop kernel.
fn naive_contraction_extent(p: &Program) -> i64 {
    fn muls(stmts: &[Stmt]) -> bool {
        stmts.iter().any(|s| match s {
            Stmt::Let { inst: Inst::Binary(BinaryOp::Mul, ..), .. } => true,
            Stmt::Loop { body, .. } => muls(body),
            _ => false,
        })
    }
    fn walk(stmts: &[Stmt], in_reduce: bool, best: &mut i64) {
        let reduce_here = in_reduce || stmts.iter().any(|s| matches!(s, Stmt::AccInit { .. }));
        for s in stmts {
            if let Stmt::Loop { extent, body, .. } = s {
                if reduce_here && muls(body) {
                    *best = (*best).max(extent.as_const().unwrap_or(i64::MAX));
                }
                walk(body, reduce_here, best);
            }
        }
    }
    let mut best = 0;
    for k in &p.kernels {
        if let Kernel::Loops(l) = k {
            walk(&l.body, false, &mut best);
        }
    }
    best
}

/// Compiles `g` (optimized and not), checks it against the interpreter and that it has exactly
/// `want` matmul launches and no naive contraction loop; returns the optimized program.
fn check_matmuls(g: &Graph, want: usize) -> Program {
    for optimize in [false, true] {
        let p = compile(g, &options(optimize)).unwrap();
        assert_eq!(matmuls(&p), want, "optimize {optimize}:\n{}\n{p}", air::print(g));
        assert!(naive_contraction_extent(&p) <= 1, "a naive contraction loop is left:\n{p}");
        agree(g, &p, 7).unwrap();
    }
    let unfused = CompileOptions { fuse: false, optimize: false, ..CompileOptions::default() };
    agree(g, &compile(g, &unfused).unwrap(), 7).unwrap();
    compile(g, &options(true)).unwrap()
}

/// `y = a @ w` and the gradients of `sum(y * seed)` with respect to `a` and `w`.
fn matmul_grads(m: i64, k: i64, n: i64) -> (Graph, Vec<NodeId>) {
    let mut b = B::default();
    let a = b.f32(&[m, k]);
    let w = b.f32(&[k, n]);
    let seed = b.f32(&[m, n]);
    let y = b.matmul(a, w);
    let grads = grad_with_seed(&mut b.g, y, seed, &[a, w]).unwrap();
    (b.g, grads)
}

/// Checks the dump of the optimized program.
fn check_dump(p: &Program, want: Expect) {
    want.assert_eq(&p.to_string());
}

#[test]
fn matmul_input_gradient_is_a_matmul() {
    // dA = g @ W^T: the reduce runs over the middle axis (N) of [M, N, K].
    let (mut g, grads) = matmul_grads(6, 5, 7);
    g.add_output(grads[0]);
    let p = check_matmuls(&g, 1);
    check_dump(
        &p,
        expect![[r#"
            buf0: f32[35] input 1
            buf1: f32[42] input 2
            buf2: f32[30] output 0
            k0 = matmul(b0: out f32, b1: in f32, b2: in f32) {
              batch 1, m 6, n 5, k 7, f32
              a = b1[0 + batch*0 + row*7 + col*1]
              b = b2[0 + batch*0 + row*1 + col*7]
              c = b0[0 + batch*30 + row*5 + col*1]
            }
            launch k0(buf2, buf1, buf0)
            return buf2: f32[6, 5]
        "#]],
    );
}

#[test]
fn matmul_weight_gradient_is_a_matmul() {
    // dW = A^T @ g: the reduce runs over the first axis (M) of [M, N, K]; the matmul writes
    // dW^T in the reduce's own layout and the permute back is a copy.
    let (mut g, grads) = matmul_grads(6, 5, 7);
    g.add_output(grads[1]);
    let p = check_matmuls(&g, 1);
    check_dump(
        &p,
        expect![[r#"
            buf0: f32[30] input 0
            buf1: f32[42] input 2
            buf2: f32[35] output 0
            buf3: f32[35] temp
            k0 = matmul(b0: out f32, b1: in f32, b2: in f32) {
              batch 1, m 7, n 5, k 6, f32
              a = b1[0 + batch*0 + row*1 + col*7]
              b = b2[0 + batch*0 + row*5 + col*1]
              c = b0[0 + batch*35 + row*5 + col*1]
            }
            k1 = kernel(b0: out f32, b1: in f32) {
              for i0 in 0..5 parallel {
                for i1 in 0..7 {
                  r0: f32 = load b1[(i0 + i1*5)]
                  store b0[(i0*7 + i1)] = r0
                }
              }
            }
            launch k0(buf3, buf1, buf0)
            launch k1(buf2, buf3)
            return buf2: f32[5, 7]
        "#]],
    );
}

#[test]
fn both_matmul_gradients_of_a_nonlinear_loss_are_matmuls() {
    // loss = sum(relu(a @ w) * seed): the gradients read an element-wise `g`, which gets a buffer.
    let mut b = B::default();
    let a = b.f32(&[8, 6]);
    let w = b.f32(&[6, 5]);
    let seed = b.f32(&[8, 5]);
    let y = b.matmul(a, w);
    let r = b.op(Op::Unary(UnaryOp::Neg), &[y]);
    let grads = grad_with_seed(&mut b.g, r, seed, &[a, w]).unwrap();
    let g = b.out(&[r, grads[0], grads[1]]);
    check_matmuls(&g, 3);
}

#[test]
fn batched_matmul_gradients_are_matmuls() {
    // Attention-shaped: [2, 3, 4] @ [2, 4, 5], gradients to both operands.
    let mut b = B::default();
    let q = b.f32(&[2, 3, 4]);
    let k = b.f32(&[2, 4, 5]);
    let seed = b.f32(&[2, 3, 5]);
    let y = b.matmul(q, k);
    let grads = grad_with_seed(&mut b.g, y, seed, &[q, k]).unwrap();
    let g = b.out(&[grads[0], grads[1]]);
    check_matmuls(&g, 2);
}

#[test]
fn einsum_over_a_middle_axis() {
    // bij,bjk->bik in a [b, i, j, k] layout, summed over axis 2.
    let mut b = B::default();
    let x = b.f32(&[2, 3, 4]);
    let y = b.f32(&[2, 4, 5]);
    let full = dims(&[2, 3, 4, 5]);
    let x1 = b.reshape(x, &dims(&[2, 3, 4, 1]));
    let x2 = b.expand(x1, &full);
    let y1 = b.reshape(y, &dims(&[2, 1, 4, 5]));
    let y2 = b.expand(y1, &full);
    let p = b.mul(x2, y2);
    let s = b.sum(p, &[2]);
    let out = b.reshape(s, &dims(&[2, 3, 5]));
    let p = check_matmuls(&b.out(&[out]), 1);
    check_dump(
        &p,
        expect![[r#"
            buf0: f32[24] input 0
            buf1: f32[40] input 1
            buf2: f32[30] output 0
            k0 = matmul(b0: out f32, b1: in f32, b2: in f32) {
              batch 2, m 3, n 5, k 4, f32
              a = b1[0 + batch*12 + row*4 + col*1]
              b = b2[0 + batch*20 + row*5 + col*1]
              c = b0[0 + batch*15 + row*5 + col*1]
            }
            launch k0(buf2, buf0, buf1)
            return buf2: f32[2, 3, 5]
        "#]],
    );
}

#[test]
fn contraction_over_the_first_axis() {
    // x^T y for x: [k, m], y: [k, n], summed over axis 0 of [k, m, n].
    let mut b = B::default();
    let x = b.f32(&[4, 3]);
    let y = b.f32(&[4, 5]);
    let full = dims(&[4, 3, 5]);
    let x1 = b.reshape(x, &dims(&[4, 3, 1]));
    let x2 = b.expand(x1, &full);
    let y1 = b.reshape(y, &dims(&[4, 1, 5]));
    let y2 = b.expand(y1, &full);
    let p = b.mul(y2, x2);
    let s = b.sum(p, &[0]);
    let out = b.reshape(s, &dims(&[3, 5]));
    let p = check_matmuls(&b.out(&[out]), 1);
    check_dump(
        &p,
        expect![[r#"
            buf0: f32[12] input 0
            buf1: f32[20] input 1
            buf2: f32[15] output 0
            k0 = matmul(b0: out f32, b1: in f32, b2: in f32) {
              batch 1, m 3, n 5, k 4, f32
              a = b1[0 + batch*0 + row*1 + col*3]
              b = b2[0 + batch*0 + row*5 + col*1]
              c = b0[0 + batch*15 + row*5 + col*1]
            }
            launch k0(buf2, buf0, buf1)
            return buf2: f32[3, 5]
        "#]],
    );
}

#[test]
fn a_broadcast_batch_folds_into_m() {
    // [2, 3, 4] @ [4, 5] broadcast over the batch: one [6, 4] @ [4, 5] GEMM.
    let mut b = B::default();
    let x = b.f32(&[2, 3, 4]);
    let w = b.f32(&[1, 4, 5]);
    let we = b.expand(w, &dims(&[2, 4, 5]));
    let y = b.matmul(x, we);
    let p = check_matmuls(&b.out(&[y]), 1);
    check_dump(
        &p,
        expect![[r#"
            buf0: f32[24] input 0
            buf1: f32[20] input 1
            buf2: f32[30] output 0
            k0 = matmul(b0: out f32, b1: in f32, b2: in f32) {
              batch 1, m 6, n 5, k 4, f32
              a = b1[0 + batch*0 + row*4 + col*1]
              b = b2[0 + batch*0 + row*5 + col*1]
              c = b0[0 + batch*30 + row*5 + col*1]
            }
            launch k0(buf2, buf0, buf1)
            return buf2: f32[2, 3, 5]
        "#]],
    );
}

#[test]
fn a_broadcast_left_operand_keeps_the_batch() {
    // [3, 4] broadcast over the batch of [2, 4, 5]: the batch axis only varies in `b` but cannot
    // join N (M lies between them in the output), so it stays a batch with a zero stride in `a`.
    let mut b = B::default();
    let x = b.f32(&[1, 3, 4]);
    let xe = b.expand(x, &dims(&[2, 3, 4]));
    let w = b.f32(&[2, 4, 5]);
    let y = b.matmul(xe, w);
    let p = check_matmuls(&b.out(&[y]), 1);
    check_dump(
        &p,
        expect![[r#"
            buf0: f32[12] input 0
            buf1: f32[40] input 1
            buf2: f32[30] output 0
            k0 = matmul(b0: out f32, b1: in f32, b2: in f32) {
              batch 2, m 3, n 5, k 4, f32
              a = b1[0 + batch*0 + row*4 + col*1]
              b = b2[0 + batch*20 + row*5 + col*1]
              c = b0[0 + batch*15 + row*5 + col*1]
            }
            launch k0(buf2, buf0, buf1)
            return buf2: f32[2, 3, 5]
        "#]],
    );
}

#[test]
fn heads_split_from_a_sequence_layout_are_copied_once() {
    // q: [b, s, h, d] read as [b, h, s, d]: its (b, h) batch does not collapse into one stride,
    // so the permuted view gets a buffer (one copy) and the product is one batched GEMM; the
    // gradients go the same way.
    let mut b = B::default();
    let q = b.f32(&[2, 5, 3, 4]);
    let k = b.f32(&[2, 3, 4, 6]);
    let seed = b.f32(&[2, 3, 5, 6]);
    let qh = b.permute(q, &[0, 2, 1, 3]);
    let y = b.matmul(qh, k);
    let mut only_y = b.g.clone();
    only_y.set_outputs(vec![y]);
    let forward = compile(&only_y, &options(true)).unwrap();
    assert_eq!((matmuls(&forward), forward.steps.len()), (1, 2), "{forward}");
    let grads = grad_with_seed(&mut b.g, y, seed, &[q, k]).unwrap();
    let g = b.out(&[y, grads[0], grads[1]]);
    check_matmuls(&g, 3);
}

#[test]
fn a_search_remembered_from_one_product_decides_its_twin_alike() {
    // Two heads-split products of one structure (two layers of attention scores): the first
    // searches the shorter operand views, the second starts from the cuts the first found. Both
    // launch the kernels a product alone gets (a copy and a GEMM), shared, and agree with the
    // interpreter.
    let layer = |b: &mut B| {
        let q = b.f32(&[2, 5, 3, 4]);
        let k = b.f32(&[2, 3, 4, 6]);
        let qh = b.permute(q, &[0, 2, 1, 3]);
        b.matmul(qh, k)
    };
    let mut one = B::default();
    let y = layer(&mut one);
    let alone = compile(&one.out(&[y]), &options(true)).unwrap();
    let mut two = B::default();
    let (y1, y2) = (layer(&mut two), layer(&mut two));
    let g = two.out(&[y1, y2]);
    let twins = compile(&g, &options(true)).unwrap();
    assert_eq!(alone.to_string().matches("matmul(").count(), 1, "{alone}");
    assert_eq!((twins.kernels.len(), twins.steps.len()), (alone.kernels.len(), 2 * alone.steps.len()), "{twins}");
    assert_eq!(matmuls(&twins), 2, "{twins}");
    agree(&g, &twins, 7).unwrap();
}

#[test]
fn products_of_one_structure_but_other_shapes_are_planned_apart() {
    // The same ops as a heads split, once with three heads (the permuted view needs a copy) and
    // once with one (it collapses into one batch stride: no copy). The second product's
    // signature differs in its types, so it is planned afresh, not given the first's cuts: the
    // program has exactly the kernels of the two compiled alone.
    let layer = |b: &mut B, heads: i64| {
        let q = b.f32(&[2, 5, heads, 4]);
        let k = b.f32(&[2, heads, 4, 6]);
        let qh = b.permute(q, &[0, 2, 1, 3]);
        b.matmul(qh, k)
    };
    let steps = |heads: &[i64]| {
        let mut b = B::default();
        let ys: Vec<NodeId> = heads.iter().map(|&h| layer(&mut b, h)).collect();
        let g = b.out(&ys);
        let p = compile(&g, &options(true)).unwrap();
        agree(&g, &p, 11).unwrap();
        (matmuls(&p), p.steps.len())
    };
    let (three, one) = (steps(&[3]), steps(&[1]));
    assert_eq!(three, (1, 2));
    assert_eq!(one, (1, 1));
    assert_eq!(steps(&[3, 1]), (2, 3));
}

#[test]
fn several_reduced_axes_collapse_into_k() {
    // sum over [k1, k2] of x: [m, k1, k2] and y: [k1, k2, n] in a [m, k1, k2, n] layout.
    let mut b = B::default();
    let x = b.f32(&[3, 2, 4]);
    let y = b.f32(&[2, 4, 5]);
    let full = dims(&[3, 2, 4, 5]);
    let x1 = b.reshape(x, &dims(&[3, 2, 4, 1]));
    let x2 = b.expand(x1, &full);
    let y1 = b.reshape(y, &dims(&[1, 2, 4, 5]));
    let y2 = b.expand(y1, &full);
    let p = b.mul(x2, y2);
    let s = b.sum(p, &[1, 2]);
    let out = b.reshape(s, &dims(&[3, 5]));
    check_matmuls(&b.out(&[out]), 1);
}

#[test]
fn dot_products_and_bias_epilogues_stay_as_before() {
    // A batch of dot products (no M, no N) stays a loop kernel.
    let mut b = B::default();
    let x = b.f32(&[4, 6]);
    let y = b.f32(&[4, 6]);
    let p = b.mul(x, y);
    let s = b.sum(p, &[1]);
    let g = b.out(&[s]);
    let p = compile(&g, &options(true)).unwrap();
    assert_eq!(matmuls(&p), 0);
    agree(&g, &p, 3).unwrap();
    // A generalised contraction still takes a bias add over: x^T w + bias.
    let mut b = B::default();
    let x = b.f32(&[4, 3]);
    let w = b.f32(&[4, 5]);
    let bias = b.f32(&[3, 5]);
    let full = dims(&[4, 3, 5]);
    let x1 = b.reshape(x, &dims(&[4, 3, 1]));
    let x2 = b.expand(x1, &full);
    let w1 = b.reshape(w, &dims(&[4, 1, 5]));
    let w2 = b.expand(w1, &full);
    let p = b.mul(x2, w2);
    let s = b.sum(p, &[0]);
    let r = b.reshape(s, &dims(&[3, 5]));
    let y = b.op(Op::Binary(BinaryOp::Add), &[r, bias]);
    let g = b.out(&[y]);
    let p = check_matmuls(&g, 1);
    let accumulates = p.kernels.iter().any(|k| matches!(k, Kernel::Matmul(m) if m.accumulate));
    assert!(accumulates, "{p}");
}

/// The role of one axis of a generated contraction.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Batch,
    M,
    N,
    K,
}

/// A contraction over the axes `roles` (with `sizes`): `x` has the batch, M and K axes and `y`
/// the batch, N and K axes, each stored in the order `x_order`/`y_order` (a permutation of its
/// axes) and permuted, reshaped and expanded to the product space; the sum over the K axes is
/// reshaped to drop them. With `neg`, `x` is negated first (an element-wise operand).
fn contraction_graph(roles: &[Role], sizes: &[i64], x_order: &[usize], y_order: &[usize], neg: bool) -> Graph {
    let mut b = B::default();
    let full = dims(sizes);
    let operand = |b: &mut B, has: &[Role], order: &[usize], neg: bool| {
        let axes: Vec<usize> = (0..roles.len()).filter(|&d| has.contains(&roles[d])).collect();
        let order: Vec<usize> = order.iter().copied().filter(|&i| i < axes.len()).collect();
        let stored: Vec<i64> = order.iter().map(|&i| sizes[axes[i]]).collect();
        let mut x = b.f32(&stored);
        if neg {
            x = b.op(Op::Unary(UnaryOp::Neg), &[x]);
        }
        // Back to space order: result dim i is stored dim `order.position(i)`.
        let perm: Vec<usize> = (0..axes.len()).map(|i| order.iter().position(|&o| o == i).unwrap()).collect();
        let x = b.permute(x, &perm);
        let with_ones: Vec<Dim> =
            (0..roles.len()).map(|d| Dim::Const(if axes.contains(&d) { sizes[d] } else { 1 })).collect();
        let x = b.reshape(x, &with_ones);
        b.expand(x, &full)
    };
    let x = operand(&mut b, &[Role::Batch, Role::M, Role::K], x_order, neg);
    let y = operand(&mut b, &[Role::Batch, Role::N, Role::K], y_order, false);
    let p = b.mul(x, y);
    let reduced: Vec<usize> = (0..roles.len()).filter(|&d| roles[d] == Role::K).collect();
    let s = b.sum(p, &reduced);
    let kept: Vec<Dim> = (0..roles.len()).filter(|&d| roles[d] != Role::K).map(|d| Dim::Const(sizes[d])).collect();
    let out = b.reshape(s, &kept);
    b.out(&[out])
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Batch), Just(Role::M), Just(Role::N), Just(Role::K)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// One axis per role in a random order, random sizes (1 included) and operand layouts: a
    /// matmul exactly when K and one of M, N are larger than 1, and always the interpreter's values.
    #[test]
    fn one_axis_per_role(
        roles in Just(vec![Role::Batch, Role::M, Role::N, Role::K]).prop_shuffle(),
        sizes in prop::collection::vec(1i64..4, 4),
        x_order in Just(vec![0usize, 1, 2]).prop_shuffle(),
        y_order in Just(vec![0usize, 1, 2]).prop_shuffle(),
        neg in any::<bool>(),
    ) {
        let g = contraction_graph(&roles, &sizes, &x_order, &y_order, neg);
        let size = |r: Role| sizes[roles.iter().position(|&x| x == r).unwrap()];
        let gemm = size(Role::K) > 1 && (size(Role::M) > 1 || size(Role::N) > 1);
        for optimize in [false, true] {
            let p = compile(&g, &options(optimize)).unwrap();
            if !optimize {
                prop_assert_eq!(matmuls(&p), usize::from(gemm), "{}", p);
            }
            if gemm {
                prop_assert!(naive_contraction_extent(&p) <= 1, "{}", p);
            }
            prop_assert!(agree(&g, &p, 5).is_ok(), "{:?}", agree(&g, &p, 5));
        }
    }

    /// Any role per axis over five axes (at least one K): whatever the recognition decides, the
    /// program computes the interpreter's values.
    #[test]
    fn random_roles_agree(
        mut roles in prop::collection::vec(role(), 5),
        sizes in prop::collection::vec(1i64..4, 5),
        x_order in Just(vec![0usize, 1, 2, 3, 4]).prop_shuffle(),
        y_order in Just(vec![0usize, 1, 2, 3, 4]).prop_shuffle(),
        neg in any::<bool>(),
    ) {
        if !roles.contains(&Role::K) {
            roles[0] = Role::K;
        }
        let g = contraction_graph(&roles, &sizes, &x_order, &y_order, neg);
        for optimize in [false, true] {
            let p = compile(&g, &options(optimize)).unwrap();
            prop_assert!(matmuls(&p) <= 1);
            prop_assert!(agree(&g, &p, 9).is_ok(), "{:?}", agree(&g, &p, 9));
        }
    }
}

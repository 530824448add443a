//! Tests of reverse-mode autodiff: every VJP rule and some compositions against central finite
//! differences in f64 through the reference interpreter, a proptest over random op chains, the tie
//! conventions, the errors, and a linear bound on the size of the backward graph.

use air::dim::shape_of;
use air::op::{Cast, Const, Expand, Input, Iota, Pad, Permute, Reduce, Reshape, Shrink};
use air::{BinaryOp, Bindings, DType, Dim, Graph, HostTensor, NodeId, Op, ReduceOp, Scalar, TensorType, UnaryOp};
use kiln_lower::autodiff::{AutodiffError, grad, grad_with_seed};
use proptest::prelude::*;

use crate::common::Rng;

const EPS: f64 = 1e-6;
/// Central differences of deep random chains (exp2 of exp2, pow) carry truncation error near 1e-6;
/// a wrong VJP rule gives errors of order one, so 1e-5 still catches every broken rule.
const TOL: f64 = 1e-5;

/// Builds an f64 graph and remembers the differentiable inputs and their data.
struct Net {
    g: Graph,
    inputs: Vec<NodeId>,
    data: Vec<HostTensor>,
    rng: Rng,
}

impl Net {
    fn new(seed: u64) -> Net {
        Net { g: Graph::new(), inputs: Vec::new(), data: Vec::new(), rng: Rng::new(seed) }
    }

    /// An input with values drawn uniformly from `lo..hi`.
    fn input(&mut self, shape: &[usize], lo: f64, hi: f64) -> NodeId {
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n).map(|_| self.rng.uniform(lo, hi)).collect();
        self.input_with(shape, values)
    }

    fn input_with(&mut self, shape: &[usize], values: Vec<f64>) -> NodeId {
        let slot = self.inputs.len() as u32;
        let ty = TensorType::new(DType::F64, shape_of(shape));
        let id = self.g.add_leaf(Op::Input(Input { slot }), ty).unwrap();
        self.inputs.push(id);
        self.data.push(HostTensor::from_vec(values, shape.to_vec()).unwrap());
        id
    }

    fn c(&mut self, value: f64, like: NodeId) -> NodeId {
        let ty = self.g.ty(like).clone();
        self.g.add_leaf(Op::Const(Const { value: Scalar::Float(value) }), ty).unwrap()
    }
    fn un(&mut self, op: UnaryOp, x: NodeId) -> NodeId {
        self.g.add(Op::Unary(op), &[x]).unwrap()
    }
    fn bin(&mut self, op: BinaryOp, x: NodeId, y: NodeId) -> NodeId {
        self.g.add(Op::Binary(op), &[x, y]).unwrap()
    }
    fn add(&mut self, x: NodeId, y: NodeId) -> NodeId {
        self.bin(BinaryOp::Add, x, y)
    }
    fn mul(&mut self, x: NodeId, y: NodeId) -> NodeId {
        self.bin(BinaryOp::Mul, x, y)
    }
    fn mul_c(&mut self, x: NodeId, v: f64) -> NodeId {
        let c = self.c(v, x);
        self.mul(x, c)
    }
    fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> NodeId {
        self.g.add(Op::Where, &[cond, a, b]).unwrap()
    }
    fn cast(&mut self, x: NodeId, to: DType) -> NodeId {
        self.g.add(Op::Cast(Cast { to }), &[x]).unwrap()
    }
    fn reduce(&mut self, op: ReduceOp, axes: &[usize], x: NodeId) -> NodeId {
        self.g.add(Op::Reduce(Reduce { op, axes: axes.into() }), &[x]).unwrap()
    }
    fn reshape(&mut self, x: NodeId, shape: &[usize]) -> NodeId {
        self.g.add(Op::Reshape(Reshape { shape: shape_of(shape) }), &[x]).unwrap()
    }
    fn permute(&mut self, x: NodeId, perm: &[usize]) -> NodeId {
        self.g.add(Op::Permute(Permute { perm: perm.into() }), &[x]).unwrap()
    }
    fn expand(&mut self, x: NodeId, shape: &[usize]) -> NodeId {
        self.g.add(Op::Expand(Expand { shape: shape_of(shape) }), &[x]).unwrap()
    }
    fn pad(&mut self, x: NodeId, padding: &[(i64, i64)], value: f64) -> NodeId {
        let padding = padding.iter().map(|&(a, b)| (Dim::Const(a), Dim::Const(b))).collect();
        self.g.add(Op::Pad(Pad { padding, value: Scalar::Float(value) }), &[x]).unwrap()
    }
    fn shrink(&mut self, x: NodeId, ranges: &[(i64, i64)]) -> NodeId {
        let ranges = ranges.iter().map(|&(a, b)| (Dim::Const(a), Dim::Const(b))).collect();
        self.g.add(Op::Shrink(Shrink { ranges }), &[x]).unwrap()
    }
    fn sum_all(&mut self, x: NodeId) -> NodeId {
        let axes: Vec<usize> = (0..self.g.ty(x).rank()).collect();
        self.reduce(ReduceOp::Sum, &axes, x)
    }
    /// `exp(x)` from primitives.
    fn exp(&mut self, x: NodeId) -> NodeId {
        let scaled = self.mul_c(x, std::f64::consts::LOG2_E);
        self.un(UnaryOp::Exp2, scaled)
    }
    fn shape(&self, x: NodeId) -> Vec<usize> {
        self.g.ty(x).shape.iter().map(|d| d.as_const().unwrap() as usize).collect()
    }
    /// `a @ b` in the canonical expand-mul-sum pattern.
    fn matmul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        let (sa, sb) = (self.shape(a), self.shape(b));
        let (m, k, n) = (sa[0], sa[1], sb[1]);
        let a3 = self.reshape(a, &[m, 1, k]);
        let a3 = self.expand(a3, &[m, n, k]);
        let bt = self.permute(b, &[1, 0]);
        let b3 = self.reshape(bt, &[1, n, k]);
        let b3 = self.expand(b3, &[m, n, k]);
        let prod = self.mul(a3, b3);
        let s = self.reduce(ReduceOp::Sum, &[2], prod);
        self.reshape(s, &[m, n])
    }
    /// Softmax over the last axis: `exp(x - max) / sum(exp(x - max))`.
    fn softmax(&mut self, x: NodeId) -> NodeId {
        let shape = self.shape(x);
        let last = shape.len() - 1;
        let mx = self.reduce(ReduceOp::Max, &[last], x);
        let mx = self.expand(mx, &shape);
        let centered = self.bin(BinaryOp::Sub, x, mx);
        let e = self.exp(centered);
        let s = self.reduce(ReduceOp::Sum, &[last], e);
        let r = self.un(UnaryOp::Recip, s);
        let r = self.expand(r, &shape);
        self.mul(e, r)
    }
    /// Layer norm over the last axis, with a learned scale and shift.
    fn layernorm(&mut self, x: NodeId, scale: NodeId, shift: NodeId) -> NodeId {
        let shape = self.shape(x);
        let last = shape.len() - 1;
        let inv_n = 1.0 / shape[last] as f64;
        let s = self.reduce(ReduceOp::Sum, &[last], x);
        let mean = self.mul_c(s, inv_n);
        let mean = self.expand(mean, &shape);
        let d = self.bin(BinaryOp::Sub, x, mean);
        let d2 = self.mul(d, d);
        let v = self.reduce(ReduceOp::Sum, &[last], d2);
        let v = self.mul_c(v, inv_n);
        let eps = self.c(1e-5, v);
        let v = self.add(v, eps);
        let sd = self.un(UnaryOp::Sqrt, v);
        let rstd = self.un(UnaryOp::Recip, sd);
        let rstd = self.expand(rstd, &shape);
        let norm = self.mul(d, rstd);
        let scaled = self.mul(norm, scale);
        self.add(scaled, shift)
    }
}

fn eval1(g: &mut Graph, out: NodeId, data: &[HostTensor]) -> Vec<f64> {
    g.set_outputs(vec![out]);
    let v = air::eval(g, data, &Bindings::new()).unwrap();
    v[0].as_slice::<f64>().unwrap().to_vec()
}

/// Checks the gradient of `sum(out * w)` (random `w`) with respect to every input of `net` against
/// central differences, once through `grad` on the scalar loss and once through `grad_with_seed`
/// with `w` as the seed. Returns the largest error, relative to `1 + |finite difference|`.
fn check(net: Net, out: NodeId) -> f64 {
    match try_check(net, out) {
        Ok(worst) => worst,
        Err(message) => panic!("{message}"),
    }
}

/// [`check`], returning an error instead of panicking when too few elements have a usable finite
/// difference (the random chains redraw then: such a chain is no reference for anything).
fn try_check(mut net: Net, out: NodeId) -> Result<f64, String> {
    let out_shape = net.shape(out);
    let n_out: usize = out_shape.iter().product();
    let w_values: Vec<f64> = (0..n_out).map(|_| net.rng.uniform(-1.0, 1.0)).collect();
    let wrt = net.inputs.clone();
    let slot = wrt.len() as u32;
    let w = net.g.add_leaf(Op::Input(Input { slot }), TensorType::new(DType::F64, shape_of(&out_shape))).unwrap();
    let mut data = net.data.clone();
    data.push(HostTensor::from_vec(w_values, out_shape.clone()).unwrap());
    let weighted = net.mul(out, w);
    let loss = net.sum_all(weighted);

    let grads = grad(&mut net.g, loss, &wrt).unwrap();
    let seeded = grad_with_seed(&mut net.g, out, w, &wrt).unwrap();
    air::verify(&net.g).unwrap();
    for (&x, (&gx, &sx)) in wrt.iter().zip(grads.iter().zip(&seeded)) {
        assert_eq!(net.g.ty(gx), net.g.ty(x));
        assert_eq!(net.g.ty(sx), net.g.ty(x));
    }
    net.g.set_outputs(grads.iter().chain(&seeded).copied().collect());
    let analytic = air::eval(&net.g, &data, &Bindings::new()).unwrap();

    let mut worst: f64 = 0.0;
    let (mut compared, mut elements) = (0, 0);
    for (i, _) in wrt.iter().enumerate() {
        let base = data[i].as_slice::<f64>().unwrap().to_vec();
        let got = analytic[i].as_slice::<f64>().unwrap();
        let got_seeded = analytic[wrt.len() + i].as_slice::<f64>().unwrap();
        let (mut fds, mut ads, mut seeded_ads) = (Vec::new(), Vec::new(), Vec::new());
        elements += base.len();
        for j in 0..base.len() {
            let mut at = |delta: f64| {
                let mut v = base.clone();
                v[j] += delta;
                let mut d = data.clone();
                d[i] = HostTensor::from_vec(v, data[i].shape.clone()).unwrap();
                eval1(&mut net.g, loss, &d)[0]
            };
            let fd = (at(EPS) - at(-EPS)) / (2.0 * EPS);
            // Where the loss is too curved for central differences (two step sizes disagree),
            // finite differences are no reference: skip that element rather than the rule.
            let fd_wide = (at(4.0 * EPS) - at(-4.0 * EPS)) / (8.0 * EPS);
            if (fd - fd_wide).abs() / (1.0 + fd.abs()) > TOL / 4.0 {
                continue;
            }
            fds.push(fd);
            ads.push(got[j]);
            seeded_ads.push(got_seeded[j]);
        }
        if fds.is_empty() {
            continue;
        }
        compared += fds.len();
        for (how, a) in [("grad", &ads), ("grad_with_seed", &seeded_ads)] {
            let what = format!("input {i}: autodiff ({how}) vs finite differences\n{}", air::print(&net.g));
            worst = worst.max(air::testing::assert_close(&what, a, &fds, air::testing::Tol::both(TOL)).max_err);
        }
    }
    // Skipping curved elements must leave most of them: a check of nothing proves nothing.
    if compared * 2 < elements || compared == 0 {
        return Err(format!(
            "only {compared} of {elements} elements had a usable finite difference\n{}",
            air::print(&net.g)
        ));
    }
    Ok(worst)
}

fn report(name: &str, err: f64) {
    eprintln!("{name}: max FD error {err:e}");
}

#[test]
fn unary_ops_match_finite_differences() {
    let cases: &[(UnaryOp, f64, f64)] = &[
        (UnaryOp::Neg, -2.0, 2.0),
        (UnaryOp::Exp2, -2.0, 2.0),
        (UnaryOp::Log2, 0.3, 3.0),
        (UnaryOp::Sin, -4.0, 4.0),
        (UnaryOp::Sqrt, 0.3, 3.0),
        (UnaryOp::Recip, 0.4, 3.0),
        (UnaryOp::Recip, -3.0, -0.4),
        (UnaryOp::Erf, -2.5, 2.5),
        // Away from integers, where trunc is flat.
        (UnaryOp::Trunc, 0.1, 0.9),
    ];
    for (k, &(op, lo, hi)) in cases.iter().enumerate() {
        let mut net = Net::new(k as u64);
        let x = net.input(&[2, 3], lo, hi);
        let y = net.un(op, x);
        report(op.name(), check(net, y));
    }
}

#[test]
fn binary_ops_match_finite_differences() {
    /// An op with the ranges its two operands are drawn from.
    type Case = (BinaryOp, (f64, f64), (f64, f64));
    let cases: &[Case] = &[
        (BinaryOp::Add, (-2.0, 2.0), (-2.0, 2.0)),
        (BinaryOp::Sub, (-2.0, 2.0), (-2.0, 2.0)),
        (BinaryOp::Mul, (-2.0, 2.0), (-2.0, 2.0)),
        (BinaryOp::Div, (-2.0, 2.0), (0.5, 2.0)),
        (BinaryOp::Div, (-2.0, 2.0), (-2.0, -0.5)),
        (BinaryOp::Max, (-2.0, 2.0), (-2.0, 2.0)),
        (BinaryOp::Min, (-2.0, 2.0), (-2.0, 2.0)),
        (BinaryOp::Pow, (0.3, 2.5), (-2.0, 2.0)),
        (BinaryOp::Mod, (-3.0, 3.0), (0.7, 1.3)),
        (BinaryOp::Mod, (-3.0, 3.0), (-1.3, -0.7)),
    ];
    for (k, &(op, (alo, ahi), (blo, bhi))) in cases.iter().enumerate() {
        let mut net = Net::new(100 + k as u64);
        let a = net.input(&[3, 2], alo, ahi);
        let b = net.input(&[3, 2], blo, bhi);
        let y = net.bin(op, a, b);
        report(op.name(), check(net, y));
    }
}

#[test]
fn one_operand_used_twice() {
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Pow, BinaryOp::Max] {
        let mut net = Net::new(7);
        let a = net.input(&[4], 0.5, 2.0);
        let y = net.bin(op, a, a);
        report(op.name(), check(net, y));
    }
}

#[test]
fn comparisons_logic_and_where() {
    let mut net = Net::new(200);
    let a = net.input(&[2, 3], -2.0, 2.0);
    let b = net.input(&[2, 3], -2.0, 2.0);
    let lt = net.bin(BinaryOp::CmpLt, a, b);
    let ne = net.bin(BinaryOp::CmpNe, a, b);
    let eq = net.bin(BinaryOp::CmpEq, a, b);
    let not_eq = net.un(UnaryOp::Not, eq);
    let both = net.bin(BinaryOp::And, lt, ne);
    let either = net.bin(BinaryOp::Or, both, not_eq);
    let sa = net.un(UnaryOp::Sin, a);
    let bb = net.mul(b, b);
    let picked = net.select(lt, sa, bb);
    // A comparison turned into a float carries no gradient.
    let as_float = net.cast(either, DType::F64);
    let y = net.mul(picked, as_float);
    let y = net.add(y, as_float);
    report("where/cmp", check(net, y));
}

#[test]
fn casts() {
    // f64 -> f64 is the identity; through an int the gradient is zero.
    let mut net = Net::new(300);
    let x = net.input(&[5], -3.0, 3.0);
    let same = net.cast(x, DType::F64);
    let as_int = net.cast(x, DType::I32);
    let back = net.cast(as_int, DType::F64);
    let y = net.mul(same, back);
    report("cast", check(net, y));

    // f64 -> f32 -> f64: the gradient comes back cast to f64.
    let mut net = Net::new(301);
    let x = net.input(&[5], -3.0, 3.0);
    let narrow = net.cast(x, DType::F32);
    let wide = net.cast(narrow, DType::F64);
    let [gx] = grad_with_seed(&mut net.g, wide, x, &[x]).unwrap()[..] else { unreachable!() };
    assert_eq!(net.g.ty(gx), net.g.ty(x));
    let got = eval1(&mut net.g, gx, &net.data);
    for (g, x) in got.iter().zip(net.data[0].as_slice::<f64>().unwrap()) {
        assert_eq!(*g, *x as f32 as f64);
    }
}

#[test]
fn reductions() {
    let mut net = Net::new(400);
    let x = net.input(&[2, 3, 4], -2.0, 2.0);
    let s = net.reduce(ReduceOp::Sum, &[0, 2], x);
    let m = net.reduce(ReduceOp::Max, &[1], x);
    let s2 = net.mul(s, s);
    let m2 = net.un(UnaryOp::Sin, m);
    let a = net.sum_all(s2);
    let b = net.reduce(ReduceOp::Max, &[0, 1, 2], m2);
    let y = net.add(a, b);
    report("reduce", check(net, y));

    // Max over copies made by expand: the copies move together, so the even split sums back to
    // the whole gradient and agrees with finite differences.
    let mut net = Net::new(401);
    let x = net.input(&[1, 3], -2.0, 2.0);
    let e = net.expand(x, &[4, 3]);
    let y = net.reduce(ReduceOp::Max, &[0], e);
    report("reduce max over copies", check(net, y));
}

#[test]
fn reduce_max_splits_ties_evenly() {
    let mut net = Net::new(0);
    let x = net.input_with(&[2, 3], vec![1.0, 3.0, 3.0, 5.0, 5.0, 5.0]);
    let y = net.reduce(ReduceOp::Max, &[1], x);
    let [gx] = grad(&mut net.g, y, &[x]).unwrap()[..] else { unreachable!() };
    let got = eval1(&mut net.g, gx, &net.data);
    let third = 1.0 / 3.0;
    assert_eq!(got, vec![0.0, 0.5, 0.5, third, third, third]);
}

#[test]
fn binary_max_min_split_ties_in_half() {
    for op in [BinaryOp::Max, BinaryOp::Min] {
        let mut net = Net::new(0);
        let a = net.input_with(&[3], vec![1.0, 2.0, 3.0]);
        let b = net.input_with(&[3], vec![2.0, 2.0, 2.0]);
        let y = net.bin(op, a, b);
        let grads = grad(&mut net.g, y, &[a, b]).unwrap();
        let ga = eval1(&mut net.g, grads[0], &net.data);
        let gb = eval1(&mut net.g, grads[1], &net.data);
        if op == BinaryOp::Max {
            assert_eq!((ga, gb), (vec![0.0, 0.5, 1.0], vec![1.0, 0.5, 0.0]));
        } else {
            assert_eq!((ga, gb), (vec![1.0, 0.5, 0.0], vec![0.0, 0.5, 1.0]));
        }
    }
}

#[test]
fn pow_at_zero_follows_pytorch() {
    let mut net = Net::new(0);
    let a = net.input_with(&[3], vec![0.0, 0.0, 2.0]);
    let b = net.input_with(&[3], vec![0.0, 2.0, 3.0]);
    let y = net.bin(BinaryOp::Pow, a, b);
    let grads = grad(&mut net.g, y, &[a, b]).unwrap();
    let ga = eval1(&mut net.g, grads[0], &net.data);
    let gb = eval1(&mut net.g, grads[1], &net.data);
    assert_eq!(ga, vec![0.0, 0.0, 12.0]);
    assert_eq!(gb[..2], [0.0, 0.0]);
    assert!((gb[2] - 8.0 * std::f64::consts::LN_2).abs() < 1e-12);
}

#[test]
fn movement_ops() {
    let mut net = Net::new(500);
    let x = net.input(&[2, 3], -2.0, 2.0);
    let r = net.reshape(x, &[3, 1, 2]);
    let p = net.permute(r, &[2, 0, 1]);
    let e = net.expand(p, &[2, 3, 4]);
    let pd = net.pad(e, &[(1, 0), (0, 2), (1, 1)], 0.5);
    let s = net.shrink(pd, &[(0, 2), (1, 5), (0, 5)]);
    let y = net.un(UnaryOp::Sin, s);
    report("movement", check(net, y));

    let mut net = Net::new(501);
    let x = net.input(&[1, 4, 1], -2.0, 2.0);
    let e = net.expand(x, &[3, 4, 2]);
    let sh = net.shrink(e, &[(1, 3), (0, 3), (0, 2)]);
    let p = net.permute(sh, &[1, 2, 0]);
    let f = net.reshape(p, &[12]);
    let pd = net.pad(f, &[(2, 3)], 0.0);
    let y = net.mul(pd, pd);
    report("movement 2", check(net, y));
}

#[test]
fn compositions() {
    let mut net = Net::new(600);
    let x = net.input(&[3, 5], -2.0, 2.0);
    let y = net.softmax(x);
    report("softmax", check(net, y));

    let mut net = Net::new(601);
    let a = net.input(&[3, 4], -1.0, 1.0);
    let b = net.input(&[4, 2], -1.0, 1.0);
    let y = net.matmul(a, b);
    report("matmul", check(net, y));

    let mut net = Net::new(602);
    let x = net.input(&[2, 6], -2.0, 2.0);
    let scale = net.input(&[2, 6], 0.5, 1.5);
    let shift = net.input(&[2, 6], -0.5, 0.5);
    let y = net.layernorm(x, scale, shift);
    report("layernorm", check(net, y));

    // A two-layer MLP with exact GELU and a softmax head.
    let mut net = Net::new(603);
    let x = net.input(&[2, 3], -1.0, 1.0);
    let w1 = net.input(&[3, 4], -1.0, 1.0);
    let w2 = net.input(&[4, 3], -1.0, 1.0);
    let h = net.matmul(x, w1);
    let h_scaled = net.mul_c(h, std::f64::consts::FRAC_1_SQRT_2);
    let erf = net.un(UnaryOp::Erf, h_scaled);
    let one = net.c(1.0, erf);
    let erf1 = net.add(erf, one);
    let gelu = net.mul(h, erf1);
    let gelu = net.mul_c(gelu, 0.5);
    let logits = net.matmul(gelu, w2);
    let y = net.softmax(logits);
    report("mlp", check(net, y));

    // Sigmoid and log-sum-exp.
    let mut net = Net::new(604);
    let x = net.input(&[4, 3], -2.0, 2.0);
    let nx = net.un(UnaryOp::Neg, x);
    let e = net.exp(nx);
    let one = net.c(1.0, e);
    let d = net.add(one, e);
    let sig = net.un(UnaryOp::Recip, d);
    let ex = net.exp(x);
    let s = net.reduce(ReduceOp::Sum, &[1], ex);
    let lse = net.un(UnaryOp::Log2, s);
    let lse = net.expand(lse, &[4, 3]);
    let y = net.add(sig, lse);
    report("sigmoid+lse", check(net, y));
}

#[test]
fn iota_and_consts_are_leaves() {
    let mut net = Net::new(700);
    let x = net.input(&[2, 3], -1.0, 1.0);
    let iota = net.g.add_leaf(Op::Iota(Iota { axis: 1 }), TensorType::new(DType::F64, shape_of(&[2, 3]))).unwrap();
    let y = net.mul(x, iota);
    let two = net.c(2.0, y);
    let y = net.bin(BinaryOp::Pow, y, two);
    report("iota", check(net, y));
}

#[test]
fn gradient_with_respect_to_an_intermediate_node() {
    let mut net = Net::new(800);
    let x = net.input_with(&[3], vec![0.5, 1.0, 2.0]);
    let h = net.mul(x, x);
    let y = net.un(UnaryOp::Sin, h);
    let grads = grad(&mut net.g, y, &[h, x, y]).unwrap();
    let gh = eval1(&mut net.g, grads[0], &net.data);
    let gx = eval1(&mut net.g, grads[1], &net.data);
    let gy = eval1(&mut net.g, grads[2], &net.data);
    for (k, &x) in [0.5f64, 1.0, 2.0].iter().enumerate() {
        assert!((gh[k] - (x * x).cos()).abs() < 1e-12);
        assert!((gx[k] - 2.0 * x * (x * x).cos()).abs() < 1e-12);
        assert_eq!(gy[k], 1.0);
    }
    // With respect to `h` only, nothing is built for `x * x`: the seed plus sin's rule (a const,
    // an add, a sin, a mul).
    let before = net.g.len();
    grad(&mut net.g, y, &[h]).unwrap();
    assert_eq!(net.g.len() - before, 5);
}

#[test]
fn unconnected_and_int_paths_give_zeros() {
    let mut net = Net::new(900);
    let x = net.input(&[2, 2], -1.0, 1.0);
    let z = net.input(&[3], -1.0, 1.0);
    let r = net.cast(x, DType::I64);
    let r = net.cast(r, DType::F64);
    let y = net.un(UnaryOp::Sin, r);
    let before = net.g.len();
    let grads = grad(&mut net.g, y, &[z, x]).unwrap();
    // Only the seed and two zeros consts.
    assert_eq!(net.g.len() - before, 3);
    assert_eq!(net.g.ty(grads[0]), net.g.ty(z));
    assert_eq!(net.g.ty(grads[1]), net.g.ty(x));
    assert_eq!(eval1(&mut net.g, grads[0], &net.data), vec![0.0; 3]);
    assert_eq!(eval1(&mut net.g, grads[1], &net.data), vec![0.0; 4]);
}

#[test]
fn f32_and_symbolic_shapes() {
    // f32, with a symbolic batch: the gradient keeps the wrt node's type exactly.
    let mut g = Graph::new();
    let n = Dim::sym("n");
    let ty = TensorType::new(DType::F32, [n, Dim::Const(3)].into_iter().collect::<air::Shape>());
    let x = g.add_leaf(Op::Input(Input { slot: 0 }), ty.clone()).unwrap();
    let e = g.add(Op::Unary(UnaryOp::Exp2), &[x]).unwrap();
    let padded = g
        .add(
            Op::Pad(Pad {
                padding: vec![(Dim::Const(1), Dim::Const(0)), (Dim::Const(0), Dim::Const(2))],
                value: Scalar::Float(0.0),
            }),
            &[e],
        )
        .unwrap();
    let s = g.add(Op::Reduce(Reduce { op: ReduceOp::Sum, axes: [0, 1].into_iter().collect() }), &[padded]).unwrap();
    let [gx] = grad(&mut g, s, &[x]).unwrap()[..] else { unreachable!() };
    assert_eq!(g.ty(gx), &ty);
    air::verify(&g).unwrap();
    g.set_outputs(vec![gx]);
    let mut bindings = Bindings::new();
    bindings.insert(air::Symbol::new("n"), 2);
    let data = HostTensor::from_vec(vec![0.0f32, 1.0, 2.0, -1.0, 0.5, 3.0], vec![2, 3]).unwrap();
    let got = air::eval(&g, std::slice::from_ref(&data), &bindings).unwrap();
    for (g, x) in got[0].as_slice::<f32>().unwrap().iter().zip(data.as_slice::<f32>().unwrap()) {
        let want = x.exp2() * std::f32::consts::LN_2;
        assert!((g - want).abs() <= 1e-5 * want.abs(), "{g} vs {want}");
    }
}

#[test]
fn errors_are_reported() {
    let mut g = Graph::new();
    let f = TensorType::new(DType::F32, shape_of(&[2]));
    let x = g.add_leaf(Op::Input(Input { slot: 0 }), f.clone()).unwrap();
    let i = g.add_leaf(Op::Input(Input { slot: 1 }), TensorType::new(DType::I32, shape_of(&[2]))).unwrap();
    let y = g.add(Op::Unary(UnaryOp::Sin), &[x]).unwrap();
    let lt = g.add(Op::Binary(BinaryOp::CmpLt), &[x, y]).unwrap();
    let dead = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    g.remove(dead).unwrap();

    assert_eq!(grad(&mut g, y, &[i]), Err(AutodiffError::WrtNotFloat { node: i, dtype: DType::I32 }));
    assert_eq!(grad(&mut g, lt, &[x]), Err(AutodiffError::OutputNotFloat { node: lt, dtype: DType::Bool }));
    assert_eq!(grad(&mut g, y, &[dead]), Err(AutodiffError::NotInGraph { role: "wrt", node: dead }));
    assert_eq!(grad(&mut g, dead, &[x]), Err(AutodiffError::NotInGraph { role: "output", node: dead }));
    let wrong = g.add_leaf(Op::Const(Const { value: Scalar::Float(1.0) }), TensorType::new(DType::F64, shape_of(&[2])));
    let wrong = wrong.unwrap();
    assert!(matches!(grad_with_seed(&mut g, y, wrong, &[x]), Err(AutodiffError::SeedType { .. })));
    assert!(grad(&mut g, y, &[x]).is_ok());

    // A graph built unchecked with a wrong type gets an error, not a panic.
    let bad = g.add_unchecked(air::Node {
        op: Op::Reshape(Reshape { shape: shape_of(&[3]) }),
        inputs: [x].into_iter().collect(),
        ty: TensorType::new(DType::F32, shape_of(&[3])),
    });
    assert!(grad(&mut g, bad, &[x]).is_err());
    let bad_perm = g.add_unchecked(air::Node {
        op: Op::Permute(Permute { perm: [5].into_iter().collect() }),
        inputs: [x].into_iter().collect(),
        ty: f.clone(),
    });
    assert!(matches!(grad(&mut g, bad_perm, &[x]), Err(AutodiffError::InvalidGraph { .. })));
    let bad_arity =
        g.add_unchecked(air::Node { op: Op::Binary(BinaryOp::Add), inputs: [x].into_iter().collect(), ty: f.clone() });
    assert!(matches!(grad(&mut g, bad_arity, &[x]), Err(AutodiffError::InvalidGraph { .. })));
    // A cycle (only `set_inputs_unchecked` can make one).
    let a = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    let b = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
    g.set_inputs_unchecked(a, &[b]);
    assert!(matches!(grad(&mut g, b, &[x]), Err(AutodiffError::InvalidGraph { .. })));
}

/// Builds a chain of `n` ops on a `[4, 8]` input and returns the node count the gradient adds.
fn backward_size(n: usize) -> (usize, usize) {
    let mut net = Net::new(n as u64);
    let x = net.input(&[4, 8], 0.5, 1.0);
    let mut cur = x;
    for k in 0..n {
        cur = match k % 10 {
            0 => net.un(UnaryOp::Sin, cur),
            1 => net.mul(cur, x),
            2 => net.un(UnaryOp::Erf, cur),
            3 => net.bin(BinaryOp::Max, cur, x),
            4 => net.un(UnaryOp::Exp2, cur),
            5 => net.permute(cur, &[1, 0]),
            6 => net.permute(cur, &[1, 0]),
            7 => {
                let m = net.reduce(ReduceOp::Max, &[1], cur);
                net.expand(m, &[4, 8])
            }
            8 => net.bin(BinaryOp::Div, cur, x),
            _ => net.bin(BinaryOp::Pow, x, cur),
        };
    }
    let loss = net.sum_all(cur);
    let before = net.g.len();
    grad(&mut net.g, loss, &[x]).unwrap();
    air::verify(&net.g).unwrap();
    (before, net.g.len() - before)
}

#[test]
fn backward_graph_is_linear_in_the_chain() {
    for n in [10, 100, 1000] {
        let (forward, added) = backward_size(n);
        eprintln!("chain of {n} ops: {forward} forward nodes, {added} gradient nodes");
        assert!(added <= 16 * n + 16, "{n} ops added {added} nodes");
    }
}

/// A random chain of smooth ops on random small shapes, built from `rng`. Returns the network and
/// its output. Domain-restricted operands (of `log2`, `sqrt`, `recip`, divisors, `pow` bases) are
/// squashed into `[0.5, 2]` by `exp2(sin(x))`.
fn random_chain(rng: &mut Rng, len: usize) -> (Net, NodeId) {
    let mut net = Net::new(rng.next_u64());
    let rank = 1 + rng.below(3);
    let shape: Vec<usize> = (0..rank).map(|_| 1 + rng.below(3)).collect();
    let x0 = net.input(&shape, -1.5, 1.5);
    let mut cur = x0;
    let mut seen = vec![x0];
    let positive = |net: &mut Net, x: NodeId| {
        let s = net.un(UnaryOp::Sin, x);
        net.un(UnaryOp::Exp2, s)
    };
    for _ in 0..len {
        let shape = net.shape(cur);
        let numel: usize = shape.iter().product();
        // A second operand of the same shape: a fresh input or an earlier node of that shape.
        let other = |net: &mut Net, rng: &mut Rng, seen: &[NodeId]| {
            let same: Vec<NodeId> = seen.iter().copied().filter(|&s| net.shape(s) == shape).collect();
            if !same.is_empty() && rng.below(2) == 0 {
                same[rng.below(same.len())]
            } else {
                net.input(&shape, -1.5, 1.5)
            }
        };
        cur = match rng.below(22) {
            0 => net.un(UnaryOp::Neg, cur),
            1 => net.un(UnaryOp::Exp2, cur),
            2 => {
                let p = positive(&mut net, cur);
                net.un(UnaryOp::Log2, p)
            }
            3 => net.un(UnaryOp::Sin, cur),
            4 => {
                let p = positive(&mut net, cur);
                net.un(UnaryOp::Sqrt, p)
            }
            5 => {
                let p = positive(&mut net, cur);
                net.un(UnaryOp::Recip, p)
            }
            6 => net.un(UnaryOp::Erf, cur),
            7 => {
                let o = other(&mut net, rng, &seen);
                net.add(cur, o)
            }
            8 => {
                let o = other(&mut net, rng, &seen);
                net.bin(BinaryOp::Sub, o, cur)
            }
            9 => {
                let o = other(&mut net, rng, &seen);
                net.mul(cur, o)
            }
            10 => {
                let o = other(&mut net, rng, &seen);
                let p = positive(&mut net, o);
                net.bin(BinaryOp::Div, cur, p)
            }
            11 => {
                // A fresh input keeps the operands apart (no ties).
                let o = net.input(&shape, -1.5, 1.5);
                let op = if rng.below(2) == 0 { BinaryOp::Max } else { BinaryOp::Min };
                net.bin(op, cur, o)
            }
            12 => {
                let o = other(&mut net, rng, &seen);
                let base = positive(&mut net, cur);
                net.bin(BinaryOp::Pow, base, o)
            }
            13 => {
                let o = other(&mut net, rng, &seen);
                let r = net.input(&shape, -1.0, 1.0);
                let zero = net.c(0.0, r);
                let cond = net.bin(BinaryOp::CmpLt, r, zero);
                net.select(cond, cur, o)
            }
            14 => {
                let axes: Vec<usize> = (0..shape.len()).filter(|_| rng.below(2) == 0).collect();
                let op = if rng.below(2) == 0 { ReduceOp::Sum } else { ReduceOp::Max };
                net.reduce(op, &axes, cur)
            }
            15 => {
                let mut s = shape.clone();
                if s.len() < 4 && rng.below(2) == 0 {
                    s.insert(rng.below(s.len() + 1), 1);
                } else if let Some(k) = s.iter().position(|&d| d == 1).filter(|_| s.len() > 1) {
                    s.remove(k);
                } else {
                    s = vec![numel];
                }
                net.reshape(cur, &s)
            }
            16 => {
                let mut perm: Vec<usize> = (0..shape.len()).collect();
                for k in (1..perm.len()).rev() {
                    perm.swap(k, rng.below(k + 1));
                }
                net.permute(cur, &perm)
            }
            17 => {
                let s: Vec<usize> = shape.iter().map(|&d| if d == 1 { 1 + rng.below(3) } else { d }).collect();
                if s.iter().product::<usize>() > 64 { cur } else { net.expand(cur, &s) }
            }
            18 => {
                let padding: Vec<(i64, i64)> =
                    shape.iter().map(|_| (rng.below(2) as i64, rng.below(2) as i64)).collect();
                let grown: usize = shape.iter().zip(&padding).map(|(d, (a, b))| d + (a + b) as usize).product();
                let value = rng.uniform(-1.0, 1.0);
                if grown > 64 { cur } else { net.pad(cur, &padding, value) }
            }
            19 => {
                let ranges: Vec<(i64, i64)> = shape
                    .iter()
                    .map(|&d| {
                        let start = rng.below(d);
                        let end = start + 1 + rng.below(d - start);
                        (start as i64, end as i64)
                    })
                    .collect();
                net.shrink(cur, &ranges)
            }
            20 => net.cast(cur, DType::F64),
            _ => {
                // Feed an earlier node back in (a DAG, not only a chain).
                let o = seen[rng.below(seen.len())];
                if net.shape(o) == shape {
                    let so = net.un(UnaryOp::Sin, o);
                    net.mul(cur, so)
                } else {
                    cur
                }
            }
        };
        seen.push(cur);
    }
    (net, cur)
}

/// Whether every value the loss depends on is modest, so that finite differences are accurate.
fn well_scaled(net: &mut Net, out: NodeId) -> bool {
    let order = net.g.topo_order().to_vec();
    net.g.set_outputs(order.iter().copied().filter(|&n| net.g.ty(n).dtype == DType::F64).collect());
    let Ok(values) = air::eval(&net.g, &net.data, &Bindings::new()) else { return false };
    let ok = values.iter().all(|v| v.as_slice::<f64>().unwrap().iter().all(|x| x.is_finite() && x.abs() < 1e3));
    net.g.set_outputs(vec![out]);
    ok
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_chains_match_finite_differences(seed in any::<u64>(), len in 1usize..=15) {
        let mut rng = Rng::new(seed);
        // Redraw (a bounded number of times) until every value is modest and most elements have
        // a usable finite difference (a chain too curved for central differences is no reference).
        for _ in 0..50 {
            let (mut net, out) = random_chain(&mut rng, len);
            if well_scaled(&mut net, out) {
                net.g.set_outputs(Vec::new());
                if let Ok(err) = try_check(net, out) {
                    prop_assert!(err <= TOL);
                    return Ok(());
                }
            }
        }
        prop_assert!(false, "no well-scaled chain with usable finite differences in 50 draws");
    }
}

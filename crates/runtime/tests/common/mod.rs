//! Shared helpers of the end-to-end tests: building graphs by hand and comparing the CPU device
//! with the reference interpreter.

#![allow(dead_code)]

use air::dim::shape_of;
use air::op::{Const, Expand, Input, Permute, Reduce, Reshape};
use air::{Bindings, DType, Dim, Graph, HostData, HostTensor, NodeId, Op, ReduceOp, Scalar, TensorType};
use kiln_runtime::CpuDevice;

pub fn input(g: &mut Graph, slot: u32, dtype: DType, shape: &[Dim]) -> NodeId {
    g.add_leaf(Op::Input(Input { slot }), TensorType::new(dtype, shape.to_vec())).unwrap()
}

pub fn input_f32(g: &mut Graph, slot: u32, shape: &[usize]) -> NodeId {
    g.add_leaf(Op::Input(Input { slot }), TensorType::new(DType::F32, shape_of(shape))).unwrap()
}

pub fn constant(g: &mut Graph, value: f64, like: NodeId) -> NodeId {
    let ty = g.ty(like).clone();
    g.add_leaf(Op::Const(Const { value: Scalar::Float(value) }), ty).unwrap()
}

pub fn reduce(g: &mut Graph, op: ReduceOp, x: NodeId, axes: &[usize]) -> NodeId {
    g.add(Op::Reduce(Reduce { op, axes: axes.iter().copied().collect() }), &[x]).unwrap()
}

pub fn reshape(g: &mut Graph, x: NodeId, shape: &[usize]) -> NodeId {
    g.add(Op::Reshape(Reshape { shape: shape_of(shape) }), &[x]).unwrap()
}

pub fn reshape_dims(g: &mut Graph, x: NodeId, shape: &[Dim]) -> NodeId {
    g.add(Op::Reshape(Reshape { shape: shape.iter().cloned().collect() }), &[x]).unwrap()
}

pub fn expand(g: &mut Graph, x: NodeId, shape: &[usize]) -> NodeId {
    g.add(Op::Expand(Expand { shape: shape_of(shape) }), &[x]).unwrap()
}

pub fn expand_dims(g: &mut Graph, x: NodeId, shape: &[Dim]) -> NodeId {
    g.add(Op::Expand(Expand { shape: shape.iter().cloned().collect() }), &[x]).unwrap()
}

pub fn permute(g: &mut Graph, x: NodeId, perm: &[usize]) -> NodeId {
    g.add(Op::Permute(Permute { perm: perm.iter().copied().collect() }), &[x]).unwrap()
}

/// `a[.., m, k] @ b[.., k, n]` as expand-mul-sum over a last axis `k` (`b` seen transposed), the
/// pattern the lowering turns into a matmul.
pub fn matmul(g: &mut Graph, a: NodeId, b: NodeId, batch: &[usize], m: usize, k: usize, n: usize) -> NodeId {
    let with = |tail: &[usize]| -> Vec<usize> { batch.iter().chain(tail).copied().collect() };
    let r = batch.len();
    let a4 = reshape(g, a, &with(&[m, 1, k]));
    let a4 = expand(g, a4, &with(&[m, n, k]));
    let mut perm: Vec<usize> = (0..r).collect();
    perm.extend([r + 1, r]);
    let bt = permute(g, b, &perm);
    let b4 = reshape(g, bt, &with(&[1, n, k]));
    let b4 = expand(g, b4, &with(&[m, n, k]));
    let prod = g.add(Op::Binary(air::BinaryOp::Mul), &[a4, b4]).unwrap();
    let s = reduce(g, ReduceOp::Sum, prod, &[r + 2]);
    reshape(g, s, &with(&[m, n]))
}

/// Deterministic values in about [-2, 2].
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0) as f32
        })
        .collect()
}

pub fn tensor(shape: &[usize], seed: u64) -> HostTensor {
    HostTensor::from_vec(data(shape.iter().product(), seed), shape.to_vec()).unwrap()
}

/// Whether `got` matches `want`: exact for ints and bools, within `rtol * (1 + |want|)` for
/// floats, NaN only where `want` is NaN, at least one element (see `air::testing`).
pub fn close(got: &HostTensor, want: &HostTensor, rtol: f64) -> Result<(), String> {
    air::testing::check_host(got, want, air::testing::Tol::both(rtol)).map(drop)
}

/// Runs `g` on the device and the interpreter and compares every output.
pub fn check_with(dev: &CpuDevice, g: &Graph, inputs: &[HostTensor], bindings: &Bindings, rtol: f64) {
    let want = air::eval(g, inputs, bindings).expect("interpreter");
    let got = dev.run(g, inputs, bindings).unwrap_or_else(|e| panic!("cpu device: {e}"));
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        if let Err(e) = close(a, b, rtol) {
            panic!("output {i}: {e}");
        }
    }
}

pub fn check(g: &Graph, inputs: &[HostTensor]) {
    check_with(&CpuDevice::new().unwrap(), g, inputs, &Bindings::new(), 1e-5);
}

pub fn f64_tensor(shape: &[usize], seed: u64) -> HostTensor {
    let v: Vec<f64> = data(shape.iter().product(), seed).into_iter().map(f64::from).collect();
    HostTensor::new(HostData::F64(v), shape.to_vec()).unwrap()
}

/// `exp2(shrink [(0, m)] x)` for `x: f32[n]`: valid only while `m <= n`.
pub fn window() -> Graph {
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, &[Dim::sym("n")]);
    let ranges = vec![(Dim::Const(0), Dim::sym("m"))];
    let w = g.add(Op::Shrink(air::op::Shrink { ranges }), &[x]).unwrap();
    let y = g.add(Op::Unary(air::UnaryOp::Exp2), &[w]).unwrap();
    g.add_output(y);
    g
}

/// Bindings of `n` and `m` (the symbols of [`window`]).
pub fn bind(n: i64, m: i64) -> Bindings {
    [(air::Symbol::new("n"), n), (air::Symbol::new("m"), m)].into_iter().collect()
}

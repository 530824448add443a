//! Property tests: random graphs run on the CPU device (and, with fewer cases, on wgpu) agree with
//! the reference interpreter. The graphs mix element-wise ops of every dtype the backend has (f32,
//! i32, i64, bool), casts, `where`, reductions, transposes, pad/shrink, and matmuls built as the
//! facade builds them (expand-mul-sum, plain and batched, f32 and integer), over shapes that may be
//! symbolic (one compiled program run under several bindings) and large enough to split a kernel
//! over threads.
//!
//! Exactness is tracked per node: a float value is *exact* when every op on its way is computed
//! bit-for-bit like the interpreter (IEEE add/sub/mul, max/min, movement, casts from ints, and on
//! the CPU the correctly rounded div/sqrt). Ops that are discontinuous (comparisons, trunc, mod,
//! casts from floats) or blow up errors (div, log2, exp2, sin) only ever read exact values, so an
//! approximation elsewhere (polynomial exp2, a GEMM's summation order) can never flip a branch.
//! Exact outputs must match exactly; the others within a norm-wise tolerance. Either way a NaN
//! where the reference has a number fails, and a failure reports the worst element.
//!
//! `PROPTEST_CASES` scales every test here (the default keeps the file well under a minute in a
//! debug build on two cores); `scripts/proptest-long.sh` runs them with many cases.

use crate::common;

use std::sync::OnceLock;

use air::op::{Cast, Const, Input, Pad, Shrink};
use air::{
    BinaryOp, Bindings, DType, Dim, Graph, HostTensor, NodeId, Op, ReduceOp, Scalar, Symbol, TensorType, UnaryOp,
};
use common::{expand_dims, permute, reduce, reshape_dims};
use kiln_runtime::CpuDevice;
use kiln_runtime::vm::PARALLEL_MIN_WORK;
use kiln_runtime::wgpu::WgpuDevice;
use proptest::prelude::Rng as _;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// What a backend computes, and how exactly.
#[derive(Clone, Copy, Debug)]
struct Backend {
    /// The dtypes it runs (the first is f32).
    dtypes: &'static [DType],
    /// Whether `div`, `recip` and `sqrt` are correctly rounded (IEEE), so exact in, exact out.
    exact_div_sqrt: bool,
    /// Whether NaN, infinities and -0 may appear in inputs and pad values.
    specials: bool,
    /// Norm-wise tolerance of inexact float outputs.
    rtol: f64,
}

const CPU: Backend = Backend {
    dtypes: &[DType::F32, DType::I32, DType::I64, DType::Bool],
    exact_div_sqrt: true,
    specials: true,
    rtol: 2e-3,
};

/// Like the CPU's, without f64 (this generator's float is f32; wgpu_ops.rs's random graphs run
/// f64 on wgpu); i64 is emulated, exact. WGSL allows 2.5 ULP for division and inherits
/// `sqrt` from `inverseSqrt`, and leaves NaN and infinities to the implementation.
const WGPU: Backend = Backend {
    dtypes: &[DType::F32, DType::I32, DType::I64, DType::Bool],
    exact_div_sqrt: false,
    specials: false,
    rtol: 2e-3,
};

/// One step of a random graph; the numbers choose operands and variants (modulo what exists).
#[derive(Clone, Debug)]
enum Step {
    Unary {
        a: usize,
        op: usize,
    },
    Binary {
        a: usize,
        b: usize,
        op: usize,
    },
    Cast {
        a: usize,
        to: usize,
    },
    Where {
        c: usize,
        a: usize,
        b: usize,
    },
    /// Reduce one axis and expand back.
    Reduce {
        a: usize,
        op: usize,
        axis: usize,
    },
    /// Transpose and reshape back to `[R, C]`.
    Transpose {
        a: usize,
    },
    /// Pad one axis by `lo`/`hi` elements of a value, then shrink a window of the old size.
    PadShrink {
        a: usize,
        axis: usize,
        lo: usize,
        hi: usize,
        shift: usize,
        value: usize,
    },
    /// Shrink `lo`/`hi` elements off one axis, then pad them back with a value.
    ShrinkPad {
        a: usize,
        axis: usize,
        lo: usize,
        hi: usize,
        value: usize,
    },
    /// `a @ (b^T @ c)`: two matmuls, one contracting over `R`.
    Matmul {
        a: usize,
        b: usize,
        c: usize,
    },
    /// `a[r] @ outer(b[r], c[r])` for every row `r` (batched, both operands per batch), or with
    /// `broadcast`, `a[r] @ (b^T @ c)` with the right operand shared by every batch.
    Batched {
        a: usize,
        b: usize,
        c: usize,
        broadcast: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let n = || 0usize..1024;
    prop_oneof![
        3 => (n(), n()).prop_map(|(a, op)| Step::Unary { a, op }),
        4 => (n(), n(), n()).prop_map(|(a, b, op)| Step::Binary { a, b, op }),
        2 => (n(), n()).prop_map(|(a, to)| Step::Cast { a, to }),
        1 => (n(), n(), n()).prop_map(|(c, a, b)| Step::Where { c, a, b }),
        1 => (n(), n(), 0usize..2).prop_map(|(a, op, axis)| Step::Reduce { a, op, axis }),
        1 => n().prop_map(|a| Step::Transpose { a }),
        1 => (n(), 0usize..2, 0usize..3, 0usize..3, n(), n())
            .prop_map(|(a, axis, lo, hi, shift, value)| Step::PadShrink { a, axis, lo, hi, shift, value }),
        1 => (n(), 0usize..2, 0usize..2, 0usize..2, n())
            .prop_map(|(a, axis, lo, hi, value)| Step::ShrinkPad { a, axis, lo, hi, value }),
        1 => (n(), n(), n()).prop_map(|(a, b, c)| Step::Matmul { a, b, c }),
        1 => (n(), n(), n(), any::<bool>()).prop_map(|(a, b, c, broadcast)| Step::Batched { a, b, c, broadcast }),
    ]
}

/// A node of the graph being built, with its dtype and whether it is exact (see the module docs).
#[derive(Clone, Copy, Debug)]
struct Val {
    id: NodeId,
    dtype: DType,
    exact: bool,
}

struct Builder {
    g: Graph,
    vals: Vec<Val>,
    backend: Backend,
    rows: Dim,
    cols: Dim,
    /// The smallest value `rows` and `cols` take in any binding (bounds pad/shrink).
    min_size: i64,
}

/// A built graph: its outputs' exactness, and the input slots' dtypes in slot order.
struct Built {
    g: Graph,
    exact_outputs: Vec<bool>,
    inputs: Vec<DType>,
}

impl Builder {
    fn new(backend: Backend, rows: Dim, cols: Dim, min_size: i64) -> Builder {
        let mut b = Builder { g: Graph::new(), vals: Vec::new(), backend, rows, cols, min_size };
        // Two f32 inputs, then one of every other dtype: every dtype has an exact node.
        let mut slots: Vec<DType> = vec![DType::F32];
        slots.extend(backend.dtypes.iter().copied());
        for (slot, &dtype) in slots.iter().enumerate() {
            let ty = TensorType::new(dtype, vec![b.rows, b.cols]);
            let id = b.g.add_leaf(Op::Input(Input { slot: slot as u32 }), ty).unwrap();
            b.vals.push(Val { id, dtype, exact: true });
        }
        b
    }

    fn input_dtypes(&self) -> Vec<DType> {
        let mut slots = vec![DType::F32];
        slots.extend(self.backend.dtypes.iter().copied());
        slots
    }

    fn shape(&self) -> Vec<Dim> {
        vec![self.rows, self.cols]
    }

    fn pick(&self, i: usize) -> Val {
        self.vals[i % self.vals.len()]
    }

    fn pick_where(&self, i: usize, keep: impl Fn(&Val) -> bool) -> Val {
        let found: Vec<Val> = self.vals.iter().copied().filter(|v| keep(v)).collect();
        found[i % found.len()]
    }

    fn of_dtype(&self, i: usize, dtype: DType) -> Val {
        self.pick_where(i, |v| v.dtype == dtype)
    }

    /// `v` if exact, else an exact node of its dtype.
    fn exact(&self, v: Val, i: usize) -> Val {
        if v.exact { v } else { self.pick_where(i, |w| w.dtype == v.dtype && w.exact) }
    }

    /// An integer `v` with every 0 replaced by 1.
    fn nonzero(&mut self, v: Val) -> Val {
        let ty = self.g.ty(v.id).clone();
        let zero = self.g.add_leaf(Op::Const(Const { value: Scalar::Int(0) }), ty.clone()).unwrap();
        let one = self.g.add_leaf(Op::Const(Const { value: Scalar::Int(1) }), ty).unwrap();
        let is_zero = self.add(Op::Binary(BinaryOp::CmpEq), &[v.id, zero]);
        Val { id: self.add(Op::Where, &[is_zero, one, v.id]), ..v }
    }

    fn add(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        self.g.add(op, inputs).unwrap_or_else(|e| panic!("building the test graph: {e}"))
    }

    fn push(&mut self, id: NodeId, exact: bool) {
        let dtype = self.g.ty(id).dtype;
        self.vals.push(Val { id, dtype, exact: exact || !dtype.is_float() });
    }

    fn back_to_shape(&mut self, id: NodeId) -> NodeId {
        let shape = self.shape();
        reshape_dims(&mut self.g, id, &shape)
    }

    fn pad_value(&self, dtype: DType, i: usize) -> Scalar {
        match dtype {
            DType::Bool => Scalar::Bool(i.is_multiple_of(2)),
            d if d.is_float() => {
                let common = [0.0, -1.5, 2.0];
                let special = [f64::NAN, f64::NEG_INFINITY, -0.0];
                let n = if self.backend.specials { 6 } else { 3 };
                let k = i % n;
                Scalar::Float(if k < 3 { common[k] } else { special[k - 3] })
            }
            _ => Scalar::Int([0, -7, 5][i % 3]),
        }
    }

    fn apply(&mut self, s: &Step) {
        match *s {
            Step::Unary { a, op } => {
                let v = self.pick(a);
                let (op, v, exact) = match v.dtype {
                    DType::Bool => (UnaryOp::Not, v, true),
                    d if d.is_float() => {
                        const OPS: [UnaryOp; 8] = [
                            UnaryOp::Neg,
                            UnaryOp::Exp2,
                            UnaryOp::Sin,
                            UnaryOp::Sqrt,
                            UnaryOp::Trunc,
                            UnaryOp::Recip,
                            UnaryOp::Log2,
                            UnaryOp::Erf,
                        ];
                        let op = OPS[op % OPS.len()];
                        if op == UnaryOp::Neg {
                            (op, v, v.exact)
                        } else {
                            let exact = match op {
                                UnaryOp::Trunc => true,
                                UnaryOp::Sqrt | UnaryOp::Recip => self.backend.exact_div_sqrt,
                                _ => false,
                            };
                            (op, self.exact(v, a), exact)
                        }
                    }
                    _ => ([UnaryOp::Neg, UnaryOp::Not][op % 2], v, true),
                };
                let id = self.add(Op::Unary(op), &[v.id]);
                self.push(id, exact);
            }
            Step::Binary { a, b, op } => {
                let x = self.pick(a);
                let y = self.of_dtype(b, x.dtype);
                use BinaryOp::*;
                let ops: &[BinaryOp] = match x.dtype {
                    DType::Bool => &[And, Or, Max, Min, CmpEq, CmpNe],
                    d if d.is_float() => &[Add, Sub, Mul, Div, Max, Min, Mod, CmpLt, CmpEq, CmpNe],
                    _ => &[Add, Sub, Mul, Div, Mod, Max, Min, And, Or, CmpLt, CmpEq, CmpNe],
                };
                let op = ops[op % ops.len()];
                let (x, y, exact) = if x.dtype.is_float() {
                    match op {
                        Add | Sub | Mul | Max | Min => (x, y, x.exact && y.exact),
                        Div => (self.exact(x, a), self.exact(y, b), self.backend.exact_div_sqrt),
                        // fmod is exact in IEEE, but a backend may compute it through a quotient.
                        Mod => (self.exact(x, a), self.exact(y, b), false),
                        _ => (self.exact(x, a), self.exact(y, b), true),
                    }
                } else if matches!(op, Div | Mod) {
                    // An integer division by zero is an error of the run (`air::interp` and every
                    // backend report it); these graphs compare values, so divisors are never 0.
                    (x, self.nonzero(y), true)
                } else {
                    (x, y, true)
                };
                let id = self.add(Op::Binary(op), &[x.id, y.id]);
                self.push(id, exact);
            }
            Step::Cast { a, to } => {
                let v = self.pick(a);
                let to = self.backend.dtypes[to % self.backend.dtypes.len()];
                let v = if v.dtype.is_float() && !to.is_float() { self.exact(v, a) } else { v };
                let id = self.add(Op::Cast(Cast { to }), &[v.id]);
                self.push(id, v.exact || !v.dtype.is_float());
            }
            Step::Where { c, a, b } => {
                let cond = self.of_dtype(c, DType::Bool);
                let x = self.pick(a);
                let y = self.of_dtype(b, x.dtype);
                let id = self.add(Op::Where, &[cond.id, x.id, y.id]);
                self.push(id, x.exact && y.exact);
            }
            Step::Reduce { a, op, axis } => {
                let mut v = self.pick(a);
                if v.dtype == DType::Bool {
                    let id = self.add(Op::Cast(Cast { to: DType::I32 }), &[v.id]);
                    v = Val { id, dtype: DType::I32, exact: true };
                }
                let op = [ReduceOp::Sum, ReduceOp::Max][op % 2];
                let r = reduce(&mut self.g, op, v.id, &[axis]);
                let shape = self.shape();
                let id = expand_dims(&mut self.g, r, &shape);
                // A float sum's rounding depends on the order the backend adds in.
                self.push(id, v.exact && op == ReduceOp::Max);
            }
            Step::Transpose { a } => {
                let v = self.pick(a);
                let t = permute(&mut self.g, v.id, &[1, 0]);
                let id = self.back_to_shape(t);
                self.push(id, v.exact);
            }
            Step::PadShrink { a, axis, lo, hi, shift, value } => {
                let v = self.pick(a);
                let size = self.shape()[axis];
                let mut padding = vec![(Dim::Const(0), Dim::Const(0)); 2];
                padding[axis] = (Dim::Const(lo as i64), Dim::Const(hi as i64));
                let value = self.pad_value(v.dtype, value);
                let p = self.add(Op::Pad(Pad { padding, value }), &[v.id]);
                let start = (shift % (lo + hi + 1)) as i64;
                let mut ranges: Vec<(Dim, Dim)> = self.shape().into_iter().map(|d| (Dim::Const(0), d)).collect();
                ranges[axis] = (Dim::Const(start), size + Dim::Const(start));
                let id = self.add(Op::Shrink(Shrink { ranges }), &[p]);
                self.push(id, v.exact);
            }
            Step::ShrinkPad { a, axis, lo, hi, value } => {
                let v = self.pick(a);
                let (lo, hi) = if (lo + hi) as i64 > self.min_size { (0, 0) } else { (lo as i64, hi as i64) };
                let size = self.shape()[axis];
                let mut ranges: Vec<(Dim, Dim)> = self.shape().into_iter().map(|d| (Dim::Const(0), d)).collect();
                ranges[axis] = (Dim::Const(lo), size - Dim::Const(hi));
                let s = self.add(Op::Shrink(Shrink { ranges }), &[v.id]);
                let mut padding = vec![(Dim::Const(0), Dim::Const(0)); 2];
                padding[axis] = (Dim::Const(lo), Dim::Const(hi));
                let value = self.pad_value(v.dtype, value);
                let id = self.add(Op::Pad(Pad { padding, value }), &[s]);
                self.push(id, v.exact);
            }
            Step::Matmul { a, b, c } => {
                let (x, y, z) = self.matmul_operands(a, b, c);
                let yt = permute(&mut self.g, y.id, &[1, 0]);
                let w = canonical_matmul(&mut self.g, yt, z.id);
                let id = canonical_matmul(&mut self.g, x.id, w);
                self.push(id, !x.dtype.is_float());
            }
            Step::Batched { a, b, c, broadcast } => {
                let (x, y, z) = self.matmul_operands(a, b, c);
                let (r, k) = (self.rows, self.cols);
                let one = Dim::Const(1);
                let right = if broadcast {
                    let yt = permute(&mut self.g, y.id, &[1, 0]);
                    canonical_matmul(&mut self.g, yt, z.id)
                } else {
                    let col = reshape_dims(&mut self.g, y.id, &[r, k, one]);
                    let row = reshape_dims(&mut self.g, z.id, &[r, one, k]);
                    canonical_matmul(&mut self.g, col, row)
                };
                let left = reshape_dims(&mut self.g, x.id, &[r, one, k]);
                let out = canonical_matmul(&mut self.g, left, right);
                let id = self.back_to_shape(out);
                self.push(id, !x.dtype.is_float());
            }
        }
    }

    /// Three operands of one numeric dtype (a bool pick becomes f32).
    fn matmul_operands(&self, a: usize, b: usize, c: usize) -> (Val, Val, Val) {
        let mut x = self.pick(a);
        if x.dtype == DType::Bool {
            x = self.of_dtype(a, DType::F32);
        }
        (x, self.of_dtype(b, x.dtype), self.of_dtype(c, x.dtype))
    }

    fn finish(mut self, extra: &[usize]) -> Built {
        let mut outs = vec![*self.vals.last().unwrap()];
        outs.extend(extra.iter().map(|&e| self.pick(e)));
        for v in &outs {
            self.g.add_output(v.id);
        }
        let inputs = self.input_dtypes();
        Built { g: self.g, exact_outputs: outs.iter().map(|v| v.exact).collect(), inputs }
    }
}

/// The facade's matmul pattern (`kiln::ops::matmul::canonical_matmul`): `a: [..., M, K]` and
/// `b: [..., K, N]` (or `b: [K, N]`, broadcast over `a`'s batch dims) as expand-mul-sum.
fn canonical_matmul(g: &mut Graph, a: NodeId, b: NodeId) -> NodeId {
    let (sa, sb) = (g.ty(a).shape.to_vec(), g.ty(b).shape.to_vec());
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    let batch: Vec<Dim> = if ra >= rb { sa[..ra - 2].to_vec() } else { sb[..rb - 2].to_vec() };
    let one = Dim::Const(1);
    let ones = |rank: usize| std::iter::repeat_n(one, batch.len() + 2 - rank);
    let full: Vec<Dim> = batch.iter().cloned().chain([m, n, k]).collect();
    let a_shape: Vec<Dim> = ones(ra).chain(sa[..ra - 2].iter().cloned()).chain([m, one, k]).collect();
    let a3 = reshape_dims(g, a, &a_shape);
    let a3 = expand_dims(g, a3, &full);
    let mut perm: Vec<usize> = (0..rb).collect();
    perm.swap(rb - 2, rb - 1);
    let bt = permute(g, b, &perm);
    let b_shape: Vec<Dim> = ones(rb).chain(sb[..rb - 2].iter().cloned()).chain([one, n, k]).collect();
    let b3 = reshape_dims(g, bt, &b_shape);
    let b3 = expand_dims(g, b3, &full);
    let prod = g.add(Op::Binary(BinaryOp::Mul), &[a3, b3]).unwrap();
    let summed = reduce(g, ReduceOp::Sum, prod, &[full.len() - 1]);
    let out: Vec<Dim> = batch.into_iter().chain([m, n]).collect();
    reshape_dims(g, summed, &out)
}

/// Values from proptest's seeded generator (`TestRng`, XorShift), so that a seed replays exactly.
struct Rng(TestRng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(TestRng::from_seed(RngAlgorithm::XorShift, &[seed.to_le_bytes(), (!seed).to_le_bytes()].concat()))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        self.0.random_range(0.0..1.0)
    }
}

/// `n` values from `common`, except about one in 64 drawn from `specials`.
fn mixed<T: Copy + air::Element>(n: usize, rng: &mut Rng, specials: &[T], common: impl Fn(&mut Rng) -> T) -> Vec<T> {
    (0..n)
        .map(
            |_| {
                if rng.next().is_multiple_of(64) { specials[rng.next() as usize % specials.len()] } else { common(rng) }
            },
        )
        .collect()
}

/// Input data of `dtype`: mostly small values, about one element in 64 a special one (NaN,
/// infinities, -0, integers for floats when the backend allows them; extremes for ints).
fn input_tensor(dtype: DType, shape: &[usize], seed: u64, backend: &Backend) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(seed);
    let shape = shape.to_vec();
    let t = match dtype {
        DType::F32 => {
            let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0, 3.0, -1.0, 0.5];
            let usable = if backend.specials { &specials[..] } else { &specials[4..] };
            HostTensor::from_vec(mixed(n, &mut rng, usable, |r| (r.unit() * 4.0 - 2.0) as f32), shape)
        }
        DType::I32 => {
            let specials = [i32::MIN, i32::MAX, -1, 0, 1];
            HostTensor::from_vec(mixed(n, &mut rng, &specials, |r| (r.next() % 201) as i32 - 100), shape)
        }
        DType::I64 => {
            let specials = [i64::MIN, i64::MAX, i32::MIN as i64 - 1, -1, 0];
            HostTensor::from_vec(mixed(n, &mut rng, &specials, |r| (r.next() % 2001) as i64 - 1000), shape)
        }
        DType::Bool => HostTensor::from_vec(mixed(n, &mut rng, &[true], |r| r.next() % 2 == 0), shape),
        other => panic!("no test data for {other}"),
    };
    t.unwrap()
}

fn inputs_for(built: &Built, shape: &[usize], seed: u64, backend: &Backend) -> Vec<HostTensor> {
    built
        .inputs
        .iter()
        .enumerate()
        .map(|(slot, &d)| input_tensor(d, shape, seed.wrapping_add(slot as u64 * 7919), backend))
        .collect()
}

/// Compares one output: ints and bools exactly; floats exactly when `exact`, else within
/// `rtol` norm-wise (`|got - want| <= rtol * (|want| + max |want|)`). NaN must meet NaN and an
/// infinity the same infinity, except on a backend without `specials`, where a NaN or an infinity
/// the graph computes (`sqrt` of a negative) is the implementation's to give (WGSL's rule) and
/// any value stands. The error names the worst element.
fn compare(got: &HostTensor, want: &HostTensor, exact: bool, rtol: f64, specials: bool) -> Result<(), String> {
    if got.dtype() != want.dtype() || got.shape != want.shape {
        return Err(format!("got {}{:?}, want {}{:?}", got.dtype(), got.shape, want.dtype(), want.shape));
    }
    let (g, w) = (got.data.to_f64_vec(), want.data.to_f64_vec());
    let float = want.dtype().is_float();
    let scale = w.iter().filter(|x| x.is_finite()).fold(0.0f64, |m, x| m.max(x.abs()));
    let mut worst: Option<(usize, f64)> = None;
    let mut bad = 0usize;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let compare_exactly = !float || exact || !a.is_finite() || !b.is_finite();
        let err = if float && !specials && !b.is_finite() {
            0.0
        } else if compare_exactly {
            if a == b || (a.is_nan() && b.is_nan()) { 0.0 } else { f64::INFINITY }
        } else {
            (a - b).abs() / (b.abs() + scale).max(f64::MIN_POSITIVE)
        };
        if err > rtol || (exact && err > 0.0) {
            bad += 1;
        }
        if err > 0.0 && worst.is_none_or(|(_, e)| err > e) {
            worst = Some((i, err));
        }
    }
    match worst {
        Some((i, err)) if bad > 0 => Err(format!(
            "{bad} of {} elements differ ({}); worst: element {i} got {} want {} (error {err:.3e})",
            w.len(),
            if exact || !float { "exact" } else { "norm-wise" },
            g[i],
            w[i]
        )),
        _ => Ok(()),
    }
}

/// Runs `built` once through `run` and through the interpreter and compares every output.
fn check_outputs(
    built: &Built,
    inputs: &[HostTensor],
    bindings: &Bindings,
    backend: &Backend,
    got: Result<Vec<HostTensor>, String>,
) -> Result<(), TestCaseError> {
    let want = air::eval(&built.g, inputs, bindings).map_err(|e| TestCaseError::fail(format!("interpreter: {e}")))?;
    let got = got.map_err(|e| TestCaseError::fail(format!("device: {e}\n{}", air::print(&built.g))))?;
    prop_assert_eq!(got.len(), want.len());
    for (i, ((a, b), &exact)) in got.iter().zip(&want).zip(&built.exact_outputs).enumerate() {
        if let Err(e) = compare(a, b, exact, backend.rtol, backend.specials) {
            return Err(TestCaseError::fail(format!("output {i} with {bindings:?}: {e}\n{}", air::print(&built.g))));
        }
    }
    Ok(())
}

fn device() -> &'static CpuDevice {
    static DEV: OnceLock<CpuDevice> = OnceLock::new();
    DEV.get_or_init(|| CpuDevice::new().unwrap())
}

/// Cases of a test: `PROPTEST_CASES` if set (proptest's own variable), else `default`.
fn config(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    Config { cases, failure_persistence: None, ..Config::default() }
}

fn run_property<S: Strategy>(default_cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let mut runner = TestRunner::new(config(default_cases));
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

/// Compiles `built` on the CPU device once and checks it under each `(rows, cols)` binding.
/// Returns how many loop launches split over threads.
fn check_cpu(built: &Built, sizes: &[(usize, usize)], symbolic: bool, seed: u64) -> Result<u64, TestCaseError> {
    let exe = device()
        .compile(&built.g)
        .map_err(|e| TestCaseError::fail(format!("compile: {e}\n{}", air::print(&built.g))))?;
    let before = exe.split_launches();
    for (k, &(r, c)) in sizes.iter().enumerate() {
        let mut bindings = Bindings::new();
        if symbolic {
            bindings.insert(Symbol::new("r"), r as i64);
            bindings.insert(Symbol::new("c"), c as i64);
        }
        let inputs = inputs_for(built, &[r, c], seed.wrapping_add(k as u64), &CPU);
        let got = exe.run(&inputs, &bindings).map_err(|e| e.to_string());
        check_outputs(built, &inputs, &bindings, &CPU, got)?;
    }
    Ok(exe.split_launches() - before)
}

fn build(backend: Backend, rows: Dim, cols: Dim, min_size: i64, steps: &[Step], extra: &[usize]) -> Built {
    let mut b = Builder::new(backend, rows, cols, min_size);
    for s in steps {
        b.apply(s);
    }
    b.finish(extra)
}

fn steps(n: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), n)
}

/// Small concrete shapes (size-1 and odd dims included): every op and dtype, many cases.
#[test]
fn cpu_matches_interpreter_on_small_graphs() {
    let strategy = (1usize..6, 1usize..7, steps(1..10), prop::collection::vec(0usize..64, 2), any::<u64>());
    run_property(64, strategy, |(rows, cols, steps, extra, seed)| {
        let built = build(CPU, Dim::Const(rows as i64), Dim::Const(cols as i64), rows.min(cols) as i64, &steps, &extra);
        check_cpu(&built, &[(rows, cols)], false, seed).map(|_| ())
    });
}

/// Symbolic `[r, c]`: one compiled program run under three bindings, one of them sometimes large
/// enough to split.
#[test]
fn cpu_matches_interpreter_under_several_bindings() {
    let binding = || (2usize..9, 2usize..9);
    let strategy =
        (binding(), binding(), any::<bool>(), steps(1..9), prop::collection::vec(0usize..64, 2), any::<u64>());
    run_property(16, strategy, |(first, second, large, steps, extra, seed)| {
        let built = build(CPU, Dim::sym("r"), Dim::sym("c"), 2, &steps, &extra);
        let third = if large { (PARALLEL_MIN_WORK as usize / 5 + 3, 5) } else { (1 + first.0, 3) };
        check_cpu(&built, &[first, second, third], true, seed).map(|_| ())
    });
}

/// Shapes of at least `PARALLEL_MIN_WORK` elements, so that element-wise kernels split over the
/// threads; at least one case (a fixed one-kernel case is among them) must have split, when there
/// are threads to split over.
#[test]
fn cpu_matches_interpreter_on_large_graphs() {
    let threshold = PARALLEL_MIN_WORK as usize;
    let shape = prop::sample::select(vec![(threshold / 8 + 1, 8), (threshold / 5 + 7, 5), (threshold / 3 + 1, 3)]);
    let strategy = (shape, steps(1..7), prop::collection::vec(0usize..64, 2), any::<u64>());
    // Random programs often run their big kernels in a concurrent dependency level, one thread
    // per step, unsplit; a program of one element-wise kernel always splits.
    let (rows, cols) = (threshold / 8 + 1, 8);
    let one_kernel =
        build(CPU, Dim::Const(rows as i64), Dim::Const(cols as i64), 3, &[Step::Unary { a: 0, op: 0 }], &[]);
    let splits = std::cell::Cell::new(check_cpu(&one_kernel, &[(rows, cols)], false, 1).unwrap());
    run_property(6, strategy, |((rows, cols), steps, extra, seed)| {
        let built = build(CPU, Dim::Const(rows as i64), Dim::Const(cols as i64), 3, &steps, &extra);
        splits.set(splits.get() + check_cpu(&built, &[(rows, cols)], false, seed)?);
        Ok(())
    });
    let splits = splits.get();
    if kiln_runtime::parallel::threads() > 1 {
        assert!(splits > 0, "no launch split over threads in any large case");
    } else {
        eprintln!("one thread: splitting not checked");
    }
}

fn gpu() -> Option<&'static WgpuDevice> {
    static DEV: OnceLock<Option<WgpuDevice>> = OnceLock::new();
    DEV.get_or_init(|| match WgpuDevice::new() {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipping: no wgpu device ({e})");
            None
        }
    })
    .as_ref()
}

/// The same graphs on wgpu (f32, i32 and bool; no NaN or infinity in the data), fewer cases.
#[test]
fn wgpu_matches_interpreter_on_random_graphs() {
    let Some(dev) = gpu() else { return };
    let strategy = (
        1usize..6,
        prop::sample::select(vec![1usize, 3, 7, 70]),
        steps(1..8),
        prop::collection::vec(0usize..64, 2),
        any::<u64>(),
    );
    run_property(12, strategy, |(rows, cols, steps, extra, seed)| {
        let built =
            build(WGPU, Dim::Const(rows as i64), Dim::Const(cols as i64), rows.min(cols) as i64, &steps, &extra);
        let inputs = inputs_for(&built, &[rows, cols], seed, &WGPU);
        let got = dev.run(&built.g, &inputs, &Bindings::new()).map_err(|e| e.to_string());
        check_outputs(&built, &inputs, &Bindings::new(), &WGPU, got)
    });
}

/// The comparison itself: NaN for a number fails, the worst element is named, exact is exact.
#[test]
fn comparison_is_nan_aware_and_names_the_worst_element() {
    let t = |v: Vec<f32>| HostTensor::from_vec(v, vec![4]).unwrap();
    let want = t(vec![1.0, 2.0, f32::NAN, 100.0]);
    assert!(compare(&t(vec![1.0, 2.0, f32::NAN, 100.0]), &want, true, 0.0, true).is_ok());
    assert!(compare(&t(vec![1.0, 2.0001, f32::NAN, 100.0]), &want, false, 1e-3, true).is_ok());
    let e = compare(&t(vec![1.0, 2.0001, f32::NAN, 100.0]), &want, true, 1e-3, true).unwrap_err();
    assert!(e.contains("element 1"), "{e}");
    let e = compare(&t(vec![f32::NAN, 2.0, f32::NAN, 100.0]), &want, false, 1e-3, true).unwrap_err();
    assert!(e.contains("element 0 got NaN want 1"), "{e}");
    let e = compare(&t(vec![1.0, 2.0, 0.0, 100.0]), &want, false, 1e-3, true).unwrap_err();
    assert!(e.contains("element 2"), "{e}");
    let e = compare(&t(vec![1.5, 2.0, f32::NAN, 90.0]), &want, false, 1e-3, true).unwrap_err();
    assert!(e.contains("2 of 4") && e.contains("element 3"), "{e}");
    // Without specials, a NaN the graph computes may come back as any value; a finite want
    // is still compared, and a NaN for it still fails.
    assert!(compare(&t(vec![1.0, 2.0, 0.5, 100.0]), &want, false, 1e-3, false).is_ok());
    let e = compare(&t(vec![f32::NAN, 2.0, 0.5, 100.0]), &want, false, 1e-3, false).unwrap_err();
    assert!(e.contains("element 0 got NaN want 1"), "{e}");
}

//! Every unary and binary op, cast and `where`, on every dtype the op accepts, at sizes that
//! exercise the vector main loop, the one-vector loop and the scalar tail; JIT vs the plain
//! evaluator in `common`.

use crate::common;

use air::{BinaryOp, DType, Scalar, UnaryOp};
use common::*;
use lower::kir::{Access, IExpr, Inst};

fn unary_ok(op: UnaryOp, d: DType) -> bool {
    match op {
        UnaryOp::Neg => !d.is_bool(),
        UnaryOp::Not => !d.is_float(),
        _ => d.is_float(),
    }
}

fn binary_ok(op: BinaryOp, d: DType) -> bool {
    match op {
        BinaryOp::And | BinaryOp::Or => !d.is_float(),
        BinaryOp::Pow => d.is_float(),
        BinaryOp::CmpEq | BinaryOp::CmpNe | BinaryOp::CmpLt | BinaryOp::Max | BinaryOp::Min => true,
        _ => !d.is_bool(),
    }
}

/// Tolerance of a JIT result against the libm-based evaluator.
fn tol(op_is_approx: bool, d: DType) -> f64 {
    match d {
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        DType::F32 if op_is_approx => 1e-6,
        _ => 0.0,
    }
}

fn sizes(d: DType) -> &'static [usize] {
    if matches!(d, DType::F32 | DType::I32) { &SIZES } else { &[0, 1, 5, 17, 100] }
}

#[test]
fn every_unary_op_and_dtype() {
    for &op in UnaryOp::ALL {
        for d in DType::ALL {
            if !unary_ok(op, d) {
                continue;
            }
            let k = unary_kernel(op, d, d, IExpr::Sym(0));
            let approx = matches!(op, UnaryOp::Exp2 | UnaryOp::Log2 | UnaryOp::Sin | UnaryOp::Erf);
            for &n in sizes(d) {
                let a = Buf::from_vals(d, &sample(d, n, n as u64 + 3));
                let out = Buf::zeros(d, n);
                check(&k, &[a, out], &[n as i64], 0, n as i64, tol(approx, d), &format!("{} {d} n={n}", op.name()));
            }
        }
    }
}

#[test]
fn every_binary_op_and_dtype() {
    for &op in BinaryOp::ALL {
        for d in DType::ALL {
            if !binary_ok(op, d) {
                continue;
            }
            let out = if op.is_comparison() { DType::Bool } else { d };
            let k = binary_kernel(op, d, out, IExpr::Sym(0));
            for &n in sizes(d) {
                let a = Buf::from_vals(d, &sample(d, n, 2 * n as u64 + 1));
                let b = Buf::from_vals(d, &sample(d, n, 3 * n as u64 + 7));
                let o = Buf::zeros(out, n);
                check(&k, &[a, b, o], &[n as i64], 0, n as i64, tol(false, d), &format!("{} {d} n={n}", op.name()));
            }
        }
    }
}

#[test]
fn a_chain_of_half_ops_rounds_after_every_op_as_the_evaluator() {
    // Halves compute in f32 and round to storage after every op (the interpreter's semantics):
    // a chain seen through a cast to f64 has the evaluator's bits exactly, not the unrounded
    // f32 values of its steps.
    for d in [DType::F16, DType::BF16] {
        let k = elementwise(
            vec![p(d, Access::Read), p(DType::F64, Access::Write)],
            IExpr::Sym(0),
            vec![
                load(0, d, 0, i(0)),
                let_(1, d, Inst::Const(Scalar::Float(0.3).cast(d))),
                let_(2, d, Inst::Binary(BinaryOp::Mul, r(0), r(1))),
                let_(3, d, Inst::Const(Scalar::Float(0.1).cast(d))),
                let_(4, d, Inst::Binary(BinaryOp::Add, r(2), r(3))),
                let_(5, d, Inst::Unary(UnaryOp::Recip, r(4))),
                let_(6, d, Inst::Binary(BinaryOp::Sub, r(5), r(0))),
                let_(7, DType::F64, Inst::Cast(r(6))),
                store(1, i(0), 7),
            ],
        );
        let n = 200;
        let bufs = [Buf::from_vals(d, &sample(d, n, 11)), Buf::zeros(DType::F64, n)];
        for (j, g, w) in jit_and_evaluator_outputs(&k, &bufs) {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{d} element {j}: jit {g}, evaluator {w}"
            );
        }
    }
}

/// Runs the one-loop kernel `k` (extent `s0` = the first buffer's length) with the JIT and the
/// evaluator on copies of `bufs`; the elements of buffer 1 as `(index, jit, evaluator)`.
fn jit_and_evaluator_outputs(k: &lower::kir::LoopKernel, bufs: &[Buf]) -> Vec<(usize, f64, f64)> {
    let n = bufs[0].len();
    let (mut got, mut want) = (bufs.to_vec(), bufs.to_vec());
    jit(k, &mut got, &[n as i64], 0, n as i64);
    eval(k, &mut want, &[n as i64], 0, n as i64);
    (0..n).map(|j| (j, got[1].get(j).f64(), want[1].get(j).f64())).collect()
}

#[test]
fn min_and_max_against_a_constant_keep_nans_and_signed_zeros() {
    // With one operand a constant (a ReLU's `max(x, 0)`, a clamp), the JIT takes a compare and a
    // select (`Math::min_max_const`): ties of signed zeros, NaNs and infinities must come out as
    // the evaluator's, bit for bit (a NaN as any NaN), in both operand orders, in the vector loop
    // and the scalar tail, for every constant (those it does not take stay on the general path).
    let xs = [0.0, -0.0, 1.5, -1.5, -2.0, 2.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e-30, -1e-30, 3.0, 7.25];
    let consts = [0.0, -0.0, 1.5, -2.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN];
    for d in [DType::F32, DType::F64] {
        for op in [BinaryOp::Max, BinaryOp::Min] {
            for &k_const in &consts {
                for const_first in [false, true] {
                    let (a, b) = if const_first { (r(1), r(0)) } else { (r(0), r(1)) };
                    let k = elementwise(
                        vec![p(d, Access::Read), p(d, Access::Write)],
                        IExpr::Sym(0),
                        vec![
                            load(0, d, 0, i(0)),
                            let_(1, d, Inst::Const(Scalar::Float(k_const).cast(d))),
                            let_(2, d, Inst::Binary(op, a, b)),
                            store(1, i(0), 2),
                        ],
                    );
                    for n in [xs.len(), 1001] {
                        let vals: Vec<V> = (0..n).map(|j| cast(V::D(xs[j % xs.len()]), d)).collect();
                        let bufs = [Buf::from_vals(d, &vals), Buf::zeros(d, n)];
                        for (j, g, w) in jit_and_evaluator_outputs(&k, &bufs) {
                            assert!(
                                (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits(),
                                "{} {d} of {} and {k_const} (constant first: {const_first}), n={n}: {g} vs {w}",
                                op.name(),
                                xs[j % xs.len()]
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn int_division_edge_cases() {
    for d in [DType::I32, DType::I64] {
        let (min, max) = if d == DType::I32 { (i32::MIN as i64, i32::MAX as i64) } else { (i64::MIN, i64::MAX) };
        let xs = [7, -7, 7, -7, min, min, max, 0, 5, -5, 3, min];
        let ys = [2, 2, -2, -2, -1, 1, -1, 0, 0, 0, 7, 0];
        let a = Buf::from_vals(d, &xs.iter().map(|&x| cast(V::I64(x), d)).collect::<Vec<_>>());
        let b = Buf::from_vals(d, &ys.iter().map(|&x| cast(V::I64(x), d)).collect::<Vec<_>>());
        for op in [BinaryOp::Div, BinaryOp::Mod] {
            let k = binary_kernel(op, d, d, IExpr::Sym(0));
            let o = Buf::zeros(d, xs.len());
            check(&k, &[a.clone(), b.clone(), o], &[xs.len() as i64], 0, xs.len() as i64, 0.0, op.name());
        }
    }
}

#[test]
fn every_cast() {
    for from in DType::ALL {
        for to in DType::ALL {
            let k = elementwise(
                vec![p(from, Access::Read), p(to, Access::Write)],
                IExpr::Sym(0),
                vec![load(0, from, 0, i(0)), let_(1, to, Inst::Cast(r(0))), store(1, i(0), 1)],
            );
            for &n in sizes(if from == to { from } else { DType::F32 }) {
                let mut vals = sample(from, n, n as u64 * 5 + 2);
                // Out-of-range floats saturate; include some large ones.
                if from.is_float() && n > 4 {
                    vals[1] = cast(V::D(3e9), from);
                    vals[2] = cast(V::D(-3e9), from);
                    vals[3] = cast(V::D(65519.0), from);
                }
                let a = Buf::from_vals(from, &vals);
                let o = Buf::zeros(to, n);
                check(&k, &[a, o], &[n as i64], 0, n as i64, 0.0, &format!("cast {from} -> {to} n={n}"));
            }
        }
    }
}

#[test]
fn where_and_constants() {
    for d in DType::ALL {
        let k = elementwise(
            vec![p(DType::Bool, Access::Read), p(d, Access::Read), p(d, Access::Write)],
            IExpr::Sym(0),
            vec![
                load(0, DType::Bool, 0, i(0)),
                load(1, d, 1, i(0)),
                let_(2, d, Inst::Const(Scalar::Float(2.7).cast(d))),
                let_(3, d, Inst::Where(r(0), r(1), r(2))),
                store(2, i(0), 3),
            ],
        );
        for &n in sizes(d) {
            let c = Buf::from_vals(DType::Bool, &sample(DType::Bool, n, 9));
            let a = Buf::from_vals(d, &sample(d, n, 10));
            let o = Buf::zeros(d, n);
            check(&k, &[c, a, o], &[n as i64], 0, n as i64, 0.0, &format!("where {d} n={n}"));
        }
    }
}

#[test]
fn comparisons_feed_where_in_vector_loops() {
    // f32: out = where(a < b, a, b) + cast(a != b): masks, bitselect and bool casts in lanes.
    let d = DType::F32;
    let k = elementwise(
        vec![p(d, Access::Read), p(d, Access::Read), p(d, Access::Write), p(DType::I32, Access::Write)],
        IExpr::Sym(0),
        vec![
            load(0, d, 0, i(0)),
            load(1, d, 1, i(0)),
            let_(2, DType::Bool, Inst::Binary(BinaryOp::CmpLt, r(0), r(1))),
            let_(3, d, Inst::Where(r(2), r(0), r(1))),
            let_(4, DType::Bool, Inst::Binary(BinaryOp::CmpNe, r(0), r(1))),
            let_(5, d, Inst::Cast(r(4))),
            let_(6, d, Inst::Binary(BinaryOp::Add, r(3), r(5))),
            store(2, i(0), 6),
            let_(7, DType::Bool, Inst::Unary(UnaryOp::Not, r(2))),
            let_(8, DType::Bool, Inst::Binary(BinaryOp::And, r(7), r(4))),
            let_(9, DType::I32, Inst::Cast(r(8))),
            let_(10, DType::I32, Inst::Cast(r(6))),
            let_(11, DType::I32, Inst::Binary(BinaryOp::Mul, r(9), r(10))),
            store(3, i(0), 11),
        ],
    );
    for n in SIZES {
        let a = Buf::from_vals(d, &sample(d, n, 1));
        let b = Buf::from_vals(d, &sample(d, n, 2));
        check(
            &k,
            &[a, b, Buf::zeros(d, n), Buf::zeros(DType::I32, n)],
            &[n as i64],
            0,
            n as i64,
            0.0,
            &format!("n={n}"),
        );
    }
}

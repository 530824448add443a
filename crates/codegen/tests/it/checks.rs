//! Data-dependent indexing and checks in the CPU JIT against the plain kir evaluator: gathers
//! (in range, negative, too large, i32 and i64 indices, every element dtype), scatter-adds, and
//! integer division checks; the status buffer must hold the same words, and a faulting element
//! must never touch memory outside its buffer.

use crate::common;

use air::{BinaryOp, DType};
use common::*;
use lower::kir::{Access, IExpr, Inst, LoopKernel, STATUS_WORDS, Stmt};

fn status() -> Buf {
    Buf::from_vals(DType::I32, &[V::I32(0); STATUS_WORDS])
}

fn ints(d: DType, v: &[i64]) -> Buf {
    Buf::from_vals(d, &v.iter().map(|&x| cast(V::I64(x), d)).collect::<Vec<_>>())
}

/// `out[i] = src[row(i)*4 + index[i]]` for `n` outputs: b0 out, b1 src `[rows, 4]`, b2 index,
/// b3 status. Row `i / 2` of `src`.
fn gather_kernel(d: DType, index: DType, n: i64) -> LoopKernel {
    let row_base = IExpr::mul(IExpr::div(i(0), c(2)), c(4));
    LoopKernel {
        params: vec![p(d, Access::Write), p(d, Access::Read), p(index, Access::Read), p(DType::I32, Access::Write)],
        n_syms: 0,
        body: vec![for_(
            0,
            c(n),
            true,
            vec![
                load(0, index, 2, i(0)),
                let_(
                    1,
                    d,
                    Inst::Gather { buf: 1, base: row_base, index: r(0), stride: c(1), size: c(4), status: 3, check: 5 },
                ),
                store(0, i(0), 1),
            ],
        )],
    }
}

#[test]
fn gathers_read_the_indexed_element_and_report_bad_indices() {
    for d in [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool, DType::F16, DType::BF16] {
        for index in [DType::I32, DType::I64] {
            let k = gather_kernel(d, index, 6);
            let src = Buf::from_vals(d, &sample(d, 12, 3));
            let good = [Buf::from_vals(d, &sample(d, 6, 1)), src.clone(), ints(index, &[3, 0, 1, 1, 2, 3]), status()];
            check(&k, &good, &[], 0, 6, 0.0, &format!("{d} gather, {index} index"));
            let mut out = good.to_vec();
            jit(&k, &mut out, &[], 0, 6);
            assert_eq!(out[3].vals()[0], V::I32(0), "{d}: no failure recorded for good indices");

            // Out-of-range indices far past the buffer: the JIT must not touch memory there.
            let far = if index == DType::I32 { [i32::MIN as i64, i32::MAX as i64] } else { [1 << 40, -(1 << 40)] };
            for bad in [-1i64, 4, far[0], far[1]] {
                let bufs =
                    [Buf::from_vals(d, &sample(d, 6, 1)), src.clone(), ints(index, &[3, 0, bad, 1, 2, bad]), status()];
                check(&k, &bufs, &[], 0, 6, 0.0, &format!("{d} gather with index {bad}"));
                let mut out = bufs.to_vec();
                jit(&k, &mut out, &[], 0, 6);
                let words = out[3].vals();
                let (lo, hi) = (bad as i32, (bad >> 32) as i32);
                assert_eq!(&words[..3], &[V::I32(6), V::I32(lo), V::I32(hi)], "{d}: status after index {bad}");
            }
        }
    }
}

/// `out = 0` (a `[2, 3]` line per row), then `out[row, index[row, k]] += v[row, k]` for `k < 4`.
fn scatter_kernel(d: DType) -> LoopKernel {
    LoopKernel {
        params: vec![
            p(d, Access::Write),
            p(DType::I32, Access::Read),
            p(d, Access::Read),
            p(DType::I32, Access::Write),
        ],
        n_syms: 0,
        body: vec![for_(
            0,
            c(2),
            true,
            vec![
                for_(
                    1,
                    c(3),
                    false,
                    vec![
                        let_(0, d, Inst::Const(air::Scalar::Int(0))),
                        store(0, IExpr::add(IExpr::mul(i(0), c(3)), i(1)), 0),
                    ],
                ),
                for_(
                    2,
                    c(4),
                    false,
                    vec![
                        load(1, DType::I32, 1, IExpr::add(IExpr::mul(i(0), c(4)), i(2))),
                        load(2, d, 2, IExpr::add(IExpr::mul(i(0), c(4)), i(2))),
                        Stmt::ScatterAdd {
                            buf: 0,
                            base: IExpr::mul(i(0), c(3)),
                            index: r(1),
                            stride: c(1),
                            size: c(3),
                            value: r(2),
                            status: 3,
                            check: 0,
                        },
                    ],
                ),
            ],
        )],
    }
}

#[test]
fn scatter_adds_accumulate_and_skip_bad_indices() {
    for d in [DType::F32, DType::F64, DType::I32, DType::I64] {
        let k = scatter_kernel(d);
        let values = Buf::from_vals(d, &sample(d, 8, 5));
        let good = [
            Buf::from_vals(d, &sample(d, 6, 9)),
            ints(DType::I32, &[2, 2, 0, 2, 1, 1, 1, 0]),
            values.clone(),
            status(),
        ];
        check(&k, &good, &[], 0, 2, 0.0, &format!("{d} scatter_add"));
        let bad = [Buf::from_vals(d, &sample(d, 6, 9)), ints(DType::I32, &[2, 3, 0, 2, 1, -7, 1, 0]), values, status()];
        check(&k, &bad, &[], 0, 2, 0.0, &format!("{d} scatter_add with bad indices"));
        let mut out = bad.to_vec();
        jit(&k, &mut out, &[], 0, 2);
        assert_ne!(out[3].vals()[0], V::I32(0), "{d}: a bad scatter index is recorded");
    }
}

#[test]
fn checks_record_the_first_failure_only() {
    // out[i] = a[i] / b[i] with a check of b[i] == 0; two zero divisors, the first one wins.
    for d in [DType::I32, DType::I64] {
        let k = LoopKernel {
            params: vec![p(d, Access::Read), p(d, Access::Read), p(d, Access::Write), p(DType::I32, Access::Write)],
            n_syms: 0,
            body: vec![for_(
                0,
                c(5),
                false,
                vec![
                    load(0, d, 0, i(0)),
                    load(1, d, 1, i(0)),
                    let_(2, d, Inst::Const(air::Scalar::Int(0))),
                    let_(3, DType::Bool, Inst::Binary(BinaryOp::CmpEq, r(1), r(2))),
                    Stmt::Check { cond: r(3), value: r(0), status: 3, check: 2 },
                    let_(4, d, Inst::Binary(BinaryOp::Div, r(0), r(1))),
                    store(2, i(0), 4),
                ],
            )],
        };
        let bufs = [ints(d, &[7, 8, 9, 10, 11]), ints(d, &[1, 0, 3, 0, 2]), ints(d, &[0; 5]), status()];
        check(&k, &bufs, &[], 0, 1, 0.0, &format!("{d} division check"));
        let mut out = bufs.to_vec();
        jit(&k, &mut out, &[], 0, 1);
        assert_eq!(&out[3].vals()[..3], &[V::I32(3), V::I32(8), V::I32(0)], "{d}");
    }
}

//! Loop-nest constructs: masks, iota, accumulators, nested loops with div/mod indices, symbolic
//! extents, parallel sub-ranges, broadcasts and the vectorized reduction path.

use crate::common;

use air::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};
use common::*;
use lower::kir::{Acc, Access, IExpr, Inst, LoopKernel, Stmt};

fn acc_init(n: u32, dtype: DType, op: ReduceOp) -> Stmt {
    Stmt::AccInit { acc: Acc(n), dtype, op }
}
fn acc_update(n: u32, value: u32) -> Stmt {
    Stmt::AccUpdate { acc: Acc(n), value: lower::kir::Reg(value) }
}

/// `out[o] = reduce_k in[o*s0 + k]` over `rows` rows of `s0` elements.
fn row_reduce(d: DType, op: ReduceOp) -> LoopKernel {
    LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Write)],
        n_syms: 2,
        body: vec![for_(
            0,
            IExpr::Sym(1),
            true,
            vec![
                acc_init(0, d, op),
                for_(
                    1,
                    IExpr::Sym(0),
                    false,
                    vec![load(0, d, 0, IExpr::add(IExpr::mul(i(0), IExpr::Sym(0)), i(1))), acc_update(0, 0)],
                ),
                let_(1, d, Inst::ReadAcc(Acc(0))),
                store(1, i(0), 1),
            ],
        )],
    }
}

#[test]
fn reductions_sum_and_max_every_numeric_dtype_and_length() {
    for d in [DType::F32, DType::I32, DType::I64, DType::F64, DType::F16, DType::BF16] {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let k = row_reduce(d, op);
            for &len in &SIZES {
                let rows = 3;
                let mut vals = sample(d, len * rows, len as u64 + 11);
                if d.is_float() {
                    // Keep NaN only in row 1 so that rows 0 and 2 check plain sums/maxima.
                    for (j, v) in vals.iter_mut().enumerate() {
                        if j / len.max(1) != 1 && v.f64().is_nan() {
                            *v = cast(V::D(0.5), d);
                        }
                        if v.f64().is_infinite() {
                            *v = cast(V::D(-3.0), d);
                        }
                    }
                }
                let a = Buf::from_vals(d, &vals);
                let o = Buf::zeros(d, rows);
                let tol = match d {
                    DType::F32 => 1e-6,
                    DType::F16 => 1e-3,
                    DType::BF16 => 8e-3,
                    _ => 1e-12,
                };
                check(&k, &[a, o], &[len as i64, rows as i64], 0, rows as i64, tol, &format!("{op:?} {d} len={len}"));
            }
        }
    }
}

/// A row of symbolic length runs the unrolled vector loop (four vectors per step) from 32
/// elements and one vector per step below that, so that a row of 8 is not all scalar remainder:
/// both loops are in the kernel (the test above runs both, at lengths on each side).
#[test]
fn symbolic_rows_have_an_unrolled_and_a_short_vector_loop() {
    let text = kiln_codegen::clif_text(&row_reduce(DType::F32, ReduceOp::Max)).unwrap();
    assert_eq!(text.matches("load.f32x4").count(), 5, "{text}");
}

#[test]
fn max_reduction_propagates_nan_and_empty_gives_identity() {
    let k = row_reduce(DType::F32, ReduceOp::Max);
    let mut vals = vec![1.0f32; 40];
    vals[37] = f32::NAN;
    let mut bufs = [Buf::f32s(&vals), Buf::zeros(DType::F32, 2)];
    jit(&k, &mut bufs, &[20, 2], 0, 2);
    assert_eq!(bufs[1].get(0), V::F(1.0));
    assert!(bufs[1].get(1).f64().is_nan());
    let mut bufs = [Buf::f32s(&[]), Buf::f32s(&[7.0])];
    jit(&k, &mut bufs, &[0, 1], 0, 1);
    assert_eq!(bufs[1].get(0), V::F(f32::NEG_INFINITY));
    let k = row_reduce(DType::I32, ReduceOp::Max);
    let mut bufs = [Buf::zeros(DType::I32, 0), Buf::zeros(DType::I32, 1)];
    jit(&k, &mut bufs, &[0, 1], 0, 1);
    assert_eq!(bufs[1].get(0), V::I32(i32::MIN));
}

#[test]
fn f32_sum_accumulates_in_f64() {
    // 1 + 2^-24 * many: an f32 accumulator would stay at 1.
    let k = row_reduce(DType::F32, ReduceOp::Sum);
    let mut vals = vec![2f32.powi(-24); 1001];
    vals[0] = 1.0;
    let mut bufs = [Buf::f32s(&vals), Buf::zeros(DType::F32, 1)];
    jit(&k, &mut bufs, &[1001, 1], 0, 1);
    let want = (1.0f64 + 1000.0 * 2f64.powi(-24)) as f32;
    assert_eq!(bufs[1].get(0), V::F(want));
}

#[test]
fn masked_loads_pad_without_touching_memory() {
    // out[j] = (1 <= j < n+1) ? in[j-1] : -5, over n+2 outputs: a pad of one on each side. The
    // index j-1 is -1 at j=0: reading it would be out of bounds, the mask must skip it.
    for d in [DType::F32, DType::I64, DType::F16] {
        let mask = IExpr::and(IExpr::lt(c(0), i(0)), IExpr::lt(i(0), IExpr::add(IExpr::Sym(0), c(1))));
        let k = LoopKernel {
            params: vec![p(d, Access::Read), p(d, Access::Write)],
            n_syms: 1,
            body: vec![for_(
                0,
                IExpr::add(IExpr::Sym(0), c(2)),
                true,
                vec![
                    let_(
                        0,
                        d,
                        Inst::Load {
                            buf: 0,
                            index: IExpr::add(i(0), c(-1)),
                            mask: Some(mask.clone()),
                            other: Scalar::Float(-5.0).cast(d),
                        },
                    ),
                    store(1, i(0), 0),
                ],
            )],
        };
        for n in [0usize, 1, 7, 30] {
            let a = Buf::from_vals(d, &sample(d, n, 4));
            check(&k, &[a, Buf::zeros(d, n + 2)], &[n as i64], 0, n as i64 + 2, 0.0, &format!("pad {d} n={n}"));
        }
    }
}

#[test]
fn masked_broadcast_load_in_a_vector_loop() {
    // out[o, j] = (o < 2 ? b[o] : 9) + a[o, j]: the mask depends only on the outer variable.
    let d = DType::F32;
    let k = LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Read), p(d, Access::Write)],
        n_syms: 1,
        body: vec![for_(
            0,
            c(4),
            true,
            vec![for_(
                1,
                IExpr::Sym(0),
                false,
                vec![
                    let_(
                        0,
                        d,
                        Inst::Load {
                            buf: 1,
                            index: i(0),
                            mask: Some(IExpr::lt(i(0), c(2))),
                            other: Scalar::Float(9.0),
                        },
                    ),
                    load(1, d, 0, IExpr::add(IExpr::mul(i(0), IExpr::Sym(0)), i(1))),
                    let_(2, d, Inst::Binary(BinaryOp::Add, r(0), r(1))),
                    store(2, IExpr::add(IExpr::mul(i(0), IExpr::Sym(0)), i(1)), 2),
                ],
            )],
        )],
    };
    for n in [1usize, 5, 16, 19] {
        let a = Buf::from_vals(d, &sample(d, 4 * n, 1));
        let b = Buf::f32s(&[1.0, 2.0]);
        check(&k, &[a, b, Buf::zeros(d, 4 * n)], &[n as i64], 0, 4, 0.0, &format!("n={n}"));
    }
}

#[test]
fn iota_index_values_in_every_dtype() {
    for d in [DType::F32, DType::I32, DType::I64, DType::F64, DType::F16, DType::BF16, DType::Bool] {
        // out[j] = index(3*j + 2 - j*2) = j + 2 (coefficient 1, so vectorized for 32-bit types).
        let e = IExpr::add(IExpr::add(IExpr::mul(c(3), i(0)), c(2)), IExpr::mul(i(0), c(-2)));
        let k = LoopKernel {
            params: vec![p(d, Access::Write)],
            n_syms: 1,
            body: vec![for_(0, IExpr::Sym(0), true, vec![let_(0, d, Inst::Index(e.clone())), store(0, i(0), 0)])],
        };
        for n in SIZES {
            check(&k, &[Buf::zeros(d, n)], &[n as i64], 0, n as i64, 0.0, &format!("iota {d} n={n}"));
        }
    }
}

#[test]
fn nested_loops_with_div_mod_indices_transpose() {
    // out[a, b, c] = in[c, a, b] via a flat index with div/mod: shape (A, B, C) = (s0, 3, 5).
    let d = DType::F32;
    let (bb, cc) = (3i64, 5i64);
    let flat = i(0);
    let a_ = IExpr::div(flat.clone(), c(bb * cc));
    let b_ = IExpr::rem(IExpr::div(flat.clone(), c(cc)), c(bb));
    let c_ = IExpr::rem(flat.clone(), c(cc));
    // input (C, A, B): index c*A*B + a*B + b
    let src = IExpr::add(IExpr::add(IExpr::mul(c_, IExpr::mul(IExpr::Sym(0), c(bb))), IExpr::mul(a_, c(bb))), b_);
    let k = LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Write)],
        n_syms: 1,
        body: vec![for_(0, IExpr::mul(IExpr::Sym(0), c(bb * cc)), true, vec![load(0, d, 0, src), store(1, i(0), 0)])],
    };
    for a in [1usize, 2, 7] {
        let n = a * (bb * cc) as usize;
        let x = Buf::from_vals(d, &sample(d, n, 3));
        check(&k, &[x, Buf::zeros(d, n)], &[a as i64], 0, n as i64, 0.0, &format!("transpose A={a}"));
    }
    // Non-power-of-two and power-of-two divisors, and a symbolic divisor.
    for divisor in [c(4), c(7), IExpr::Sym(1), c(0)] {
        let k = LoopKernel {
            params: vec![p(DType::I64, Access::Write), p(DType::I64, Access::Write)],
            n_syms: 2,
            body: vec![for_(
                0,
                IExpr::Sym(0),
                false,
                vec![
                    let_(0, DType::I64, Inst::Index(IExpr::Div(Box::new(i(0)), Box::new(divisor.clone())))),
                    let_(1, DType::I64, Inst::Index(IExpr::Mod(Box::new(i(0)), Box::new(divisor.clone())))),
                    store(0, i(0), 0),
                    store(1, i(0), 1),
                ],
            )],
        };
        for s1 in [3i64, 0] {
            check(
                &k,
                &[Buf::zeros(DType::I64, 50), Buf::zeros(DType::I64, 50)],
                &[50, s1],
                0,
                1,
                0.0,
                &format!("div {divisor} s1={s1}"),
            );
        }
    }
}

#[test]
fn nested_loops_matmul_like_with_broadcast() {
    // out[m, n] = sum_k a[m, k] * b[k, n] + bias[n]: inner reduction over k is strided in b.
    let d = DType::F32;
    let (m, n, kk) = (5i64, 6i64, 7i64);
    let k = LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Read), p(d, Access::Read), p(d, Access::Write)],
        n_syms: 0,
        body: vec![for_(
            0,
            c(m),
            true,
            vec![for_(
                1,
                c(n),
                false,
                vec![
                    acc_init(0, d, ReduceOp::Sum),
                    for_(
                        2,
                        c(kk),
                        false,
                        vec![
                            load(0, d, 0, IExpr::add(IExpr::mul(i(0), c(kk)), i(2))),
                            load(1, d, 1, IExpr::add(IExpr::mul(i(2), c(n)), i(1))),
                            let_(2, d, Inst::Binary(BinaryOp::Mul, r(0), r(1))),
                            acc_update(0, 2),
                        ],
                    ),
                    let_(3, d, Inst::ReadAcc(Acc(0))),
                    load(4, d, 2, i(1)),
                    let_(5, d, Inst::Binary(BinaryOp::Add, r(3), r(4))),
                    store(3, IExpr::add(IExpr::mul(i(0), c(n)), i(1)), 5),
                ],
            )],
        )],
    };
    let a = Buf::from_vals(
        d,
        &sample(d, (m * kk) as usize, 1)
            .iter()
            .map(|v| if v.f64().is_finite() { *v } else { V::F(1.0) })
            .collect::<Vec<_>>(),
    );
    let b = Buf::from_vals(
        d,
        &sample(d, (kk * n) as usize, 2)
            .iter()
            .map(|v| if v.f64().is_finite() { *v } else { V::F(2.0) })
            .collect::<Vec<_>>(),
    );
    let bias = Buf::from_vals(d, &sample(d, n as usize, 3));
    check(&k, &[a, b, bias, Buf::zeros(d, (m * n) as usize)], &[], 0, m, 1e-6, "matmul");
}

#[test]
fn vectorized_reduction_with_elementwise_prologue() {
    // softmax-ish row pass: s = sum_j exp2(x[j] - 1); also max_j x[j]; both into outputs.
    let d = DType::F32;
    let row = IExpr::add(IExpr::mul(i(0), IExpr::Sym(0)), i(1));
    let k = LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Write), p(d, Access::Write)],
        n_syms: 2,
        body: vec![for_(
            0,
            IExpr::Sym(1),
            true,
            vec![
                acc_init(0, d, ReduceOp::Sum),
                acc_init(1, d, ReduceOp::Max),
                for_(
                    1,
                    IExpr::Sym(0),
                    false,
                    vec![
                        load(0, d, 0, row),
                        let_(1, d, Inst::Const(Scalar::Float(1.0))),
                        let_(2, d, Inst::Binary(BinaryOp::Sub, r(0), r(1))),
                        let_(3, d, Inst::Unary(UnaryOp::Exp2, r(2))),
                        acc_update(0, 3),
                        acc_update(1, 0),
                    ],
                ),
                let_(4, d, Inst::ReadAcc(Acc(0))),
                let_(5, d, Inst::ReadAcc(Acc(1))),
                store(1, i(0), 4),
                store(2, i(0), 5),
            ],
        )],
    };
    for len in SIZES {
        let vals: Vec<V> =
            sample(d, 2 * len, 7).into_iter().map(|v| if v.f64().is_finite() { v } else { V::F(0.25) }).collect();
        check(
            &k,
            &[Buf::from_vals(d, &vals), Buf::zeros(d, 2), Buf::zeros(d, 2)],
            &[len as i64, 2],
            0,
            2,
            2e-6,
            &format!("len={len}"),
        );
    }
    // i32 sum and max vectorized too (wrapping).
    for op in [ReduceOp::Sum, ReduceOp::Max] {
        let k = row_reduce(DType::I32, op);
        let vals = vec![V::I32(i32::MAX); 37];
        check(&k, &[Buf::from_vals(DType::I32, &vals), Buf::zeros(DType::I32, 1)], &[37, 1], 0, 1, 0.0, "i32 wrap");
    }
}

#[test]
fn parallel_sub_ranges_cover_exactly_the_range() {
    let k = unary_kernel(UnaryOp::Neg, DType::F32, DType::F32, IExpr::Sym(0));
    let n = 1001usize;
    let input: Vec<f32> = (0..n).map(|j| j as f32 + 1.0).collect();
    let cuts = [0i64, 1, 17, 18, 500, 999, 1001];
    let mut bufs = [Buf::f32s(&input), Buf::f32s(&vec![0.0; n])];
    for w in cuts.windows(2) {
        jit(&k, &mut bufs, &[n as i64], w[0], w[1]);
    }
    for j in 0..n {
        assert_eq!(bufs[1].get(j), V::F(-(j as f32 + 1.0)), "element {j}");
    }
    // A sub-range touches only its elements; an out-of-range end is clamped to the extent.
    let mut bufs = [Buf::f32s(&input), Buf::f32s(&vec![7.0; n + 8])];
    jit(&k, &mut bufs, &[n as i64], 10, 20);
    for j in 0..n + 8 {
        let want = if (10..20).contains(&j) { -(j as f32 + 1.0) } else { 7.0 };
        assert_eq!(bufs[1].get(j), V::F(want), "element {j}");
    }
    let mut bufs = [Buf::f32s(&input), Buf::f32s(&vec![7.0; n + 8])];
    jit(&k, &mut bufs, &[n as i64], 990, 5000);
    assert_eq!(bufs[1].get(n), V::F(7.0));
    assert_eq!(bufs[1].get(n - 1), V::F(-(n as f32)));
}

#[test]
fn non_parallel_kernel_ignores_the_range() {
    let k = LoopKernel {
        params: vec![p(DType::I32, Access::Write)],
        n_syms: 0,
        body: vec![for_(0, c(9), false, vec![let_(0, DType::I32, Inst::Index(i(0))), store(0, i(0), 0)])],
    };
    let mut bufs = [Buf::zeros(DType::I32, 9)];
    jit(&k, &mut bufs, &[], 0, 1);
    assert_eq!(bufs[0].vals(), (0..9).map(V::I32).collect::<Vec<_>>());
}

#[test]
fn broadcast_and_outer_registers_are_splatted() {
    // out[o, j] = a[j] * s[o] + t, with t computed outside the inner loop.
    let d = DType::F32;
    let k = LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Read), p(d, Access::Write)],
        n_syms: 1,
        body: vec![for_(
            0,
            c(3),
            true,
            vec![
                load(0, d, 1, i(0)),
                let_(1, d, Inst::Unary(UnaryOp::Sqrt, r(0))),
                let_(9, DType::Bool, Inst::Binary(BinaryOp::CmpLt, r(0), r(1))),
                for_(
                    1,
                    IExpr::Sym(0),
                    false,
                    vec![
                        load(2, d, 0, i(1)),
                        let_(3, d, Inst::Binary(BinaryOp::Mul, r(2), r(0))),
                        let_(4, d, Inst::Binary(BinaryOp::Add, r(3), r(1))),
                        let_(5, d, Inst::Where(r(9), r(4), r(2))),
                        store(2, IExpr::add(IExpr::mul(i(0), IExpr::Sym(0)), i(1)), 5),
                    ],
                ),
            ],
        )],
    };
    for n in SIZES {
        let a = Buf::from_vals(d, &sample(d, n, 5));
        let s = Buf::f32s(&[0.25, 4.0, 9.0]);
        check(&k, &[a, s, Buf::zeros(d, 3 * n)], &[n as i64], 0, 3, 0.0, &format!("n={n}"));
    }
}

#[test]
fn int_and_bool_elementwise_vectorize() {
    // i32: out = (a*b - a) / (b | 1) max a; bool out = !(a < b) and (a != 0)
    let d = DType::I32;
    let k = LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Read), p(d, Access::Write), p(DType::Bool, Access::Write)],
        n_syms: 1,
        body: vec![for_(
            0,
            IExpr::Sym(0),
            true,
            vec![
                load(0, d, 0, i(0)),
                load(1, d, 1, i(0)),
                let_(2, d, Inst::Binary(BinaryOp::Mul, r(0), r(1))),
                let_(3, d, Inst::Binary(BinaryOp::Sub, r(2), r(0))),
                let_(4, d, Inst::Const(Scalar::Int(1))),
                let_(5, d, Inst::Binary(BinaryOp::Or, r(1), r(4))),
                let_(6, d, Inst::Binary(BinaryOp::Div, r(3), r(5))),
                let_(7, d, Inst::Binary(BinaryOp::Max, r(6), r(0))),
                let_(8, d, Inst::Binary(BinaryOp::Mod, r(7), r(1))),
                store(2, i(0), 8),
                let_(9, DType::Bool, Inst::Binary(BinaryOp::CmpLt, r(0), r(1))),
                let_(10, DType::Bool, Inst::Unary(UnaryOp::Not, r(9))),
                let_(11, DType::Bool, Inst::Cast(r(0))),
                let_(12, DType::Bool, Inst::Binary(BinaryOp::And, r(10), r(11))),
                let_(13, DType::Bool, Inst::Binary(BinaryOp::CmpLt, r(12), r(9))),
                store(3, i(0), 13),
            ],
        )],
    };
    for n in SIZES {
        let a = Buf::from_vals(d, &sample(d, n, 1));
        let b = Buf::from_vals(d, &sample(d, n, 2));
        check(
            &k,
            &[a, b, Buf::zeros(d, n), Buf::zeros(DType::Bool, n)],
            &[n as i64],
            0,
            n as i64,
            0.0,
            &format!("n={n}"),
        );
    }
}

#[test]
fn matmul_kernels_and_invalid_kernels_are_errors() {
    use kiln_codegen::{CodegenError, CpuCompiler};
    use lower::kir::{Kernel, MatOperand, MatmulKernel};
    let compiler = CpuCompiler::new().unwrap();
    let op = |buf| MatOperand { buf, offset: c(0), batch_stride: c(0), row_stride: c(1), col_stride: c(1) };
    let mm = Kernel::Matmul(MatmulKernel {
        params: vec![],
        n_syms: 0,
        dtype: DType::F32,
        batch: c(1),
        m: c(1),
        n: c(1),
        k: c(1),
        a: op(0),
        b: op(1),
        c: op(2),
        accumulate: false,
    });
    assert!(matches!(compiler.compile_kernel(&mm), Err(CodegenError::Matmul)));
    // Undefined register, buffer out of range, symbol out of range, variable out of scope.
    let bad = [
        vec![store(0, c(0), 5)],
        vec![load(0, DType::F32, 3, c(0))],
        vec![load(0, DType::F32, 0, IExpr::Sym(4)), store(0, c(0), 0)],
        vec![load(0, DType::F32, 0, i(2)), store(0, c(0), 0)],
        vec![let_(0, DType::F32, Inst::Unary(UnaryOp::Not, r(0)))],
    ];
    for body in bad {
        let k = LoopKernel { params: vec![p(DType::F32, Access::Write)], n_syms: 0, body };
        let e = compiler.compile(&k);
        assert!(e.is_err(), "{k:?}");
    }
    assert_eq!(compiler.stats().failures, 5);
    // Arity is checked by `run`.
    let k = unary_kernel(UnaryOp::Neg, DType::F32, DType::F32, c(1));
    let compiled = compiler.compile(&k).unwrap();
    let err = unsafe { compiled.run(&[], &[1], 0, 1) };
    assert!(matches!(err, Err(CodegenError::Arity { .. })));
}

/// A 2x2, stride-2 pooling of `rows * 2` rows of `w` elements into `rows x cols` outputs:
/// `out[r, c] = reduce over (i, j) in 2x2 of in[(2r + i) * w + 2c + j]`, the window loops
/// constant (they unroll) and the column loop vectorized with stride-2 loads and one
/// accumulator per lane.
fn pool_2x2(d: DType, op: ReduceOp, cols: i64, w: i64) -> LoopKernel {
    let at = IExpr::add(
        IExpr::add(IExpr::mul(IExpr::add(IExpr::mul(i(0), c(2)), i(2)), c(w)), IExpr::mul(i(1), c(2))),
        i(3),
    );
    LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Write)],
        n_syms: 1,
        body: vec![for_(
            0,
            IExpr::Sym(0),
            true,
            vec![for_(
                1,
                c(cols),
                false,
                vec![
                    acc_init(0, d, op),
                    for_(2, c(2), false, vec![for_(3, c(2), false, vec![load(0, d, 0, at.clone()), acc_update(0, 0)])]),
                    let_(1, d, Inst::ReadAcc(Acc(0))),
                    store(1, IExpr::add(IExpr::mul(i(0), c(cols)), i(1)), 1),
                ],
            )],
        )],
    }
}

#[test]
fn pooling_windows_vectorize_lane_wise_with_stride_two_loads() {
    for (d, op) in [(DType::F32, ReduceOp::Max), (DType::I32, ReduceOp::Max), (DType::I32, ReduceOp::Sum)] {
        // 13 and 21 columns: a vector main loop and a scalar tail; 3: the tail alone. The row is
        // one element wider than the windows need, and the last row ends the buffer.
        for cols in [3, 13, 21] {
            let (rows, w) = (3, 2 * cols + 1);
            let k = pool_2x2(d, op, cols, w);
            let text = kiln_codegen::clif_text(&k).unwrap();
            assert_eq!(text.contains("shuffle"), cols >= 4, "{d} {op:?} cols={cols}: {text}");
            let a = Buf::from_vals(d, &sample(d, (2 * rows * w) as usize, cols as u64));
            let o = Buf::zeros(d, (rows * cols) as usize);
            check(&k, &[a, o], &[rows], 0, rows, 0.0, &format!("pool {op:?} {d} cols={cols}"));
        }
    }
}

/// `out[r, j] = in[r - 1, j - 1]` inside a border of one (`-5` on it), over `rows + 2` rows of
/// `cols + 2` outputs: the column loop splits at its two cuts into border and interior segments,
/// and the interior, unmasked along the columns, vectorizes. With `symbolic`, the column extent
/// is a symbol, so the last segment runs to it.
fn padded_copy(symbolic: bool, cols: i64) -> LoopKernel {
    let hi = if symbolic { IExpr::Sym(1) } else { c(cols + 1) };
    let extent = if symbolic { IExpr::add(IExpr::Sym(1), c(1)) } else { c(cols + 2) };
    let inside = |v: u32, hi: IExpr| IExpr::and(IExpr::lt(c(0), i(v)), IExpr::lt(i(v), hi));
    let mask = IExpr::and(inside(0, IExpr::add(IExpr::Sym(0), c(1))), inside(1, hi));
    let width = if symbolic { IExpr::add(IExpr::Sym(1), c(-1)) } else { c(cols) };
    let index = IExpr::add(IExpr::add(IExpr::mul(IExpr::add(i(0), c(-1)), width), i(1)), c(-1));
    let out_width = IExpr::add(extent.clone(), c(0));
    LoopKernel {
        params: vec![p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
        n_syms: 2,
        body: vec![for_(
            0,
            IExpr::add(IExpr::Sym(0), c(2)),
            true,
            vec![for_(
                1,
                extent,
                false,
                vec![
                    let_(0, DType::F32, Inst::Load { buf: 0, index, mask: Some(mask), other: Scalar::Float(-5.0) }),
                    let_(1, DType::Bool, Inst::Index(inside(1, IExpr::Const(cols + 1)))),
                    let_(2, DType::F32, Inst::Cast(lower::kir::Reg(1))),
                    let_(3, DType::F32, Inst::Binary(BinaryOp::Add, lower::kir::Reg(0), lower::kir::Reg(2))),
                    store(1, IExpr::add(IExpr::mul(i(0), out_width), i(1)), 3),
                ],
            )],
        )],
    }
}

#[test]
fn masked_borders_split_from_a_vectorized_interior() {
    for symbolic in [false, true] {
        for cols in [1i64, 3, 9, 30] {
            let rows = 3i64;
            let k = padded_copy(symbolic, cols);
            // (Rows of up to 12 outputs unroll fully instead: short constant loops.)
            if !symbolic && cols >= 16 {
                let text = kiln_codegen::clif_text(&k).unwrap();
                assert!(text.contains("f32x4"), "cols={cols}: {text}");
            }
            let a = Buf::from_vals(DType::F32, &sample(DType::F32, (rows * cols) as usize, cols as u64));
            let out = Buf::zeros(DType::F32, ((rows + 2) * (cols + 2)) as usize);
            let syms = [rows, cols + 1];
            check(&k, &[a, out], &syms, 0, rows + 2, 0.0, &format!("padded copy cols={cols} symbolic={symbolic}"));
        }
    }
}
/// `0 < i(v) < hi`: inside a border of one.
fn inside(v: u32, hi: IExpr) -> IExpr {
    IExpr::and(IExpr::lt(c(0), i(v)), IExpr::lt(i(v), hi))
}

/// Rows `i(r)` of a padded plane (`rows` inside a border of one) and columns `i(r + 1)` up to
/// `columns`, `body` inside.
fn padded_plane(r: u32, rows: i64, columns: IExpr, body: Vec<Stmt>) -> Stmt {
    for_(r, c(rows + 2), false, vec![for_(r + 1, columns, false, body)])
}

/// The end of a padded row's interior and the row's length, `cols` interior columns with a
/// border of one: constants, or with `symbolic` in terms of `Sym(1) = cols + 1`.
fn padded_columns(symbolic: bool, cols: i64) -> (IExpr, IExpr) {
    if symbolic { (IExpr::Sym(1), IExpr::add(IExpr::Sym(1), c(1))) } else { (c(cols + 1), c(cols + 2)) }
}

/// A BatchNorm+ReLU written into a padded plane (MobileNet's pad kernels): `out[r, j] = inside ?
/// max(in[r - 1, j - 1] * s + t, 0) : -5`, every load masked by `inside` (rows and columns
/// compared with constants) and the border chosen by a `where` on the same comparison. In each
/// segment of the split, the masks and the `where` fold: the border is stores of its value, the
/// interior the arithmetic alone, with no select but the ReLU's left; the values are the
/// evaluator's for constant and symbolic widths.
#[test]
fn a_where_on_the_border_folds_with_its_masks_in_each_segment() {
    for symbolic in [false, true] {
        for (rows, cols) in [(1i64, 1i64), (3, 7), (4, 16), (5, 33)] {
            let (hi_c, ext_c) = padded_columns(symbolic, cols);
            let mask = IExpr::and(inside(0, c(rows + 1)), inside(1, hi_c.clone()));
            let index = IExpr::add(IExpr::mul(IExpr::add(i(0), c(-1)), c(cols)), IExpr::add(i(1), c(-1)));
            let masked =
                |buf: u32, index: IExpr| Inst::Load { buf, index, mask: Some(mask.clone()), other: Scalar::Float(0.0) };
            let reg = lower::kir::Reg;
            let k = LoopKernel {
                params: vec![p(DType::F32, Access::Read), p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
                n_syms: 2,
                body: vec![padded_plane(
                    0,
                    rows,
                    ext_c,
                    vec![
                        let_(0, DType::F32, masked(0, index)),
                        let_(1, DType::F32, masked(1, c(0))),
                        let_(2, DType::F32, masked(1, c(1))),
                        let_(3, DType::F32, Inst::Binary(BinaryOp::Mul, reg(0), reg(1))),
                        let_(4, DType::F32, Inst::Binary(BinaryOp::Add, reg(3), reg(2))),
                        let_(5, DType::F32, Inst::Const(Scalar::Float(0.0))),
                        let_(6, DType::F32, Inst::Binary(BinaryOp::Max, reg(4), reg(5))),
                        let_(7, DType::Bool, Inst::Index(mask.clone())),
                        let_(8, DType::F32, Inst::Const(Scalar::Float(-5.0))),
                        let_(9, DType::F32, Inst::Where(reg(7), reg(6), reg(8))),
                        store(2, IExpr::add(IExpr::mul(i(0), c(cols + 2)), i(1)), 9),
                    ],
                )],
            };
            if !symbolic {
                let text = kiln_codegen::clif_text(&k).unwrap();
                // Each ReLU is one compare and one select; a `where` left would add a select.
                assert_eq!(
                    text.matches("select").count(),
                    text.matches("fcmp ugt").count(),
                    "rows={rows} cols={cols}: {text}"
                );
            }
            let a = Buf::from_vals(DType::F32, &sample(DType::F32, (rows * cols) as usize, cols as u64));
            let st = Buf::f32s(&[1.5, -0.25]);
            let o = Buf::zeros(DType::F32, ((rows + 2) * (cols + 2)) as usize);
            let what = format!("padded BatchNorm+ReLU rows={rows} cols={cols} symbolic={symbolic}");
            check(&k, &[a, st, o], &[rows, cols + 1], 0, 1, 0.0, &what);
        }
    }
}

/// Under a constant extent, each segment's trip count is known: a one-column border is
/// straight-line code, and an interior of 16 columns runs as unrolled vectors with no scalar
/// tail. The padded copy's kernel had 23 branches when every segment was a vector loop with a
/// tail; it now has 8 (one loop per row, the interior's vector loop, the checks around them).
#[test]
fn constant_segments_unroll_their_borders_and_drop_their_tails() {
    let text = kiln_codegen::clif_text(&padded_copy(false, 16)).unwrap();
    assert!(text.matches("brif").count() <= 10, "{text}");
    assert!(text.contains("f32x4"), "{text}");
}

/// A padded plane per batch (a depthwise convolution's padded input): `out[b, r, j] = in[b, r -
/// 1, j - 1] * 2` inside a border of one (`-5` on it), the masks comparing both the row and the
/// column with constants. The row loop splits too (the masks sit in its nested column loop), so
/// the interior rows' column loops are unmasked by rows and split by columns in turn; every
/// segment must still compute the evaluator's values, for constant and symbolic widths.
#[test]
fn nested_masks_split_the_row_loop_as_well() {
    for symbolic in [false, true] {
        for (rows, cols) in [(1i64, 1i64), (2, 5), (4, 16), (5, 33)] {
            let (hi_c, ext_c) = padded_columns(symbolic, cols);
            let mask = IExpr::and(inside(1, c(rows + 1)), inside(2, hi_c.clone()));
            let index = IExpr::add(
                IExpr::add(IExpr::mul(i(0), c(rows * cols)), IExpr::mul(IExpr::add(i(1), c(-1)), c(cols))),
                IExpr::add(i(2), c(-1)),
            );
            let out = IExpr::add(
                IExpr::add(IExpr::mul(i(0), c((rows + 2) * (cols + 2))), IExpr::mul(i(1), c(cols + 2))),
                i(2),
            );
            let k = LoopKernel {
                params: vec![p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
                n_syms: 2,
                body: vec![for_(
                    0,
                    IExpr::Sym(0),
                    true,
                    vec![
                        let_(9, DType::F32, Inst::Const(Scalar::Float(2.0))),
                        padded_plane(
                            1,
                            rows,
                            ext_c,
                            vec![
                                let_(
                                    0,
                                    DType::F32,
                                    Inst::Load { buf: 0, index, mask: Some(mask), other: Scalar::Float(-5.0) },
                                ),
                                let_(
                                    1,
                                    DType::F32,
                                    Inst::Binary(BinaryOp::Mul, lower::kir::Reg(0), lower::kir::Reg(9)),
                                ),
                                store(1, out, 1),
                            ],
                        ),
                    ],
                )],
            };
            let batch = 3;
            let a = Buf::from_vals(DType::F32, &sample(DType::F32, (batch * rows * cols) as usize, cols as u64));
            let o = Buf::zeros(DType::F32, (batch * (rows + 2) * (cols + 2)) as usize);
            check(
                &k,
                &[a, o],
                &[batch, cols + 1],
                0,
                batch,
                0.0,
                &format!("rows={rows} cols={cols} symbolic={symbolic}"),
            );
        }
    }
}

//! Golden CLIF dump of one small kernel, the vectorization decisions as seen in the dumps, and
//! the kernel cache.

use crate::common;

use air::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};
use common::*;
use expect_test::expect;
use kiln_codegen::{CpuCompiler, clif_text};
use lower::kir::{Acc, Access, IExpr, Inst, LoopKernel, Stmt};

#[test]
fn golden_clif_of_a_small_scalar_kernel() {
    // i64 is not vectorized, so the dump stays small: out[i] = in[i] + 1 for i in 0..3, a short
    // constant loop of a small body, emitted as three straight-line copies (no loop left).
    let mut k = LoopKernel {
        params: vec![p(DType::I64, Access::Read), p(DType::I64, Access::Write)],
        n_syms: 0,
        body: vec![for_(
            0,
            c(3),
            false,
            vec![
                load(0, DType::I64, 0, i(0)),
                let_(1, DType::I64, Inst::Const(Scalar::Int(1))),
                let_(2, DType::I64, Inst::Binary(BinaryOp::Add, r(0), r(1))),
                store(1, i(0), 2),
            ],
        )],
    };
    expect![[r#"
        function u0:0(i64, i64, i64, i64) system_v {
        block0(v0: i64, v1: i64, v2: i64, v3: i64):
            v4 = load.i64 notrap v0
            v5 = load.i64 notrap v0+8
            v6 = iconst.i64 0
            v7 = iconst.i64 3
            v8 = ishl v6, v7  ; v6 = 0, v7 = 3
            v9 = iadd v4, v8
            v10 = load.i64 notrap v9
            v11 = iconst.i64 1
            v12 = iadd v10, v11  ; v11 = 1
            v13 = iadd v5, v8
            store notrap v12, v13
            v14 = iconst.i64 3
            v15 = ishl v11, v14  ; v11 = 1, v14 = 3
            v16 = iadd v4, v15
            v17 = load.i64 notrap v16
            v18 = iadd v17, v11  ; v11 = 1
            v19 = iadd v5, v15
            store notrap v18, v19
            v20 = iconst.i64 2
            v21 = iconst.i64 3
            v22 = ishl v20, v21  ; v20 = 2, v21 = 3
            v23 = iadd v4, v22
            v24 = load.i64 notrap v23
            v25 = iadd v24, v11  ; v11 = 1
            v26 = iadd v5, v22
            store notrap v25, v26
            return
        }
    "#]]
    .assert_eq(&clif_text(&k).unwrap());
    // The same body over 0..100 stays a loop.
    let Stmt::Loop { extent, .. } = &mut k.body[0] else { unreachable!() };
    *extent = c(100);
    assert!(clif_text(&k).unwrap().contains("brif"));
}

#[test]
fn vectorization_decisions() {
    let neg = unary_kernel(UnaryOp::Neg, DType::F32, DType::F32, IExpr::Sym(0));
    assert!(clif_text(&neg).unwrap().contains("f32x4"));
    let neg64 = unary_kernel(UnaryOp::Neg, DType::F64, DType::F64, IExpr::Sym(0));
    assert!(!clif_text(&neg64).unwrap().contains("x4"));
    // Stride-2 loads (a pooling's columns) are two vector loads and a shuffle; wider strides
    // stay scalar.
    let strided = |stride: i64| LoopKernel {
        params: vec![p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
        n_syms: 0,
        body: vec![for_(0, c(8), true, vec![load(0, DType::F32, 0, IExpr::mul(i(0), c(stride))), store(1, i(0), 0)])],
    };
    let text = clif_text(&strided(2)).unwrap();
    assert!(text.contains("f32x4") && text.contains("shuffle"), "{text}");
    assert!(!clif_text(&strided(3)).unwrap().contains("x4"));
    // An f32 sum reduction gets f64x2 partial accumulators.
    let sum = LoopKernel {
        params: vec![p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
        n_syms: 0,
        body: vec![
            Stmt::AccInit { acc: Acc(0), dtype: DType::F32, op: ReduceOp::Sum },
            for_(0, c(64), false, vec![load(0, DType::F32, 0, i(0)), Stmt::AccUpdate { acc: Acc(0), value: r(0) }]),
            let_(1, DType::F32, Inst::ReadAcc(Acc(0))),
            store(1, c(0), 1),
        ],
    };
    let text = clif_text(&sum).unwrap();
    assert!(text.contains("f64x2") && text.contains("fvpromote_low"), "{text}");
}

#[test]
fn identical_kernels_compile_once() {
    let compiler = CpuCompiler::new().unwrap();
    // Counts compiles: element-wise nests compile rather than run natively at first.
    compiler.set_native_maps(false);
    let a = unary_kernel(UnaryOp::Sqrt, DType::F32, DType::F32, IExpr::Sym(0));
    let b = a.clone();
    let ka = compiler.compile(&a).unwrap();
    let kb = compiler.compile(&b).unwrap();
    assert!(std::sync::Arc::ptr_eq(&ka, &kb));
    let other = unary_kernel(UnaryOp::Neg, DType::F32, DType::F32, IExpr::Sym(0));
    compiler.compile(&other).unwrap();
    let s = compiler.stats();
    assert_eq!((s.hits, s.misses, s.compiled, s.failures, s.arenas), (1, 2, 2, 0, 1));
    assert!(s.compile_time > std::time::Duration::ZERO);
    assert_eq!(compiler.cached(), 2);
    // Cached kernels stay callable after the cache is cleared.
    compiler.clear_cache();
    let mut bufs = [Buf::f32s(&[4.0, 9.0]), Buf::f32s(&[0.0, 0.0])];
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.bytes.as_mut_ptr()).collect();
    unsafe { ka.run(&ptrs, &[2], 0, 2).unwrap() };
    assert_eq!(bufs[1].vals(), vec![V::F(2.0), V::F(3.0)]);
    compiler.compile(&a).unwrap();
    assert_eq!(compiler.stats().misses, 3);
}

#[test]
fn compiled_kernels_are_send_and_sync_and_run_from_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<kiln_codegen::CompiledKernel>();
    assert_send_sync::<CpuCompiler>();
    let compiler = std::sync::Arc::new(CpuCompiler::new().unwrap());
    let n = 10_000usize;
    let k = unary_kernel(UnaryOp::Neg, DType::F32, DType::F32, IExpr::Sym(0));
    let compiled = compiler.compile(&k).unwrap();
    let input: Vec<f32> = (0..n).map(|j| j as f32).collect();
    let mut out = vec![0f32; n];
    let (inp, outp) = (input.as_ptr() as usize, out.as_mut_ptr() as usize);
    std::thread::scope(|s| {
        for t in 0..4i64 {
            let compiled = compiled.clone();
            s.spawn(move || {
                let ptrs = [inp as *mut u8, outp as *mut u8];
                let chunk = n as i64 / 4;
                // SAFETY: the threads write disjoint ranges of `out`.
                unsafe { compiled.run(&ptrs, &[n as i64], t * chunk, (t + 1) * chunk).unwrap() };
            });
        }
    });
    assert!(out.iter().enumerate().all(|(j, &x)| x == -(j as f32)));
}

//! The vector loop's shape: unrolled copies addressed by immediate offsets, the scalar tail,
//! constants shared across copies (emitted once), and a compiler that reuses its Cranelift
//! context across compilations, failed ones included.

use crate::common;

use air::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};
use common::*;
use kiln_codegen::{CpuCompiler, TileLevel, TileMode, Tiling, clif_text, clif_text_with};
use lower::kir::{Acc, Access, IExpr, Inst, LoopKernel, Stmt};

/// `out[i] = exp2(a[i] * 0.25 + b[0]) + float(i) - a[i] * 0.25`: a body of more than three
/// statements (two unrolled copies) with an iota, a broadcast load and a repeated constant.
fn mixed() -> LoopKernel {
    let f = DType::F32;
    LoopKernel {
        params: vec![p(f, Access::Read), p(f, Access::Read), p(f, Access::Write)],
        n_syms: 1,
        body: vec![for_(
            0,
            IExpr::Sym(0),
            true,
            vec![
                load(0, f, 0, i(0)),
                let_(1, f, Inst::Const(Scalar::Float(0.25))),
                let_(2, f, Inst::Binary(BinaryOp::Mul, r(0), r(1))),
                load(3, f, 1, c(0)),
                let_(4, f, Inst::Binary(BinaryOp::Add, r(2), r(3))),
                let_(5, f, Inst::Unary(UnaryOp::Exp2, r(4))),
                let_(6, DType::I32, Inst::Index(i(0))),
                let_(7, f, Inst::Cast(r(6))),
                let_(8, f, Inst::Binary(BinaryOp::Add, r(5), r(7))),
                let_(9, f, Inst::Const(Scalar::Float(0.25))),
                let_(10, f, Inst::Binary(BinaryOp::Mul, r(0), r(9))),
                let_(11, f, Inst::Binary(BinaryOp::Sub, r(8), r(10))),
                store(2, i(0), 11),
            ],
        )],
    }
}

#[test]
fn unrolled_copies_and_tails_match_the_interpreter() {
    let compiler = CpuCompiler::new().unwrap();
    // The unrolled code itself: element-wise nests compile rather than run natively at first.
    compiler.set_native_maps(false);
    let neg = unary_kernel(UnaryOp::Neg, DType::F32, DType::F32, IExpr::Sym(0));
    let mixed = mixed();
    for n in 0..=41usize {
        let a: Vec<f32> = (0..n).map(|j| (j as f32 * 0.37).sin() * 8.0).collect();
        for start in [0, 1, 3, 5] {
            let (start, end) = (start.min(n as i64), n as i64);
            let mut bufs = [Buf::f32s(&a), Buf::zeros(DType::F32, n)];
            let mut want = bufs.clone();
            jit_with(&compiler, &neg, &mut bufs, &[n as i64], start, end);
            eval(&neg, &mut want, &[n as i64], start, end);
            assert_bufs_close(&bufs[1], &want[1], 0.0, &format!("neg n={n} start={start}"));

            let mut bufs = [Buf::f32s(&a), Buf::f32s(&[-1.5]), Buf::zeros(DType::F32, n)];
            let mut want = bufs.clone();
            jit_with(&compiler, &mixed, &mut bufs, &[n as i64], start, end);
            eval(&mixed, &mut want, &[n as i64], start, end);
            assert_bufs_close(&bufs[2], &want[2], 1e-6, &format!("mixed n={n} start={start}"));
        }
    }
    assert_eq!(compiler.stats().compiled, 2);
}

#[test]
fn constants_are_emitted_once_per_kernel() {
    let text = clif_text(&mixed()).unwrap();
    let consts: Vec<&str> = text.lines().filter(|l| l.contains("f32const")).map(|l| l.trim()).collect();
    let mut values: Vec<&str> = consts.iter().map(|l| l.rsplit(' ').next().unwrap_or("")).collect();
    let all = values.len();
    values.sort_unstable();
    values.dedup();
    assert_eq!(values.len(), all, "a constant emitted twice:\n{text}");
    // 0.25 appears in the kernel twice and in both the vector and the scalar bodies.
    assert_eq!(consts.iter().filter(|l| l.ends_with("0x1.000000p-2")).count(), 1, "{text}");
    // Vector accesses of the second unrolled copy use an immediate offset, not a new index.
    assert!(buffer_accesses(&text).contains("+16"), "{text}");
}

#[test]
fn compiler_recovers_after_errors_and_reuses_its_context() {
    let compiler = CpuCompiler::new().unwrap();
    // Counts compiles: tiled and element-wise kernels compile rather than run natively at first.
    compiler.set_native_tiles(false);
    compiler.set_native_maps(false);
    let bad = LoopKernel {
        params: vec![p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
        n_syms: 1,
        body: vec![for_(0, IExpr::Sym(0), true, vec![load(0, DType::F32, 0, IExpr::Sym(3)), store(1, i(0), 0)])],
    };
    let ops = [UnaryOp::Neg, UnaryOp::Sqrt, UnaryOp::Exp2, UnaryOp::Log2, UnaryOp::Recip];
    for (round, op) in ops.iter().enumerate() {
        assert!(compiler.compile(&bad).is_err());
        let k = unary_kernel(*op, DType::F32, DType::F32, IExpr::Sym(0));
        let n = 23 + round;
        let a: Vec<f32> = (0..n).map(|j| 0.5 + j as f32 * 0.75).collect();
        check(&k, &[Buf::f32s(&a), Buf::zeros(DType::F32, n)], &[n as i64], 0, n as i64, 2.5e-7, &format!("{op:?}"));
        let mut bufs = [Buf::f32s(&a), Buf::zeros(DType::F32, n)];
        let mut want = bufs.clone();
        jit_with(&compiler, &k, &mut bufs, &[n as i64], 0, n as i64);
        eval(&k, &mut want, &[n as i64], 0, n as i64);
        assert_bufs_close(&bufs[1], &want[1], 2.5e-7, &format!("{op:?} after an error"));
    }
    let s = compiler.stats();
    assert_eq!((s.compiled, s.failures), (5, 5));
}

/// `count` sigmoids applied in turn to `x`, registers from `first` on; returns the last register.
fn sigmoids(body: &mut Vec<Stmt>, x: u32, first: u32, count: u32) -> u32 {
    let f = DType::F32;
    let mut x = x;
    let mut n = first;
    for _ in 0..count {
        body.extend([
            let_(n, f, Inst::Unary(UnaryOp::Neg, r(x))),
            let_(n + 1, f, Inst::Const(Scalar::Float(std::f64::consts::LOG2_E))),
            let_(n + 2, f, Inst::Binary(BinaryOp::Mul, r(n), r(n + 1))),
            let_(n + 3, f, Inst::Unary(UnaryOp::Exp2, r(n + 2))),
            let_(n + 4, f, Inst::Const(Scalar::Float(1.0))),
            let_(n + 5, f, Inst::Binary(BinaryOp::Add, r(n + 4), r(n + 3))),
            let_(n + 6, f, Inst::Unary(UnaryOp::Recip, r(n + 5))),
        ]);
        x = n + 6;
        n += 7;
    }
    x
}

/// `out[i]` = `count` sigmoids of `in[i]` applied in turn.
fn sigmoid_chain(count: u32) -> LoopKernel {
    let f = DType::F32;
    let mut body = vec![load(0, f, 0, i(0))];
    let out = sigmoids(&mut body, 0, 1, count);
    body.push(store(1, i(0), out));
    LoopKernel {
        params: vec![p(f, Access::Read), p(f, Access::Write)],
        n_syms: 1,
        body: vec![for_(0, IExpr::Sym(0), true, body)],
    }
}

/// `clif`'s lines but the vector math's constants, read-only loads from the table of splats
/// at offsets of their own: what is left of offsets is the buffers' accesses.
fn buffer_accesses(clif: &str) -> String {
    clif.lines().filter(|l| !l.contains("readonly")).collect::<Vec<_>>().join("\n")
}

/// The JIT-only tiling (no routine calls) and a compiler set to it.
fn jit_only() -> (Tiling, CpuCompiler) {
    let tiling = Tiling { mode: TileMode::Off, level: TileLevel::Base };
    let compiler = CpuCompiler::new().unwrap();
    compiler.set_tiling(tiling);
    (tiling, compiler)
}

/// A fused chain of sigmoids is a long body: four copies, interleaved statement by statement
/// (when the JIT runs it itself, not tiled: see tests/it/tile.rs for that).
#[test]
fn long_bodies_interleave_four_copies_and_match_the_interpreter() {
    let f = DType::F32;
    let (jit_only, compiler) = jit_only();
    let chain = sigmoid_chain(3);
    // Four interleaved copies: the second copy's first load (+16 bytes) comes before the first
    // copy's second statement, and the fourth copy's store is at +48.
    let text = buffer_accesses(&clif_text_with(&chain, jit_only).unwrap());
    assert!(text.contains("+48"), "{text}");
    for n in [0usize, 1, 15, 16, 17, 33, 47, 100] {
        let a: Vec<f32> = (0..n).map(|j| (j as f32 * 0.37).sin() * 8.0).collect();
        for start in [0, 3] {
            let (start, end) = (start.min(n as i64), n as i64);
            let mut bufs = [Buf::f32s(&a), Buf::zeros(f, n)];
            let mut want = bufs.clone();
            jit_with(&compiler, &chain, &mut bufs, &[n as i64], start, end);
            eval(&chain, &mut want, &[n as i64], start, end);
            assert_bufs_close(&bufs[1], &want[1], 1e-5, &format!("chain n={n} start={start}"));
        }
    }
}

/// A long body that ends in a reduction: one partial sum per interleaved copy.
#[test]
fn long_bodies_with_a_reduction_match_the_interpreter() {
    let f = DType::F32;
    let mut inner = vec![load(0, f, 0, IExpr::add(IExpr::mul(i(0), IExpr::Sym(0)), i(1)))];
    let out = sigmoids(&mut inner, 0, 1, 3);
    inner.push(Stmt::AccUpdate { acc: Acc(0), value: r(out) });
    let k = LoopKernel {
        params: vec![p(f, Access::Read), p(f, Access::Write)],
        n_syms: 2,
        body: vec![for_(
            0,
            IExpr::Sym(1),
            true,
            vec![
                Stmt::AccInit { acc: Acc(0), dtype: f, op: ReduceOp::Sum },
                for_(1, IExpr::Sym(0), false, inner),
                let_(100, f, Inst::ReadAcc(Acc(0))),
                store(1, i(0), 100),
            ],
        )],
    };
    for cols in [1usize, 7, 16, 37] {
        let rows = 3;
        let a: Vec<f32> = (0..rows * cols).map(|j| (j as f32 * 0.61).cos() * 6.0).collect();
        let mut bufs = [Buf::f32s(&a), Buf::zeros(f, rows)];
        let mut want = bufs.clone();
        let syms = [cols as i64, rows as i64];
        jit(&k, &mut bufs, &syms, 0, rows as i64);
        eval(&k, &mut want, &syms, 0, rows as i64);
        assert_bufs_close(&bufs[1], &want[1], 1e-5, &format!("reduction cols={cols}"));
    }
}

/// A body whose ops expand to many instructions (eight `exp2`s in 58 statements) counts by its
/// expansion: two copies, where eight plain statements each would have been four.
#[test]
fn expensive_bodies_keep_two_copies_and_match_the_interpreter() {
    let f = DType::F32;
    let (jit_only, compiler) = jit_only();
    let chain = sigmoid_chain(8);
    let text = buffer_accesses(&clif_text_with(&chain, jit_only).unwrap());
    assert!(text.contains("+16") && !text.contains("+32"), "{text}");
    for n in [0usize, 1, 7, 8, 9, 33] {
        let a: Vec<f32> = (0..n).map(|j| (j as f32 * 0.37).sin() * 8.0).collect();
        let mut bufs = [Buf::f32s(&a), Buf::zeros(f, n)];
        let mut want = bufs.clone();
        jit_with(&compiler, &chain, &mut bufs, &[n as i64], 0, n as i64);
        eval(&chain, &mut want, &[n as i64], 0, n as i64);
        assert_bufs_close(&bufs[1], &want[1], 1e-5, &format!("chain n={n}"));
    }
}

/// An inner loop of a known trip count that the unrolled vector loop covers has no scalar tail
/// (no scalar load in the kernel); one it does not cover keeps it. Both match the interpreter.
#[test]
fn a_covered_trip_count_has_no_scalar_tail() {
    let f = DType::F32;
    let (jit_only, compiler) = jit_only();
    let rows = |width: i64| {
        let at = IExpr::Add(Box::new(IExpr::Mul(Box::new(i(0)), Box::new(c(width)))), Box::new(i(1)));
        LoopKernel {
            params: vec![p(f, Access::Read), p(f, Access::Write)],
            n_syms: 1,
            body: vec![for_(
                0,
                IExpr::Sym(0),
                true,
                vec![for_(
                    1,
                    c(width),
                    false,
                    vec![
                        load(0, f, 0, at.clone()),
                        let_(1, f, Inst::Unary(UnaryOp::Neg, r(0))),
                        store(1, at.clone(), 1),
                    ],
                )],
            )],
        }
    };
    for (width, tail) in [(32, false), (34, true)] {
        let k = rows(width);
        let text = clif_text_with(&k, jit_only).unwrap();
        assert_eq!(text.contains("load.f32 "), tail, "width {width}:\n{text}");
        let n = 3usize;
        let a: Vec<f32> = (0..n * width as usize).map(|j| j as f32 - 40.0).collect();
        let mut bufs = [Buf::f32s(&a), Buf::zeros(f, a.len())];
        let mut want = bufs.clone();
        jit_with(&compiler, &k, &mut bufs, &[n as i64], 0, n as i64);
        eval(&k, &mut want, &[n as i64], 0, n as i64);
        assert_bufs_close(&bufs[1], &want[1], 0.0, &format!("rows of {width}"));
    }
}

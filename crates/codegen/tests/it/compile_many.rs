//! `CpuCompiler::compile_many`: batches compile to the same code as single compiles (run and
//! compared bit for bit, helper calls and their relocations included), share the cache and its
//! counters with `compile`, keep errors with their kernel, and are safe to call from many threads.

use crate::common;

use std::sync::Arc;

use air::{BinaryOp, DType, ReduceOp, UnaryOp};
use common::*;
use kiln_codegen::{CompiledKernel, CpuCompiler};
use lower::kir::{Acc, Access, IExpr, Inst, LoopKernel, Stmt};

/// A compiler that compiles tiled and element-wise kernels too, rather than run them natively
/// at first: these tests count compiles.
fn compiling() -> CpuCompiler {
    let c = CpuCompiler::new().unwrap();
    c.set_native_tiles(false);
    c.set_native_maps(false);
    c
}

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

fn binary_out(op: BinaryOp, d: DType) -> DType {
    match op {
        BinaryOp::CmpEq | BinaryOp::CmpNe | BinaryOp::CmpLt => DType::Bool,
        _ => d,
    }
}

/// `out[r] = op(reduce(a[r * 7 + j] for j < 7))`: a reduction per row, then a unary op on the
/// result (which calls a helper for f64 and rounds through one for f16).
fn row_reduce(d: DType, reduce: ReduceOp, op: UnaryOp) -> LoopKernel {
    let index = IExpr::add(IExpr::mul(i(0), c(7)), i(1));
    LoopKernel {
        params: vec![p(d, Access::Read), p(d, Access::Write)],
        n_syms: 1,
        body: vec![for_(
            0,
            IExpr::Sym(0),
            true,
            vec![
                Stmt::AccInit { acc: Acc(0), dtype: d, op: reduce },
                for_(1, c(7), false, vec![load(0, d, 0, index), Stmt::AccUpdate { acc: Acc(0), value: r(0) }]),
                let_(1, d, Inst::ReadAcc(Acc(0))),
                let_(2, d, Inst::Unary(op, r(1))),
                store(1, i(0), 2),
            ],
        )],
    }
}

/// A kernel that fails to compile: it reads symbol 3 of 1.
fn bad(n: i64) -> LoopKernel {
    LoopKernel {
        params: vec![p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
        n_syms: 1,
        body: vec![for_(0, c(n), true, vec![load(0, DType::F32, 0, IExpr::Sym(3)), store(1, i(0), 0)])],
    }
}

/// Every unary and binary op on every dtype it accepts (f64 transcendentals, pow and fmod call
/// helpers; f16 results round through one), and reductions of several dtypes.
fn many_kernels() -> Vec<LoopKernel> {
    let mut ks = Vec::new();
    for &op in UnaryOp::ALL {
        for d in DType::ALL {
            if unary_ok(op, d) {
                ks.push(unary_kernel(op, d, d, IExpr::Sym(0)));
            }
        }
    }
    for &op in BinaryOp::ALL {
        for d in DType::ALL {
            if binary_ok(op, d) {
                ks.push(binary_kernel(op, d, binary_out(op, d), IExpr::Sym(0)));
            }
        }
    }
    for d in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        ks.push(row_reduce(d, ReduceOp::Sum, UnaryOp::Exp2));
        ks.push(row_reduce(d, ReduceOp::Max, UnaryOp::Sin));
    }
    ks
}

/// The buffers `k` runs on: 37 rows of 7 (or 259 elements) of sample data per input.
fn buffers(k: &LoopKernel) -> (Vec<Buf>, i64) {
    let n = 259;
    let rows = if k.params.len() == 2 && matches!(&k.body[0], Stmt::Loop { body, .. } if body.len() == 5) {
        37
    } else {
        n as i64
    };
    let bufs = k
        .params
        .iter()
        .enumerate()
        .map(|(j, p)| match p.access {
            Access::Read => Buf::from_vals(p.dtype, &sample(p.dtype, n, 11 + j as u64)),
            _ => Buf::zeros(p.dtype, n),
        })
        .collect();
    (bufs, rows)
}

/// Runs `c` on fresh buffers for `k` and returns every buffer's bytes.
fn run(c: &CompiledKernel, k: &LoopKernel) -> Vec<Vec<u8>> {
    let (mut bufs, n) = buffers(k);
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.bytes.as_mut_ptr()).collect();
    // SAFETY: every buffer holds 259 elements of its parameter's dtype, enough for n <= 259
    // iterations (37 rows of 7 for the reductions).
    unsafe { c.run(&ptrs, &[n], 0, n).expect("arity") };
    bufs.into_iter().map(|b| b.bytes).collect()
}

fn assert_same_behaviour(got: &CompiledKernel, want: &CompiledKernel, k: &LoopKernel) {
    assert_eq!(
        run(got, k),
        run(want, k),
        "batch and single compile differ on\n{}",
        lower::kir::Kernel::Loops(k.clone())
    );
}

#[test]
fn a_batch_behaves_like_single_compiles_bit_for_bit() {
    let ks = many_kernels();
    assert!(ks.len() > 60, "{}", ks.len());
    let single = compiling();
    for threads in [4, 2, 1] {
        let batch = compiling();
        batch.set_compile_threads(threads);
        let refs: Vec<&LoopKernel> = ks.iter().collect();
        let got = batch.compile_many(&refs);
        assert_eq!(got.len(), ks.len());
        for (k, g) in ks.iter().zip(&got) {
            let g = g.as_ref().unwrap_or_else(|e| panic!("{e}\n{}", lower::kir::Kernel::Loops(k.clone())));
            assert_eq!(g.n_params(), k.params.len());
            assert!(g.is_parallel());
            assert_same_behaviour(g, &single.compile(k).unwrap(), k);
        }
        let s = batch.stats();
        let n = ks.len() as u64;
        assert_eq!((s.hits, s.misses, s.compiled, s.failures, s.arenas), (0, n, n, 0, 1), "{threads} threads");
        assert!(s.compile_time > std::time::Duration::ZERO);
        assert_eq!(batch.cached(), ks.len());
    }
    // And the batch is checked against the reference evaluator, not only against itself.
    let batch = compiling();
    let k = row_reduce(DType::F64, ReduceOp::Sum, UnaryOp::Exp2);
    let c = batch.compile_many(&[&k, &k]).pop().unwrap().unwrap();
    let (mut want, n) = buffers(&k);
    eval(&k, &mut want, &[n], 0, n);
    let got = run(&c, &k);
    assert_eq!(got[1], want[1].bytes, "f64 sum + exp2 against the evaluator");
}

#[test]
fn duplicates_compile_once_and_cached_kernels_are_hits() {
    let compiler = compiling();
    compiler.set_compile_threads(2);
    let k = |n| unary_kernel(UnaryOp::Sin, DType::F64, DType::F64, c(n));
    let (a, b, d, e) = (k(10), k(11), k(12), k(13));
    let got: Vec<Arc<CompiledKernel>> =
        compiler.compile_many(&[&a, &b, &a, &d, &b, &a]).into_iter().map(Result::unwrap).collect();
    assert!(Arc::ptr_eq(&got[0], &got[2]) && Arc::ptr_eq(&got[0], &got[5]) && Arc::ptr_eq(&got[1], &got[4]));
    assert!(!Arc::ptr_eq(&got[0], &got[1]) && !Arc::ptr_eq(&got[0], &got[3]));
    let s = compiler.stats();
    assert_eq!((s.hits, s.misses, s.compiled), (3, 3, 3));
    // Cached kernels are hits, in a batch and one at a time.
    let again = compiler.compile_many(&[&d, &e, &a]);
    assert!(Arc::ptr_eq(again[0].as_ref().unwrap(), &got[3]));
    assert!(Arc::ptr_eq(again[2].as_ref().unwrap(), &got[0]));
    assert!(Arc::ptr_eq(&compiler.compile(&e).unwrap(), again[1].as_ref().unwrap()));
    let s = compiler.stats();
    assert_eq!((s.hits, s.misses, s.compiled, s.failures), (6, 4, 4, 0));
    assert_eq!(compiler.cached(), 4);
    // An empty batch does nothing; a cleared cache compiles again.
    assert!(compiler.compile_many(&[]).is_empty());
    compiler.clear_cache();
    let fresh = compiler.compile_many(&[&a]).pop().unwrap().unwrap();
    assert!(!Arc::ptr_eq(&fresh, &got[0]));
    assert_same_behaviour(&fresh, &got[0], &a);
    assert_eq!(compiler.stats().compiled, 5);
}

#[test]
fn an_error_stays_with_its_kernel() {
    let compiler = compiling();
    compiler.set_compile_threads(3);
    let single = compiling();
    let good: Vec<LoopKernel> = [UnaryOp::Exp2, UnaryOp::Erf, UnaryOp::Sqrt, UnaryOp::Sin]
        .into_iter()
        .map(|op| unary_kernel(op, DType::F64, DType::F64, IExpr::Sym(0)))
        .collect();
    let (bad1, bad2) = (bad(5), bad(6));
    let batch = [&good[0], &bad1, &good[1], &bad2, &bad1, &good[2], &good[3]];
    let got = compiler.compile_many(&batch);
    for (k, g) in batch.iter().zip(&got) {
        match g {
            Ok(g) => assert_same_behaviour(g, &single.compile(k).unwrap(), k),
            Err(e) => assert!(e.to_string().contains("symbol"), "{e}"),
        }
    }
    let failed: Vec<bool> = got.iter().map(Result::is_err).collect();
    assert_eq!(failed, [false, true, false, true, true, false, false]);
    let s = compiler.stats();
    assert_eq!((s.hits, s.misses, s.compiled, s.failures), (1, 6, 4, 2));
    // Failures are not cached (they fail again), and the workers recover for later batches.
    let more = [&bad1, &good[0], &row_reduce(DType::F16, ReduceOp::Max, UnaryOp::Sin), &bad2];
    let got = compiler.compile_many(&more);
    assert!(got[0].is_err() && got[1].is_ok() && got[2].is_ok() && got[3].is_err());
    assert_same_behaviour(got[2].as_ref().unwrap(), &single.compile(more[2]).unwrap(), more[2]);
    assert_eq!(compiler.stats().failures, 4);
    // A failure in a single compile is reported the same way.
    assert!(compiler.compile(&bad1).is_err());
}

#[test]
fn batches_from_many_threads_compile_each_kernel_once() {
    let compiler = compiling();
    compiler.set_compile_threads(2);
    let ks = many_kernels();
    let results: Vec<Vec<Arc<CompiledKernel>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (compiler, ks) = (&compiler, &ks);
                s.spawn(move || {
                    // Each thread asks for every kernel, in its own order and chunks, and one
                    // thread one at a time.
                    let mut order: Vec<usize> = (0..ks.len()).collect();
                    order.rotate_left(t * ks.len() / 4);
                    if t % 2 == 1 {
                        order.reverse();
                    }
                    let mut got: Vec<Option<Arc<CompiledKernel>>> = vec![None; ks.len()];
                    for chunk in order.chunks(if t == 3 { 1 } else { 5 + 7 * t }) {
                        let refs: Vec<&LoopKernel> = chunk.iter().map(|&j| &ks[j]).collect();
                        let out = if t == 3 { vec![compiler.compile(refs[0])] } else { compiler.compile_many(&refs) };
                        for (&j, c) in chunk.iter().zip(out) {
                            got[j] = Some(c.unwrap());
                        }
                    }
                    got.into_iter().map(Option::unwrap).collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let n = ks.len() as u64;
    let s = compiler.stats();
    assert_eq!((s.misses, s.compiled, s.failures, s.hits), (n, n, 0, 3 * n));
    for j in 0..ks.len() {
        for r in &results[1..] {
            assert!(Arc::ptr_eq(&results[0][j], &r[j]), "kernel {j} compiled twice");
        }
    }
    let single = compiling();
    for (k, c) in ks.iter().zip(&results[0]) {
        assert_same_behaviour(c, &single.compile(k).unwrap(), k);
    }
}

#[test]
fn a_batch_larger_than_an_arena_starts_another() {
    let compiler = compiling();
    compiler.set_compile_threads(2);
    let ks: Vec<LoopKernel> = (1..=300).map(|n| unary_kernel(UnaryOp::Neg, DType::F32, DType::F32, c(n))).collect();
    let refs: Vec<&LoopKernel> = ks.iter().collect();
    let got: Vec<Arc<CompiledKernel>> = compiler.compile_many(&refs).into_iter().map(Result::unwrap).collect();
    let s = compiler.stats();
    assert_eq!((s.compiled, s.arenas), (300, 2));
    // The kernels outlive the compiler; each negates exactly its own extent.
    drop(compiler);
    for (n, c) in [(1usize, &got[0]), (200, &got[199]), (257, &got[256]), (300, &got[299])] {
        let a: Vec<f32> = (0..310).map(|j| j as f32 + 0.5).collect();
        let mut bufs = [Buf::f32s(&a), Buf::zeros(DType::F32, 310)];
        let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.bytes.as_mut_ptr()).collect();
        // SAFETY: both buffers hold 310 f32, more than any kernel's extent.
        unsafe { c.run(&ptrs, &[0], 0, 400).unwrap() };
        for (j, x) in a.iter().enumerate() {
            let want = if j < n { -x } else { 0.0 };
            assert_eq!(bufs[1].get(j), V::F(want), "kernel of extent {n}, element {j}");
        }
    }
}

/// The runtime's pattern: a program's kernels mix loop kernels and matmuls; the loop kernels are
/// compiled in one batch and handed back to their places.
#[test]
fn a_programs_loop_kernels_in_one_batch() {
    use kiln_codegen::CodegenError;
    use lower::kir::{Kernel, MatOperand, MatmulKernel};
    let op = |buf| MatOperand { buf, offset: c(0), batch_stride: c(0), row_stride: c(1), col_stride: c(1) };
    let mm = MatmulKernel {
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
    };
    let ks = many_kernels();
    let program: Vec<Kernel> = vec![
        Kernel::Loops(ks[0].clone()),
        Kernel::Matmul(mm.clone()),
        Kernel::Loops(ks[5].clone()),
        Kernel::Loops(ks[0].clone()),
        Kernel::Matmul(mm),
        Kernel::Loops(ks[60].clone()),
    ];
    let compiler = compiling();
    let loops: Vec<&LoopKernel> = program
        .iter()
        .filter_map(|k| match k {
            Kernel::Loops(k) => Some(k),
            Kernel::Matmul(_) => None,
        })
        .collect();
    let code: Vec<Arc<CompiledKernel>> =
        compiler.compile_many(&loops).into_iter().collect::<Result<_, CodegenError>>().unwrap();
    let mut fns = code.iter().map(|c| c.entry().clone());
    let loop_fns: Vec<Option<Arc<kiln_codegen::KernelEntry>>> = program
        .iter()
        .map(|k| match k {
            Kernel::Loops(_) => fns.next(),
            Kernel::Matmul(_) => None,
        })
        .collect();
    let present: Vec<bool> = loop_fns.iter().map(Option::is_some).collect();
    assert_eq!(present, [true, false, true, true, false, true]);
    assert!(Arc::ptr_eq(loop_fns[0].as_ref().unwrap(), loop_fns[3].as_ref().unwrap()));
    let s = compiler.stats();
    assert_eq!((s.hits, s.misses), (1, 3));
    // One bad kernel fails the whole program when collected.
    let b = bad(9);
    let all: Result<Vec<_>, CodegenError> = compiler.compile_many(&[&ks[1], &b, &ks[2]]).into_iter().collect();
    assert!(all.is_err());
}

/// Waits (up to ten seconds) until `early` has compiled at least `n` kernels.
fn wait_compiled(early: &kiln_codegen::EarlyCompile, n: usize) {
    let t0 = std::time::Instant::now();
    while early.compiled() < n {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{} of {n} compiled early", early.compiled());
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The runtime's pattern with early compiles: each kernel is sent as the lowering makes it (some
/// twice), and the batch takes the codes compiled meanwhile, compiles the rest, and behaves as
/// single compiles do, with the same counters.
#[test]
fn kernels_compiled_early_behave_as_a_batch_and_count_once() {
    let ks = many_kernels();
    let single = compiling();
    let compiler = compiling();
    compiler.set_compile_threads(2);
    let mut early = compiler.early().expect("two compile threads compile early");
    // The first half is sent (each kernel twice), the second is not.
    let half = ks.len() / 2;
    for k in ks[..half].iter().chain(&ks[..half]) {
        compiler.send_early(&mut early, k.structural_hash(), &Arc::new(k.clone()));
    }
    assert_eq!(early.sent(), half);
    wait_compiled(&early, 3);
    let batch: Vec<(u64, &LoopKernel)> = ks.iter().map(|k| (k.structural_hash(), k)).collect();
    let got = compiler.compile_many_early(&batch, Some(early));
    for (k, g) in ks.iter().zip(&got) {
        let g = g.as_ref().unwrap_or_else(|e| panic!("{e}\n{}", lower::kir::Kernel::Loops(k.clone())));
        assert_same_behaviour(g, &single.compile(k).unwrap(), k);
    }
    let s = compiler.stats();
    let n = ks.len() as u64;
    assert_eq!((s.hits, s.misses, s.compiled, s.failures), (0, n, n, 0));
    assert!((3..=half as u64).contains(&s.early), "{} of {half} sent taken from the early compile", s.early);
    assert_eq!(compiler.cached(), ks.len());
    // A kernel the cache has is not sent again; a kernel sent but not asked for is dropped
    // with its code, and compiled when a later batch asks.
    let mut early = compiler.early().unwrap();
    compiler.send_early(&mut early, ks[0].structural_hash(), &Arc::new(ks[0].clone()));
    assert_eq!(early.sent(), 0);
    let extra = unary_kernel(UnaryOp::Sin, DType::F64, DType::F64, c(77));
    compiler.send_early(&mut early, extra.structural_hash(), &Arc::new(extra.clone()));
    wait_compiled(&early, 1);
    let again = compiler.compile_many_early(&[(ks[0].structural_hash(), &ks[0])], Some(early));
    assert!(Arc::ptr_eq(again[0].as_ref().unwrap(), got[0].as_ref().unwrap()));
    assert_eq!(compiler.cached(), ks.len());
    let later = compiler.compile_many(&[&extra]).pop().unwrap().unwrap();
    assert_same_behaviour(&later, &single.compile(&extra).unwrap(), &extra);
}

#[test]
fn an_early_error_stays_with_its_kernel_and_an_abandoned_early_compile_costs_nothing() {
    let compiler = compiling();
    compiler.set_compile_threads(2);
    let good = unary_kernel(UnaryOp::Erf, DType::F64, DType::F64, IExpr::Sym(0));
    let (bad1, bad2) = (bad(5), bad(6));
    let mut early = compiler.early().unwrap();
    for k in [&bad1, &good, &bad2] {
        compiler.send_early(&mut early, k.structural_hash(), &Arc::new(k.clone()));
    }
    wait_compiled(&early, 3);
    let batch: Vec<(u64, &LoopKernel)> = [&good, &bad1, &bad2].iter().map(|k| (k.structural_hash(), *k)).collect();
    let got = compiler.compile_many_early(&batch, Some(early));
    assert!(got[0].is_ok());
    for g in &got[1..] {
        assert!(g.as_ref().is_err_and(|e| e.to_string().contains("symbol")), "{:?}", g.as_ref().err());
    }
    let s = compiler.stats();
    assert_eq!((s.misses, s.compiled, s.failures, s.early), (3, 1, 2, 3));
    // Dropped with kernels queued (a lowering that failed): nothing waits, and the next batch
    // compiles as usual.
    let mut early = compiler.early().unwrap();
    for n in 1..40 {
        let k = unary_kernel(UnaryOp::Sin, DType::F64, DType::F64, c(n));
        compiler.send_early(&mut early, k.structural_hash(), &Arc::new(k.clone()));
    }
    drop(early);
    let k = unary_kernel(UnaryOp::Sin, DType::F64, DType::F64, c(3));
    let single = compiling();
    assert_same_behaviour(&compiler.compile_many(&[&k]).pop().unwrap().unwrap(), &single.compile(&k).unwrap(), &k);
    // One compile thread: nothing to overlap, no early compile.
    compiler.set_compile_threads(1);
    assert!(compiler.early().is_none());
}

/// An early compile whose task never got a pool thread (every one busy, as when other threads'
/// compiles wait for the compiler's lock that the batch holds): the batch compiles everything
/// itself and never waits for the task.
#[test]
fn a_batch_does_not_wait_for_an_early_task_that_never_started() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let compiler = compiling();
    compiler.set_compile_threads(2);
    let threads = rayon::current_num_threads();
    let (started, release) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    for _ in 0..threads {
        let (started, release) = (started.clone(), release.clone());
        rayon::spawn(move || {
            started.fetch_add(1, Ordering::SeqCst);
            while !release.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        });
    }
    while started.load(Ordering::SeqCst) < threads {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    // Two kernels: the batch compiles them on the calling thread (one thread per two kernels).
    let ks = [
        unary_kernel(UnaryOp::Exp2, DType::F32, DType::F32, c(40)),
        row_reduce(DType::F32, ReduceOp::Sum, UnaryOp::Sin),
    ];
    let mut early = compiler.early().unwrap();
    for k in &ks {
        compiler.send_early(&mut early, k.structural_hash(), &Arc::new(k.clone()));
    }
    let batch: Vec<(u64, &LoopKernel)> = ks.iter().map(|k| (k.structural_hash(), k)).collect();
    let got = compiler.compile_many_early(&batch, Some(early));
    release.store(true, Ordering::SeqCst);
    let single = compiling();
    for (k, g) in ks.iter().zip(&got) {
        assert_same_behaviour(g.as_ref().unwrap(), &single.compile(k).unwrap(), k);
    }
    let s = compiler.stats();
    assert_eq!((s.misses, s.compiled, s.early), (2, 2, 0));
}

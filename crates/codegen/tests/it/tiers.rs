//! The tiered JIT: a kernel compiled quickly runs correct code at once, and once a runner asks,
//! the background thread swaps optimised code in behind the same entry (seen by whoever holds the entry, mid-run
//! included), and the three modes count what they did.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use air::{DType, UnaryOp};
use common::*;
use kiln_codegen::{CompiledKernel, CpuCompiler, JitMode};
use lower::kir::{Access, IExpr, Inst, LoopKernel};

/// `out[i] = exp2(a[i]) * a[i]` over `n = sym 0` elements (exp2 calls into a polynomial).
fn silu() -> LoopKernel {
    silu_over(IExpr::Sym(0))
}

/// The same body over `extent` elements.
fn silu_over(extent: IExpr) -> LoopKernel {
    LoopKernel {
        params: vec![p(DType::F32, Access::Read), p(DType::F32, Access::Write)],
        n_syms: 1,
        body: vec![for_(
            0,
            extent,
            true,
            vec![
                load(0, DType::F32, 0, i(0)),
                let_(1, DType::F32, Inst::Unary(UnaryOp::Exp2, r(0))),
                let_(2, DType::F32, Inst::Binary(air::BinaryOp::Mul, r(1), r(0))),
                store(1, i(0), 2),
            ],
        )],
    }
}

fn run(k: &CompiledKernel, n: usize) -> Buf {
    let mut bufs = vec![Buf::from_vals(DType::F32, &sample(DType::F32, n, 7)), Buf::zeros(DType::F32, n)];
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.bytes.as_mut_ptr()).collect();
    // SAFETY: both buffers hold `n` f32 values, all the kernel touches for `n`.
    unsafe { k.run(&ptrs, &[n as i64], 0, n as i64).expect("arity") };
    bufs.pop().expect("output")
}

fn expected(k: &LoopKernel, n: usize) -> Buf {
    let mut bufs = vec![Buf::from_vals(DType::F32, &sample(DType::F32, n, 7)), Buf::zeros(DType::F32, n)];
    eval(k, &mut bufs, &[n as i64], 0, n as i64);
    bufs.pop().expect("output")
}

#[test]
fn tiered_kernels_swap_to_optimised_code_behind_their_entry() {
    let jit = CpuCompiler::with_mode(JitMode::Tiered).expect("host ISA");
    let k = silu();
    let compiled = jit.compile(&k).expect("compiles");
    // Its quick tier is native (a tiled kernel: routine calls, no code of its own).
    assert!(compiled.is_native());
    let entry = compiled.entry().clone();
    let want = expected(&k, 1000);
    assert_bufs_close(&run(&compiled, 1000), &want, 1e-6, "before the tier-up");
    // Nothing goes to the background thread until a runner asks (a program's second run).
    jit.wait_tier_up();
    assert!(!compiled.is_optimized());
    assert_eq!(jit.stats().tier_up_queued, 0);
    compiled.request_tier_up();
    compiled.request_tier_up();
    jit.wait_tier_up();
    assert!(compiled.is_optimized(), "the background thread swapped the optimised code in");
    assert!(!compiled.is_native());
    let stats = jit.stats();
    assert_eq!((stats.compiled, stats.tier_up_queued, stats.tiered_up, stats.tier_up_failures), (0, 1, 1, 0));
    // The entry a runner kept before the swap follows it.
    assert_eq!(entry.get().map(|f| f as usize), compiled.as_fn().map(|f| f as usize));
    assert_bufs_close(&run(&compiled, 1000), &want, 1e-6, "after the tier-up");
    // A cache hit is the same kernel, optimised already, and sends nothing more.
    let again = jit.compile(&k).expect("cached");
    assert!(Arc::ptr_eq(&again, &compiled) && again.is_optimized());
    jit.wait_tier_up();
    assert_eq!(jit.stats().tier_up_queued, 1);
}

#[test]
fn an_im2col_moved_in_vectors_stays_native_and_sends_nothing() {
    // out[t][i0][i1] = in[i0][i1 + t]: a 1-D window's three taps over rows of 26, each tap's rows
    // contiguous. On an AVX-512 host its native run moves each row in two vectors and beats the
    // optimised tier's code, so no optimised code is made for it (`CopyPlan::stays`).
    let mut body = Vec::new();
    for t in 0..3 {
        let at = IExpr::Add(
            Box::new(IExpr::Add(Box::new(IExpr::Mul(Box::new(i(0)), Box::new(c(28)))), Box::new(i(1)))),
            Box::new(c(t)),
        );
        let to = IExpr::Add(
            Box::new(IExpr::Add(Box::new(IExpr::Mul(Box::new(i(0)), Box::new(c(26)))), Box::new(i(1)))),
            Box::new(c(t * 104)),
        );
        body.push(load(t as u32, DType::F32, 1, at));
        body.push(store(0, to, t as u32));
    }
    let k = LoopKernel {
        params: vec![p(DType::F32, Access::Write), p(DType::F32, Access::Read)],
        n_syms: 0,
        body: vec![for_(0, c(4), true, vec![for_(1, c(26), false, body)])],
    };
    let jit = CpuCompiler::with_mode(JitMode::Tiered).expect("host ISA");
    let compiled = jit.compile(&k).expect("compiles");
    assert!(compiled.is_native());
    compiled.request_tier_up();
    jit.wait_tier_up();
    let wide = jit.tiling().level == kiln_codegen::TileLevel::Avx512;
    assert_eq!(compiled.is_native(), wide, "stays native exactly where it moves vectors");
    assert_eq!(jit.stats().tier_up_queued, u64::from(!wide));
    let input = sample(DType::F32, 4 * 28, 3);
    let mut bufs = vec![Buf::zeros(DType::F32, 3 * 104), Buf::from_vals(DType::F32, &input)];
    let mut want = bufs.clone();
    jit_with(&jit, &k, &mut bufs, &[], 0, 4);
    eval(&k, &mut want, &[], 0, 4);
    assert_same(&bufs[0], &want[0], "the im2col");
}

#[test]
fn quick_and_optimized_modes_do_not_tier_up() {
    for (mode, optimized) in [(JitMode::Quick, false), (JitMode::Optimized, true)] {
        let jit = CpuCompiler::with_mode(mode).expect("host ISA");
        assert_eq!(jit.jit_mode(), mode);
        let compiled = jit.compile(&silu()).expect("compiles");
        compiled.request_tier_up();
        jit.wait_tier_up();
        assert_eq!(compiled.is_optimized(), optimized, "{mode:?}");
        assert_eq!(jit.stats().tier_up_queued, 0, "{mode:?}");
        assert_bufs_close(&run(&compiled, 257), &expected(&silu(), 257), 1e-6, &format!("{mode:?}"));
    }
}

#[test]
fn the_swap_is_safe_while_the_kernel_runs_on_other_threads() {
    let jit = CpuCompiler::with_mode(JitMode::Tiered).expect("host ISA");
    let k = silu();
    let n = 4096;
    let want = expected(&k, n);
    let compiled = jit.compile(&k).expect("compiles");
    compiled.request_tier_up();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let runner = s.spawn(|| {
            let mut runs = 0;
            while !stop.load(Ordering::Relaxed) || runs < 10 {
                assert_bufs_close(&run(&compiled, n), &want, 1e-6, &format!("run {runs}"));
                runs += 1;
            }
        });
        jit.wait_tier_up();
        stop.store(true, Ordering::Relaxed);
        runner.join().expect("runner");
    });
    assert!(compiled.is_optimized());
}

#[test]
fn a_kernel_dropped_before_its_turn_is_skipped_and_waiting_ends() {
    let jit = CpuCompiler::with_mode(JitMode::Tiered).expect("host ISA");
    // Many distinct kernels (different extents), dropped at once with the cache: some may have
    // been optimised already, the rest are skipped. They are compiled, never run.
    let kernels: Vec<LoopKernel> = (1..40).map(|m| silu_over(IExpr::mul(IExpr::Sym(0), c(m)))).collect();
    let refs: Vec<&LoopKernel> = kernels.iter().collect();
    let compiled: Vec<_> = jit.compile_many(&refs).into_iter().collect::<Result<_, _>>().expect("compiles");
    compiled.iter().for_each(|k: &Arc<CompiledKernel>| k.request_tier_up());
    drop(compiled);
    jit.clear_cache();
    jit.wait_tier_up();
    let stats = jit.stats();
    assert_eq!(stats.tier_up_queued, 39);
    assert!(stats.tiered_up <= 39 && stats.tier_up_failures == 0, "{stats:?}");
    // Waiting for the whole process's jobs ends too.
    kiln_codegen::wait_tier_up_all();
}

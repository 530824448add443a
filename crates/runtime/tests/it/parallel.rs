//! Independent steps run at the same time: a tree of equal matmuls runs as one concurrent level
//! (the grouped GEMM), concurrency never changes results (many runs, bitwise), the steps of a
//! concurrent level never touch overlapping memory where one writes, and small programs keep the
//! in-order path and its memory plan.

use crate::common;

use air::{BinaryOp, Bindings, Graph, HostTensor, Op, UnaryOp};
use common::{input_f32, matmul, tensor};
use kiln_runtime::levels::{LEVEL_PARALLEL_MIN_WORK, Phase};
use kiln_runtime::{CpuDevice, Executable, parallel};
use lower::kir::Access;

/// `n` independent products `(m x k) @ (k x p)`, plus (when `tail`) a sum of the first two run
/// through `sin`, which depends on them.
fn tree(n: usize, m: usize, k: usize, p: usize, tail: bool) -> (Graph, Vec<HostTensor>) {
    let mut g = Graph::new();
    let mut inputs = Vec::new();
    let mut outs = Vec::new();
    for i in 0..n {
        let a = input_f32(&mut g, 2 * i as u32, &[m, k]);
        let b = input_f32(&mut g, 2 * i as u32 + 1, &[k, p]);
        inputs.push(tensor(&[m, k], 2 * i as u64));
        inputs.push(tensor(&[k, p], 2 * i as u64 + 1));
        outs.push(matmul(&mut g, a, b, &[], m, k, p));
    }
    if tail {
        let s = g.add(Op::Binary(BinaryOp::Add), &[outs[0], outs[1]]).unwrap();
        let s = g.add(Op::Unary(UnaryOp::Sin), &[s]).unwrap();
        outs.push(s);
    }
    for o in outs {
        g.add_output(o);
    }
    (g, inputs)
}

/// Eight independent unfused chains of element-wise ops over `numel` elements.
fn chains(numel: usize) -> (Graph, Vec<HostTensor>) {
    let mut g = Graph::new();
    let mut inputs = Vec::new();
    for i in 0..8 {
        let mut x = input_f32(&mut g, i, &[numel]);
        inputs.push(tensor(&[numel], i as u64));
        for j in 0..3 {
            let op = if j % 2 == 0 { UnaryOp::Sin } else { UnaryOp::Neg };
            x = g.add(Op::Unary(op), &[x]).unwrap();
        }
        g.add_output(x);
    }
    (g, inputs)
}

fn bits(outs: &[HostTensor]) -> Vec<Vec<u32>> {
    outs.iter().map(|t| t.as_slice::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()).collect()
}

fn sequential() -> CpuDevice {
    CpuDevice::with_level_threshold(lower::CompileOptions::default(), None).unwrap()
}

fn unfused(min_work: Option<u128>) -> CpuDevice {
    let options = lower::CompileOptions { fuse: false, optimize: false, ..lower::CompileOptions::default() };
    CpuDevice::with_level_threshold(options, min_work).unwrap()
}

/// Checks, with the addresses of the last run, that no step of a concurrent level writes bytes
/// another step of that level touches.
fn assert_level_memory_disjoint(exe: &Executable, bindings: &Bindings) {
    let Some(schedule) = exe.level_schedule(bindings).unwrap() else { return };
    let p = exe.program();
    let addr = exe.last_buffer_addresses();
    let bytes = |b: usize| p.buffers[b].numel.eval(bindings).unwrap() as usize * p.buffers[b].dtype.size_bytes();
    for phase in &schedule.phases {
        let Phase::Concurrent { bins } = phase else { continue };
        let steps: Vec<usize> = bins.iter().flatten().map(|&s| s as usize).collect();
        let ranges = |s: usize| -> Vec<(usize, usize, bool)> {
            let step = &p.steps[s];
            let params = p.kernels[step.kernel as usize].params();
            params
                .iter()
                .zip(&step.args)
                .map(|(pa, b)| {
                    let b = b.0 as usize;
                    (addr[b], addr[b] + bytes(b), pa.access == Access::Write)
                })
                .collect()
        };
        for &s in &steps {
            for &t in &steps {
                if s == t {
                    continue;
                }
                for (a0, a1, w) in ranges(s) {
                    for (b0, b1, _) in ranges(t) {
                        assert!(
                            !w || a0 == a1 || b0 == b1 || a1 <= b0 || b1 <= a0,
                            "steps {s} and {t} run together and overlap"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_tree_of_equal_matmuls_is_one_concurrent_level() {
    let (g, inputs) = tree(12, 32, 64, 128, true);
    let dev = CpuDevice::new().unwrap();
    let exe = dev.compile(&g).unwrap();
    let b = Bindings::new();
    let schedule = exe.level_schedule(&b).unwrap();
    if parallel::threads() < 2 {
        assert!(schedule.is_none(), "one thread: nothing runs concurrently");
        return;
    }
    let schedule = schedule.expect("12 matmuls of 262k multiply-adds each run together");
    assert_eq!(schedule.concurrent_levels, 1);
    let bins: Vec<Vec<u32>> = match &schedule.phases[0] {
        Phase::Concurrent { bins } => bins.clone(),
        Phase::Step(_) => Vec::new(),
    };
    assert_eq!(bins.iter().map(Vec::len).sum::<usize>(), 12);
    assert_eq!(bins.len(), parallel::threads().min(12));

    let want = sequential().run(&g, &inputs, &b).unwrap();
    let first = exe.run(&inputs, &b).unwrap();
    for (x, y) in first.iter().zip(&want) {
        common::close(x, y, 1e-5).unwrap();
    }
    let want = air::interp::eval(&g, &inputs, &b).unwrap();
    for (x, y) in first.iter().zip(&want) {
        common::close(x, y, 1e-4).unwrap();
    }
    for _ in 0..40 {
        assert_eq!(bits(&exe.run(&inputs, &b).unwrap()), bits(&first), "a concurrent run changed the results");
    }
    assert_level_memory_disjoint(&exe, &b);
}

#[test]
fn concurrent_chains_match_the_in_order_run_bitwise() {
    let (g, inputs) = chains(1 << 16);
    let b = Bindings::new();
    let conc = unfused(Some(LEVEL_PARALLEL_MIN_WORK)).compile(&g).unwrap();
    let seq = unfused(None).compile(&g).unwrap();
    assert!(seq.level_schedule(&b).unwrap().is_none());
    let schedule = conc.level_schedule(&b).unwrap();
    assert_eq!(schedule.is_some(), parallel::threads() > 1);
    if let Some(s) = &schedule {
        assert_eq!(s.concurrent_levels, 3, "{:?}", s.phases);
        // Running by levels keeps each level's temps apart: more arena than in order.
        assert!(conc.memory(&b).unwrap().arena_bytes > seq.memory(&b).unwrap().arena_bytes);
    }
    let want = bits(&seq.run(&inputs, &b).unwrap());
    for _ in 0..30 {
        assert_eq!(bits(&conc.run(&inputs, &b).unwrap()), want);
        assert_level_memory_disjoint(&conc, &b);
    }
}

#[test]
fn small_programs_keep_the_in_order_path() {
    let b = Bindings::new();
    // 32 products of 4x4 matrices: 2k multiply-adds in all, far below the level threshold.
    let (g, inputs) = tree(32, 4, 4, 4, false);
    let exe = CpuDevice::new().unwrap().compile(&g).unwrap();
    assert!(exe.level_schedule(&b).unwrap().is_none());
    let seq = sequential().compile(&g).unwrap();
    assert_eq!(exe.memory(&b).unwrap(), seq.memory(&b).unwrap());
    assert_eq!(bits(&exe.run(&inputs, &b).unwrap()), bits(&seq.run(&inputs, &b).unwrap()));

    let (g, _) = chains(64);
    let exe = unfused(Some(LEVEL_PARALLEL_MIN_WORK)).compile(&g).unwrap();
    assert!(exe.level_schedule(&b).unwrap().is_none());
}

#[test]
fn many_threads_of_callers_share_one_executable() {
    let (g, inputs) = tree(8, 32, 64, 64, true);
    let exe = CpuDevice::new().unwrap().compile(&g).unwrap();
    let b = Bindings::new();
    let want = bits(&exe.run(&inputs, &b).unwrap());
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..10 {
                    assert_eq!(bits(&exe.run(&inputs, &b).unwrap()), want);
                }
            });
        }
    });
}

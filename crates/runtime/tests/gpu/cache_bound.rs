//! The devices' caches stay at their bounds under endless distinct shapes: the CPU program cache
//! and the code generator's kernel cache (10,000 shapes), the wgpu program and pipeline caches
//! (fewer: lavapipe compiles slowly); evicted programs still held by a caller keep running, and a
//! program compiled again after eviction gives the same answer.

use crate::common;

use std::sync::Arc;

use air::{Graph, HostTensor, Op, UnaryOp};
use common::*;
use kiln_runtime::wgpu::WgpuDevice;
use kiln_runtime::{CpuDevice, Executable};

/// `neg(x)` over `f32[n]`: one small loop kernel, whose structure (its extent) differs per `n`.
fn neg_graph(n: usize) -> Graph {
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[n]);
    let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    g.add_output(y);
    g
}

/// Runs `exe` on `[0, 1, .., n)` and checks it negated every element.
fn check_neg(run: impl FnOnce(&[HostTensor]) -> Vec<HostTensor>, n: usize) {
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let out = run(&[HostTensor::from_vec(x, vec![n]).unwrap()]);
    let got = out[0].as_slice::<f32>().unwrap();
    assert_eq!(got.len(), n);
    assert!(got.iter().enumerate().all(|(i, &v)| v == -(i as f32)), "neg over {n} elements");
}

const SHAPES: usize = 10_000;
const PROGRAMS: usize = 8;
const KERNELS: usize = 16;

#[test]
fn cpu_caches_stay_at_their_bounds() {
    let dev = CpuDevice::new().unwrap();
    dev.set_compile_threads(1);
    dev.set_cache_capacity(PROGRAMS);
    dev.set_kernel_cache_capacity(KERNELS);
    // Held across every eviction: its code must stay valid.
    let first: Arc<Executable> = dev.compile(&neg_graph(1)).unwrap();
    for n in 1..=SHAPES {
        dev.compile(&neg_graph(n)).unwrap();
        assert!(dev.cached_programs() <= PROGRAMS, "{} programs cached after {n} shapes", dev.cached_programs());
        assert!(dev.cached_kernels() <= KERNELS, "{} kernels cached after {n} shapes", dev.cached_kernels());
    }
    let stats = dev.stats();
    assert_eq!(stats.programs_compiled, SHAPES as u64);
    assert_eq!(stats.programs_evicted, (SHAPES - PROGRAMS) as u64);
    assert_eq!(stats.kernels_evicted, (SHAPES - KERNELS) as u64);
    check_neg(|inputs| first.run(inputs, &Default::default()).unwrap(), 1);
    // The most recent programs are hits; an evicted one compiles again and still computes.
    dev.compile(&neg_graph(SHAPES)).unwrap();
    assert_eq!(dev.stats().cache_hits, 2); // `neg_graph(1)` in the loop, and this one
    check_neg(|inputs| dev.run(&neg_graph(3), inputs, &Default::default()).unwrap(), 3);
    assert_eq!(dev.stats().programs_compiled, SHAPES as u64 + 1);
}

/// `clear_caches` empties both caches: the same graph lowers and makes its kernel again (its quick
/// tier: a native run or compiled code), and an executable compiled before still runs.
#[test]
fn cleared_cpu_caches_compile_again() {
    let dev = CpuDevice::new().unwrap();
    let made = |dev: &CpuDevice| {
        let s = dev.stats();
        (s.programs_compiled, s.kernels_compiled + s.kernels_native, s.cache_hits)
    };
    let before: Arc<Executable> = dev.compile(&neg_graph(7)).unwrap();
    dev.compile(&neg_graph(7)).unwrap();
    assert_eq!(made(&dev), (1, 1, 1));
    dev.clear_caches();
    assert_eq!((dev.cached_programs(), dev.cached_kernels()), (0, 0));
    dev.compile(&neg_graph(7)).unwrap();
    assert_eq!(made(&dev), (2, 2, 1));
    check_neg(|inputs| before.run(inputs, &Default::default()).unwrap(), 7);
}

#[test]
fn cpu_executables_outlive_eviction_while_running() {
    let dev = CpuDevice::new().unwrap();
    dev.set_cache_capacity(1);
    dev.set_kernel_cache_capacity(1);
    let n = 1 << 16;
    let held = dev.compile(&neg_graph(n)).unwrap();
    std::thread::scope(|s| {
        let runner = s.spawn(|| {
            for _ in 0..50 {
                check_neg(|inputs| held.run(inputs, &Default::default()).unwrap(), n);
            }
        });
        // Meanwhile other programs evict `held` from both caches.
        for m in 1..50 {
            dev.compile(&neg_graph(m)).unwrap();
        }
        runner.join().unwrap();
    });
    assert_eq!(dev.cached_programs(), 1);
    assert!(dev.stats().programs_evicted >= 49);
}

#[test]
fn wgpu_caches_stay_at_their_bounds() {
    let dev = match WgpuDevice::new() {
        Ok(d) => d,
        Err(e) => {
            let required = std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v.trim() == "1");
            assert!(!required, "KILN_REQUIRE_VULKAN=1 but no wgpu device: {e}");
            eprintln!("skipping: no wgpu device ({e})");
            return;
        }
    };
    dev.set_cache_capacity(3);
    dev.set_pipeline_cache_capacity(4);
    let first = dev.compile(&neg_graph(1)).unwrap();
    let shapes = 40;
    for n in 1..=shapes {
        let exe = dev.compile(&neg_graph(n)).unwrap();
        check_neg(|inputs| exe.run(inputs, &Default::default()).unwrap(), n);
        assert!(dev.cached_programs() <= 3, "{} programs after {n} shapes", dev.cached_programs());
        assert!(dev.cached_pipelines() <= 4, "{} pipelines after {n} shapes", dev.cached_pipelines());
    }
    let stats = dev.stats();
    assert_eq!(stats.programs_compiled, shapes as u64);
    assert_eq!(stats.programs_evicted, shapes as u64 - 3);
    assert!(stats.pipelines_evicted >= shapes as u64 - 4, "{stats:?}");
    // Evicted from both caches long ago, still held: still runs.
    check_neg(|inputs| first.run(inputs, &Default::default()).unwrap(), 1);
}

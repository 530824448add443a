//! The memory planner's numbers, asserted (not timed): every number `BENCHMARKS.md` publishes for
//! `kiln bench memory` (default sizes: a chain of 100 unary ops on 65536 `f32`s, unfused and
//! fused, and the 2-layer Transformer forward) has a bound here, on the CPU device and on wgpu:
//! unique kernels and launches exactly, the planned arena and the peak live bytes at most the
//! published bytes, the naive bytes exactly, naive/planned at least the published ratio, buffers
//! created by the first run at most the published count and by the second run none. The wgpu
//! tests are skipped with a printed reason when there is no adapter, unless `KILN_REQUIRE_VULKAN=1`.
//! When the planner gets better, these tests fail on purpose: update `PUBLISHED` and
//! `BENCHMARKS.md` together.

use kiln_cli::bench::memory::{self, Measured};
use kiln_cli::model::GptConfig;
use kiln_cli::pipeline::Traced;
use runtime::CpuDevice;
#[cfg(feature = "wgpu")]
use runtime::wgpu::WgpuDevice;

/// One row of the memory table in `BENCHMARKS.md`.
#[derive(Debug)]
struct Published {
    program: &'static str,
    kernels: usize,
    launches: usize,
    arena_bytes: u64,
    peak_live_bytes: u64,
    naive_bytes: u64,
    /// naive/planned as printed (three significant digits).
    ratio: f64,
    /// Buffers created by compile + the first run on wgpu.
    wgpu_buffers_first_run: u64,
}

/// `BENCHMARKS.md`, "Memory planning", in program order: unfused chain, fused chain, Transformer.
const PUBLISHED_CPU: [Published; 3] = [
    Published {
        program: "chain of 100 unary ops, unfused",
        kernels: 2,
        launches: 100,
        arena_bytes: 524_288,
        peak_live_bytes: 524_288,
        naive_bytes: 25_952_256,
        ratio: 49.5,
        wgpu_buffers_first_run: 0,
    },
    Published {
        program: "chain of 100 unary ops, fused",
        kernels: 2,
        launches: 2,
        arena_bytes: 262_144,
        peak_live_bytes: 262_144,
        naive_bytes: 262_144,
        ratio: 1.0,
        wgpu_buffers_first_run: 0,
    },
    Published {
        program: "transformer forward, 2 layers",
        kernels: 32,
        launches: 62,
        arena_bytes: 84_480,
        peak_live_bytes: 76_800,
        naive_bytes: 368_000,
        ratio: 4.36,
        wgpu_buffers_first_run: 0,
    },
];

/// The same table for `kiln bench memory --device wgpu` (lavapipe). The Transformer program
/// differs: on wgpu the causal mask arrives as a realized `bool` input.
#[cfg(feature = "wgpu")]
const PUBLISHED_WGPU: [Published; 3] = [
    Published { wgpu_buffers_first_run: 5, ..PUBLISHED_CPU[0] },
    Published { wgpu_buffers_first_run: 5, ..PUBLISHED_CPU[1] },
    Published {
        program: "transformer forward, 2 layers",
        kernels: 31,
        launches: 60,
        arena_bytes: 84_480,
        peak_live_bytes: 76_800,
        naive_bytes: 364_544,
        ratio: 4.32,
        wgpu_buffers_first_run: 45,
    },
];

/// The three programs at the suite's default sizes, traced for `device`.
fn programs(device: kiln::Device) -> [Traced; 3] {
    let chain = memory::chain_program(memory::ELEMENTS, memory::CHAIN).expect("the chain traces");
    let transformer = memory::transformer_program(GptConfig::default(), device).expect("the forward traces");
    [chain.clone(), chain, transformer]
}

/// Asserts every published number of one program against its measurement.
fn check_published(m: &Measured, p: &Published, wgpu: bool) {
    let what = format!("{} ({}): measured {m:?}, published {p:?}", p.program, if wgpu { "wgpu" } else { "cpu" });
    assert_eq!(m.kernels, p.kernels, "unique kernels: {what}");
    assert_eq!(m.launches, p.launches, "launches: {what}");
    let bytes = &m.memory;
    assert!(bytes.arena_bytes as u64 <= p.arena_bytes, "planned arena above the published bytes: {what}");
    assert!(bytes.peak_live_bytes as u64 <= p.peak_live_bytes, "peak live bytes above the published bytes: {what}");
    assert!(bytes.peak_live_bytes <= bytes.arena_bytes, "peak live bytes bound the arena from below: {what}");
    assert_eq!(bytes.naive_bytes as u64, p.naive_bytes, "naive bytes: {what}");
    let ratio = m.ratio().expect("every program has temporaries");
    // The published ratio is rounded to three digits: allow half a unit of its last digit.
    let half_unit = 0.5 * 10f64.powi(p.ratio.log10().floor() as i32 - 2);
    assert!(ratio >= p.ratio - half_unit, "naive/planned {ratio:.3} below the published {}: {what}", p.ratio);
    if wgpu {
        let first = m.buffers_first_run.expect("wgpu counts buffers");
        assert!(first > 0, "the first run creates its buffers: {what}");
        assert!(first <= p.wgpu_buffers_first_run, "buffers created by the first run: {what}");
        assert_eq!(m.buffers_second_run, Some(0), "the second run of a cached program creates no buffer: {what}");
    }
}

#[test]
fn cpu_plans_meet_the_published_numbers() {
    let unfused = CpuDevice::with_options(memory::options(false)).expect("the cpu device");
    let fused = CpuDevice::with_options(memory::options(true)).expect("the cpu device");
    for ((traced, device), published) in
        programs(kiln::Device::Cpu).iter().zip([&unfused, &fused, &fused]).zip(&PUBLISHED_CPU)
    {
        let m = memory::measure_cpu(device, traced).expect("the program compiles, runs and matches the interpreter");
        check_published(&m, published, false);
    }
}

#[test]
fn unfused_chain_reuses_two_buffers_at_any_size() {
    // The shape of the saving, independent of the published size: 99 temporaries of one vector
    // each, of which only two are ever live.
    const ELEMENTS: usize = 4096;
    const BUFFER: u64 = 4 * ELEMENTS as u64;
    let traced = memory::chain_program(ELEMENTS, 100).expect("the chain traces");
    let device = CpuDevice::with_options(memory::options(false)).expect("the cpu device");
    let m = memory::measure_cpu(&device, &traced).expect("the chain compiles and runs");
    assert_eq!(m.memory.naive_bytes as u64, 99 * BUFFER, "{m:?}");
    assert_eq!(m.memory.arena_bytes as u64, 2 * BUFFER, "{m:?}");
}

#[cfg(feature = "wgpu")]
fn wgpu_device(fuse: bool) -> Option<WgpuDevice> {
    match WgpuDevice::with_options(memory::options(fuse)) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v == "1") => {
            panic!("KILN_REQUIRE_VULKAN=1 but no wgpu device: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no wgpu device ({e}); set KILN_REQUIRE_VULKAN=1 to make this a failure");
            None
        }
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_plans_and_buffer_counts_meet_the_published_numbers() {
    let (Some(unfused), Some(fused)) = (wgpu_device(false), wgpu_device(true)) else { return };
    let traced = programs(kiln::Device::Wgpu);
    for ((traced, device), published) in traced.iter().zip([&unfused, &fused, &fused]).zip(&PUBLISHED_WGPU) {
        let m = memory::measure_wgpu(device, traced).expect("the program compiles, runs and matches the interpreter");
        check_published(&m, published, true);
    }
    // A third run of the Transformer, through the device's program cache this time.
    let before = fused.buffers_created();
    fused.run(&traced[2].graph, &traced[2].inputs, &traced[2].bindings).expect("the cached program runs");
    assert_eq!(fused.buffers_created(), before, "a cache hit must create no buffer");
}

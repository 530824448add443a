//! The memory planner's reuse shows in numbers (asserted, not timed): a chain of 100 unary ops
//! compiled one kernel per op plans an arena of about two buffers where one allocation per
//! temporary needs 99; the 2-layer Transformer forward plans less than naive; on wgpu the second
//! run of the cached Transformer program creates no buffer (skipped with a printed reason when
//! there is no adapter, unless `KILN_REQUIRE_VULKAN=1`).

use kiln_cli::bench::memory::{self, Measured};
use kiln_cli::model::GptConfig;
use runtime::CpuDevice;
use runtime::wgpu::WgpuDevice;

const ELEMENTS: usize = 4096;
const BUFFER: u64 = 4 * ELEMENTS as u64;

fn cpu(fuse: bool) -> CpuDevice {
    CpuDevice::with_options(memory::options(fuse)).expect("the cpu device")
}

#[test]
fn unfused_chain_of_100_ops_reuses_two_buffers() {
    let traced = memory::chain_program(ELEMENTS, 100).expect("the chain traces");
    let m = memory::measure_cpu(&cpu(false), &traced).expect("the chain compiles and runs");
    assert_eq!(m.launches, 100, "one kernel launch per op: {m:?}");
    // 100 ops: 99 temporaries (the last op writes the output buffer), each one vector.
    assert!(m.naive_bytes >= 99 * BUFFER, "naive should be 99 buffers of {BUFFER} bytes: {m:?}");
    assert!(
        m.arena_bytes <= 3 * BUFFER,
        "the arena should hold at most 3 buffers of {BUFFER} bytes, got {} (naive {}, ratio {:.1}): {m:?}",
        m.arena_bytes,
        m.naive_bytes,
        m.ratio().unwrap_or(0.0)
    );
    assert!(m.peak_live_bytes <= m.arena_bytes, "{m:?}");
}

#[test]
fn fused_chain_needs_at_most_one_buffer() {
    // Fused kernels hold at most `MAX_DEPTH` ops: 100 ops make 2 kernels and 1 temporary.
    let traced = memory::chain_program(ELEMENTS, 100).expect("the chain traces");
    let m = memory::measure_cpu(&cpu(true), &traced).expect("the chain compiles and runs");
    assert_eq!(m.launches, 100usize.div_ceil(lower::schedule::MAX_DEPTH as usize), "{m:?}");
    assert!(m.arena_bytes <= BUFFER, "{m:?}");
}

fn check_transformer_plan(m: &Measured) {
    let ratio = m.ratio().expect("the forward has temporaries");
    assert!(
        m.arena_bytes < m.naive_bytes,
        "planned arena {} bytes should be below naive {} bytes (naive/planned {ratio:.2}): {m:?}",
        m.arena_bytes,
        m.naive_bytes
    );
    assert!(m.peak_live_bytes <= m.arena_bytes, "peak live bytes bound the arena from below: {m:?}");
}

#[test]
fn transformer_forward_plans_less_than_naive() {
    let traced = memory::transformer_program(GptConfig::default(), kiln::Device::Cpu).expect("the forward traces");
    let m = memory::measure_cpu(&cpu(true), &traced).expect("the forward compiles and runs");
    check_transformer_plan(&m);
}

#[test]
fn wgpu_second_run_of_cached_transformer_creates_no_buffers() {
    let device = match WgpuDevice::new() {
        Ok(d) => d,
        Err(e) if std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v == "1") => {
            panic!("KILN_REQUIRE_VULKAN=1 but no wgpu device: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no wgpu device ({e}); set KILN_REQUIRE_VULKAN=1 to make this a failure");
            return;
        }
    };
    let traced = memory::transformer_program(GptConfig::default(), kiln::Device::Wgpu).expect("the forward traces");
    let m = memory::measure_wgpu(&device, &traced).expect("the forward compiles and runs on wgpu");
    assert!(m.buffers_first_run.is_some_and(|n| n > 0), "the first run allocates its buffers: {m:?}");
    assert_eq!(m.buffers_second_run, Some(0), "the second run of a cached program must create no buffer: {m:?}");
    // A third run, through the device's program cache this time.
    let before = device.buffers_created();
    device.run(&traced.graph, &traced.inputs, &traced.bindings).expect("the cached program runs");
    assert_eq!(device.buffers_created(), before, "a cache hit must create no buffer");
    check_transformer_plan(&m);
}

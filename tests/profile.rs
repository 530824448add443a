//! Profiling a user's realize through the library: `kiln::profile::profile` sees the trace, every
//! compiler pass, code generation, the memory plan and the run, and a cached second realize.

use kiln::profile::{self, CountingAlloc, PassRow, Report};
use kiln::{Device, Tensor};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::SYSTEM;

/// A two-layer MLP with a softmax head on the CPU device; `seed` varies only the data.
fn mlp(seed: f32) -> kiln::Result<Tensor> {
    let data = |n: usize, scale: f32| (0..n).map(|i| ((i as f32 + seed) * 0.37).sin() * scale).collect::<Vec<f32>>();
    let x = Tensor::from_vec(data(4 * 8, 1.0), &[4, 8]).to_device(Device::Cpu)?;
    let w1 = Tensor::from_vec(data(8 * 16, 0.5), &[8, 16]).to_device(Device::Cpu)?;
    let w2 = Tensor::from_vec(data(16 * 3, 0.5), &[16, 3]).to_device(Device::Cpu)?;
    Ok(x.matmul(&w1).relu().matmul(&w2).softmax(1))
}

fn row<'a>(rows: &'a [PassRow], name: &str) -> Option<&'a PassRow> {
    rows.iter().find(|r| r.name == name)
}

fn profiled(seed: f32) -> (Vec<f32>, Report) {
    let (out, report) = profile::profile(|| mlp(seed)?.to_vec::<f32>());
    (out.expect("the MLP runs"), report)
}

#[test]
fn profile_of_a_realize_covers_the_compiler_and_a_second_realize_hits_the_cache() {
    let (probs, first) = profiled(0.0);
    assert_eq!(probs.len(), 12);
    for r in probs.chunks(3) {
        assert!((r.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{probs:?}");
    }
    let rows = first.passes();
    for name in ["trace", "graph-key", "verify", "optimize", "decide-fusion", "emit-kernels", "codegen", "prepare"] {
        let r = row(&rows, name).unwrap_or_else(|| panic!("no {name} span in\n{first}"));
        assert!(!r.time.is_zero(), "{name} took no time\n{first}");
    }
    for name in ["trace", "optimize", "decide-fusion", "emit-kernels"] {
        let r = row(&rows, name).unwrap();
        assert!(r.nodes_out.is_some_and(|n| n > 0), "{name} has no node count\n{first}");
    }
    assert!(row(&rows, "trace").unwrap().nodes_out.is_some_and(|n| n >= 8), "{first}");
    let run = row(&rows, "first-run").unwrap_or_else(|| panic!("no first-run span in\n{first}"));
    assert!(!run.time.is_zero());
    assert!(row(&rows, "run").is_none() && row(&rows, "cache-hit").is_none(), "{first}");
    assert!(first.counter("kernels").is_some_and(|k| k > 0), "{first}");
    assert!(first.counter("loop kernels").is_some(), "{first}");
    let memory = first.memory.expect("the memory plan is recorded");
    assert!(memory.naive_bytes >= memory.arena_bytes);
    let phases: Vec<profile::Phase> = first.phase_totals().into_iter().map(|(p, _)| p).collect();
    for p in [profile::Phase::GraphBuild, profile::Phase::Rewrite, profile::Phase::Schedule, profile::Phase::Codegen] {
        assert!(phases.contains(&p), "{p:?} missing\n{first}");
    }
    let text = first.to_string();
    for name in ["trace", "optimize", "decide-fusion", "emit-kernels", "codegen", "first-run", "peak memory planned"] {
        assert!(text.contains(name), "{name} not printed\n{text}");
    }

    // The same structure with other data: compiled once already, so no compiler passes.
    let (again, second) = profiled(1.0);
    assert_eq!(again.len(), 12);
    let rows = second.passes();
    assert!(row(&rows, "cache-hit").is_some(), "{second}");
    for name in ["codegen", "optimize", "emit-kernels", "prepare", "first-run"] {
        assert!(row(&rows, name).is_none(), "{name} on a cache hit\n{second}");
    }
    assert!(row(&rows, "trace").is_some() && row(&rows, "run").is_some(), "{second}");
    let text = second.to_string();
    assert!(text.contains("cache-hit") && !text.contains("codegen "), "{text}");
    println!("first realize:\n{first}\nsecond realize:\n{second}");
}

#[test]
fn realize_outside_a_profile_records_nothing() {
    let t = (Tensor::from_vec(vec![1.0f32, 2.0], &[2]).to_device(Device::Cpu).unwrap() * 3.0).sum_all();
    assert_eq!(t.item::<f32>().unwrap(), 9.0);
    assert!(!profile::is_active());
    let ((), report) = profile::profile(|| ());
    assert!(report.spans.is_empty());
}

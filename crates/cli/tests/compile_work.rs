//! The compile-time regression guard: counts work, not time. For the decoder at depths 1, 2, 4
//! and 8, the rewriter's node visits and rule attempts, the allocations made while lowering and
//! generating code, and the kernels compiled must grow at most linearly with depth, with roughly
//! constant per-layer increments (identical layers share compiled kernels).

use kiln_cli::model::{Gpt, GptConfig};
use kiln_cli::pipeline::{Traced, WorkCounts, compile_work};

#[global_allocator]
static ALLOC: kiln::profile::CountingAlloc = kiln::profile::CountingAlloc;

fn work(layers: usize) -> WorkCounts {
    let gpt = Gpt::new(GptConfig { layers, ..GptConfig::default() }, 0).expect("the model builds");
    let logits = gpt.forward(&gpt.tokens(1));
    let traced = Traced::of(&[&logits]).expect("the forward pass traces");
    compile_work(&traced.graph, &lower::CompileOptions::default()).expect("the graph compiles")
}

/// Checks one counter: `count(8) / count(1) <= 8 * 1.25`, and every per-layer increment
/// (2 -> 4, 4 -> 8) at most twice the first (1 -> 2) and at least half of it.
fn check_linear(what: &str, counts: &[(usize, u64)]) {
    let (d1, c1) = counts[0];
    let (d8, c8) = counts[counts.len() - 1];
    assert!(c1 > 0, "{what}: zero at depth {d1}");
    let ratio = c8 as f64 / c1 as f64;
    assert!(ratio <= (d8 / d1) as f64 * 1.25, "{what}: {counts:?} grows faster than linearly ({ratio:.2}x)");
    let per_layer: Vec<f64> =
        counts.windows(2).map(|w| (w[1].1 as f64 - w[0].1 as f64) / (w[1].0 - w[0].0) as f64).collect();
    let first = per_layer[0].max(1.0);
    for (i, inc) in per_layer.iter().enumerate() {
        assert!(
            *inc <= 2.0 * first + 8.0,
            "{what}: per-layer increment {i} is {inc:.1}, the first was {first:.1} ({counts:?})"
        );
    }
}

#[test]
fn compile_work_grows_linearly_with_depth() {
    assert!(kiln::profile::counting_installed(), "CountingAlloc counts this test's allocations");
    let depths = [1usize, 2, 4, 8];
    let counts: Vec<(usize, WorkCounts)> = depths.iter().map(|&d| (d, work(d))).collect();
    for (d, w) in &counts {
        eprintln!("depth {d}: {w:?}");
    }
    let series = |f: fn(&WorkCounts) -> u64| counts.iter().map(|(d, w)| (*d, f(w))).collect::<Vec<_>>();
    check_linear("graph nodes", &series(|w| w.nodes));
    check_linear("rewrite visits", &series(|w| w.visits));
    check_linear("rule attempts", &series(|w| w.attempts));
    check_linear("allocations in lower::compile", &series(|w| w.lower_allocs));
    check_linear("allocations in codegen", &series(|w| w.codegen_allocs));
    check_linear("launches", &series(|w| w.launches));
    // Identical layers share kernels: the kernels compiled grow far slower than the depth.
    let compiled = series(|w| w.compiled);
    let (c1, c8) = (compiled[0].1, compiled[3].1);
    assert!(c8 <= 2 * c1 + 8, "loop kernels compiled {compiled:?}: identical layers should share kernels");
}

//! The compile-time regression guard: counts work, not time. The decoder is compiled at depths 1,
//! 2, 4, 8 and 16, and for every compile step (graph key, verify, optimize, decide-fusion,
//! emit-kernels, codegen, prepare, memory plan) the units of work it counted (`air::work`: nodes
//! visited, edges touched, rule attempts, planner steps, tree operations, instructions emitted)
//! are fitted with `work(d) = a + b*d + c*d^2` by least squares (see the FIXME on the memory
//! plan of concurrent levels, checked to depth 8 only). The test fails when a step grows
//! faster than linearly (`c` not near zero next to `b`) or when it does less work per layer than
//! it must (its counters would then not be counting the work). Allocations and kernel counts are
//! checked the same way.

use kiln_cli::model::{Gpt, GptConfig};
use kiln_cli::pipeline::{Traced, WORK_STEPS, WorkCounts, compile_work};
use lower::Pass;
use runtime::Step;

#[global_allocator]
static ALLOC: kiln::profile::CountingAlloc = kiln::profile::CountingAlloc::SYSTEM;

/// The depths compiled; the largest is `MAX_DEPTH`.
const DEPTHS: [usize; 5] = [1, 2, 4, 8, 16];
const MAX_DEPTH: f64 = 16.0;

/// How much of a step's linear growth its quadratic term may add at the largest depth `D` of a
/// series: `c * D^2 <= QUADRATIC_SHARE * b * D`, that is `c * D <= 0.1 * b`.
///
/// Why a tenth: a linear step fits `c = 0` up to rounding (measured at depth 16: `c * 16 / b` at
/// most 0.003 for the graph passes; codegen's is negative, -0.76, because identical layers share
/// kernels). The memory plan's placement is O(T log T), and its log factor fits as 0.04. One scan
/// of the graph per node (210 nodes per layer) adds `c` of about 210^2 = 44100 units per layer^2,
/// hundreds of times the threshold for any step here. What passes is a quadratic term below a
/// tenth of the linear one at depth 16: one that cannot dominate its step before depth 160.
const QUADRATIC_SHARE: f64 = 0.1;

fn work(layers: usize) -> WorkCounts {
    let gpt = Gpt::new(GptConfig { layers, ..GptConfig::default() }, 0).expect("the model builds");
    let logits = gpt.forward(&gpt.tokens(1));
    let traced = Traced::of(&[&logits]).expect("the forward pass traces");
    compile_work(&traced.graph, &traced.bindings, &lower::CompileOptions::default()).expect("the graph compiles")
}

/// The least-squares fit `(a, b, c)` of `y = a + b*x + c*x^2`.
fn fit_quadratic(points: &[(f64, f64)]) -> (f64, f64, f64) {
    // Normal equations: sum_k x^(i+k) * coef_k = sum y * x^i, solved by Gaussian elimination with
    // partial pivoting (the system is 3x3 and well conditioned for these few small depths).
    let mut m = [[0.0f64; 4]; 3];
    for &(x, y) in points {
        let powers = [1.0, x, x * x];
        for i in 0..3 {
            for k in 0..3 {
                m[i][k] += powers[i] * powers[k];
            }
            m[i][3] += y * powers[i];
        }
    }
    for col in 0..3 {
        let pivot = (col..3).max_by(|&p, &q| m[p][col].abs().total_cmp(&m[q][col].abs())).unwrap();
        m.swap(col, pivot);
        let pivot_row = m[col];
        for row in &mut m[col + 1..] {
            let f = row[col] / pivot_row[col];
            for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                *x -= f * p;
            }
        }
    }
    let mut coef = [0.0f64; 3];
    for row in (0..3).rev() {
        let known: f64 = (row + 1..3).map(|k| m[row][k] * coef[k]).sum();
        coef[row] = (m[row][3] - known) / m[row][row];
    }
    (coef[0], coef[1], coef[2])
}

/// Fits one series and checks it: the quadratic term stays below `QUADRATIC_SHARE` of the linear
/// one at the series' largest depth, and the work per layer `b` is at least `min_per_layer`. Returns `b`.
fn check_linear(what: &str, series: &[(usize, u64)], min_per_layer: f64) -> f64 {
    let points: Vec<(f64, f64)> = series.iter().map(|&(d, w)| (d as f64, w as f64)).collect();
    let (a, b, c) = fit_quadratic(&points);
    let max_depth = points.last().expect("a series has points").0;
    eprintln!("{what:>24}: a {a:>12.1}  b {b:>10.1}  c {c:>9.3}  c*{max_depth}/b {:>7.4}", c * max_depth / b.max(1e-9));
    assert!(
        b >= min_per_layer && b > 0.0,
        "{what}: {b:.1} units per layer, expected at least {min_per_layer:.1}: the counters miss work ({series:?})"
    );
    assert!(
        c * max_depth <= QUADRATIC_SHARE * b,
        "{what}: grows faster than linearly with depth: work(d) = {a:.1} + {b:.1} d + {c:.3} d^2, \
         c*{max_depth} > {QUADRATIC_SHARE} b ({series:?})"
    );
    b
}

#[test]
fn fit_recovers_known_coefficients() {
    let points: Vec<(f64, f64)> =
        DEPTHS.iter().map(|&d| (d as f64, 7.0 + 3.0 * d as f64 + 0.5 * (d * d) as f64)).collect();
    let (a, b, c) = fit_quadratic(&points);
    assert!((a - 7.0).abs() < 1e-6 && (b - 3.0).abs() < 1e-6 && (c - 0.5).abs() < 1e-9, "{a} {b} {c}");
}

#[test]
fn compile_work_grows_linearly_with_depth() {
    assert!(kiln::profile::counting_installed(), "CountingAlloc counts this test's allocations");
    let counts: Vec<(usize, WorkCounts)> = DEPTHS.iter().map(|&d| (d, work(d))).collect();
    for (d, w) in &counts {
        eprintln!("depth {d}: {w:?}");
    }
    let series = |f: &dyn Fn(&WorkCounts) -> u64| counts.iter().map(|(d, w)| (*d, f(w))).collect::<Vec<_>>();

    let nodes_per_layer = check_linear("graph nodes", &series(&|w| w.nodes), 1.0);
    let launches_per_layer = check_linear("launches", &series(&|w| w.launches), 1.0);
    // Lower bounds: the graph passes visit every node of a layer at least once (the optimizer
    // only the live ones, about half); the program passes every launch of a layer.
    for (i, step) in WORK_STEPS.iter().enumerate() {
        let min = match *step {
            Step::GraphKey | Step::Lower(Pass::Verify | Pass::DecideFusion | Pass::EmitKernels) => nodes_per_layer,
            Step::Lower(Pass::Optimize) => nodes_per_layer / 2.0,
            // Saturation runs only at `OptLevel::O2` and above (not the default, which this
            // compiles at): it does no work here, so there is nothing to fit.
            Step::Lower(Pass::Saturate) => continue,
            Step::Prepare => launches_per_layer,
            Step::MemoryPlan => continue,
            // Identical layers share kernels: codegen looks each of a layer's kernels up, and
            // compiles only the kernels no earlier layer has.
            Step::Codegen => 0.0,
            other => panic!("no lower bound for step {other}"),
        };
        check_linear(step.name(), &series(&|w| w.steps[i]), min);
    }
    check_linear("memory plan, sequential", &series(&|w| w.plan_sequential), launches_per_layer);
    // FIXME: the device's plan is the sequential one until a depth where the first dependency
    // level (independent steps of every layer) has enough work to run concurrently (depth 16
    // while every `Linear`'s bias was accumulated by its GEMM; with the bias added by the
    // consumer's kernel, none of the depths here). Such a level's temporaries share one time
    // slot, all overlap, and placement examines every placed temporary of the slot for each one:
    // quadratic in depth (56528 units at depth 16 against 11858 for the sequential plan). Checked
    // linear where it is, and the jump asserted where a concurrent plan appears, so that a fix
    // (placement by free intervals, not by a scan of the overlapping buffers) updates this test.
    let device_plan = series(&|w| w.step(Step::MemoryPlan).unwrap());
    let sequential = series(&|w| w.plan_sequential);
    let concurrent_from = device_plan.iter().zip(&sequential).position(|(d, s)| d.1 != s.1).unwrap_or(DEPTHS.len());
    assert!(concurrent_from >= 3, "a concurrent level from depth {}: linear below it?", DEPTHS[concurrent_from]);
    check_linear("memory-plan (sequential depths)", &device_plan[..concurrent_from], launches_per_layer);
    if let (Some(d), Some(s)) = (device_plan.get(concurrent_from), sequential.get(concurrent_from)) {
        assert!(
            d.1 > 3 * s.1,
            "the concurrent plan at depth {} costs {} units, the sequential {}: fixed? see the FIXME",
            d.0,
            d.1,
            s.1
        );
    }
    let without_plan: Vec<(usize, u64)> =
        counts.iter().map(|(d, w)| (*d, w.steps.iter().sum::<u64>() - w.step(Step::MemoryPlan).unwrap())).collect();
    let total = check_linear("all steps but the plan", &without_plan, nodes_per_layer * 5.0);
    eprintln!("total work per layer {total:.0} units, {:.1} per graph node", total / nodes_per_layer);
    check_linear("rewrite visits", &series(&|w| w.visits), nodes_per_layer / 2.0);
    check_linear("rule attempts", &series(&|w| w.attempts), 1.0);
    check_linear("allocations in lower", &series(&|w| w.lower_allocs), 1.0);
    // Identical layers share kernels: the kernels compiled grow far slower than the depth.
    let compiled = series(&|w| w.compiled);
    let (c1, cmax) = (compiled[0].1, compiled[compiled.len() - 1].1);
    assert!(cmax <= 2 * c1 + 8, "loop kernels compiled {compiled:?}: identical layers should share kernels");
    let codegen_allocs = series(&|w| w.codegen_allocs);
    let (a1, amax) = (codegen_allocs[0].1, codegen_allocs[codegen_allocs.len() - 1].1);
    assert!(amax <= 2 * a1 + 64 * MAX_DEPTH as u64, "allocations in codegen {codegen_allocs:?}");
}

/// The memory plan of the cached forward (`kiln profile transformer --start-pos 2`: every
/// `Linear`'s bias broadcast into its product's output by a step that reads only the bias), to
/// depth 32. Those steps depend on nothing: at dependency level 0 they were all alive from the
/// start, the first level became wide enough to run concurrently (from depth 32) and the whole
/// program then ran by levels, its plan placing every layer's copies against each other (112907
/// units at depth 32 against 9369 at 16, and an arena of 1.66 MiB against 82.5 KiB).
/// `lower::batch` now puts such a step one level below its first dependent.
#[test]
fn the_cached_forward_plans_linearly_to_depth_32() {
    let depths = [1usize, 2, 4, 8, 16, 32];
    let counts: Vec<(usize, WorkCounts)> = depths
        .iter()
        .map(|&layers| {
            let gpt = Gpt::new(GptConfig { layers, start_pos: Some(2), ..GptConfig::default() }, 0)
                .expect("the model builds");
            let (outputs, bindings) = gpt.outputs(&gpt.tokens(1)).expect("the cached forward records");
            let traced = Traced::of(&outputs.iter().collect::<Vec<_>>()).expect("the cached forward traces");
            let mut bindings = bindings;
            bindings.extend(traced.bindings.iter().map(|(k, v)| (k.clone(), *v)));
            let work = compile_work(&traced.graph, &bindings, &lower::CompileOptions::default()).expect("it compiles");
            (layers, work)
        })
        .collect();
    let series = |f: &dyn Fn(&WorkCounts) -> u64| counts.iter().map(|(d, w)| (*d, f(w))).collect::<Vec<_>>();
    let launches_per_layer = check_linear("cached launches", &series(&|w| w.launches), 1.0);
    check_linear("cached memory plan", &series(&|w| w.step(Step::MemoryPlan).unwrap()), launches_per_layer);
}

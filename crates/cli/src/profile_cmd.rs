//! `kiln profile transformer` and `kiln profile model`: build the decoder (or a model of
//! `nn::zoo`), compile it, run it once, all inside `kiln::profile`, and report the per-pass
//! table, the totals and the planned memory.

use std::time::Instant;

use kiln::Bindings;
use kiln::profile::{self, Report};
use lower::CompileOptions;
use lower::rewrite::RewriteStats;

use crate::model::{Gpt, GptConfig};
use crate::pipeline::{self, Compiled, Traced};

/// The result of one profiled build + compile + first run.
pub struct Profiled {
    pub report: Report,
    pub traced: Traced,
    pub compiled: Compiled,
    pub rewrite: RewriteStats,
    /// Milliseconds of a second run (the program already compiled and its memory planned).
    pub second_run_ms: f64,
    /// Milliseconds from the end of the second run until the JIT's background thread had
    /// swapped optimised code into every kernel (`kiln::wait_tier_up`; 0 when not tiered),
    /// and of a run after that.
    pub tier_up_wait_ms: f64,
    pub optimized_run_ms: f64,
}

/// Profiles any tensor program: `build` (run inside the profile, so its own spans count) returns
/// lazy tensors, which are then traced, compiled on a fresh CPU device (nothing cached) and
/// run once, each step a span. The report also gets the rewriter's counters (from the compile's
/// own `optimize` pass). With `keep_graphs`, `compiled.graphs` holds the graph after each pass
/// that changed it (for `--dump`; copied only then).
///
/// ```no_run
/// use kiln::Tensor;
/// let p = kiln_cli::profile_cmd::profile_tensors(
///     || {
///         let x = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]);
///         Ok(vec![(x.exp() + 1.0).sum_all()])
///     },
///     &lower::CompileOptions::default(),
///     false,
/// )?;
/// println!("{}", p.report);
/// # Ok::<(), anyhow::Error>(())
/// ```
pub fn profile_tensors(
    build: impl FnOnce() -> anyhow::Result<Vec<kiln::Tensor>>,
    options: &CompileOptions,
    keep_graphs: bool,
) -> anyhow::Result<Profiled> {
    profile_bound(|| Ok((build()?, Bindings::new())), options, keep_graphs)
}

/// Records, compiles (on a device of its own, as a profile does) and runs once what `build`
/// returns, untimed: the warm-up before a profile, so that the profiled compilation pays none of
/// the process's one-time start-up costs. One run only: a second would send the program's kernels
/// to the JIT's optimising thread, still at work while the profiled compilation runs.
pub fn warm_up(
    build: impl FnOnce() -> anyhow::Result<Vec<kiln::Tensor>>,
    options: &CompileOptions,
) -> anyhow::Result<()> {
    record_compile_run(|| Ok((build()?, Bindings::new())), options, false).map(drop)
}

/// Records what `build` returns (symbol values it returns added to the traced program's
/// bindings), compiles it on a device of its own and runs it once: the `trace`, compile and
/// `first-run` spans when a profile records. A compile thread is woken first, as `kiln::jit`
/// wakes one before it runs the closure it traces (`CpuDevice::expect_compile`).
fn record_compile_run(
    build: impl FnOnce() -> anyhow::Result<(Vec<kiln::Tensor>, Bindings)>,
    options: &CompileOptions,
    keep_graphs: bool,
) -> anyhow::Result<(Traced, Compiled)> {
    kiln::backend::cpu_device()?.expect_compile();
    let (outputs, bindings) = build()?;
    let refs: Vec<&kiln::Tensor> = outputs.iter().collect();
    profile::begin(profile::Step::Trace, None);
    let traced = Traced::of(&refs);
    profile::end(traced.as_ref().ok().map(|t| t.graph.len()));
    let mut traced = traced?;
    traced.bindings.extend(bindings);
    let compiled = pipeline::compile(&traced.graph, &traced.bindings, options, keep_graphs)?;
    pipeline::first_run(&compiled, &traced)?;
    Ok((traced, compiled))
}

/// [`profile_tensors`] for a `build` that also returns symbol values its inputs do not bind (a
/// position), added to the traced program's bindings.
pub fn profile_bound(
    build: impl FnOnce() -> anyhow::Result<(Vec<kiln::Tensor>, Bindings)>,
    options: &CompileOptions,
    keep_graphs: bool,
) -> anyhow::Result<Profiled> {
    let (result, mut report) = profile::profile(|| record_compile_run(build, options, keep_graphs));
    let (traced, compiled) = result?;
    // Runs as a decoding loop makes them: a key/value cache given up and taken back, not copied.
    let mut inputs = pipeline::owned_inputs(&compiled, &traced);
    let t0 = Instant::now();
    drop(pipeline::run_in_place(&compiled, &mut inputs, &traced.bindings)?);
    let second_run_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t0 = Instant::now();
    kiln::wait_tier_up();
    let tier_up_wait_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t0 = Instant::now();
    drop(pipeline::run_in_place(&compiled, &mut inputs, &traced.bindings)?);
    let optimized_run_ms = t0.elapsed().as_secs_f64() * 1e3;
    let rewrite = compiled.rewrite.clone();
    report.counters.push(("rewrite visits".into(), rewrite.visits));
    report.counters.push(("attempts".into(), rewrite.attempts));
    report.counters.push(("rewrites".into(), rewrite.rewrites));
    report.counters.push(("cse merged".into(), rewrite.cse_merged));
    report.counters.push(("dead removed".into(), rewrite.dead_removed));
    if let Some(s) = &compiled.saturate {
        report.counters.push(("saturate iterations".into(), s.iterations as u64));
        report.counters.push(("e-nodes".into(), s.enodes as u64));
        report.counters.push(("e-classes".into(), s.eclasses as u64));
        report.counters.push(("saturate regions".into(), s.regions as u64));
        report.counters.push(("distinct regions".into(), s.distinct as u64));
    }
    Ok(Profiled { report, traced, compiled, rewrite, second_run_ms, tier_up_wait_ms, optimized_run_ms })
}

/// Builds the decoder of `config` (its weights and, for the cached forward, its key/value cache:
/// model state, made before the profiler starts, as the zoo's and ONNX models are), then records,
/// compiles and runs its forward pass once under the profiler ([`profile_tensors`]).
pub fn profile_transformer(config: GptConfig, options: &CompileOptions) -> anyhow::Result<Profiled> {
    profile_transformer_with(config, options, false)
}

/// [`profile_transformer`], keeping the graph after each pass when `keep_graphs` (see
/// [`profile_tensors`]).
pub fn profile_transformer_with(
    config: GptConfig,
    options: &CompileOptions,
    keep_graphs: bool,
) -> anyhow::Result<Profiled> {
    config.validate().map_err(anyhow::Error::msg)?;
    let model = Gpt::new(config, 0)?;
    let tokens = model.tokens(1);
    profile_bound(|| profile::span(profile::Step::Forward, || model.outputs(&tokens)), options, keep_graphs)
}

/// The text `kiln profile transformer` prints.
pub fn render(config: &GptConfig, p: &Profiled) -> String {
    let title = format!(
        "kiln profile transformer: layers {} dim {} heads {} vocab {} tokens ({}, {}){} on cpu",
        config.layers,
        config.dim,
        config.heads,
        config.vocab,
        config.batch,
        config.seq,
        match config.start_pos {
            Some(p) => format!(" at start position {p} (key/value cache of {} positions)", config.max_seq),
            None => String::new(),
        },
    );
    render_titled(&title, p)
}

/// `title`, the graph and kernel counts, the per-pass table and the second run's time: what every
/// `kiln profile` target prints.
pub fn render_titled(title: &str, p: &Profiled) -> String {
    format!(
        "{title}\n\
         graph: {} nodes traced -> {} kernels ({} loop kernels), {} launches per run\n\n\
         {}second run: {:.3} ms\n\
         optimised code (the JIT's background tier-up): in place {:.3} ms after the second run; a run then: {:.3} ms\n",
        p.traced.graph.len(),
        p.compiled.kernels,
        p.compiled.loop_kernels,
        p.compiled.launches,
        p.report,
        p.second_run_ms,
        p.tier_up_wait_ms,
        p.optimized_run_ms
    )
}

/// The `top` kernels of a profiled program by their launches' total time (each launch's median
/// over 11 runs, one launch at a time, after the calibration runs): where the run's time goes;
/// beside it, the same launches' time in the program's first run, where they were timed
/// (`runtime::time_first_runs` on before it): what a program called once pays.
pub fn launch_table(p: &Profiled, top: usize) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let exe = &p.compiled.exe;
    let first = exe.first_run_times();
    // Past the runs that calibrate each launch's threading, as a steady state is.
    for _ in 0..2 * runtime::CALIBRATION_RUNS + 1 {
        exe.run(&p.traced.inputs, &p.traced.bindings)?;
    }
    let times = exe.launch_times(&p.traced.inputs, &p.traced.bindings, 11)?;
    let total: u64 = times.iter().map(|t| t.median_ns).sum();
    // Per kernel: launches, total ns, first-run ns, the first launch's matmul sizes and threads.
    type Row = (u32, usize, u64, u64, Option<(usize, usize, usize, usize)>, u32, Option<runtime::InPlace>);
    let mut by_kernel: Vec<Row> = Vec::new();
    for t in &times {
        let first_ns = first.get(t.step).copied().unwrap_or(0);
        match by_kernel.iter_mut().find(|k| k.0 == t.kernel) {
            Some(k) => {
                k.1 += 1;
                k.2 += t.median_ns;
                k.3 += first_ns;
            }
            None => by_kernel.push((t.kernel, 1, t.median_ns, first_ns, t.matmul, t.threads, t.in_place)),
        }
    }
    by_kernel.sort_by_key(|k| std::cmp::Reverse(k.2));
    let mut out = format!(
        "\nlaunches: {} in {:.3} ms (sum of per-launch medians); top {} kernels by time\n",
        times.len(),
        total as f64 / 1e6,
        top.min(by_kernel.len())
    );
    let first_total: u64 = first.iter().sum();
    let first_timed = first.len() == times.len();
    if first_timed {
        writeln!(out, "first run: {:.3} ms (sum of its launches; `first us` below)", first_total as f64 / 1e6)?;
    }
    writeln!(
        out,
        "{:>6} {:>9} {:>10} {:>7} {:>10} {:>8}  what",
        "kernel", "launches", "total us", "share", "first us", "threads"
    )?;
    for (kernel, count, ns, first_ns, matmul, threads, in_place) in by_kernel.into_iter().take(top) {
        let what = match (matmul, &exe.program().kernels[kernel as usize]) {
            (Some((b, m, n, k)), lower::kir::Kernel::Matmul(mk)) => {
                let layout = |o: &lower::kir::MatOperand| {
                    if o.col_stride == lower::kir::IExpr::Const(1) { "row" } else { "col" }
                };
                let b_read = match in_place {
                    Some(runtime::InPlace::Window) => "read in place from the copy's source".to_string(),
                    _ => format!("{}-major", layout(&mk.b)),
                };
                format!("matmul batch {b} m {m} n {n} k {k} (a {}-major, b {b_read})", layout(&mk.a))
            }
            _ if in_place == Some(runtime::InPlace::Skipped) => {
                "loops (a copy skipped: its product reads its source)".into()
            }
            _ => "loops".to_string(),
        };
        let first_us = if first_timed { format!("{:.1}", first_ns as f64 / 1e3) } else { "-".into() };
        writeln!(
            out,
            "{:>6} {:>9} {:>10.1} {:>6.1}% {:>10} {:>8}  {what}",
            format!("k{kernel}"),
            count,
            ns as f64 / 1e3,
            100.0 * ns as f64 / total.max(1) as f64,
            first_us,
            threads
        )?;
    }
    Ok(out)
}

/// Builds the model `name` of `nn::zoo` and profiles its predict program (the forward pass under
/// `kiln::no_grad`, as `nn::Predictor` runs it) or, with `fit`, its training program without the
/// optimizer: the loss and the gradient of every parameter.
/// Unless `cold`, the same program is compiled and run once first ([`warm_up`]).
pub fn profile_model(
    name: &str,
    fit: bool,
    options: &CompileOptions,
    keep_graphs: bool,
    cold: bool,
) -> anyhow::Result<Profiled> {
    let mut case = nn::zoo::build(name)?;
    if !cold {
        warm_up(|| zoo_outputs(&mut case, fit), options)?;
    }
    profile_tensors(|| zoo_outputs(&mut case, fit), options, keep_graphs)
}

/// What [`profile_model`] records: the prediction, or with `fit` the loss and its gradients.
fn zoo_outputs(case: &mut nn::zoo::Case, fit: bool) -> anyhow::Result<Vec<kiln::Tensor>> {
    let x = case.x.clone();
    let forward = |model: &mut dyn nn::Module| profile::span(profile::Step::Forward, || model.forward(&x));
    if !fit {
        return Ok(vec![kiln::no_grad(|| forward(&mut *case.model))]);
    }
    let loss = case.loss.compute(&forward(&mut *case.model), &case.y);
    let params = case.model.parameters();
    let refs: Vec<&kiln::Tensor> = params.iter().collect();
    let mut out = vec![loss.clone()];
    out.extend(kiln::grad(&loss, &refs)?);
    Ok(out)
}

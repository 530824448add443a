//! `kiln bench transformer-compile`: compile time and forward time of the decoder per depth.
//!
//! - In process: end-to-end compile time (median of several runs, each with a fresh code
//!   generator and no program cache, after one untimed warm-up compile; the depths take turns, so
//!   a slow spell of the machine falls on all of them), its ratio to depth 1 and the phase split.
//!   A Kiln-internal figure: no peer is measured this way.
//! - In fresh processes (`--fresh-process N`): the first call of the model in a new `kiln`
//!   process (the hidden `kiln bench transformer-first-call`), N processes per depth, median;
//!   "cold" with nothing run before it, "pre-warmed" after one trivial realize (device start-up),
//!   as the anchor script times jax.jit's first call (after a trivial jit call) and torch.compile's
//!   cold and cold pre-warmed first calls, each in a fresh process. These are the like-for-like
//!   compile figures.
//! - Steady forward, as two separately labelled rows: the facade forward (record the lazy forward
//!   and `kiln::realize` it: trace, program-cache hit, run; what a user calls, like-for-like with torch
//!   eager's and jax.jit's call) and the bare `Executable::run` of the compiled program (no peer
//!   row measures this).
//!
//! Before timing each depth, the facade forward on the CPU device is checked against the same
//! forward on the interpreter device ([`check_forward`]), and before the steady timing the compiled
//! program's outputs against `air::interp::eval` ([`check_program`]); each fresh process checks
//! its result after its timed call.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail};
use kiln::profile::Phase;
use kiln::{Device, Tensor};
use lower::CompileOptions;

use crate::bench::check::{self, Tolerance};
use crate::model::{Gpt, GptConfig};
use crate::output::{Cell, SuiteOutput, Table, progress};
use crate::pipeline;
use crate::profile_cmd::{Profiled, profile_transformer};
use crate::runner::Runner;
use crate::svg::{Plot, Series};
use crate::timing::{Budget, measure_ms, median};

/// How fresh processes are started: this binary, `processes` times per depth and mode.
#[derive(Clone, Debug)]
pub struct FreshProcess {
    /// The `kiln` executable to spawn.
    pub exe: PathBuf,
    /// Processes per depth for each of cold and pre-warmed.
    pub processes: usize,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Args {
    pub layers: Vec<usize>,
    pub repeats: usize,
    pub base: GptConfig,
    pub steady: Budget,
    /// Also time the first call in fresh processes.
    pub fresh_process: Option<FreshProcess>,
}

/// The medians for one depth.
#[derive(Clone, Debug, Default)]
pub struct DepthResult {
    pub layers: usize,
    pub nodes: usize,
    pub kernels: usize,
    pub loop_kernels: usize,
    pub launches: usize,
    /// Median milliseconds of each phase, in `Phase::ALL` order.
    pub phases_ms: Vec<f64>,
    pub end_to_end_ms: f64,
    pub allocs: u64,
    /// Median milliseconds of `runtime::CpuDevice::compile` on a fresh device (the same work as
    /// the rewrite to memory-plan phases, through the device's own entry point).
    pub device_compile_ms: f64,
    pub steady_ms: f64,
    /// Median milliseconds of a whole forward through the facade on `Device::Cpu`: record the
    /// lazy forward, `kiln::realize` (trace, program-cache hit, run). `None` for the cached
    /// forward, which runs only compiled.
    pub facade_ms: Option<f64>,
    /// Median milliseconds of the same forward as a compiled function (`nn::Predictor`, built on
    /// `kiln::jit`; with a start position, `Transformer::forward_at`): bind the tokens and
    /// weights (and the cache) to the traced program and run it.
    pub jit_ms: f64,
    /// Milliseconds of the first call in each fresh process: nothing before it (cold), and after
    /// a trivial realize (pre-warmed). Empty without `--fresh-process`.
    pub fresh_cold_ms: Vec<f64>,
    pub fresh_prewarmed_ms: Vec<f64>,
}

/// The line a `transformer-first-call` process prints its result on, followed by milliseconds.
pub const FIRST_CALL_PREFIX: &str = "first-call-ms ";

/// Checks the outputs of the compiled program of a profiled compilation `p` against
/// `air::interp::eval` of its graph on the same inputs.
pub fn check_program(p: &Profiled) -> anyhow::Result<()> {
    let outputs = p.compiled.exe.run(&p.traced.inputs, &p.traced.bindings)?;
    let what = format!("transformer Executable::run, {} graph nodes", p.traced.graph.len());
    check::against_eval(&what, &p.traced, &outputs, Tolerance::MODEL)
}

/// Checks the facade forward of `config` (weights from seed 0, tokens from seed 1) on `runner`
/// against the interpreter.
/// With a start position, the cached forward (`Transformer::forward_at` after a prefill of that
/// many tokens) is checked instead.
pub fn check_forward(config: GptConfig, runner: &Runner) -> anyhow::Result<()> {
    let what = match config.start_pos {
        Some(p) => format!("transformer cached forward at start position {p}, {} layers", config.layers),
        None => format!("transformer facade forward, {} layers", config.layers),
    };
    check::against_interp(&what, runner, Tolerance::MODEL, |r| {
        let mut gpt = Gpt::new(config, 0)?;
        r.place_module(&mut gpt.model)?;
        let tokens = r.place(gpt.tokens(1))?;
        match config.start_pos {
            Some(p) => {
                let (mut cache, logits) = cached_at(&mut gpt, &tokens, p, r)?;
                let again = gpt.model.forward_at(&tokens, p, &mut cache)?;
                Ok(vec![logits, again])
            }
            None => Ok(vec![gpt.forward(&tokens)]),
        }
    })
}

/// A key/value cache of `gpt` prefilled with `start_pos` tokens (from seed 2), and the logits of
/// `tokens` fed after them.
fn cached_at(gpt: &mut Gpt, tokens: &Tensor, start_pos: usize, r: &Runner) -> anyhow::Result<(nn::KvCache, Tensor)> {
    let mut cache = gpt.model.kv_cache(gpt.config.batch)?;
    if start_pos > 0 {
        let prefix = Gpt::new(GptConfig { seq: start_pos, ..gpt.config }, 0)?.tokens(2);
        let _ = gpt.model.forward_at(&r.place(prefix)?, 0, &mut cache)?;
    }
    let logits = gpt.model.forward_at(tokens, start_pos, &mut cache)?;
    Ok((cache, logits))
}

/// The launches of the compiled forward that check data (their step binds the program's status
/// buffer: a gather's index range, an integer division), all launches, and the share of the
/// run's launch time (medians of [`runtime::Executable::launch_times`]) the checking launches
/// take as a whole. The checks are one compare and a never-taken branch inside those launches,
/// so the share bounds their cost from above.
pub fn checked_share(p: &Profiled) -> anyhow::Result<(usize, usize, f64)> {
    let exe = &p.compiled.exe;
    let program = exe.program();
    let checks = |step: usize| {
        program.steps[step].args.iter().any(|b| program.buffers[b.0 as usize].kind == lower::BufferKind::Status)
    };
    let times = exe.launch_times(&p.traced.inputs, &p.traced.bindings, 21)?;
    let total: u64 = times.iter().map(|t| t.median_ns).sum();
    let checked: Vec<_> = times.iter().filter(|t| checks(t.step)).collect();
    let checked_ns: u64 = checked.iter().map(|t| t.median_ns).sum();
    Ok((checked.len(), times.len(), checked_ns as f64 / total.max(1) as f64))
}

/// The first call of the decoder in this process, in milliseconds: record the forward and
/// `kiln::realize` it on the CPU device (trace, compile, code generation, run). Weights and tokens
/// are made before the clock starts (the anchors make their parameters first too); with
/// `prewarm`, one trivial program is realized first, untimed, so that device start-up (thread
/// pool, code generator) is paid before, as the jax anchor does with a trivial jit call. The
/// result is checked against the interpreter's after the timed call.
pub fn first_call(config: GptConfig, prewarm: bool) -> anyhow::Result<f64> {
    config.validate().map_err(anyhow::Error::msg)?;
    let runner = Runner::on(Device::Cpu);
    if prewarm {
        let x = runner.place(kiln::Tensor::from_vec(vec![1.0f32; 3], &[3]))?;
        runner.realize(&[&x.neg()])?;
    }
    let mut gpt = Gpt::new(config, 0)?;
    runner.place_module(&mut gpt.model)?;
    let tokens = runner.place(gpt.tokens(1))?;
    let t0 = Instant::now();
    let logits = gpt.forward(&tokens);
    kiln::realize(&[&logits])?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let interp = Runner::on(Device::Interp);
    let mut reference = Gpt::new(config, 0)?;
    interp.place_module(&mut reference.model)?;
    let want = reference.forward(&interp.place(reference.tokens(1))?).to_host()?;
    let what = format!("transformer first call, {} layers", config.layers);
    check::compare(&what, &logits.to_host()?, &want, Tolerance::MODEL)?;
    Ok(ms)
}

/// Runs one `kiln bench transformer-first-call` process for `config` and reads its time.
fn spawn_first_call(fresh: &FreshProcess, config: GptConfig, prewarm: bool) -> anyhow::Result<f64> {
    let mut cmd = Command::new(&fresh.exe);
    cmd.arg("bench").arg("transformer-first-call");
    for (flag, value) in [
        ("--layers", config.layers),
        ("--dim", config.dim),
        ("--heads", config.heads),
        ("--vocab", config.vocab),
        ("--max-seq", config.max_seq),
        ("--batch", config.batch),
        ("--seq", config.seq),
    ] {
        cmd.arg(flag).arg(value.to_string());
    }
    if prewarm {
        cmd.arg("--prewarm");
    }
    let out = cmd.output().with_context(|| format!("starting {}", fresh.exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("{cmd:?} failed ({}):\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(FIRST_CALL_PREFIX))
        .with_context(|| format!("{cmd:?} printed no `{FIRST_CALL_PREFIX}` line:\n{stdout}"))?;
    line.trim().parse().with_context(|| format!("{cmd:?} printed `{line}`, not a number"))
}

fn phase_index(p: Phase) -> usize {
    Phase::ALL.iter().position(|&q| q == p).unwrap_or(0)
}

/// One depth's timed compiles: per phase, end to end, allocations and the device's compile, in
/// ms (allocations in counts), and the last compile's profile.
#[derive(Default)]
struct Compiles {
    phases: Vec<Vec<f64>>,
    totals: Vec<f64>,
    allocs: Vec<f64>,
    device_compile: Vec<f64>,
    last: Option<Profiled>,
}

/// Runs the suite.
pub fn run(args: &Args) -> anyhow::Result<SuiteOutput> {
    if args.base.start_pos.is_some() && args.fresh_process.is_some() {
        bail!("--fresh-process times the plain forward's first call; run it without --start-pos");
    }
    let options = CompileOptions::default();
    // Process-wide one-time costs (thread pool start, lazily built tables) are paid here, untimed,
    // so that the first depth measured is not charged for them.
    profile_transformer(GptConfig { layers: 1, ..args.base }, &options)?;

    let bar = progress((args.layers.len() * args.repeats) as u64, "transformer-compile");
    for &layers in &args.layers {
        check_forward(GptConfig { layers, ..args.base }, &Runner::on(Device::Cpu))?;
    }
    // The compiles of every depth take turns (depth 1, 2, 4, ..., then again), so that a slow
    // spell of the machine falls on all depths alike rather than on the one being measured: the
    // ratios between depths are the suite's targets.
    let mut compiles: Vec<Compiles> = args
        .layers
        .iter()
        .map(|_| Compiles { phases: vec![Vec::new(); Phase::ALL.len()], ..Compiles::default() })
        .collect();
    for _ in 0..args.repeats {
        for (&layers, c) in args.layers.iter().zip(&mut compiles) {
            bar.set_message(format!("{layers} layers"));
            let p = profile_transformer(GptConfig { layers, ..args.base }, &options)?;
            let by_phase = p.report.phase_totals();
            for (i, samples) in c.phases.iter_mut().enumerate() {
                let ms =
                    by_phase.iter().find(|(q, _)| phase_index(*q) == i).map_or(0.0, |(_, d)| d.as_secs_f64() * 1e3);
                samples.push(ms);
            }
            c.totals.push(p.report.end_to_end().as_secs_f64() * 1e3);
            c.allocs.push(p.report.alloc.allocs as f64);
            let device = runtime::CpuDevice::new()?;
            let t0 = Instant::now();
            device.compile(&p.traced.graph)?;
            c.device_compile.push(t0.elapsed().as_secs_f64() * 1e3);
            c.last = Some(p);
            bar.inc(1);
        }
    }
    let mut results = Vec::new();
    let mut check_notes = Vec::new();
    for (&layers, c) in args.layers.iter().zip(compiles) {
        let config = GptConfig { layers, ..args.base };
        let Compiles { phases, totals, allocs, device_compile, last } = c;
        let Some(p) = last else { continue };
        check_program(&p)?;
        // A cached forward's program updates the cache in place: each run takes the arrays the
        // last one returned, as a decoding loop does, rather than copying shared ones.
        let mut inputs = pipeline::owned_inputs(&p.compiled, &p.traced);
        let steady_ms =
            measure_ms(args.steady, || pipeline::run_in_place(&p.compiled, &mut inputs, &p.traced.bindings))?;
        let (checked, total, share) = checked_share(&p)?;
        check_notes.push(format!(
            "data checks, {layers} layers: {checked} of {total} launches check data (index range, integer division); \
             their whole time is {:.2}% of the bare run's launch time, an upper bound of what the checks cost",
            100.0 * share
        ));
        let mut gpt = Gpt::new(config, 0)?;
        let runner = Runner::on(Device::Cpu);
        runner.place_module(&mut gpt.model)?;
        let tokens = runner.place(gpt.tokens(1))?;
        let (facade_ms, jit_ms) = match config.start_pos {
            // The cached forward is a compiled function only (its position is a symbol the
            // call binds); each call writes its tokens' keys and values at the same position.
            Some(start) => {
                let (mut cache, _) = cached_at(&mut gpt, &tokens, start, &runner)?;
                let jit_ms = measure_ms(args.steady, || Ok(gpt.model.forward_at(&tokens, start, &mut cache)?))?;
                (None, jit_ms)
            }
            None => {
                let facade_ms = measure_ms(args.steady, || {
                    let logits = gpt.forward(&tokens);
                    kiln::realize(&[&logits])?;
                    Ok(logits)
                })?;
                let mut predictor = nn::Predictor::new();
                let jit_ms = measure_ms(args.steady, || Ok(predictor.predict(&mut gpt.model, &tokens)?))?;
                (Some(facade_ms), jit_ms)
            }
        };
        let (mut fresh_cold_ms, mut fresh_prewarmed_ms) = (Vec::new(), Vec::new());
        if let Some(fresh) = &args.fresh_process {
            // Alternated, so that both modes see the same background load.
            for _ in 0..fresh.processes {
                bar.set_message(format!("{layers} layers, fresh processes"));
                fresh_cold_ms.push(spawn_first_call(fresh, config, false)?);
                fresh_prewarmed_ms.push(spawn_first_call(fresh, config, true)?);
            }
        }
        results.push(DepthResult {
            layers,
            nodes: p.traced.graph.len(),
            kernels: p.compiled.kernels,
            loop_kernels: p.compiled.loop_kernels,
            launches: p.compiled.launches,
            phases_ms: phases.iter().map(|s| median(s)).collect(),
            end_to_end_ms: median(&totals),
            allocs: median(&allocs) as u64,
            device_compile_ms: median(&device_compile),
            steady_ms,
            facade_ms,
            jit_ms,
            fresh_cold_ms,
            fresh_prewarmed_ms,
        });
    }
    bar.finish_and_clear();
    let mut out = render(args, &results);
    out.notes.extend(check_notes);
    Ok(out)
}

/// The suite's tables, plot and target checks for measured `results`.
pub fn render(args: &Args, results: &[DepthResult]) -> SuiteOutput {
    let mut out = SuiteOutput::new("transformer-compile");
    let c = &args.base;
    out.meta(
        "model",
        format!(
            "GPT decoder dim {} heads {} vocab {} max_seq {} tokens ({}, {}){}",
            c.dim,
            c.heads,
            c.vocab,
            c.max_seq,
            c.batch,
            c.seq,
            match c.start_pos {
                Some(p) => format!(
                    " at start position {p}: the forward with a key/value cache (Transformer::forward_cached; \
                     start_pos and seq are symbols of the program, the cache is updated in place)"
                ),
                None => String::new(),
            }
        ),
    );
    out.meta("device", "cpu (Cranelift loop kernels + GEMM), fresh code generator and no program cache per run");
    out.meta(
        "repeats",
        format!(
            "{} in-process compiles per depth (median), the depths taking turns; one untimed warm-up compile first",
            args.repeats
        ),
    );
    out.meta(
        "end to end",
        match c.start_pos {
            Some(_) => "graph build (forward + trace + structure key) + lower + codegen + memory plan + first run; weight and key/value cache init (zeroed, realized with the weights) excluded",
            None => "graph build (forward + trace + structure key) + lower + codegen + memory plan + first run; weight init excluded",
        },
    );
    out.meta(
        "compiled forward",
        match c.start_pos {
            Some(_) => "Transformer::forward_at (the cached forward as a kiln::jit function of tokens, position, cache and weights; the cache given up and updated in place): bind, run",
            None => "nn::Predictor (the forward as a kiln::jit function, weights as arguments): bind tokens and weights, run the traced program",
        },
    );
    out.meta("facade forward", "record the lazy forward + kiln::realize on Device::Cpu (trace, program-cache hit, run): what a user calls; like-for-like with torch eager's and jax.jit's call");
    out.meta(
        "bare Executable::run",
        "the compiled program alone (no recording, tracing or cache lookup); no peer row measures this",
    );
    if let Some(fresh) = &args.fresh_process {
        out.meta(
            "fresh process",
            format!(
                "first call (record + realize: trace, compile, codegen, run) in {} new `kiln` processes per depth and mode, median; weights made before the clock starts; pre-warmed: one trivial realize first, untimed (as the jax anchor's trivial jit call)",
                fresh.processes
            ),
        );
    }
    out.meta("checked", "facade forward and compiled program against air::interp before timing (rtol 1e-3, atol 1e-4)");

    let mut columns = vec!["layers", "nodes", "kernels", "loop kernels"];
    let phase_cols: Vec<String> = Phase::ALL.iter().map(|p| format!("{} ms", p.name())).collect();
    columns.extend(phase_cols.iter().map(String::as_str));
    columns.extend(["end-to-end ms", "ratio vs depth 1", "ratio / depth"]);
    let mut compile =
        Table::new("compile", "Compile time per depth, in process (fresh device and caches, median)", &columns);
    let mut steady = Table::new(
        "steady",
        "Allocations and device compile per depth",
        &["layers", "launches", "allocs", "CpuDevice::compile ms"],
    );
    let mut forward = Table::new(
        "forward",
        "Steady-state forward per depth (median ms)",
        &["layers", "path", "ms", "like-for-like with"],
    );
    let mut fresh = Table::new(
        "fresh",
        "First call in a fresh process per depth (ms over processes)",
        &[
            "layers",
            "processes",
            "cold median",
            "cold min",
            "cold max",
            "pre-warmed median",
            "pre-warmed min",
            "pre-warmed max",
        ],
    );
    let spread = |v: &[f64]| -> [Cell; 3] {
        let min = v.iter().copied().reduce(f64::min);
        let max = v.iter().copied().reduce(f64::max);
        [median(v).into(), min.into(), max.into()]
    };
    let base = results.iter().find(|r| r.layers == 1).or(results.first());
    for r in results {
        let ratio = base.map(|b| r.end_to_end_ms / b.end_to_end_ms);
        let per_depth = base.and_then(|b| ratio.map(|x| x * b.layers as f64 / r.layers as f64));
        let mut row: Vec<Cell> = vec![r.layers.into(), r.nodes.into(), r.kernels.into(), r.loop_kernels.into()];
        row.extend(r.phases_ms.iter().map(|&ms| Cell::Num(ms)));
        row.extend([r.end_to_end_ms.into(), ratio.into(), per_depth.into()]);
        compile.push(row);
        steady.push(vec![r.layers.into(), r.launches.into(), r.allocs.into(), r.device_compile_ms.into()]);
        if let Some(ms) = r.facade_ms {
            forward.push(vec![
                r.layers.into(),
                "facade forward (record + kiln::realize)".into(),
                ms.into(),
                "torch eager call, jax.jit call".into(),
            ]);
        }
        forward.push(vec![
            r.layers.into(),
            match c.start_pos {
                Some(_) => "compiled cached forward (Transformer::forward_at, kiln::jit)".into(),
                None => "compiled forward (nn::Predictor, kiln::jit)".into(),
            },
            r.jit_ms.into(),
            "torch.compile call, jax.jit call".into(),
        ]);
        forward.push(vec![
            r.layers.into(),
            "bare Executable::run".into(),
            r.steady_ms.into(),
            "none (no peer measures the compiled program alone)".into(),
        ]);
        if !r.fresh_cold_ms.is_empty() {
            let mut row: Vec<Cell> = vec![r.layers.into(), r.fresh_cold_ms.len().into()];
            row.extend(spread(&r.fresh_cold_ms));
            row.extend(spread(&r.fresh_prewarmed_ms));
            fresh.push(row);
        }
    }
    out.tables.push(compile);
    out.tables.push(steady);
    out.tables.push(forward);
    if !fresh.rows.is_empty() {
        out.tables.push(fresh);
    }

    let series = |name: &str, f: &dyn Fn(&DepthResult) -> f64| Series {
        name: name.to_string(),
        points: results.iter().map(|r| (r.layers as f64, f(r))).collect(),
    };
    let mut curves = vec![series("end to end", &|r| r.end_to_end_ms)];
    for phase in [Phase::GraphBuild, Phase::Rewrite, Phase::Schedule, Phase::Codegen, Phase::FirstRun] {
        let i = phase_index(phase);
        curves.push(series(phase.name(), &|r| r.phases_ms.get(i).copied().unwrap_or(0.0)));
    }
    if results.iter().all(|r| !r.fresh_prewarmed_ms.is_empty()) && !results.is_empty() {
        curves.push(series("first call, fresh process (pre-warmed)", &|r| median(&r.fresh_prewarmed_ms)));
    }
    if let Some(b) = base {
        curves.push(series("linear from depth 1", &|r| b.end_to_end_ms * r.layers as f64 / b.layers as f64));
    }
    out.plots.push((
        "compile".into(),
        Plot {
            title: "Transformer compile time vs depth (cpu, fresh caches)".into(),
            x_label: "layers".into(),
            y_label: "ms".into(),
            log_x: false,
            log_y: false,
            series: curves,
        },
    ));

    if let Some(d2) = results.iter().find(|r| r.layers == 2) {
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        out.notes.push(format!(
            "target: depth 2 end to end < 10 ms: {:.2} ms ({})",
            d2.end_to_end_ms,
            verdict(d2.end_to_end_ms < 10.0)
        ));
        if let Some(facade_ms) = d2.facade_ms {
            out.notes.push(format!(
                "target: depth 2 steady-state forward <= 0.25 ms: bare Executable::run {:.3} ms ({}); facade forward {:.3} ms ({})",
                d2.steady_ms,
                verdict(d2.steady_ms <= 0.25),
                facade_ms,
                verdict(facade_ms <= 0.25)
            ));
        }
        if c.start_pos.is_some() {
            out.notes.push(format!(
                "target: depth 2 cached forward end to end within 5 ms: {:.2} ms ({})",
                d2.end_to_end_ms,
                verdict(d2.end_to_end_ms <= 5.0)
            ));
            if let Some(d8) = results.iter().find(|r| r.layers == 8) {
                let ratio = d8.end_to_end_ms / d2.end_to_end_ms;
                out.notes.push(format!(
                    "target: depth 8 cached forward end to end within 1.5x of depth 2: {:.2} ms / {:.2} ms = {ratio:.2}x ({})",
                    d8.end_to_end_ms,
                    d2.end_to_end_ms,
                    verdict(ratio <= 1.5)
                ));
            }
        }
        out.notes.push(format!(
            "target: depth 2 compiled forward (kiln::jit) within 1.3x of the bare program: {:.3} ms vs {:.3} ms = {:.2}x ({})",
            d2.jit_ms,
            d2.steady_ms,
            d2.jit_ms / d2.steady_ms,
            verdict(d2.jit_ms <= 1.3 * d2.steady_ms)
        ));
    }
    if let (Some(b), Some(deepest)) = (base, results.iter().max_by_key(|r| r.layers))
        && deepest.layers > b.layers
    {
        let growth = (deepest.end_to_end_ms / b.end_to_end_ms) / (deepest.layers as f64 / b.layers as f64);
        out.notes.push(format!(
            "target: growth linear or better: time({}) / time({}) per layer ratio = {:.2} ({})",
            deepest.layers,
            b.layers,
            growth,
            if growth <= 1.25 { "met" } else { "MISSED" }
        ));
    }
    out
}

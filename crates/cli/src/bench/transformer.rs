//! `kiln bench transformer-compile`: end-to-end compile time of the decoder per depth (median of
//! several runs, each with a fresh code generator and no program cache), its ratio to depth 1,
//! the phase split, and the steady-state forward time: of the compiled program alone
//! (`Executable::run`), and of a whole forward through the facade (record, trace, cache hit, run).

use std::time::Instant;

use kiln::profile::Phase;
use lower::CompileOptions;

use crate::model::{Gpt, GptConfig};
use crate::output::{Cell, SuiteOutput, Table, progress};
use crate::profile_cmd::profile_transformer;
use crate::runner::Runner;
use crate::svg::{Plot, Series};
use crate::timing::{Budget, measure_ms, median};

/// What to run.
#[derive(Clone, Debug)]
pub struct Args {
    pub layers: Vec<usize>,
    pub repeats: usize,
    pub base: GptConfig,
    pub steady: Budget,
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
    /// lazy forward, `kiln::realize` (trace, program-cache hit, run).
    pub facade_ms: f64,
}

fn phase_index(p: Phase) -> usize {
    Phase::ALL.iter().position(|&q| q == p).unwrap_or(0)
}

/// Runs the suite.
pub fn run(args: &Args) -> anyhow::Result<SuiteOutput> {
    let options = CompileOptions::default();
    // Process-wide one-time costs (thread pool start, lazily built tables) are paid here, untimed,
    // so that the first depth measured is not charged for them.
    profile_transformer(GptConfig { layers: 1, ..args.base }, &options)?;

    let bar = progress((args.layers.len() * args.repeats) as u64, "transformer-compile");
    let mut results = Vec::new();
    for &layers in &args.layers {
        let config = GptConfig { layers, ..args.base };
        let mut phases: Vec<Vec<f64>> = vec![Vec::new(); Phase::ALL.len()];
        let mut totals = Vec::new();
        let mut allocs = Vec::new();
        let mut device_compile = Vec::new();
        let mut last = None;
        for _ in 0..args.repeats {
            bar.set_message(format!("{layers} layers"));
            let p = profile_transformer(config, &options)?;
            let by_phase = p.report.phase_totals();
            for (i, samples) in phases.iter_mut().enumerate() {
                let ms =
                    by_phase.iter().find(|(q, _)| phase_index(*q) == i).map_or(0.0, |(_, d)| d.as_secs_f64() * 1e3);
                samples.push(ms);
            }
            totals.push(p.report.end_to_end().as_secs_f64() * 1e3);
            allocs.push(p.report.alloc.allocs as f64);
            let device = runtime::CpuDevice::new()?;
            let t0 = Instant::now();
            device.compile(&p.traced.graph)?;
            device_compile.push(t0.elapsed().as_secs_f64() * 1e3);
            last = Some(p);
            bar.inc(1);
        }
        let Some(p) = last else { continue };
        let steady_ms = measure_ms(args.steady, || Ok(p.compiled.exe.run(&p.traced.inputs, &p.traced.bindings)?))?;
        let mut gpt = Gpt::new(config, 0)?;
        let runner = Runner::Facade(kiln::Device::Cpu);
        runner.place_module(&mut gpt.model)?;
        let tokens = runner.place(gpt.tokens(1))?;
        let facade_ms = measure_ms(args.steady, || {
            let logits = gpt.forward(&tokens);
            kiln::realize(&[&logits])?;
            Ok(logits)
        })?;
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
        });
    }
    bar.finish_and_clear();
    Ok(render(args, &results))
}

/// The suite's tables, plot and target checks for measured `results`.
pub fn render(args: &Args, results: &[DepthResult]) -> SuiteOutput {
    let mut out = SuiteOutput::new("transformer-compile");
    let c = &args.base;
    out.meta(
        "model",
        format!(
            "GPT decoder dim {} heads {} vocab {} max_seq {} tokens ({}, {})",
            c.dim, c.heads, c.vocab, c.max_seq, c.batch, c.seq
        ),
    );
    out.meta("device", "cpu (Cranelift loop kernels + GEMM), fresh code generator and no program cache per run");
    out.meta("repeats", format!("{} per depth (median); one untimed warm-up compile first", args.repeats));
    out.meta("steady forward", "Executable::run of the compiled program (median); facade forward: record the lazy forward + kiln::realize on Device::Cpu (program cache hit)");
    out.meta("end to end", "graph build (forward + trace + structure key) + lower + codegen + memory plan + first run; weight init excluded");

    let mut columns = vec!["layers", "nodes", "kernels", "loop kernels"];
    let phase_cols: Vec<String> = Phase::ALL.iter().map(|p| format!("{} ms", p.name())).collect();
    columns.extend(phase_cols.iter().map(String::as_str));
    columns.extend(["end-to-end ms", "ratio vs depth 1", "ratio / depth"]);
    let mut compile = Table::new("compile", "Compile time per depth (fresh caches, median)", &columns);
    let mut steady = Table::new(
        "steady",
        "Allocations, device compile and steady-state forward per depth",
        &["layers", "launches", "allocs", "CpuDevice::compile ms", "steady forward ms", "facade forward ms"],
    );
    let base = results.iter().find(|r| r.layers == 1).or(results.first());
    for r in results {
        let ratio = base.map(|b| r.end_to_end_ms / b.end_to_end_ms);
        let per_depth = base.and_then(|b| ratio.map(|x| x * b.layers as f64 / r.layers as f64));
        let mut row: Vec<Cell> = vec![r.layers.into(), r.nodes.into(), r.kernels.into(), r.loop_kernels.into()];
        row.extend(r.phases_ms.iter().map(|&ms| Cell::Num(ms)));
        row.extend([r.end_to_end_ms.into(), ratio.into(), per_depth.into()]);
        compile.push(row);
        steady.push(vec![
            r.layers.into(),
            r.launches.into(),
            r.allocs.into(),
            r.device_compile_ms.into(),
            r.steady_ms.into(),
            r.facade_ms.into(),
        ]);
    }
    out.tables.push(compile);
    out.tables.push(steady);

    let series = |name: &str, f: &dyn Fn(&DepthResult) -> f64| Series {
        name: name.to_string(),
        points: results.iter().map(|r| (r.layers as f64, f(r))).collect(),
    };
    let mut curves = vec![series("end to end", &|r| r.end_to_end_ms)];
    for phase in [Phase::GraphBuild, Phase::Rewrite, Phase::Schedule, Phase::Codegen, Phase::FirstRun] {
        let i = phase_index(phase);
        curves.push(series(phase.name(), &|r| r.phases_ms.get(i).copied().unwrap_or(0.0)));
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
        out.notes.push(format!(
            "target: depth 2 steady-state forward <= 0.25 ms: {:.3} ms ({})",
            d2.steady_ms,
            verdict(d2.steady_ms <= 0.25)
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

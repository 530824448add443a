//! `kiln profile transformer`: build the decoder, compile it, run it once, all inside
//! `kiln::profile`, and report the per-pass table, the totals and the planned memory.

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

/// [`profile_tensors`] for a `build` that also returns symbol values its inputs do not bind (a
/// position), added to the traced program's bindings.
pub fn profile_bound(
    build: impl FnOnce() -> anyhow::Result<(Vec<kiln::Tensor>, Bindings)>,
    options: &CompileOptions,
    keep_graphs: bool,
) -> anyhow::Result<Profiled> {
    let (result, mut report) = profile::profile(|| -> anyhow::Result<(Traced, Compiled)> {
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
    });
    let (traced, compiled) = result?;
    let t0 = Instant::now();
    compiled.exe.run(&traced.inputs, &traced.bindings)?;
    let second_run_ms = t0.elapsed().as_secs_f64() * 1e3;
    let rewrite = compiled.rewrite.clone();
    report.counters.push(("rewrite visits".into(), rewrite.visits));
    report.counters.push(("attempts".into(), rewrite.attempts));
    report.counters.push(("rewrites".into(), rewrite.rewrites));
    report.counters.push(("cse merged".into(), rewrite.cse_merged));
    report.counters.push(("dead removed".into(), rewrite.dead_removed));
    Ok(Profiled { report, traced, compiled, rewrite, second_run_ms })
}

/// Builds, compiles and runs the decoder of `config` once under the profiler: weights
/// (`init-weights`, outside every phase), the forward pass, then [`profile_tensors`].
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
    profile_bound(
        || {
            let model = profile::span("init-weights", || Gpt::new(config, 0))?;
            let tokens = model.tokens(1);
            profile::span(profile::Step::Forward, || model.outputs(&tokens))
        },
        options,
        keep_graphs,
    )
}

/// The text `kiln profile transformer` prints.
pub fn render(config: &GptConfig, p: &Profiled) -> String {
    format!(
        "kiln profile transformer: layers {} dim {} heads {} vocab {} tokens ({}, {}){} on cpu\n\
         graph: {} nodes traced -> {} kernels ({} loop kernels compiled), {} launches per run\n\n\
         {}second run: {:.3} ms\n",
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
        p.traced.graph.len(),
        p.compiled.kernels,
        p.compiled.loop_kernels,
        p.compiled.launches,
        p.report,
        p.second_run_ms
    )
}

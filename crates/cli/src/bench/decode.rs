//! `kiln bench decode`: autoregressive decoding with a key/value cache
//! (`Transformer::forward_at`: one compiled program, `start_pos` and `seq` symbols, the cache
//! updated in place), batch 1, for the compile benchmark's dim-64 model and GPT-2 small's shapes
//! (random weights), on the protocol of `shared/anchors/bench_decode.py` (PyTorch eager with
//! `transformers`' GPT-2, `use_cache=True`):
//!
//! - per past length P (8, and 256 where the context allows): prefill P tokens (timed after a
//!   warm-up), then 32 greedy steps; the median ms per new token;
//! - a generation: a 128-token prompt, then 128 new tokens (greedy): tokens per second, the host
//!   time per token of `forward_at` outside the program's run (`kiln::profile`'s `run` spans
//!   subtracted from the call's wall time; the greedy pick on the host is not in it), programs
//!   compiled during the decoding (must be 0), and the process's peak resident memory.
//!
//! Before timing, each configuration checks cached decoding against a full recompute of the
//! prefix (4 steps, max abs difference of the logits at most 1e-4).

use std::time::Instant;

use kiln::{Device, Tensor};
use nn::{KvCache, Module, Transformer, TransformerConfig};

use crate::model::random_ids;
use crate::output::{Cell, SuiteOutput, Table, progress};
use crate::svg::{Plot, Series};
use crate::timing::median;

/// One model to decode with.
#[derive(Clone, Copy, Debug)]
pub struct Model {
    /// The short name `kiln bench decode --model` takes.
    pub key: &'static str,
    pub name: &'static str,
    pub config: TransformerConfig,
}

/// The compile benchmark's model (context 320 so that the 128 + 128 generation fits; the
/// anchor's tiny model has 64 positions, which only its past length 8 uses).
pub const TINY: Model = Model {
    key: "tiny",
    name: "tiny (dim 64, 2 layers)",
    config: TransformerConfig { dim: 64, n_heads: 8, n_layers: 2, norm_eps: 1e-5, vocab_size: 64, max_seq_len: 320 },
};

/// GPT-2 small's shapes: 124M parameters.
pub const GPT2_SMALL: Model = Model {
    key: "gpt2",
    name: "gpt2 small (dim 768, 12 layers)",
    config: TransformerConfig {
        dim: 768,
        n_heads: 12,
        n_layers: 12,
        norm_eps: 1e-5,
        vocab_size: 50257,
        max_seq_len: 1024,
    },
};

/// What to run.
#[derive(Clone, Debug)]
pub struct Args {
    pub models: Vec<Model>,
    /// Past lengths of the per-token rows.
    pub pasts: Vec<usize>,
    /// Greedy steps timed per past length.
    pub steps: usize,
    /// Prompt and new tokens of the generation.
    pub prompt: usize,
    pub new_tokens: usize,
}

impl Args {
    /// The full suite.
    pub fn full() -> Args {
        Args { models: vec![TINY, GPT2_SMALL], pasts: vec![8, 256], steps: 32, prompt: 128, new_tokens: 128 }
    }

    /// A seconds-long check that the suite runs.
    pub fn smoke() -> Args {
        let tiny = Model { config: TransformerConfig { max_seq_len: 40, ..TINY.config }, ..TINY };
        Args { models: vec![tiny], pasts: vec![8], steps: 4, prompt: 8, new_tokens: 8 }
    }
}

/// One past length's measurements.
struct PastRow {
    past: usize,
    prefill_ms: f64,
    ms_per_token: f64,
}

/// One model's measurements.
struct ModelResult {
    model: Model,
    params: usize,
    pasts: Vec<PastRow>,
    tokens_per_s: f64,
    host_us_per_token: f64,
    compiles_during_decode: u64,
    peak_rss_mb: Option<f64>,
}

fn row(ids: &[i32]) -> Tensor {
    Tensor::from_vec(ids.to_vec(), &[1, ids.len()])
}

/// The greedy next token from logits `[1, seq, vocab]` (the last position).
fn next_token(logits: &Tensor) -> anyhow::Result<i32> {
    let dims = logits.dims()?;
    let vocab = dims[2];
    let host = logits.to_host()?;
    let all = host.as_slice::<f32>().ok_or_else(|| anyhow::anyhow!("logits are not f32"))?;
    let last = &all[all.len() - vocab..];
    let mut best = 0;
    for (i, &x) in last.iter().enumerate() {
        if x > last[best] {
            best = i;
        }
    }
    Ok(best as i32)
}

/// Feeds `prompt`, then decodes `steps` tokens greedily; returns the wall ms of each step.
fn decode(model: &mut Transformer, cache: &mut KvCache, prompt: &[i32], steps: usize) -> anyhow::Result<Vec<f64>> {
    cache.reset();
    let mut logits = model.forward_at(&row(prompt), 0, cache)?;
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t0 = Instant::now();
        let next = next_token(&logits)?;
        logits = model.forward_at(&row(&[next]), cache.len(), cache)?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

/// Cached decoding against a full recompute of the prefix: 4 greedy steps.
fn check(model: &mut Transformer, cache: &mut KvCache) -> anyhow::Result<()> {
    let vocab = model.config.vocab_size;
    let mut ids = random_ids(6, vocab, 3);
    cache.reset();
    let mut logits = model.forward_at(&row(&ids), 0, cache)?;
    for step in 0..4 {
        ids.push(next_token(&logits)?);
        logits = model.forward_at(&row(&ids[ids.len() - 1..]), cache.len(), cache)?;
        let full = kiln::no_grad(|| model.forward(&row(&ids)));
        let (got, want) = (logits.to_vec::<f32>()?, full.to_vec::<f32>()?);
        let want = &want[want.len() - vocab..];
        // NaN-aware: a NaN anywhere is a failure, not skipped by `max`.
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, |m, d| if d > m || d.is_nan() { d } else { m });
        if worst.is_nan() || worst > 1e-4 {
            anyhow::bail!("cached decoding differs from a full recompute by {worst} at step {step}");
        }
    }
    Ok(())
}

/// The process's peak resident set (`VmHWM`), in MB, where the OS reports it.
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn run_model(model_spec: Model, args: &Args) -> anyhow::Result<ModelResult> {
    kiln::manual_seed(0);
    let mut model = Transformer::from_config(model_spec.config)?;
    model.to_device(Device::Cpu)?;
    // GPT-2's LM head is its token embedding (`tie_word_embeddings`, as in the anchor's model and
    // in a loaded checkpoint): a step reads the 124M parameters once, not 163M.
    model.head.weight = model.wte.weight.clone();
    let mut seen: Vec<Tensor> = Vec::new();
    let mut params = 0;
    for (_, t) in model.named_parameters() {
        if !seen.iter().any(|s| Tensor::ptr_eq(s, &t)) {
            params += t.numel().ok().and_then(|n| n.as_const()).unwrap_or(0) as usize;
            seen.push(t);
        }
    }
    let mut cache = model.kv_cache(1)?;
    check(&mut model, &mut cache)?;
    // The check compiled the prefill and decode programs: time their optimised code.
    kiln::wait_tier_up();
    let vocab = model_spec.config.vocab_size;
    let mut pasts = Vec::new();
    for &past in &args.pasts {
        if past + args.steps > model_spec.config.max_seq_len {
            continue;
        }
        let prompt = random_ids(past, vocab, past as u64);
        let mut prefill = Vec::new();
        for i in 0..4 {
            if i == 2 {
                // The second prefill asked for the optimised tier: time that code.
                kiln::wait_tier_up();
            }
            cache.reset();
            let t0 = Instant::now();
            let logits = model.forward_at(&row(&prompt), 0, &mut cache)?;
            logits.to_host()?;
            prefill.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        // The anchor keeps its last prefill, after warm-ups; the minimum of the last two here.
        let prefill_ms = crate::timing::fastest(&prefill[2..]);
        let times = decode(&mut model, &mut cache, &prompt, args.steps)?;
        pasts.push(PastRow { past, prefill_ms, ms_per_token: median(&times) });
    }
    // The generation: compiles counted on the CPU device, the host time from the profile.
    let cpu = kiln::backend::cpu_device()?;
    let prompt = random_ids(args.prompt, vocab, 11);
    cache.reset();
    let mut logits = model.forward_at(&row(&prompt), 0, &mut cache)?;
    let compiled = cpu.stats().programs_compiled;
    let mut host_us = Vec::new();
    let t0 = Instant::now();
    for _ in 0..args.new_tokens {
        let next = next_token(&logits)?;
        let (result, report) = kiln::profile::profile(|| -> anyhow::Result<Tensor> {
            Ok(model.forward_at(&row(&[next]), cache.len(), &mut cache)?)
        });
        logits = result?;
        let run: f64 = report.spans.iter().filter(|s| s.name == "run").map(|s| s.duration.as_secs_f64()).sum();

        host_us.push((report.total.as_secs_f64() - run) * 1e6);
    }
    let seconds = t0.elapsed().as_secs_f64();
    Ok(ModelResult {
        model: model_spec,
        params,
        pasts,
        tokens_per_s: args.new_tokens as f64 / seconds,
        host_us_per_token: median(&host_us),
        compiles_during_decode: cpu.stats().programs_compiled - compiled,
        peak_rss_mb: peak_rss_mb(),
    })
}

/// Runs the suite on the CPU device.
pub fn run(args: &Args) -> anyhow::Result<SuiteOutput> {
    let bar = progress(args.models.len() as u64, "decode");
    let mut results = Vec::new();
    for &m in &args.models {
        bar.set_message(m.name.to_string());
        results.push(run_model(m, args)?);
        bar.inc(1);
    }
    bar.finish_and_clear();

    let mut out = SuiteOutput::new("decode");
    out.meta("device", "cpu (Cranelift loop kernels + GEMM)");
    out.meta(
        "protocol",
        format!(
            "batch 1, greedy; per past length: prefill (min of 2 after two warm-ups and the tier-up), then {} steps, median ms per new token; \
             generation: {}-token prompt then {} new tokens",
            args.steps, args.prompt, args.new_tokens
        ),
    );
    out.meta("checked", "cached decoding against a full recompute of the prefix (4 steps, max abs diff <= 1e-4)");
    out.meta(
        "peer",
        "shared/anchors/bench_decode.py: transformers GPT2LMHeadModel, use_cache=True, torch eager, same shapes",
    );
    let mut per_token = Table::new(
        "per_token",
        "Decoding with a KV cache, batch 1 (ms)",
        &["model", "past", "prefill ms", "ms per token", "tokens/s"],
    );
    for r in &results {
        for p in &r.pasts {
            per_token.push(vec![
                r.model.name.into(),
                Cell::Int(p.past as u64),
                Cell::Num(p.prefill_ms),
                Cell::Num(p.ms_per_token),
                Cell::Num(1e3 / p.ms_per_token),
            ]);
        }
    }
    out.tables.push(per_token);
    out.plots.push((
        "per_token".into(),
        Plot {
            title: "Decoding with a KV cache: ms per new token vs past length (cpu, batch 1)".into(),
            x_label: "past length".into(),
            y_label: "ms per token".into(),
            log_x: true,
            log_y: true,
            series: results
                .iter()
                .map(|r| Series {
                    name: r.model.name.into(),
                    points: r.pasts.iter().map(|p| (p.past as f64, p.ms_per_token)).collect(),
                })
                .collect(),
        },
    ));
    let mut generation = Table::new(
        "generation",
        "Generation: prompt then new tokens, batch 1",
        &["model", "params", "tokens/s", "host us per token", "compiles during decode", "peak RSS MB"],
    );
    for r in &results {
        generation.push(vec![
            r.model.name.into(),
            Cell::Int(r.params as u64),
            Cell::Num(r.tokens_per_s),
            Cell::Num(r.host_us_per_token),
            Cell::Int(r.compiles_during_decode),
            r.peak_rss_mb.into(),
        ]);
    }
    out.tables.push(generation);
    for r in &results {
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        out.notes.push(format!(
            "{}: compiles during decode {} ({}); host time per token {:.1} us (target < 50 us: {})",
            r.model.name,
            r.compiles_during_decode,
            verdict(r.compiles_during_decode == 0),
            r.host_us_per_token,
            verdict(r.host_us_per_token < 50.0)
        ));
        if r.model.config.dim == 64
            && let Some(p) = r.pasts.first()
        {
            out.notes.push(format!(
                "{}: {:.3} ms per token at past {} (target < 0.1 ms: {})",
                r.model.name,
                p.ms_per_token,
                p.past,
                verdict(p.ms_per_token < 0.1)
            ));
        }
    }
    Ok(out)
}

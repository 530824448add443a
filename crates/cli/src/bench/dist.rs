//! `kiln bench dist`: data-parallel training step time and all-reduce time at 1, 2 and 4 ranks
//! (`nn::DistributedTrainer` over `kiln_dist::ThreadGroup`: ranks are threads of this process,
//! so the all-reduce is a memory copy and the ranks share the machine's cores), for the 2-layer
//! Transformer of the compile benchmark (dim 64, 8 heads, vocab 64; 8 sequences of 32 tokens per
//! rank) and the model suite's `dense-large` (its batch per rank). Each rank trains on its own
//! batch (weak scaling: the global batch grows with the ranks). After 3 warm-up steps, the mean
//! of the timed steps on rank 0: the whole step, the gradients' all-reduces within it (waiting
//! for the slowest rank included), their share, and samples per second over all ranks.
//!
//! Over MPI the same trainer runs across processes and machines: `crates/dist/examples/train_ddp.rs
//! --bench-model` under `mpirun` times the Transformer row that way.

use std::time::Duration;

use kiln::Tensor;
use kiln_dist::ThreadGroup;
use nn::{DistributedTrainer, Loss, Module, Sgd, Transformer, TransformerConfig, zoo};

use crate::model::random_ids;
use crate::output::{Cell, SuiteOutput, Table, progress};
use crate::svg::{Plot, Series};

/// What to run.
#[derive(Clone, Debug)]
pub struct Args {
    /// Models: `transformer` or a model of the suite (`nn::zoo`).
    pub models: Vec<&'static str>,
    /// Rank counts.
    pub ranks: Vec<usize>,
    /// Timed steps per configuration (after 3 warm-up steps).
    pub steps: usize,
}

impl Args {
    /// The full suite.
    pub fn full() -> Args {
        Args { models: vec!["transformer", "dense-large"], ranks: vec![1, 2, 4], steps: 20 }
    }

    /// A seconds-long check that the suite runs.
    pub fn smoke() -> Args {
        Args { models: vec!["dense-tiny"], ranks: vec![1, 2], steps: 1 }
    }
}

const WARMUP: usize = 3;

/// The Transformer's sizes (the compile benchmark's model).
const TRANSFORMER: TransformerConfig =
    TransformerConfig { dim: 64, n_heads: 8, n_layers: 2, norm_eps: 1e-5, vocab_size: 64, max_seq_len: 32 };
const SEQ: usize = 32;
const LOCAL_BATCH: usize = 8;

/// One rank's model, loss and batch.
struct Work {
    model: Box<dyn Module>,
    loss: Loss,
    x: Tensor,
    y: Tensor,
}

fn work(name: &str, rank: usize) -> anyhow::Result<Work> {
    Ok(match name {
        "transformer" => {
            let model = Transformer::from_config(TRANSFORMER)?;
            let ids = |seed| {
                let ids: Vec<i64> =
                    random_ids(LOCAL_BATCH * SEQ, TRANSFORMER.vocab_size, seed).into_iter().map(i64::from).collect();
                Tensor::from_vec(ids, &[LOCAL_BATCH, SEQ])
            };
            Work {
                model: Box::new(model),
                loss: Loss::CrossEntropy,
                x: ids(rank as u64 + 1),
                y: ids(rank as u64 + 101),
            }
        }
        other => {
            let case = zoo::build(other)?;
            Work { model: case.model, loss: case.loss, x: case.x, y: case.y }
        }
    })
}

/// Rank 0's mean step and all-reduce time, and the samples one rank trains on per step.
fn measure(name: &str, ranks: usize, steps: usize) -> anyhow::Result<(Duration, Duration, usize)> {
    let results = ThreadGroup::run(ThreadGroup::new(ranks), |comm| -> anyhow::Result<(Duration, Duration, usize)> {
        let rank = kiln_dist::Collective::rank(&comm);
        let w = work(name, rank)?;
        let samples = w.x.dims()?[0];
        let mut trainer = DistributedTrainer::new(w.model, Sgd::new(0.01, 0.9), w.loss, comm)?;
        let (mut total, mut communication) = (Duration::ZERO, Duration::ZERO);
        for step in 0..WARMUP + steps {
            trainer.step(&w.x, &w.y)?;
            if step >= WARMUP {
                total += trainer.last_step_timing().total;
                communication += trainer.last_step_timing().communication;
            }
        }
        let n = steps.max(1) as u32;
        Ok((total / n, communication / n, samples))
    });
    let mut first = None;
    for (rank, r) in results.into_iter().enumerate() {
        let r = r.map_err(|_| anyhow::anyhow!("rank {rank} of {ranks} panicked"))??;
        first.get_or_insert(r);
    }
    first.ok_or_else(|| anyhow::anyhow!("no ranks"))
}

/// Runs the suite.
pub fn run(args: &Args) -> anyhow::Result<SuiteOutput> {
    let mut out = SuiteOutput::new("dist");
    out.meta("backend", "kiln_dist::ThreadGroup (ranks are threads of one process)");
    out.meta("steps", format!("{WARMUP} warm-up, then the mean of {}", args.steps));
    let mut table = Table::new(
        "dist",
        "data-parallel step, rank 0 (weak scaling: each rank its own batch)",
        &["model", "ranks", "step ms", "all-reduce ms", "all-reduce share", "samples per s (all ranks)"],
    );
    let bar = progress((args.models.len() * args.ranks.len()) as u64, "dist");
    let mut series = Vec::new();
    for &name in &args.models {
        let mut points = Vec::new();
        for &ranks in &args.ranks {
            bar.set_message(format!("{name}, {ranks} ranks"));
            let (step, communication, samples) = measure(name, ranks, args.steps)?;
            let step_ms = step.as_secs_f64() * 1e3;
            let comm_ms = communication.as_secs_f64() * 1e3;
            table.push(vec![
                Cell::Text(name.to_string()),
                Cell::Int(ranks as u64),
                Cell::Num(step_ms),
                Cell::Num(comm_ms),
                Cell::Num(comm_ms / step_ms.max(f64::MIN_POSITIVE)),
                Cell::Num((ranks * samples) as f64 / step.as_secs_f64().max(f64::MIN_POSITIVE)),
            ]);
            points.push((ranks as f64, step_ms));
            bar.inc(1);
        }
        series.push(Series { name: name.to_string(), points });
    }
    bar.finish_and_clear();
    out.tables.push(table);
    out.plots.push((
        "step".into(),
        Plot {
            title: "Data-parallel step time vs ranks (in-process ranks, each its own batch)".into(),
            x_label: "ranks".into(),
            y_label: "step ms, rank 0".into(),
            log_x: false,
            log_y: false,
            series,
        },
    ));
    out.notes.push(
        "Threads share this machine's cores: with more ranks than cores a step waits for the others, and \
         that wait counts as all-reduce time."
            .to_string(),
    );
    Ok(out)
}

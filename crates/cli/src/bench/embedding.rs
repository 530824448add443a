//! `kiln bench embedding`: an embedding lookup (`table.index_select(0, ids)`, the gather primitive
//! nn's `Embedding` uses) at a small and at GPT-2's vocabulary, with the design it replaced (a
//! one-hot matrix times the table, one GEMM) timed beside it in the same run.
//!
//! The gather reads `tokens x dim` elements whatever the vocabulary; the one-hot GEMM does
//! `tokens x vocab x dim` multiply-adds, so its time grows with the vocabulary while the
//! gather's should not. Steady state (programs compiled during warm-up), median ms per realize.
//!
//! Before timing, the gather at every vocabulary and the one-hot GEMM at the small one are
//! checked against the reference interpreter on the same inputs (the interpreter materializes
//! the one-hot product, `tokens x vocab x dim` floats, which is too large at 50,257).

use kiln::{DType, Tensor};

use crate::bench::check::{self, Tolerance};
use crate::output::{Cell, SuiteOutput, Table, progress};
use crate::runner::Runner;
use crate::svg::{Plot, Series};
use crate::timing::{Budget, measure_ms};

/// The vocabularies: the anchor Transformer's and GPT-2's.
pub const VOCABS: [usize; 2] = [64, 50257];

/// The suite's sizes.
#[derive(Clone, Debug)]
pub struct Args {
    /// Vocabulary sizes (table rows).
    pub vocabs: Vec<usize>,
    /// Ids looked up per realize.
    pub tokens: usize,
    /// Embedding width (table columns).
    pub dim: usize,
    /// How long to time each case.
    pub budget: Budget,
}

impl Default for Args {
    fn default() -> Args {
        Args { vocabs: VOCABS.to_vec(), tokens: 256, dim: 64, budget: Budget::STEADY }
    }
}

/// The table (`vocab x dim`, deterministic) and `tokens` ids spread over the whole vocabulary, as
/// i32 so that every device (wgpu included) runs the same program.
fn inputs(vocab: usize, tokens: usize, dim: usize) -> (Tensor, Tensor) {
    let table: Vec<f32> = (0..vocab * dim).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 512.0).collect();
    let ids: Vec<i32> = (0..tokens).map(|t| ((t * 2_654_435_761usize) % vocab) as i32).collect();
    (Tensor::from_vec(table, &[vocab, dim]), Tensor::from_vec(ids, &[tokens]))
}

fn gather(table: &Tensor, ids: &Tensor) -> Tensor {
    table.index_select(0, ids)
}

fn one_hot(table: &Tensor, ids: &Tensor, vocab: usize) -> Tensor {
    ids.one_hot(vocab).cast(DType::F32).matmul(table)
}

/// Checks the gather (and, when `with_one_hot`, the one-hot GEMM) at `vocab` against the
/// interpreter.
pub fn check_lookup(vocab: usize, args: &Args, with_one_hot: bool, runner: &Runner) -> anyhow::Result<()> {
    check::against_interp(&format!("embedding vocab={vocab}"), runner, Tolerance::ELEMENTWISE, |r| {
        let (table, ids) = inputs(vocab, args.tokens, args.dim);
        let (table, ids) = (r.place(table)?, r.place(ids)?);
        let mut out = vec![gather(&table, &ids)];
        if with_one_hot {
            out.push(one_hot(&table, &ids, vocab));
        }
        Ok(out)
    })
}

/// Runs the suite on `runner`.
pub fn run(args: &Args, runner: &Runner) -> anyhow::Result<SuiteOutput> {
    let bar = progress(2 * args.vocabs.len() as u64, "embedding");
    let mut rows = Vec::new();
    for (i, &vocab) in args.vocabs.iter().enumerate() {
        bar.set_message(format!("vocab={vocab}"));
        check_lookup(vocab, args, i == 0, runner)?;
        let (table, ids) = inputs(vocab, args.tokens, args.dim);
        let (table, ids) = (runner.place(table)?, runner.place(ids)?);
        let lookup = measure_ms(args.budget, || runner.realize(&[&gather(&table, &ids)]))?;
        bar.inc(1);
        let gemm = measure_ms(args.budget, || runner.realize(&[&one_hot(&table, &ids, vocab)]))?;
        bar.inc(1);
        rows.push((vocab, lookup, gemm));
    }
    bar.finish_and_clear();

    let mut out = SuiteOutput::new("embedding");
    out.meta("device", runner.describe());
    out.meta("sizes", format!("{} ids, dim {}; median ms per realize, steady state", args.tokens, args.dim));
    let mut table = Table::new(
        "ms",
        "Embedding lookup, ms per realize",
        &["vocab", "gather (index_select)", "one-hot GEMM (previous design)", "one-hot / gather"],
    );
    for &(vocab, lookup, gemm) in &rows {
        table.push(vec![Cell::Int(vocab as u64), Cell::Num(lookup), Cell::Num(gemm), Cell::Num(gemm / lookup)]);
    }
    out.tables.push(table);
    let series = |name: &str, pick: fn(&(usize, f64, f64)) -> f64| Series {
        name: name.into(),
        points: rows.iter().map(|r| (r.0 as f64, pick(r))).collect(),
    };
    out.plots.push((
        "time".into(),
        Plot {
            title: "Embedding lookup: ms per realize vs vocabulary".into(),
            x_label: "vocabulary".into(),
            y_label: "ms".into(),
            log_x: true,
            log_y: true,
            series: vec![series("gather", |r| r.1), series("one-hot GEMM", |r| r.2)],
        },
    ));
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        out.notes.push(format!(
            "gather at vocab {} / vocab {}: {:.2}x (cost independent of the vocabulary is 1x)",
            last.0,
            first.0,
            last.1 / first.1
        ));
    }
    Ok(out)
}

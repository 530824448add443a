//! `kiln bench unary`: `neg` and `sigmoid` on 1-D `f32` tensors of the anchor sizes, on any
//! device (`--device cpu|wgpu|interp`). Three quantities over the workload
//! [`crate::workloads::unary`], the same the criterion bench `crates/cli/benches/unary.rs`
//! measures (`cargo bench -p kiln-cli --bench unary`, CPU device):
//!
//! - single: one fresh op on a realized source, realized (`x.neg()` then `realize`): the time of
//!   one `realize` of a one-op program (the anchors' "realize() steady").
//! - eager: a chain of [`CHAIN`] ops realized after every op (each op reads the previous op's
//!   realized result), in ms per op (chain time / [`CHAIN`]).
//! - lazy: the same chain recorded lazily and realized once (the compiler fuses it into one
//!   kernel), in ms per op (chain time / [`CHAIN`]).
//! - compiled: the single op as a `kiln::jit` function called on the realized source, its output
//!   dropped before the next call, so the call writes into the array of the call before (what
//!   PyTorch's `out=` does, and what the anchor's torch row measures): no recording, tracing or
//!   cache lookup, and no fresh output pages.
//!
//! Steady state (programs already compiled during warm-up). This suite reports the median of its
//! runs, criterion its own estimate; the quantities are the same.
//!
//! Before timing, the results of all three (single op, eager chain, lazy chain) at every size are
//! checked against the reference interpreter on the same input ([`check_op`]).
//!
//! `neg` chains of even length fold away (`neg-neg`), so the lazy `neg` row shows what the
//! rewriter saves rather than a kernel's speed.

use crate::bench::check::{self, Tolerance};
use crate::output::{Cell, SuiteOutput, Table, progress};
use crate::runner::Runner;
use crate::svg::{Plot, Series};
use crate::timing::{Budget, measure_ms};
pub use crate::workloads::unary::{CHAIN, SIZES, UnaryOp};
use crate::workloads::unary::{eager_chain, input, lazy_chain};

#[derive(Clone, Debug)]
pub struct Args {
    pub sizes: Vec<usize>,
    pub budget: Budget,
}

/// The three quantities (see the module docs); the first word names the plot's series and
/// matches the criterion bench's function names.
const MODES: [&str; 4] = [
    "single op, realized",
    "eager chain (realize every op)",
    "lazy chain (realize once)",
    "compiled op (kiln::jit, output reused)",
];

/// Checks the single op, the eager chain and the lazy chain of `op` on the suite's input of `n`
/// elements, computed on `runner`, against the interpreter.
pub fn check_op(op: UnaryOp, n: usize, runner: &Runner) -> anyhow::Result<()> {
    check::against_interp(&format!("unary {} n={n}", op.name()), runner, Tolerance::ELEMENTWISE, |r| {
        let x = r.place(input(n))?;
        let single = op.apply(&x);
        let eager = eager_chain(op, &x, |y| Ok::<_, anyhow::Error>(r.realize(&[&y])?.remove(0)))?;
        let compiled = kiln::jit(|a: &[kiln::Tensor]| op.apply(&a[0])).call(&[&x])?.remove(0);
        Ok(vec![single, eager, lazy_chain(op, &x), compiled])
    })
}

/// Runs the suite on `runner`.
pub fn run(args: &Args, runner: &Runner) -> anyhow::Result<SuiteOutput> {
    let ops = UnaryOp::ALL;
    let bar = progress((ops.len() * MODES.len() * args.sizes.len()) as u64, "unary");
    // results[op][mode][size] = ms per op
    let mut results = vec![vec![Vec::new(); MODES.len()]; ops.len()];
    for (oi, &op) in ops.iter().enumerate() {
        for &n in &args.sizes {
            bar.set_message(format!("{} n={n}", op.name()));
            check_op(op, n, runner)?;
            let x = runner.place(input(n))?;
            let single = measure_ms(args.budget, || runner.realize(&[&op.apply(&x)]))?;
            bar.inc(1);
            let eager = measure_ms(args.budget, || {
                eager_chain(op, &x, |y| Ok::<_, anyhow::Error>(runner.realize(&[&y])?.remove(0)))
            })? / CHAIN as f64;
            bar.inc(1);
            let lazy = measure_ms(args.budget, || runner.realize(&[&lazy_chain(op, &x)]))? / CHAIN as f64;
            bar.inc(1);
            let mut f = kiln::jit(|a: &[kiln::Tensor]| op.apply(&a[0]));
            // The output is dropped inside the timed call, so the next call reuses its array.
            let compiled = measure_ms(args.budget, || {
                f.call(&[&x])?;
                Ok(())
            })?;
            bar.inc(1);
            results[oi][0].push(single);
            results[oi][1].push(eager);
            results[oi][2].push(lazy);
            results[oi][3].push(compiled);
        }
    }
    bar.finish_and_clear();

    let mut out = SuiteOutput::new("unary");
    out.meta("device", runner.describe());
    out.meta("chain", format!("{CHAIN} ops; times are ms per op (chain time / {CHAIN}), median, steady state"));
    let size_cols: Vec<String> = args.sizes.iter().map(|n| n.to_string()).collect();
    let mut columns = vec!["op", "mode"];
    columns.extend(size_cols.iter().map(String::as_str));
    let mut table = Table::new("ms", "Unary ops, ms per op (columns: n)", &columns);
    let mut series = Vec::new();
    for (oi, op) in ops.iter().enumerate() {
        for (mi, mode) in MODES.iter().enumerate() {
            let mut row: Vec<Cell> = vec![op.name().into(), (*mode).into()];
            row.extend(results[oi][mi].iter().map(|&ms| Cell::Num(ms)));
            table.push(row);
            series.push(Series {
                name: format!("{} {}", op.name(), mode.split(' ').next().unwrap_or(mode)),
                points: args.sizes.iter().zip(&results[oi][mi]).map(|(&n, &ms)| (n as f64, ms)).collect(),
            });
        }
    }
    out.tables.push(table);
    out.plots.push((
        "time".into(),
        Plot {
            title: "Unary ops: ms per op vs size".into(),
            x_label: "elements".into(),
            y_label: "ms per op".into(),
            log_x: true,
            log_y: true,
            series,
        },
    ));
    out.notes.push(
        "neg chains of even length fold to nothing (rule neg-neg): the lazy neg row measures the rewriter's saving"
            .into(),
    );
    Ok(out)
}

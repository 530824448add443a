//! `kiln bench matmul`: the workload [`crate::workloads::matmul`], `f32` (512x1024)@(1024x2048)
//! and 1024^3 (the anchors' matmul shapes), through the facade (steady state: the program is
//! compiled once), in ms and GFLOP/s. The criterion bench `crates/cli/benches/matmul.rs` runs the
//! same products' compiled program directly.
//!
//! Before timing, each product is checked against the reference interpreter at a reduced shape
//! (every dimension divided by [`CHECK_DIVISOR`]; the interpreter materializes all `m*k*n`
//! partial products, about 4 GiB at the full first shape), from the same input generator.

use crate::bench::check::{self, Tolerance};
use crate::output::{SuiteOutput, Table, progress};
use crate::runner::Runner;
use crate::svg::{Plot, Series};
use crate::timing::{Budget, measure_ms};
pub use crate::workloads::matmul::SHAPES;
use crate::workloads::matmul::{flops, operands};

/// The checked shape is the timed one with every dimension divided by this (rounded up).
pub const CHECK_DIVISOR: usize = 8;

#[derive(Clone, Debug)]
pub struct Args {
    pub shapes: Vec<(usize, usize, usize)>,
    pub budget: Budget,
}

/// Checks `(m x k) @ (k x n)` on `runner` against the interpreter, from the suite's inputs.
pub fn check_product(m: usize, k: usize, n: usize, runner: &Runner) -> anyhow::Result<()> {
    check::against_interp(&format!("matmul ({m}x{k})@({k}x{n})"), runner, Tolerance::REDUCTION, |r| {
        let (a, b) = operands(m, k, n);
        Ok(vec![r.place(a)?.matmul(&r.place(b)?)])
    })
}

/// Runs the suite on `runner`.
pub fn run(args: &Args, runner: &Runner) -> anyhow::Result<SuiteOutput> {
    let bar = progress(args.shapes.len() as u64, "matmul");
    let mut out = SuiteOutput::new("matmul");
    out.meta("device", runner.describe());
    let mut table = Table::new("ms", "Matmul, f32", &["shape", "ms (median)", "GFLOP/s"]);
    let mut points = Vec::new();
    for &(m, k, n) in &args.shapes {
        check_product(m.div_ceil(CHECK_DIVISOR), k.div_ceil(CHECK_DIVISOR), n.div_ceil(CHECK_DIVISOR), runner)?;
        let (a, b) = operands(m, k, n);
        let (a, b) = (runner.place(a)?, runner.place(b)?);
        let ms = measure_ms(args.budget, || runner.realize(&[&a.matmul(&b)]))?;
        let gflop = flops(m, k, n) as f64 / 1e9;
        let gflops = gflop / (ms / 1e3);
        table.push(vec![format!("({m}x{k})@({k}x{n})").into(), ms.into(), gflops.into()]);
        points.push((gflop, gflops));
        bar.inc(1);
    }
    bar.finish_and_clear();
    out.tables.push(table);
    out.plots.push((
        "gflops".into(),
        Plot {
            title: "Matmul throughput".into(),
            x_label: "GFLOP per product".into(),
            y_label: "GFLOP/s".into(),
            log_x: false,
            log_y: false,
            series: vec![Series { name: "kiln".into(), points }],
        },
    ));
    Ok(out)
}

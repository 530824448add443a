//! `kiln bench tree-matmul`: the workload [`crate::workloads::tree`] (also the criterion bench
//! `crates/cli/benches/tree_matmul.rs`), 32 independent `(128x256)@(256x512)` products, three ways:
//! (a) a loop realizing each product separately, (b) `kiln::Tree`s of the operands multiplied
//! leaf by leaf and realized at once (one program; equal-shape matmuls become one grouped launch
//! whose products run concurrently), (c) one batched matmul of the pre-stacked operands. The anchors' torch and numpy rows measure the same three shapes of work.
//!
//! Before timing, the results of all three are checked against the reference interpreter at a
//! reduced size ([`Args::reduced`]: at most 4 pairs, every dimension divided by 4; the interpreter
//! materializes all `m*k*n` partial products, 2 GiB per call at full size), from the same input
//! generator.

use kiln::Tensor;

use crate::bench::check::{self, Tolerance};
use crate::output::{SuiteOutput, Table, progress};
use crate::runner::Runner;
use crate::svg::{Plot, Series};
use crate::timing::{Budget, measure_ms};
use crate::workloads::tree::{self as workload, Shape, stacked, tree_of};

#[derive(Clone, Debug)]
pub struct Args {
    pub pairs: usize,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub budget: Budget,
}

impl Default for Args {
    fn default() -> Args {
        let Shape { pairs, m, k, n } = Shape::default();
        Args { pairs, m, k, n, budget: Budget::STEADY }
    }
}

impl Args {
    /// The size the results are checked at: at most 4 pairs, each dimension divided by 4.
    pub fn reduced(&self) -> Args {
        Args { pairs: self.pairs.min(4), m: self.m.div_ceil(4), k: self.k.div_ceil(4), n: self.n.div_ceil(4), ..*self }
    }

    /// The workload's sizes.
    pub fn shape(&self) -> Shape {
        Shape { pairs: self.pairs, m: self.m, k: self.k, n: self.n }
    }
}

/// The operands: `pairs` left and right matrices placed on `runner`.
fn operands(args: &Args, runner: &Runner) -> anyhow::Result<(Vec<Tensor>, Vec<Tensor>)> {
    let (a, b) = workload::operands(args.shape());
    let place = |ts: Vec<Tensor>| ts.into_iter().map(|t| runner.place(t)).collect::<anyhow::Result<Vec<_>>>();
    Ok((place(a)?, place(b)?))
}

/// Checks the products of all three variants at the size of `args`, computed on `runner`, against
/// the interpreter.
pub fn check_variants(args: &Args, runner: &Runner) -> anyhow::Result<()> {
    let what = format!("tree-matmul {} pairs of ({}x{})@({}x{})", args.pairs, args.m, args.k, args.k, args.n);
    check::against_interp(&what, runner, Tolerance::REDUCTION, |r| {
        let (a, b) = operands(args, r)?;
        let mut products = Vec::new();
        for (x, y) in a.iter().zip(&b) {
            products.push(r.realize(&[&x.matmul(y)])?.remove(0));
        }
        products.extend(tree_of(&a)?.matmul(&tree_of(&b)?).leaves().into_iter().cloned());
        products.push(stacked(&a).matmul(&stacked(&b)));
        Ok(products)
    })
}

/// Runs the suite on `runner`.
pub fn run(args: &Args, runner: &Runner) -> anyhow::Result<SuiteOutput> {
    let (m, k, n, pairs) = (args.m, args.k, args.n, args.pairs);
    check_variants(&args.reduced(), runner)?;
    let (a, b) = operands(args, runner)?;
    let stacked_a = runner.realize(&[&stacked(&a)])?.remove(0);
    let stacked_b = runner.realize(&[&stacked(&b)])?.remove(0);

    let tree_a = tree_of(&a)?;
    let tree_b = tree_of(&b)?;

    let bar = progress(3, "tree-matmul");
    let loop_ms = measure_ms(args.budget, || {
        for (x, y) in a.iter().zip(&b) {
            runner.realize(&[&x.matmul(y)])?;
        }
        Ok(())
    })?;
    bar.inc(1);
    let many_ms = measure_ms(args.budget, || {
        let products = tree_a.matmul(&tree_b);
        runner.realize(&products.leaves())
    })?;
    bar.inc(1);
    let batched_ms = measure_ms(args.budget, || runner.realize(&[&stacked_a.matmul(&stacked_b)]))?;
    bar.finish_and_clear();

    let gflop = args.shape().flops() as f64 / 1e9;
    let mut out = SuiteOutput::new("tree-matmul");
    out.meta("device", runner.describe());
    out.meta("work", format!("N={pairs} pairs of ({m}x{k})@({k}x{n}) f32, {gflop:.3} GFLOP per call"));
    let mut table = Table::new("ms", "Tree of matmuls", &["impl", "ms (median)", "GFLOP/s"]);
    let rows = [
        ("(a) loop, realize each product", loop_ms),
        ("(b) one Tree realize of all products", many_ms),
        ("(c) batched matmul, pre-stacked", batched_ms),
    ];
    for (name, ms) in rows {
        table.push(vec![name.into(), ms.into(), (gflop / (ms / 1e3)).into()]);
    }
    out.tables.push(table);
    out.plots.push((
        "time".into(),
        Plot {
            title: "Tree of matmuls: ms per call".into(),
            x_label: "variant (a, b, c)".into(),
            y_label: "ms".into(),
            log_x: false,
            log_y: false,
            series: rows
                .iter()
                .enumerate()
                .map(|(i, (name, ms))| Series { name: name.to_string(), points: vec![(i as f64 + 1.0, *ms)] })
                .collect(),
        },
    ));
    Ok(out)
}

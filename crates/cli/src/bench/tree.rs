//! `kiln bench tree-matmul`: 32 independent `(128x256)@(256x512)` products, three ways:
//! (a) a loop realizing each product separately, (b) `kiln::Tree`s of the operands multiplied
//! leaf by leaf and realized at once (one program; equal-shape matmuls become one grouped launch
//! whose products run concurrently), (c) one batched matmul of the pre-stacked operands. The anchors' torch and numpy rows measure the same three shapes of work.
//!
//! Before timing, the results of all three are checked against the reference interpreter at a
//! reduced size ([`Args::reduced`]: at most 4 pairs, every dimension divided by 4; the interpreter
//! materializes all `m*k*n` partial products, 2 GiB per call at full size), from the same input
//! generator.

use kiln::{Tensor, Tree};

use crate::bench::check::{self, Tolerance};
use crate::output::{SuiteOutput, Table, progress};
use crate::runner::Runner;
use crate::svg::{Plot, Series};
use crate::timing::{Budget, measure_ms};

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
        Args { pairs: 32, m: 128, k: 256, n: 512, budget: Budget::STEADY }
    }
}

impl Args {
    /// The size the results are checked at: at most 4 pairs, each dimension divided by 4.
    pub fn reduced(&self) -> Args {
        Args { pairs: self.pairs.min(4), m: self.m.div_ceil(4), k: self.k.div_ceil(4), n: self.n.div_ceil(4), ..*self }
    }
}

fn filled(rows: usize, cols: usize, seed: usize) -> Tensor {
    let data: Vec<f32> = (0..rows * cols).map(|i| (((i * 31 + seed * 17) % 61) as f32 - 30.0) / 64.0).collect();
    Tensor::from_vec(data, &[rows, cols])
}

/// The operands: `pairs` left and right matrices placed on `runner`.
fn operands(args: &Args, runner: &Runner) -> anyhow::Result<(Vec<Tensor>, Vec<Tensor>)> {
    let (m, k, n) = (args.m, args.k, args.n);
    let a = (0..args.pairs).map(|i| runner.place(filled(m, k, 2 * i))).collect::<anyhow::Result<_>>()?;
    let b = (0..args.pairs).map(|i| runner.place(filled(k, n, 2 * i + 1))).collect::<anyhow::Result<_>>()?;
    Ok((a, b))
}

fn tree_of(tensors: &[Tensor]) -> anyhow::Result<Tree<Tensor>> {
    Ok(Tree::from_pairs(tensors.iter().enumerate().map(|(i, t)| (format!("node{i}"), t.clone())))?)
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
        products.extend(tree_of(&a)?.matmul(&tree_of(&b)?)?.leaves().into_iter().cloned());
        let a_refs: Vec<&Tensor> = a.iter().collect();
        let b_refs: Vec<&Tensor> = b.iter().collect();
        products.push(kiln::stack(&a_refs, 0).matmul(&kiln::stack(&b_refs, 0)));
        Ok(products)
    })
}

/// Runs the suite on `runner`.
pub fn run(args: &Args, runner: &Runner) -> anyhow::Result<SuiteOutput> {
    let (m, k, n, pairs) = (args.m, args.k, args.n, args.pairs);
    check_variants(&args.reduced(), runner)?;
    let (a, b) = operands(args, runner)?;
    let a_refs: Vec<&Tensor> = a.iter().collect();
    let b_refs: Vec<&Tensor> = b.iter().collect();
    let stacked_a = runner.realize(&[&kiln::stack(&a_refs, 0)])?.remove(0);
    let stacked_b = runner.realize(&[&kiln::stack(&b_refs, 0)])?.remove(0);

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
        let products = tree_a.matmul(&tree_b)?;
        runner.realize(&products.leaves())
    })?;
    bar.inc(1);
    let batched_ms = measure_ms(args.budget, || runner.realize(&[&stacked_a.matmul(&stacked_b)]))?;
    bar.finish_and_clear();

    let gflop = 2.0 * (pairs * m * k * n) as f64 / 1e9;
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

//! `kiln bench models`: predict (a forward pass without gradients) and fit (one training step:
//! forward, `kiln::grad`, SGD with momentum, all realized as one program) for a suite of small
//! models built from `nn`'s layers, steady state (each program compiled once, then timed).
//!
//! The suite (models, inputs, targets, loss) is [`nn::zoo`], shared with the criterion bench
//! `cargo bench -p kiln-nn --bench models`; its docs list the sizes.
//!
//! Before timing, each model's prediction and its parameters after one fit step are checked
//! against the reference interpreter from the same weights and data, at a reduced batch of at most
//! [`CHECK_BATCH`] rows (the interpreter materializes every partial product of a matmul: 400 MiB
//! for one layer of `dense-large` at its full batch of 128). A mismatch aborts the suite.
//!
//! Predict is `nn::Predictor::predict` (the forward pass compiled once with `kiln::jit`, the
//! weights its arguments) and a fit step is `nn::Trainer::step`, on the runner's device: the
//! suite times the library's own calls.
//!
//! A model `nn` cannot build, or that fails to run, gets a row saying so instead of times.

use nn::zoo::{self, NAMES};
use nn::{Sgd, Trainer};

use crate::bench::check::{self, Tolerance};
use crate::output::{Cell, SuiteOutput, Table, progress};
use crate::runner::Runner;
use crate::svg::{Plot, Series};
use crate::timing::{Budget, measure_ms};

/// The optimizer of every fit step (what the table's `fit` line says).
pub fn optimizer() -> Sgd {
    Sgd::new(0.01, 0.9)
}

/// The most rows of a batch the results are checked at.
pub const CHECK_BATCH: usize = 8;

/// Checks the prediction and the parameters after one fit step of the model `name`, computed on
/// `runner`, against the interpreter, on the first [`CHECK_BATCH`] rows of its data.
pub fn check_model(name: &str, runner: &Runner) -> anyhow::Result<()> {
    check::against_interp(&format!("models {name}"), runner, Tolerance::MODEL, |r| {
        let mut case = zoo::build(name)?;
        r.place_module(&mut *case.model)?;
        let batch = case.x.dims()?[0].min(CHECK_BATCH);
        case.x = r.place(case.x.narrow(0, 0, batch))?;
        case.y = r.place(case.y.narrow(0, 0, batch))?;
        let mut outputs = vec![nn::Predictor::new().predict(&mut *case.model, &case.x)?];
        let mut trainer = Trainer::new(case.model, optimizer(), case.loss);
        trainer.step(&case.x, &case.y)?;
        outputs.extend(trainer.model.parameters());
        Ok(outputs)
    })
}

/// The model `name` of the suite with its weights and one batch of data on `runner`'s device,
/// as the suite times it.
pub fn placed(name: &str, runner: &Runner) -> anyhow::Result<zoo::Case> {
    let mut case = zoo::build(name)?;
    runner.place_module(&mut *case.model)?;
    case.x = runner.place(case.x.clone())?;
    case.y = runner.place(case.y.clone())?;
    Ok(case)
}

/// Runs the suite (only `dense-tiny` when `smoke`).
pub fn run(smoke: bool, runner: &Runner) -> anyhow::Result<SuiteOutput> {
    let names: &[&str] = if smoke { &NAMES[..1] } else { &NAMES };
    let budget = if smoke { Budget::SMOKE } else { Budget { max_runs: 50, ..Budget::STEADY } };
    let bar = progress(names.len() as u64, "models");
    let mut table = Table::new(
        "ms",
        "Models: predict and one fit step, ms (steady state)",
        &["model", "parameters", "input", "predict ms", "fit ms/step", "status"],
    );
    let mut predict_points = Vec::new();
    let mut fit_points = Vec::new();
    for (i, &name) in names.iter().enumerate() {
        bar.set_message(name.to_string());
        let measured = (|| -> anyhow::Result<(usize, String, f64, f64)> {
            check_model(name, runner)?;
            let mut case = placed(name, runner)?;
            let input = format!("{:?}", case.x.dims()?);
            let params = case.model.num_parameters();
            let mut predictor = nn::Predictor::new();
            let predict_ms = measure_ms(budget, || Ok(predictor.predict(&mut *case.model, &case.x)?))?;
            let mut trainer = Trainer::new(case.model, optimizer(), case.loss);
            let fit_ms = measure_ms(budget, || Ok(trainer.step(&case.x, &case.y)?))?;
            Ok((params, input, predict_ms, fit_ms))
        })();
        match measured {
            Ok((params, input, p, f)) => {
                table.push(vec![name.into(), params.into(), input.into(), p.into(), f.into(), "ok".into()]);
                predict_points.push((i as f64 + 1.0, p));
                fit_points.push((i as f64 + 1.0, f));
            }
            Err(e) if check::is_mismatch(&e) => return Err(e),
            Err(e) => {
                let reason = format!("not available: {e:#}").replace('\n', " ");
                table.push(vec![
                    name.into(),
                    Cell::Missing,
                    Cell::Missing,
                    Cell::Missing,
                    Cell::Missing,
                    reason.into(),
                ]);
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut out = SuiteOutput::new("models");
    out.meta("device", runner.describe());
    out.meta("fit", "one step: forward + kiln::grad + SGD (lr 0.01, momentum 0.9), realized as one program");
    out.tables.push(table);
    out.plots.push((
        "time".into(),
        Plot {
            title: format!("Models: ms per call (x = model index: {})", names.join(", ")),
            x_label: "model".into(),
            y_label: "ms".into(),
            log_x: false,
            log_y: true,
            series: vec![
                Series { name: "predict".into(), points: predict_points },
                Series { name: "fit step".into(), points: fit_points },
            ],
        },
    ));
    Ok(out)
}

//! `kiln bench models`: predict (a forward pass without gradients) and fit (one training step:
//! forward, `kiln::grad`, SGD with momentum, all realized as one program) for a suite of small
//! models built from `nn`'s layers, steady state (each program compiled once, then timed).
//!
//! The suite (sizes chosen here; `nn` has the layers but no suite of its own):
//!
//! | name | model | input |
//! |---|---|---|
//! | dense-tiny | Linear 32-64, ReLU, Linear 64-10 | (32, 32) |
//! | dense-large | Linear 784-1024, ReLU, Linear 1024-1024, ReLU, Linear 1024-10 | (128, 784) |
//! | conv-1 | Conv2d 1-1 3x3, ReLU, Flatten, Linear 676-10 | (8, 1, 28, 28) |
//! | conv-32 | Conv2d 1-32 3x3, ReLU, MaxPool 2x2, Flatten, Linear 5408-10 | (8, 1, 28, 28) |
//! | simple-rnn, gru, lstm | the recurrent layer 8-32 (last state), Linear 32-1 | (16, 10, 8) |
//! | mobilenet | `nn::MobileNet` 3-8 stem, blocks (16,1) (32,2) (32,1), 10 classes | (4, 3, 32, 32) |
//! | attention | `nn::CausalSelfAttention` dim 64, 8 heads | (8, 16, 64) |
//!
//! A model `nn` cannot build, or that fails to run, gets a row saying so instead of times.

use kiln::Tensor;
use nn::{
    Activation, CausalSelfAttention, Conv2d, Flatten, Gru, Linear, Loss, Lstm, MaxPool2d, MobileNet, Module, Optimizer,
    ParamKind, Sequential, Sgd, SimpleRnn,
};

use crate::output::{Cell, SuiteOutput, Table, progress};
use crate::runner::Runner;
use crate::svg::{Plot, Series};
use crate::timing::{Budget, measure_ms};

/// A model of the suite with one batch of data.
pub struct Case {
    pub model: Box<dyn Module>,
    pub x: Tensor,
    pub y: Tensor,
    pub loss: Loss,
}

fn data(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((i * 37 + seed * 11) % 101) as f32 - 50.0) / 50.0).collect();
    Tensor::from_vec(v, shape)
}

fn dense(sizes: &[usize], batch: usize) -> anyhow::Result<Case> {
    let mut model = Sequential::new();
    for (i, w) in sizes.windows(2).enumerate() {
        model = model.push(Linear::new(w[0], w[1], true));
        if i + 2 < sizes.len() {
            model = model.push(Activation::Relu);
        }
    }
    let out = sizes[sizes.len() - 1];
    Ok(Case { model: Box::new(model), x: data(&[batch, sizes[0]], 1), y: data(&[batch, out], 2), loss: Loss::Mse })
}

fn conv(filters: usize, pool: bool) -> anyhow::Result<Case> {
    let mut model =
        Sequential::new().push(Conv2d::new(1, filters, (3, 3), (1, 1), (0, 0), 1, true)?).push(Activation::Relu);
    let side = if pool {
        model = model.push(MaxPool2d::new((2, 2)));
        13
    } else {
        26
    };
    let model = model.push(Flatten).push(Linear::new(filters * side * side, 10, true));
    Ok(Case { model: Box::new(model), x: data(&[8, 1, 28, 28], 3), y: data(&[8, 10], 4), loss: Loss::Mse })
}

fn recurrent(layer: impl Module + 'static) -> anyhow::Result<Case> {
    let model = Sequential::new().push(layer).push(Linear::new(32, 1, true));
    Ok(Case { model: Box::new(model), x: data(&[16, 10, 8], 5), y: data(&[16, 1], 6), loss: Loss::Mse })
}

/// The suite's names, in order.
pub const NAMES: [&str; 9] =
    ["dense-tiny", "dense-large", "conv-1", "conv-32", "simple-rnn", "gru", "lstm", "mobilenet", "attention"];

/// Builds the named model with its data.
pub fn build(name: &str) -> anyhow::Result<Case> {
    kiln::manual_seed(0);
    match name {
        "dense-tiny" => dense(&[32, 64, 10], 32),
        "dense-large" => dense(&[784, 1024, 1024, 10], 128),
        "conv-1" => conv(1, false),
        "conv-32" => conv(32, true),
        "simple-rnn" => {
            let mut rnn = SimpleRnn::new(8, 32);
            rnn.return_sequences = false;
            recurrent(rnn)
        }
        "gru" => {
            let mut rnn = Gru::new(8, 32);
            rnn.return_sequences = false;
            recurrent(rnn)
        }
        "lstm" => {
            let mut rnn = Lstm::new(8, 32);
            rnn.return_sequences = false;
            recurrent(rnn)
        }
        "mobilenet" => Ok(Case {
            model: Box::new(MobileNet::new(3, 8, &[(16, 1), (32, 2), (32, 1)], 10)?),
            x: data(&[4, 3, 32, 32], 7),
            y: data(&[4, 10], 8),
            loss: Loss::Mse,
        }),
        "attention" => Ok(Case {
            model: Box::new(CausalSelfAttention::new(64, 8, 16)?),
            x: data(&[8, 16, 64], 9),
            y: data(&[8, 16, 64], 10),
            loss: Loss::Mse,
        }),
        other => anyhow::bail!("unknown model {other}"),
    }
}

/// A forward pass without gradients, realized on `runner`.
fn predict(case: &mut Case, runner: &Runner) -> anyhow::Result<Tensor> {
    case.model.set_training(false);
    let y = kiln::no_grad(|| case.model.forward(&case.x));
    Ok(runner.realize(&[&y])?.remove(0))
}

/// One training step realized as one program on `runner` (what `nn::Trainer::step` does, with
/// the realize going through the runner); returns the loss.
fn fit_step(case: &mut Case, optimizer: &mut Sgd, runner: &Runner) -> anyhow::Result<f32> {
    case.model.set_training(true);
    let params = case.model.parameters();
    let loss = case.loss.compute(&case.model.forward(&case.x), &case.y);
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = kiln::grad(&loss, &refs)?;
    let new_params = optimizer.step(&params, &grads)?;
    let state = optimizer.state();
    let mut outputs: Vec<&Tensor> = vec![&loss];
    outputs.extend(new_params.iter());
    outputs.extend(state.iter());
    let mut realized = runner.realize(&outputs)?.into_iter();
    let loss = realized.next().ok_or_else(|| anyhow::anyhow!("no loss"))?;
    let mut fresh = realized.take(new_params.len());
    case.model.visit_mut(&mut |_, t, kind| {
        if kind == ParamKind::Weight
            && let Some(p) = fresh.next()
        {
            *t = p.requires_grad_();
        }
    });
    Ok(loss.item::<f32>()?)
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
            let mut case = build(name)?;
            runner.place_module(&mut *case.model)?;
            case.x = runner.place(case.x.clone())?;
            case.y = runner.place(case.y.clone())?;
            let input = format!("{:?}", case.x.dims()?);
            let params = case.model.num_parameters();
            let predict_ms = measure_ms(budget, || predict(&mut case, runner))?;
            let mut optimizer = Sgd::new(0.01, 0.9);
            let fit_ms = measure_ms(budget, || fit_step(&mut case, &mut optimizer, runner))?;
            Ok((params, input, predict_ms, fit_ms))
        })();
        match measured {
            Ok((params, input, p, f)) => {
                table.push(vec![name.into(), params.into(), input.into(), p.into(), f.into(), "ok".into()]);
                predict_points.push((i as f64 + 1.0, p));
                fit_points.push((i as f64 + 1.0, f));
            }
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

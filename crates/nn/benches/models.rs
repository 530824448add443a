//! `predict` and `fit` (one training step) of small models, in ms per call on the default device:
//! run with `KILN_DEVICE=cpu` for the native CPU device (the reference interpreter otherwise).
//! `predict` is a [`Predictor`] (the forward pass as a `kiln::jit` function); each `fit_step` is
//! forward + backward + Adam update as one compiled function, traced on the first step.
//!
//! The models, inputs and targets are [`kiln_nn::zoo`], the suite `kiln bench models` also runs
//! (dense-tiny, dense-large, conv with 1 and 32 filters, SimpleRNN, GRU, LSTM, MobileNet and a
//! causal attention block). Run with
//! `KILN_DEVICE=cpu cargo bench -p kiln-nn --bench models`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use kiln_nn::*;

fn models(c: &mut Criterion) {
    // As the `kiln` command does, so that outputs freed between iterations are reused warm.
    kiln::tune_host_allocator();
    let mut group = c.benchmark_group("models");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    for name in zoo::NAMES {
        let case = zoo::build(name).expect("zoo model");
        let (x, y) = (case.x, case.y);
        let mut model = case.model;
        let mut predictor = Predictor::new();
        group.bench_function(format!("{}/predict", case.name), |b| {
            b.iter(|| black_box(predictor.predict(&mut model, &x).expect("predict")))
        });
        let mut trainer = Trainer::new(model, Adam::new(1e-3), case.loss);
        group.bench_function(format!("{}/fit_step", case.name), |b| {
            b.iter(|| black_box(trainer.step(&x, &y).expect("step")))
        });
    }
    group.finish();
}

criterion_group!(benches, models);
criterion_main!(benches);

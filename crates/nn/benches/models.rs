//! `predict` and `fit` (one training step) of small models, in ms per call on the default device:
//! run with `KILN_DEVICE=cpu` for the native CPU device (the reference interpreter otherwise).
//! Each `fit_step` is forward + backward + Adam update as one graph; after the first step every
//! step hits the device's program cache.
//!
//! Sizes follow a small Keras-style benchmark suite, scaled so that the interpreter finishes:
//! dense-tiny, dense-large, conv with 1 and 32 filters, SimpleRNN, GRU, LSTM, MobileNet and a
//! causal attention block. Run with
//! `KILN_DEVICE=cpu cargo bench -p kiln-nn --bench models`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use kiln::Tensor;
use kiln_nn::*;

struct Case {
    name: &'static str,
    make: fn() -> Box<dyn Module>,
    x: Vec<usize>,
    y: Vec<usize>,
    loss: Loss,
}

/// A boxed module as a `Module` value (the trainer owns its model).
struct Boxed(Box<dyn Module>);

impl Module for Boxed {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.0.forward(x)
    }
    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        self.0.visit(f)
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        self.0.visit_mut(f)
    }
    fn set_training(&mut self, training: bool) {
        self.0.set_training(training)
    }
}

fn rnn_head<R: Module + 'static>(rnn: R) -> Box<dyn Module> {
    Box::new(Sequential::new().push(rnn).push(Linear::new(16, 1, true)))
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "dense_tiny",
            make: || {
                Box::new(
                    Sequential::new()
                        .push(Linear::new(16, 16, true))
                        .push(Activation::Relu)
                        .push(Linear::new(16, 1, true)),
                )
            },
            x: vec![32, 16],
            y: vec![32, 1],
            loss: Loss::Mse,
        },
        Case {
            name: "dense_large",
            make: || {
                Box::new(
                    Sequential::new()
                        .push(Linear::new(256, 256, true))
                        .push(Activation::Relu)
                        .push(Linear::new(256, 10, true)),
                )
            },
            x: vec![32, 256],
            y: vec![32, 10],
            loss: Loss::Mse,
        },
        Case {
            name: "conv_1_filter",
            make: || {
                let conv = Conv2d::new(3, 1, (3, 3), (1, 1), (1, 1), 1, true).expect("conv");
                Box::new(
                    Sequential::new().push(conv).push(Activation::Relu).push(Flatten).push(Linear::new(256, 10, true)),
                )
            },
            x: vec![8, 3, 16, 16],
            y: vec![8, 10],
            loss: Loss::Mse,
        },
        Case {
            name: "conv_32_filters",
            make: || {
                let conv = Conv2d::new(3, 32, (3, 3), (1, 1), (1, 1), 1, true).expect("conv");
                let pool = MaxPool2d::new((4, 4));
                Box::new(
                    Sequential::new()
                        .push(conv)
                        .push(Activation::Relu)
                        .push(pool)
                        .push(Flatten)
                        .push(Linear::new(512, 10, true)),
                )
            },
            x: vec![8, 3, 16, 16],
            y: vec![8, 10],
            loss: Loss::Mse,
        },
        Case {
            name: "simple_rnn",
            make: || {
                let mut rnn = SimpleRnn::new(8, 16);
                rnn.return_sequences = false;
                rnn_head(rnn)
            },
            x: vec![8, 10, 8],
            y: vec![8, 1],
            loss: Loss::Mse,
        },
        Case {
            name: "gru",
            make: || {
                let mut rnn = Gru::new(8, 16);
                rnn.return_sequences = false;
                rnn_head(rnn)
            },
            x: vec![8, 10, 8],
            y: vec![8, 1],
            loss: Loss::Mse,
        },
        Case {
            name: "lstm",
            make: || {
                let mut rnn = Lstm::new(8, 16);
                rnn.return_sequences = false;
                rnn_head(rnn)
            },
            x: vec![8, 10, 8],
            y: vec![8, 1],
            loss: Loss::Mse,
        },
        Case {
            name: "mobilenet",
            make: || Box::new(MobileNet::new(3, 8, &[(16, 1), (32, 2), (32, 1)], 10).expect("mobilenet")),
            x: vec![4, 3, 32, 32],
            y: vec![4, 10],
            loss: Loss::Mse,
        },
        Case {
            name: "attention",
            make: || Box::new(Block::new(32, 4, 1e-5, 16).expect("block")),
            x: vec![4, 16, 32],
            y: vec![4, 16, 32],
            loss: Loss::Mse,
        },
    ]
}

fn models(c: &mut Criterion) {
    let mut group = c.benchmark_group("models");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    for case in cases() {
        kiln::manual_seed(0);
        let x = Tensor::randn(&case.x);
        let y = Tensor::randn(&case.y);
        let mut model = Boxed((case.make)());
        group.bench_function(format!("{}/predict", case.name), |b| {
            b.iter(|| black_box(predict(&mut model, &x).expect("predict")))
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

//! The model suite the benchmarks share: `cargo bench -p kiln-nn --bench models` and
//! `kiln bench models` both build their models, inputs and targets here, so there is one
//! definition of the suite (and of the sizes `BENCHMARKS.md` records).
//!
//! | name | model | input |
//! |---|---|---|
//! | dense-tiny | Linear 32-64, ReLU, Linear 64-10 | (32, 32) |
//! | dense-large | Linear 784-1024, ReLU, Linear 1024-1024, ReLU, Linear 1024-10 | (128, 784) |
//! | conv-1 | Conv2d 1-1 3x3, ReLU, Flatten, Linear 676-10 | (8, 1, 28, 28) |
//! | conv-32 | Conv2d 1-32 3x3, ReLU, MaxPool 2x2, Flatten, Linear 5408-10 | (8, 1, 28, 28) |
//! | simple-rnn, gru, lstm | the recurrent layer 8-32 (last state), Linear 32-1 | (16, 10, 8) |
//! | mobilenet | [`MobileNet`] 3-8 stem, blocks (16,1) (32,2) (32,1), 10 classes | (4, 3, 32, 32) |
//! | attention | [`CausalSelfAttention`] dim 64, 8 heads | (8, 16, 64) |
//!
//! Every model is fitted with [`Loss::Mse`] against a target shaped like its output. Inputs and
//! targets are deterministic (no random state), and [`build`] seeds `kiln`'s generator before
//! initializing the weights, so every build of a model is the same.
//!
//! ```
//! use kiln_nn::zoo;
//!
//! let case = zoo::build("dense-tiny")?;
//! assert_eq!(case.model.num_parameters(), 2762);
//! assert_eq!(case.x.dims()?, vec![32, 32]);
//! # Ok::<(), kiln_nn::NnError>(())
//! ```

use kiln::Tensor;

use crate::{
    Activation, CausalSelfAttention, Conv2d, Flatten, Gru, Linear, Loss, Lstm, MaxPool2d, MobileNet, Module, NnError,
    Result, Sequential, SimpleRnn,
};

/// The suite's names, in order.
pub const NAMES: [&str; 9] =
    ["dense-tiny", "dense-large", "conv-1", "conv-32", "simple-rnn", "gru", "lstm", "mobilenet", "attention"];

/// A model of the suite with one batch of data: input `x`, target `y` (shaped like the model's
/// output) and the loss to fit with.
pub struct Case {
    /// The model's name (one of [`NAMES`]).
    pub name: &'static str,
    /// The model, with freshly initialized weights on the default device.
    pub model: Box<dyn Module>,
    /// One batch of input.
    pub x: Tensor,
    /// The target for `x`, shaped like the model's output.
    pub y: Tensor,
    /// The loss that `fit` minimizes.
    pub loss: Loss,
}

/// Deterministic values in [-1, 1) of `shape`; `seed` shifts the pattern.
fn data(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((i * 37 + seed * 11) % 101) as f32 - 50.0) / 50.0).collect();
    Tensor::from_vec(v, shape)
}

/// `Linear` layers of `sizes` with ReLU between them.
fn dense(name: &'static str, sizes: &[usize], batch: usize) -> Case {
    let mut model = Sequential::new();
    for (i, w) in sizes.windows(2).enumerate() {
        model = model.push(Linear::new(w[0], w[1], true));
        if i + 2 < sizes.len() {
            model = model.push(Activation::Relu);
        }
    }
    let out = sizes[sizes.len() - 1];
    Case { name, model: Box::new(model), x: data(&[batch, sizes[0]], 1), y: data(&[batch, out], 2), loss: Loss::Mse }
}

/// A 3x3 valid convolution of a 28x28 image with `filters` filters, optionally 2x2 max-pooled,
/// then a linear classifier over 10 classes.
fn conv(name: &'static str, filters: usize, pool: bool) -> Result<Case> {
    let mut model =
        Sequential::new().push(Conv2d::new(1, filters, (3, 3), (1, 1), (0, 0), 1, true)?).push(Activation::Relu);
    let side = if pool {
        model = model.push(MaxPool2d::new((2, 2)));
        13
    } else {
        26
    };
    let model = model.push(Flatten).push(Linear::new(filters * side * side, 10, true));
    Ok(Case { name, model: Box::new(model), x: data(&[8, 1, 28, 28], 3), y: data(&[8, 10], 4), loss: Loss::Mse })
}

/// A recurrent `layer` (8 inputs, 32 hidden, last state only) followed by `Linear` 32-1.
fn recurrent(name: &'static str, layer: impl Module + 'static) -> Case {
    let model = Sequential::new().push(layer).push(Linear::new(32, 1, true));
    Case { name, model: Box::new(model), x: data(&[16, 10, 8], 5), y: data(&[16, 1], 6), loss: Loss::Mse }
}

/// Builds the named model (one of [`NAMES`]) with its data, after `kiln::manual_seed(0)`.
pub fn build(name: &str) -> Result<Case> {
    kiln::manual_seed(0);
    match name {
        "dense-tiny" => Ok(dense("dense-tiny", &[32, 64, 10], 32)),
        "dense-large" => Ok(dense("dense-large", &[784, 1024, 1024, 10], 128)),
        "conv-1" => conv("conv-1", 1, false),
        "conv-32" => conv("conv-32", 32, true),
        "simple-rnn" => {
            let mut rnn = SimpleRnn::new(8, 32);
            rnn.return_sequences = false;
            Ok(recurrent("simple-rnn", rnn))
        }
        "gru" => {
            let mut rnn = Gru::new(8, 32);
            rnn.return_sequences = false;
            Ok(recurrent("gru", rnn))
        }
        "lstm" => {
            let mut rnn = Lstm::new(8, 32);
            rnn.return_sequences = false;
            Ok(recurrent("lstm", rnn))
        }
        "mobilenet" => Ok(Case {
            name: "mobilenet",
            model: Box::new(MobileNet::new(3, 8, &[(16, 1), (32, 2), (32, 1)], 10)?),
            x: data(&[4, 3, 32, 32], 7),
            y: data(&[4, 10], 8),
            loss: Loss::Mse,
        }),
        "attention" => Ok(Case {
            name: "attention",
            model: Box::new(CausalSelfAttention::new(64, 8, 16)?),
            x: data(&[8, 16, 64], 9),
            y: data(&[8, 16, 64], 10),
            loss: Loss::Mse,
        }),
        other => Err(NnError::Config(format!("unknown model {other:?} (the suite has {})", NAMES.join(", ")))),
    }
}

/// Every model of the suite, in [`NAMES`] order.
pub fn all() -> Result<Vec<Case>> {
    NAMES.iter().copied().map(build).collect()
}

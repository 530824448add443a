//! Errors from layers and losses name the line that called them (`forward` is `#[track_caller]`
//! through every layer, `Sequential` and `Box<dyn Module>`), not a line in `crates/nn/src`, and
//! convolution, pooling and recurrent shape errors say what is wrong in words.

use kiln::{Error, Tensor};
use kiln_nn::{
    AvgPool2d, CausalSelfAttention, Conv2d, Gru, LayerNorm, Linear, Lstm, MaxPool2d, Module, Sequential, SimpleRnn,
    cross_entropy, mse_loss,
};

/// The `(op, message, file, line)` of the error `t` carries (an `Error::Op`).
fn site(t: &Tensor) -> (&'static str, String, &'static str, u32) {
    match t.to_vec::<f32>().unwrap_err() {
        Error::Op { op, message, location } => (op, message, location.file(), location.line()),
        other => panic!("expected an op error, got {other:?}"),
    }
}

/// The `(file, line)` of the error `t` carries.
fn file_line(t: &Tensor) -> (&'static str, u32) {
    let (_, _, file, line) = site(t);
    (file, line)
}

fn input(shape: &[usize]) -> Tensor {
    Tensor::randn_seeded(shape, 7)
}

#[test]
fn layer_errors_name_the_callers_line() {
    let linear = Linear::new(4, 3, true);
    let (bad, line) = (linear.forward(&input(&[2, 5])), line!());
    let (op, message, file, at) = site(&bad);
    assert_eq!((op, file, at), ("matmul", file!(), line), "{message}");

    let norm = LayerNorm::new(4, 1e-5);
    let (bad, line) = (norm.forward(&input(&[2, 6])), line!());
    assert_eq!(file_line(&bad), (file!(), line));

    // Through `Sequential` and a boxed module.
    let model = Sequential::new().push(Linear::new(4, 8, true)).push(Linear::new(5, 2, true));
    let (bad, line) = (model.forward(&input(&[3, 4])), line!());
    assert_eq!(file_line(&bad), (file!(), line));
    let boxed: Box<dyn Module> = Box::new(Linear::new(4, 3, false));
    let (bad, line) = (boxed.forward(&input(&[1, 7])), line!());
    assert_eq!(file_line(&bad), (file!(), line));

    // A `[batch, dim]` input where attention needs `[batch, seq, dim]`.
    let attention = CausalSelfAttention::new(8, 2, 16).unwrap();
    let (bad, line) = (attention.forward(&input(&[2, 8])), line!());
    assert_eq!(file_line(&bad), (file!(), line));

    let rnn = Gru::new(4, 3);
    let (bad, line) = (rnn.forward(&input(&[2, 5, 6])), line!());
    assert_eq!(file_line(&bad), (file!(), line));
}

#[test]
fn loss_errors_name_the_callers_line() {
    let (bad, line) = (mse_loss(&input(&[2, 3]), &input(&[3, 2])), line!());
    let (op, _, file, at) = site(&bad);
    assert_eq!((op, file, at), ("sub", file!(), line));
    let logits = input(&[2, 3]);
    let targets = Tensor::from_vec(vec![0.5f32, 1.0], &[2]);
    // Float targets are class probabilities (PyTorch's rule), which must be shaped like the
    // logits: the error names cross_entropy and the caller's line.
    let (bad, line) = (cross_entropy(&logits, &targets), line!());
    let (op, message, file, at) = site(&bad);
    assert_eq!((op, file, at), ("cross_entropy", file!(), line), "{message}");
    assert!(message.contains("probability target [2] must be shaped like input [2, 3]"), "{message}");
}

#[test]
fn convolution_and_pooling_errors_are_in_words() {
    let conv = Conv2d::new(1, 2, (3, 3), (1, 1), (0, 0), 1, true).unwrap();
    let (bad, line) = (conv.forward(&input(&[1, 1, 1, 1])), line!());
    let (op, message, file, at) = site(&bad);
    assert_eq!((op, file, at), ("conv2d", file!(), line));
    assert_eq!(message, "kernel 3x3 is larger than the input 1x1");
    assert_eq!(bad.error().unwrap().to_string(), format!("conv2d: {message} at {file}:{line}:{}", bad_column(&bad)));

    let padded = Conv2d::new(1, 2, (5, 5), (1, 1), (1, 1), 1, false).unwrap();
    let message = site(&padded.forward(&input(&[1, 1, 2, 4]))).1;
    assert_eq!(message, "kernel 5x5 is larger than the padded input 4x6 (input 2x4)");

    let message = site(&conv.forward(&input(&[1, 4, 4]))).1;
    assert_eq!(message, "input must be [N, C, H, W] with concrete C, H and W, got [1, 4, 4]");

    let (bad, line) = (conv.forward(&input(&[1, 3, 5, 5])), line!());
    let (op, message, file, at) = site(&bad);
    assert_eq!((op, file, at), ("conv2d", file!(), line));
    assert!(message.starts_with("input [1, 3, 5, 5] has 3 channels, but weight [2, 1, 3, 3] with groups 1 takes 1"));

    let (bad, line) = (MaxPool2d::new((3, 3)).forward(&input(&[1, 1, 2, 2])), line!());
    let (op, message, file, at) = site(&bad);
    assert_eq!(
        (op, message.as_str(), file, at),
        ("max_pool2d", "kernel 3x3 is larger than the input 2x2", file!(), line)
    );

    // PyTorch's rule: padding at most half the kernel (else whole windows would be padding).
    let pool = AvgPool2d { kernel: (2, 2), stride: (1, 1), padding: (2, 0) };
    let (op, message, ..) = site(&pool.forward(&input(&[1, 1, 4, 4])));
    assert_eq!((op, message.as_str()), ("avg_pool2d", "padding (2, 0) must be at most half the kernel 2x2"));

    // An input that already carries an error keeps it: the first error is the one to fix.
    let broken = input(&[2, 3]).matmul(&input(&[2, 3]));
    assert_eq!(site(&conv.forward(&broken)).0, "matmul");
}

#[test]
fn recurrent_shape_errors_are_in_words() {
    let (bad, line) = (SimpleRnn::new(4, 3).forward(&input(&[2, 4])), line!());
    let (op, message, file, at) = site(&bad);
    assert_eq!((op, file, at), ("rnn", file!(), line));
    assert_eq!(message, "input must be [batch, seq, input] with a concrete seq, got [2, 4]");
    let (op, message, ..) = site(&Lstm::new(4, 3).forward(&input(&[2, 0, 4])));
    assert_eq!((op, message.as_str()), ("lstm", "input [2, 0, 4] has no steps (the sequence axis is 0)"));
}

/// The column of the error `t` carries (only its line is asserted elsewhere).
fn bad_column(t: &Tensor) -> u32 {
    match t.error() {
        Some(Error::Op { location, .. }) => location.column(),
        other => panic!("expected an op error, got {other:?}"),
    }
}

//! How many kernels the CPU device launches for convolutions, pooling and MobileNet: windows are
//! views of the (once) padded input, so a convolution is an im2col copy plus one GEMM (a
//! depthwise one a single fused element-wise kernel), and tiled pooling fuses into one reduce.

use kiln::{Device, Tensor};
use kiln_nn::*;

/// Kernel launches of the program that realizes `outputs` on the CPU device.
fn launches(outputs: &[&Tensor]) -> usize {
    let program = kiln::trace(outputs).expect("trace");
    let device = kiln::backend::cpu_device().expect("cpu device");
    device.compile(&program.graph).expect("compile").launches()
}

/// Launches of `module`'s forward pass in eval mode (inference) and of its forward + backward in
/// training mode (loss, every gradient; BatchNorm on batch statistics).
fn forward_and_backward(mut module: impl Module, input: &[usize]) -> (usize, usize) {
    module.to_device(Device::Cpu).expect("to cpu");
    kiln::manual_seed(0);
    let x = Tensor::randn(input).to_device(Device::Cpu).expect("input");
    module.set_training(false);
    let y = kiln::no_grad(|| module.forward(&x));
    let forward = launches(&[&y]);
    module.set_training(true);
    let loss = module.forward(&x).square().sum_all();
    let params = module.parameters();
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = kiln::grad(&loss, &refs).expect("grad");
    let mut outputs = vec![&loss];
    outputs.extend(grads.iter());
    (forward, launches(&outputs))
}

#[test]
fn convolution_is_im2col_and_one_gemm() {
    // The padded input (written once, read by every window), the im2col copies (one kernel:
    // the nine kernel offsets' copies, each writing its slice of the columns, share one loop
    // nest), bias written into the result, GEMM accumulating onto it, and (only because the
    // result is a graph output) a copy from the GEMM's `[O, N, OH, OW]` to `[N, O, OH, OW]`.
    let conv = Conv2d::new(3, 32, (3, 3), (1, 1), (1, 1), 1, true).unwrap();
    assert_eq!(forward_and_backward(conv, &[8, 3, 16, 16]), (1 + 1 + 3, 8));
    let strided = Conv2d::new(3, 8, (3, 3), (2, 2), (1, 1), 1, false).unwrap();
    assert_eq!(forward_and_backward(strided, &[2, 3, 16, 16]).0, 1 + 1 + 2);
}

#[test]
fn depthwise_convolution_is_one_kernel() {
    // The padded input, then the taps over it without border masks.
    let conv = Conv2d::new(8, 8, (3, 3), (2, 2), (1, 1), 8, false).unwrap();
    assert_eq!(forward_and_backward(conv, &[4, 8, 16, 16]).0, 2);
}

#[test]
fn pointwise_convolution_reads_its_input_in_place() {
    let conv = Conv2d::new(8, 16, (1, 1), (1, 1), (0, 0), 1, false).unwrap();
    assert_eq!(forward_and_backward(conv, &[4, 8, 16, 16]).0, 1);
}

#[test]
fn tiled_pooling_is_one_reduce() {
    assert_eq!(forward_and_backward(MaxPool2d::new((4, 4)), &[8, 32, 16, 16]).0, 1);
    assert_eq!(forward_and_backward(AvgPool2d::new((2, 2)), &[8, 32, 16, 16]).0, 1);
}

#[test]
fn mobilenet_kernel_budget() {
    let model = MobileNet::new(3, 8, &[(16, 1), (32, 2), (32, 1)], 10).unwrap();
    let (forward, backward) = forward_and_backward(model, &[4, 3, 32, 32]);
    // The stem's im2col columns are 9 copies (one per kernel offset) into one buffer; the stem's
    // and the three depthwise convolutions' padded inputs are written once each.
    assert!(forward <= 25 + 8 + 4, "mobilenet forward: {forward} launches");
    // Training mode: each of the 7 BatchNorms computes its batch's mean and variance (and their
    // gradients), 127 launches against 110 with frozen statistics; the four padded inputs add
    // one kernel each.
    assert!(backward <= 128 + 4, "mobilenet forward + backward: {backward} launches");
}

#[test]
fn recurrent_steps_fuse_their_gate_math() {
    // Six steps. Per step after the first: the hidden bias (or the step's input part) written into
    // the product's buffer, the GEMM accumulating onto it, and the gates' element-wise math in one
    // kernel (the LSTM: one for the cell state, one for the output). A `tanh` that reads its
    // argument more than once makes the pre-activation and its exponential kernels of their own
    // (at the zoo's sizes, 10 steps: gru 52 launches instead of 32, lstm 62 instead of 41).
    let launches_of = |model: Box<dyn Module>| {
        kiln::manual_seed(0);
        let x = Tensor::randn(&[4, 6, 8]);
        let y = kiln::no_grad(|| model.forward(&x));
        launches(&[&y])
    };
    let mut gru = Gru::new(8, 16);
    gru.return_sequences = false;
    let mut lstm = Lstm::new(8, 16);
    lstm.return_sequences = false;
    let mut rnn = SimpleRnn::new(8, 16);
    rnn.return_sequences = false;
    let counts = [launches_of(Box::new(rnn)), launches_of(Box::new(gru)), launches_of(Box::new(lstm))];
    assert_eq!(counts, [18, 18, 23], "launches of simple-rnn, gru, lstm");
}

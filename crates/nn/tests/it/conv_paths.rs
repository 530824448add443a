//! Every lowering path of `Conv2d` (im2col with its concatenated columns, one input channel with
//! many filters, depthwise taps), computed on the CPU device against the reference interpreter:
//! outputs and the gradients of every parameter and of the input.

use crate::common;

use common::assert_close;
use kiln::{Device, Tensor};
use kiln_nn::*;

const TOL: f64 = 1e-4;

/// The output of `module` on `x` and the gradients of `sum(out * cot)` with respect to every
/// parameter and `x`, realized on `device`.
fn forward_and_grads(module: &mut dyn Module, x: &Tensor, cot: &Tensor, device: Device) -> Vec<Tensor> {
    module.to_device(device).unwrap();
    let x = x.to_device(device).unwrap();
    let out = module.forward(&x);
    let loss = out.mul(cot.to_device(device).unwrap()).sum_all();
    let params = module.parameters();
    let mut wrt: Vec<&Tensor> = params.iter().collect();
    wrt.push(&x);
    let mut all = vec![out.clone()];
    all.extend(kiln::grad(&loss, &wrt).expect("grad builds"));
    let refs: Vec<&Tensor> = all.iter().collect();
    kiln::realize(&refs).expect("realize");
    all
}

/// Checks `conv` on an input of `shape` on the CPU device against the interpreter.
fn check_conv(what: &str, mut conv: Conv2d, shape: &[usize]) {
    kiln::manual_seed(7);
    let x = Tensor::randn(shape);
    let out_shape = kiln::no_grad(|| conv.forward(&x)).dims().expect("conv output");
    let cot = Tensor::randn(out_shape.as_slice());
    let want = forward_and_grads(&mut conv, &x, &cot, Device::Interp);
    let got = forward_and_grads(&mut conv, &x, &cot, Device::Cpu);
    assert_eq!(want.len(), got.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("{what}: output {i}"), g, w, TOL);
    }
}

#[test]
fn convolutions_on_every_path_match_the_interpreter() {
    // One input channel, many filters (conv-32's layer): im2col and one GEMM.
    check_conv("1-to-32", Conv2d::new(1, 32, (3, 3), (1, 1), (0, 0), 1, true).unwrap(), &[3, 1, 9, 8]);
    // One input channel, one filter: depthwise taps.
    check_conv("1-to-1", Conv2d::new(1, 1, (3, 3), (1, 1), (0, 0), 1, true).unwrap(), &[2, 1, 7, 7]);
    // Strided and padded im2col with several channels (MobileNet's stem).
    check_conv("stem", Conv2d::new(3, 8, (3, 3), (2, 2), (1, 1), 1, false).unwrap(), &[2, 3, 10, 9]);
    // Groups with one input channel and two filters each.
    check_conv("groups", Conv2d::new(2, 4, (3, 2), (1, 2), (1, 0), 2, true).unwrap(), &[2, 2, 6, 7]);
    // Depthwise, strided and padded.
    check_conv("depthwise", Conv2d::new(4, 4, (3, 3), (2, 2), (1, 1), 4, false).unwrap(), &[2, 4, 8, 8]);
}

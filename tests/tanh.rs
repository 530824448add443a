//! `tanh` against f64 over a sweep that covers tiny, moderate and saturating inputs, with its
//! gradient against `1 - tanh^2`, on the CPU device and the reference interpreter.

use air::testing::{Tol, assert_close};
use kiln::{Device, Tensor};

#[test]
fn tanh_and_its_gradient_match_f64() {
    let mut xs: Vec<f32> = (-400..=400).map(|i| i as f32 * 0.05).collect();
    xs.extend([1e-30, -1e-30, 1e-6, -1e-6, 1e-3, -1e-3, 50.0, -50.0, 1e4, -1e4, f32::MAX, f32::MIN, 0.0]);
    xs.extend([f32::INFINITY, f32::NEG_INFINITY]);
    let want: Vec<f32> = xs.iter().map(|&x| (x as f64).tanh() as f32).collect();
    let want_grad: Vec<f32> = xs.iter().map(|&x| (1.0 - (x as f64).tanh().powi(2)) as f32).collect();
    for device in [Device::Cpu, Device::Interp] {
        let x = Tensor::from_vec(xs.clone(), &[xs.len()]).to_device(device).expect("move");
        let y = x.tanh();
        let grad = kiln::grad(&y.sum_all(), &[&x]).expect("grad");
        let got: Vec<f32> = y.to_vec().expect("tanh");
        // Absolute: `2 / (1 + e) - 1` loses relative accuracy near 0 but stays within 3e-7.
        assert_close(&format!("tanh on {device}"), &got, &want, Tol { atol: 3e-7, rtol: 0.0 });
        let got_grad: Vec<f32> = grad[0].to_vec().expect("grad");
        assert_close(&format!("tanh gradient on {device}"), &got_grad, &want_grad, Tol { atol: 1e-6, rtol: 0.0 });
        assert!(got.iter().all(|v| (-1.0..=1.0).contains(v)), "tanh out of [-1, 1] on {device}");
    }
}

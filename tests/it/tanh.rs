//! `tanh` and `sigmoid` against f64 over a sweep that covers tiny, moderate and saturating inputs,
//! with their gradients (`1 - tanh^2`, `s (1 - s)`), on the CPU device and the reference interpreter.

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

#[test]
fn sigmoid_and_its_gradient_match_f64_and_never_go_nan() {
    let mut xs: Vec<f32> = (-400..=400).map(|i| i as f32 * 0.05).collect();
    xs.extend([-87.0, -88.5, -89.0, -90.0, -100.0, -1e4, 100.0, 1e4, f32::MAX, f32::MIN, 0.0]);
    xs.extend([f32::INFINITY, f32::NEG_INFINITY]);
    let sig = |x: f32| 1.0 / (1.0 + (-(x as f64)).exp());
    let want: Vec<f32> = xs.iter().map(|&x| sig(x) as f32).collect();
    let want_grad: Vec<f32> = xs.iter().map(|&x| (sig(x) * (1.0 - sig(x))) as f32).collect();
    for device in [Device::Cpu, Device::Interp] {
        let x = Tensor::from_vec(xs.clone(), &[xs.len()]).to_device(device).expect("move");
        let y = x.sigmoid();
        let grad = kiln::grad(&y.sum_all(), &[&x]).expect("grad");
        let got: Vec<f32> = y.to_vec().expect("sigmoid");
        assert_close(&format!("sigmoid on {device}"), &got, &want, Tol { atol: 1e-7, rtol: 1e-6 });
        let got_grad: Vec<f32> = grad[0].to_vec().expect("grad");
        assert!(got_grad.iter().all(|g| g.is_finite()), "NaN or inf in the sigmoid gradient on {device}: {got_grad:?}");
        assert_close(&format!("sigmoid gradient on {device}"), &got_grad, &want_grad, Tol { atol: 1e-7, rtol: 1e-6 });
    }
}

#[test]
fn sigmoid_gradient_is_finite_in_f64_and_f16() {
    for dtype in [kiln::DType::F64, kiln::DType::F16] {
        let x = Tensor::from_vec(vec![-1e4f32, -800.0, -40.0, 0.0, 40.0], &[5]).cast(dtype);
        let grad = kiln::grad(&x.sigmoid().sum_all(), &[&x]).expect("grad");
        let got: Vec<f64> = grad[0].cast(kiln::DType::F64).to_vec().expect("grad");
        assert!(got.iter().all(|g| g.is_finite() && *g >= 0.0), "sigmoid gradient in {dtype:?}: {got:?}");
    }
}

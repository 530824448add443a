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

/// sigmoid far below zero: the value is a tiny non-negative number and the gradient is 0 or
/// tiny, never NaN (an uncapped `exp(-x)` overflowed to inf and its backward gave `0 * inf`), on
/// every device and in f32 and f64. Above zero it saturates to 1 with a zero gradient.
#[test]
fn sigmoid_and_its_gradient_stay_finite_far_from_zero() {
    for device in [kiln::Device::Cpu, kiln::Device::Interp] {
        for dtype in [kiln::DType::F32, kiln::DType::F64] {
            let xs = vec![-1000.0f32, -100.0, -90.0, -88.0, -20.0, 0.0, 20.0, 100.0, 1000.0];
            let x = kiln::Tensor::from_vec_on(xs.clone(), &[xs.len()], device).cast(dtype);
            let y = x.sigmoid();
            let g = kiln::grad(&y.sum(&[0], false), &[&x]).unwrap();
            kiln::realize(&[&y, &g[0]]).unwrap();
            let y = y.cast(kiln::DType::F64).to_vec::<f64>().unwrap();
            let g = g[0].cast(kiln::DType::F64).to_vec::<f64>().unwrap();
            for (i, &v) in xs.iter().enumerate() {
                let want = 1.0 / (1.0 + (-(v as f64)).exp());
                let dwant = want * (1.0 - want);
                assert!(y[i].is_finite() && g[i].is_finite(), "{device} {dtype} x={v}: {} {}", y[i], g[i]);
                assert!((y[i] - want).abs() <= 1e-6, "{device} {dtype} sigmoid({v}) = {} vs {want}", y[i]);
                assert!((g[i] - dwant).abs() <= 1e-6, "{device} {dtype} sigmoid'({v}) = {} vs {dwant}", g[i]);
            }
        }
    }
}

//! Choosing a device in code: every constructor's `_on` form (random ones included) puts its tensor on the device it is
//! given and the program runs there (the interpreter's and the CPU's run counters show which),
//! whatever `KILN_DEVICE` says; `Device::wgpu_if_available` returns a device that works; and a
//! build without the `wgpu` feature turns `Device::Wgpu` into an error, never a panic.
//!
//! With `KILN_REQUIRE_VULKAN=1` (CI, where lavapipe provides an adapter) `wgpu_if_available` must
//! pick the GPU.

use kiln::{DType, Device, HostTensor, Tensor};

/// Realizes `t` and returns its values as f64, with how many interpreter and native CPU runs that
/// took on this thread.
fn realize_counting(t: &Tensor) -> (Vec<f64>, u64, u64) {
    let (interp, cpu) = (kiln::stats::interp_runs(), kiln::stats::cpu_runs());
    let host = t.to_host().unwrap_or_else(|e| panic!("realize on {}: {e}", t.device()));
    (host.data.to_f64_vec(), kiln::stats::interp_runs() - interp, kiln::stats::cpu_runs() - cpu)
}

#[test]
fn zeros_on_the_interpreter_runs_on_the_interpreter() {
    let t = Tensor::zeros_on(&[2, 3], DType::F32, Device::Interp);
    assert_eq!(t.device(), Device::Interp);
    let y = &t + 1.5;
    assert_eq!(y.device(), Device::Interp, "ops stay on their inputs' device");
    let (values, interp, cpu) = realize_counting(&y);
    assert_eq!(values, vec![1.5; 6]);
    assert_eq!((interp, cpu), (1, 0), "one interpreter run and no native one");
}

#[test]
fn every_constructor_puts_its_tensor_on_the_device_it_is_given() {
    for device in [Device::Interp, Device::Cpu] {
        let host = HostTensor::from_vec(vec![7i32, 8], vec![2]).unwrap();
        let made: Vec<(&str, Tensor, Vec<f64>)> = vec![
            ("zeros_on", Tensor::zeros_on(&[3], DType::I32, device), vec![0.0; 3]),
            ("ones_on", Tensor::ones_on(&[2, 2], DType::F32, device), vec![1.0; 4]),
            ("full_on", Tensor::full_on(&[2], 2.5, DType::F64, device), vec![2.5, 2.5]),
            ("from_vec_on", Tensor::from_vec_on(vec![1.0f32, -2.0, 3.0], &[3], device), vec![1.0, -2.0, 3.0]),
            ("from_host_on", Tensor::from_host_on(host, device), vec![7.0, 8.0]),
            ("arange_on", Tensor::arange_on(1, 10, 3, device), vec![1.0, 4.0, 7.0]),
            ("arange_on (float)", Tensor::arange_on(0.0, 1.0, 0.5, device), vec![0.0, 0.5]),
        ];
        for (name, t, want) in made {
            assert_eq!(t.device(), device, "{name}");
            // Multiplying by one makes a program to run even for a tensor that holds data.
            let y = &t * 1;
            let (got, interp, cpu) = realize_counting(&y);
            assert_eq!(got, want, "{name} on {device}");
            let expected = if device == Device::Interp { (1, 0) } else { (0, 1) };
            assert_eq!((interp, cpu), expected, "{name} on {device}: (interpreter runs, native runs)");
        }
    }
}

#[test]
fn random_tensors_go_to_the_device_they_are_given_and_draw_the_same_values() {
    kiln::manual_seed(7);
    let plain: Vec<f32> = Tensor::rand(&[5]).to_vec().unwrap();
    let normal: Vec<f32> = Tensor::randn(&[3]).to_vec().unwrap();
    kiln::manual_seed(7);
    let u = Tensor::rand_on(&[5], Device::Interp);
    let n = Tensor::randn_on(&[3], Device::Interp);
    assert_eq!((u.device(), n.device()), (Device::Interp, Device::Interp));
    let (got, interp, cpu) = realize_counting(&(&u * 1.0));
    assert_eq!(got, plain.iter().map(|&x| f64::from(x)).collect::<Vec<_>>(), "the same draws as `rand`");
    assert_eq!((interp, cpu), (1, 0));
    assert_eq!(n.to_vec::<f32>().unwrap(), normal);
    let err = Tensor::rand_on(&[2, -1], Device::Cpu).realize().unwrap_err().to_string();
    assert!(err.starts_with("rand:"), "{err}");
}

#[test]
fn the_device_forms_keep_the_plain_forms_dtypes_and_errors() {
    let a = Tensor::arange_on(0, 4, 1, Device::Interp);
    assert_eq!(a.dtype(), DType::I64, "integer arange is i64, as without a device");
    assert_eq!(Tensor::arange_on(0.0, 2.0, 1.0, Device::Cpu).dtype(), DType::F32);
    let (bad, line) = (Tensor::zeros_on(&[2, -1], DType::F32, Device::Interp), line!());
    let err = bad.realize().unwrap_err().to_string();
    assert!(err.contains("negative dim"), "{err}");
    assert!(err.contains(&format!("device_select.rs:{line}")), "the error names the caller's line: {err}");
    let err = Tensor::from_vec_on(vec![1.0f32; 3], &[2, 2], Device::Cpu).realize().unwrap_err().to_string();
    assert!(err.contains("3 elements do not fill shape [2, 2]"), "{err}");
    let err = Tensor::arange_on(0, 4, 0, Device::Cpu).realize().unwrap_err().to_string();
    assert!(err.contains("invalid range"), "{err}");
}

#[test]
fn tensors_on_different_devices_do_not_mix() {
    let a = Tensor::ones_on(&[2], DType::F32, Device::Interp);
    let b = Tensor::ones_on(&[2], DType::F32, Device::Cpu);
    let err = (&a + &b).realize().unwrap_err().to_string();
    assert!(err.contains("device"), "{err}");
}

#[test]
fn wgpu_if_available_returns_a_working_device() {
    let device = Device::wgpu_if_available();
    assert_eq!(Device::wgpu_if_available(), device, "the probe is cached");
    assert!(matches!(device, Device::Wgpu | Device::Cpu), "{device}");
    assert_eq!(device == Device::Wgpu, Device::Wgpu.probe().is_ok(), "the pick agrees with the probe");
    if std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v.trim() == "1") && cfg!(feature = "wgpu") {
        assert_eq!(device, Device::Wgpu, "KILN_REQUIRE_VULKAN=1 but wgpu_if_available picked {device}");
    }
    let x = Tensor::from_vec_on(vec![1.0f32, -2.0, 3.0, 0.5], &[2, 2], device);
    let w = Tensor::full_on(&[2, 2], 2.0, DType::F32, device);
    let y = (x.matmul(&w) + Tensor::arange_on(0.0, 2.0, 1.0, device)).relu();
    assert_eq!(y.device(), device);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 7.0, 8.0], "on {device}");
}

#[test]
fn the_interpreter_and_the_cpu_are_always_available() {
    Device::Interp.probe().unwrap();
    Device::Cpu.probe().unwrap();
}

#[cfg(not(feature = "wgpu"))]
#[test]
fn without_the_wgpu_feature_the_gpu_is_an_error_not_a_panic() {
    let want = "wgpu support not compiled in (enable the kiln feature \"wgpu\")";
    assert_eq!(Device::wgpu_if_available(), Device::Cpu);
    assert!(!Device::ALL.contains(&Device::Wgpu));
    let err = Device::Wgpu.probe().unwrap_err().to_string();
    assert!(err.contains(want), "{err}");
    let t = Tensor::ones_on(&[2], DType::F32, Device::Wgpu) * 3.0;
    let err = t.realize().unwrap_err().to_string();
    assert!(err.contains(want), "{err}");
    // Moving data there is recorded, and fails the same way when the result is asked for.
    let moved = Tensor::from_vec(vec![1.0f32], &[1]).to_device(Device::Wgpu).unwrap();
    let err = (moved + 1.0).to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains(want), "{err}");
}

//! A `KILN_DEVICE` that names no device: the plain constructors carry that error to `realize`,
//! the `_on` forms never read it. Its own test binary with one test, so the variable is set before
//! anything in the process reads the default device.

use kiln::{DType, Device, Tensor};

#[test]
fn explicit_devices_ignore_a_bad_kiln_device() {
    // SAFETY: the only test of this binary sets the variable before any code reads it, and no
    // other thread runs yet.
    unsafe { std::env::set_var("KILN_DEVICE", "no-such-device") };
    let err = Tensor::zeros(&[2], DType::F32).realize().unwrap_err().to_string();
    assert!(err.contains("unknown device `no-such-device`"), "{err}");
    for device in [Device::Interp, Device::Cpu] {
        let t = Tensor::from_vec_on(vec![1.0f32, 2.0], &[2], device) + Tensor::ones_on(&[2], DType::F32, device);
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.0, 3.0], "on {device}");
    }
}

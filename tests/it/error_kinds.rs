//! Device failures keep their kind through the facade: `kiln::Error::Runtime` carries the
//! runtime's error, so callers match out of memory, unsupported, bad input, bounds and the rest
//! with `Error::kind()` instead of reading a message.

use kiln::{Device, Error, ErrorKind, RuntimeError, Tensor};

#[test]
fn a_data_dependent_index_error_is_a_bounds_error_on_the_cpu() {
    let x = Tensor::from_vec(vec![1.0f32, 2., 3., 4.], &[4]).to_device(Device::Cpu).unwrap();
    let idx = Tensor::from_vec(vec![0i32, 9], &[2]).to_device(Device::Cpu).unwrap();
    let e = x.gather(0, &idx).realize().unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::Bounds), "{e}");
    match &e {
        Error::Runtime { device: "cpu", error } => {
            assert!(matches!(**error, RuntimeError::Lower(lower::LowerError::Data(_))), "{e}");
            assert!(e.to_string().contains("index 9 out of range for size 4 in gather"), "{e}");
        }
        other => panic!("expected a runtime error of the cpu, got {other:?}"),
    }
    // Clones share the error and compare equal.
    assert_eq!(e.clone(), e);
}

#[test]
fn the_facade_s_own_errors_have_no_runtime_kind() {
    let a = Tensor::from_vec(vec![1.0f32, 2.], &[2]);
    let b = Tensor::from_vec(vec![1.0f32, 2., 3.], &[3]);
    let e = a.add(&b).realize().unwrap_err();
    assert!(matches!(e, Error::Op { .. }), "{e:?}");
    assert_eq!(e.kind(), None);
}

/// f64 runs on wgpu where the adapter has SHADER_F64 (lavapipe, NVIDIA; required under
/// `KILN_REQUIRE_VULKAN=1`), and is otherwise an `Unsupported` error naming the dtype.
#[test]
fn f64_on_wgpu_runs_or_is_unsupported() {
    let probe = Tensor::from_vec(vec![1.0f32], &[1]).to_device(Device::Wgpu).and_then(|t| {
        t.neg().realize()?;
        Ok(())
    });
    if let Err(e) = probe {
        let required = std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| v == "1");
        assert!(!required, "KILN_REQUIRE_GPU=1 but the wgpu device failed: {e}");
        eprintln!("skipping wgpu: no usable GPU adapter ({e})");
        return;
    }
    let x = Tensor::from_vec(vec![1.0f64, 2.], &[2]).to_device(Device::Wgpu).unwrap();
    let y = x.neg();
    match y.realize() {
        Ok(_) => assert_eq!(y.to_vec::<f64>().unwrap(), vec![-1.0, -2.0]),
        Err(e) => {
            assert!(!std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v.trim() == "1"), "{e}");
            assert_eq!(e.kind(), Some(ErrorKind::Unsupported), "{e}");
            assert!(matches!(e, Error::Runtime { device: "wgpu", .. }), "{e:?}");
            assert!(e.to_string().contains("f64"), "{e}");
        }
    }
}

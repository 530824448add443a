//! Every device reports the same failures with the same `RuntimeError` variant and `ErrorKind`:
//! a wrong input count or dtype (structured: what was expected, what was given), a shape
//! condition that fails for the bindings, a data-dependent index error, and (wgpu) an unsupported
//! dtype.

use crate::common;

use kiln_runtime as runtime;

use air::dim::shape_of;
use air::op::{Gather, Input};
use air::{Bindings, DType, Dim, Graph, HostTensor, Op, TensorType};
#[cfg(feature = "wgpu")]
use runtime::wgpu::WgpuDevice;
use runtime::{CpuDevice, ErrorKind, RuntimeError};

type Run<'a> = Box<dyn Fn(&Graph, &[HostTensor], &Bindings) -> runtime::Result<Vec<HostTensor>> + 'a>;

/// The devices to check: the CPU always, wgpu when an adapter works.
fn devices() -> Vec<(&'static str, Run<'static>)> {
    let cpu = CpuDevice::new().unwrap();
    #[allow(unused_mut)] // without the wgpu feature the CPU is the only device
    let mut out: Vec<(&'static str, Run<'static>)> = vec![("cpu", Box::new(move |g, x, b| cpu.run(g, x, b)))];
    #[cfg(feature = "wgpu")]
    match WgpuDevice::new() {
        Ok(gpu) => out.push(("wgpu", Box::new(move |g, x, b| gpu.run(g, x, b)))),
        Err(e) => {
            let required = std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v == "1");
            assert!(!required, "KILN_REQUIRE_VULKAN=1 but no wgpu device: {e}");
            eprintln!("skipping wgpu: {e}");
        }
    }
    out
}

fn f32s(n: usize) -> HostTensor {
    HostTensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), vec![n]).unwrap()
}

#[test]
fn bad_input_count_and_dtype_are_bad_inputs() {
    let g = common::window();
    for (name, run) in devices() {
        let e = run(&g, &[], &common::bind(4, 2)).unwrap_err();
        assert!(matches!(e, RuntimeError::InputCount { expected: 1, got: 0 }), "{name}: {e}");
        assert_eq!(e.kind(), ErrorKind::BadInput, "{name}");
        let ints = HostTensor::from_vec(vec![1i32; 4], vec![4]).unwrap();
        let e = run(&g, &[ints], &common::bind(4, 2)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadInput, "{name}");
        match e {
            RuntimeError::InputMismatch { slot: 0, declared, expected, got } => {
                assert_eq!(*declared, TensorType::new(DType::F32, vec![Dim::sym("n")]), "{name}");
                assert_eq!((expected.dtype, expected.shape, expected.numel), (DType::F32, vec![4], 4), "{name}");
                assert_eq!((got.dtype, got.shape, got.numel), (DType::I32, vec![4], 4), "{name}");
            }
            other => panic!("{name}: expected an input mismatch, got {other}"),
        }
        let e = run(&g, &[f32s(4)], &Bindings::new()).unwrap_err();
        assert!(matches!(&e, RuntimeError::Unbound(_)), "{name}: {e}");
        assert_eq!(e.kind(), ErrorKind::BadInput, "{name}");
        // The good run still works after the failures.
        assert_eq!(run(&g, &[f32s(4)], &common::bind(4, 2)).unwrap()[0].shape, vec![2], "{name}");
    }
}

#[test]
fn shape_conditions_and_bad_indices_are_bounds_errors() {
    let g = common::window();
    let mut gather = Graph::new();
    let src = gather.add_leaf(Op::Input(Input { slot: 0 }), TensorType::new(DType::F32, shape_of(&[4]))).unwrap();
    let index = gather.add_leaf(Op::Input(Input { slot: 1 }), TensorType::new(DType::I32, shape_of(&[2]))).unwrap();
    let y = gather.add(Op::Gather(Gather { axis: 0 }), &[src, index]).unwrap();
    gather.add_output(y);
    let bad = HostTensor::from_vec(vec![1i32, 9], vec![2]).unwrap();
    for (name, run) in devices() {
        let e = run(&g, &[f32s(4)], &common::bind(4, 9)).unwrap_err();
        assert!(matches!(e, RuntimeError::Bounds(_)), "{name}: {e}");
        assert_eq!(e.kind(), ErrorKind::Bounds, "{name}");
        let e = run(&gather, &[f32s(4), bad.clone()], &Bindings::new()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Bounds, "{name}: {e}");
        assert!(e.to_string().contains("index 9 out of range for size 4 in gather"), "{name}: {e}");
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn unsupported_dtypes_on_wgpu_are_unsupported() {
    let gpu = match WgpuDevice::new() {
        Ok(gpu) => gpu,
        Err(e) => {
            let required = std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v == "1");
            assert!(!required, "KILN_REQUIRE_VULKAN=1 but no wgpu device: {e}");
            return;
        }
    };
    // f16 registers (an f32 input negated in f16) are refused.
    let mut g = Graph::new();
    let x = g.add_leaf(Op::Input(Input { slot: 0 }), TensorType::new(DType::F32, shape_of(&[3]))).unwrap();
    let h = g.add(Op::Cast(air::op::Cast { to: DType::F16 }), &[x]).unwrap();
    let y = g.add(Op::Unary(air::UnaryOp::Neg), &[h]).unwrap();
    let z = g.add(Op::Cast(air::op::Cast { to: DType::F32 }), &[y]).unwrap();
    g.add_output(z);
    let x = HostTensor::from_vec(vec![1.0f32, 2., 3.], vec![3]).unwrap();
    let e = gpu.run(&g, &[x], &Bindings::new()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("f16"), "{e}");
    // f64 runs where the adapter has SHADER_F64, and is Unsupported, naming it, elsewhere.
    let mut g = Graph::new();
    let x = g.add_leaf(Op::Input(Input { slot: 0 }), TensorType::new(DType::F64, shape_of(&[3]))).unwrap();
    let y = g.add(Op::Unary(air::UnaryOp::Neg), &[x]).unwrap();
    g.add_output(y);
    let x = HostTensor::from_vec(vec![1.0f64, 2., 3.], vec![3]).unwrap();
    match gpu.run(&g, &[x], &Bindings::new()) {
        Ok(out) => {
            assert!(gpu.supports_f64());
            assert_eq!(out[0].data.to_f64_vec(), vec![-1.0, -2.0, -3.0]);
        }
        Err(e) => {
            assert!(!gpu.supports_f64(), "{e}");
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains("f64") && e.to_string().contains("SHADER_F64"), "{e}");
        }
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_failures_map_to_their_kinds() {
    use runtime::wgpu::WgpuError;
    let kinds = [
        (WgpuError::OutOfMemory("arena".into()), ErrorKind::OutOfMemory),
        (WgpuError::DeviceLost("reset".into()), ErrorKind::DeviceLost),
        (WgpuError::NoAdapter("none".into()), ErrorKind::Device),
        (WgpuError::Device("validation".into()), ErrorKind::Device),
        (WgpuError::Codegen(codegen::CodegenError::Unsupported("f64".into())), ErrorKind::Unsupported),
    ];
    for (e, kind) in kinds {
        let message = e.to_string();
        let e = RuntimeError::from(e);
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.to_string().contains(message.split(": ").last().unwrap()), "{e} vs {message}");
    }
    let oom = RuntimeError::Alloc { bytes: 1 << 40, what: "the arena" };
    assert_eq!(oom.kind(), ErrorKind::OutOfMemory);
}

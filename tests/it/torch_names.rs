//! PyTorch's names and bool semantics on the facade: `amax`/`amin`, `+ * - /` and unary `-` on
//! bools, the logical and bitwise ops with their operators, and `where_cond`. Expected values are
//! PyTorch 2.x outputs for the same inputs (written next to each check), on `cpu`, `interp` and
//! `wgpu` where an adapter exists (`i64` results on `cpu` and `interp` only: `wgpu` has no 64-bit
//! integers yet).

#[allow(dead_code)] // `data_ptr` is for other tests.
use crate::support;

use kiln::{Device, Error, Tensor, where_cond};

/// Whether `device` runs `i64` programs.
fn has_i64(device: Device) -> bool {
    device != Device::Wgpu
}

fn on(device: Device, t: Tensor) -> Tensor {
    t.to_device(device).expect("move to device")
}

/// The `(op, message, file, line)` of an `Error::Op`.
fn op_error(e: &Error) -> (&'static str, &str, &'static str, u32) {
    match e {
        Error::Op { op, message, location } => (op, message.as_str(), location.file(), location.line()),
        other => panic!("expected an op error, got {other:?}"),
    }
}

#[test]
fn amax_and_amin_are_max_and_min_under_pytorchs_names() {
    for device in support::devices() {
        let x = on(device, Tensor::from_vec(vec![1.0f32, 5.0, 2.0, 7.0, 0.0, 7.0], &[2, 3]));
        // torch.amax(x, 1) = [5, 7]; torch.amin(x, 0, keepdim=True) = [[1, 0, 2]];
        // torch.amax(x, (0, 1)) = 7.
        assert_eq!(x.amax(1).to_vec::<f32>().unwrap(), [5.0, 7.0]);
        let kept = x.amin_keepdim(0);
        assert_eq!(kept.dims().unwrap(), [1, 3]);
        assert_eq!(kept.to_vec::<f32>().unwrap(), [1.0, 0.0, 2.0]);
        assert_eq!(x.amax(&[0, 1]).item::<f32>().unwrap(), 7.0);
        assert_eq!(x.amax(-1).to_vec::<f32>().unwrap(), x.max(-1).to_vec::<f32>().unwrap());
        assert_eq!(x.amin_keepdim(&[0, 1]).to_vec::<f32>().unwrap(), x.min_keepdim(&[0, 1]).to_vec::<f32>().unwrap());
        let ints = on(device, Tensor::from_vec(vec![3i32, -4, 9, 2], &[2, 2]));
        assert_eq!(ints.amin(1).to_vec::<i32>().unwrap(), [-4, 2]);
    }
    // Tied maxima share the gradient evenly, like torch.amax: x.grad = [0, 0.5, 0, 0.5].
    let x = Tensor::from_vec(vec![1.0f32, 7.0, 2.0, 7.0], &[4]);
    let g = kiln::grad(&x.amax(0), &[&x]).unwrap();
    assert_eq!(g[0].to_vec::<f32>().unwrap(), [0.0, 0.5, 0.0, 0.5]);

    let (bad, line) = (Tensor::zeros(&[2, 0], kiln::DType::F32).amin(1), line!());
    let e = bad.to_vec::<f32>().unwrap_err();
    let (op, message, file, at) = op_error(&e);
    assert_eq!((op, file, at), ("amin", file!(), line));
    assert!(message.contains("cannot reduce over an empty axis"), "{message}");
}

#[test]
fn arithmetic_on_bools_is_logical_as_in_pytorch() {
    for device in support::devices() {
        let a = on(device, Tensor::from_vec(vec![true, true, false, false], &[4]));
        let b = on(device, Tensor::from_vec(vec![true, false, true, false], &[4]));
        // a + b = [T, T, T, F] (or); a * b = [T, F, F, F] (and); both stay bool.
        let or = &a + &b;
        assert_eq!(or.dtype(), kiln::DType::Bool);
        assert_eq!(or.to_vec::<bool>().unwrap(), [true, true, true, false]);
        assert_eq!((&a * &b).to_vec::<bool>().unwrap(), [true, false, false, false]);
        // a + True = all True; a * False = all False (a Python bool scalar stays bool).
        assert_eq!((&a + true).to_vec::<bool>().unwrap(), [true; 4]);
        assert_eq!(a.mul(false).to_vec::<bool>().unwrap(), [false; 4]);
        // a + 1 = [2, 2, 1, 1] (i64); a * 2 = [2, 2, 0, 0]; a + 0.5 = [1.5, 1.5, 0.5, 0.5].
        if has_i64(device) {
            assert_eq!((&a + 1).to_vec::<i64>().unwrap(), [2, 2, 1, 1]);
            assert_eq!((&a * 2).to_vec::<i64>().unwrap(), [2, 2, 0, 0]);
        }
        assert_eq!((&a + 0.5).to_vec::<f32>().unwrap(), [1.5, 1.5, 0.5, 0.5]);
        // a / b = [1, inf, 0, nan] (true division in f32).
        let q = (&a / &b).to_vec::<f32>().unwrap();
        assert_eq!(&q[..3], [1.0, f32::INFINITY, 0.0]);
        assert!(q[3].is_nan());
        // maximum / minimum of bools are or / and.
        assert_eq!(a.maximum(&b).to_vec::<bool>().unwrap(), [true, true, true, false]);
        assert_eq!(a.minimum(&b).to_vec::<bool>().unwrap(), [true, false, false, false]);
    }
}

#[test]
fn subtracting_or_negating_bools_is_an_error_at_the_callers_line() {
    let a = Tensor::from_vec(vec![true, false], &[2]);
    let (diff, line) = (&a - &a, line!());
    let e = diff.to_vec::<bool>().unwrap_err();
    let (op, message, file, at) = op_error(&e);
    assert_eq!((op, file, at), ("sub", file!(), line));
    assert!(message.contains("subtracting two bool tensors is not supported") && message.contains("logical_xor"));
    let (diff, line) = (a.sub(true), line!());
    assert_eq!(op_error(diff.error().unwrap()).3, line);

    let (neg, line) = (-&a, line!());
    let (op, message, file, at) = op_error(neg.error().unwrap());
    assert_eq!((op, file, at), ("neg", file!(), line));
    assert!(message.contains("negating a bool tensor is not supported") && message.contains("logical_not"));
}

#[test]
fn logical_and_bitwise_ops_and_their_operators() {
    for device in support::devices() {
        let a = on(device, Tensor::from_vec(vec![true, true, false, false], &[4]));
        let b = on(device, Tensor::from_vec(vec![true, false, true, false], &[4]));
        // torch.logical_xor(a, b) = a ^ b = [F, T, T, F]; a & b = [T, F, F, F];
        // a | b = [T, T, T, F]; ~a = [F, F, T, T].
        assert_eq!(a.logical_xor(&b).to_vec::<bool>().unwrap(), [false, true, true, false]);
        assert_eq!((&a ^ &b).to_vec::<bool>().unwrap(), [false, true, true, false]);
        assert_eq!((&a & &b).to_vec::<bool>().unwrap(), [true, false, false, false]);
        assert_eq!((&a | &b).to_vec::<bool>().unwrap(), [true, true, true, false]);
        assert_eq!((!&a).to_vec::<bool>().unwrap(), [false, false, true, true]);
        // logical_xor reads numbers as `x != 0`: [0.5, 0, -2, 0] xor [1, 1, 0, 0] = [F, T, T, F].
        let f = on(device, Tensor::from_vec(vec![0.5f32, 0.0, -2.0, 0.0], &[4]));
        let i = on(device, Tensor::from_vec(vec![1i32, 1, 0, 0], &[4]));
        assert_eq!(f.logical_xor(&i).to_vec::<bool>().unwrap(), [false, true, true, false]);

        // On integers the ops are bitwise: i = [5, -3, 0, 12], j = [3, 6, -1, 10] give
        // i & j = [1, 4, 0, 8], i | j = [7, -1, -1, 14], i ^ j = [6, -5, -1, 6], ~i = [-6, 2, -1, -13].
        let i = on(device, Tensor::from_vec(vec![5i32, -3, 0, 12], &[4]));
        let j = on(device, Tensor::from_vec(vec![3i32, 6, -1, 10], &[4]));
        assert_eq!((&i & &j).to_vec::<i32>().unwrap(), [1, 4, 0, 8]);
        assert_eq!((&i | &j).to_vec::<i32>().unwrap(), [7, -1, -1, 14]);
        assert_eq!(i.bitwise_xor(&j).to_vec::<i32>().unwrap(), [6, -5, -1, 6]);
        assert_eq!((!&i).to_vec::<i32>().unwrap(), [-6, 2, -1, -13]);
        assert_eq!((&i & 6).to_vec::<i32>().unwrap(), [4, 4, 0, 4]);
        if has_i64(device) {
            let wide = i.cast(kiln::DType::I64).mul(1i64 << 33);
            // (i << 33) ^ (j << 33) = (i ^ j) << 33: the high word is combined too.
            let want: Vec<i64> = [6i64, -5, -1, 6].iter().map(|v| v << 33).collect();
            assert_eq!((&wide ^ &j.cast(kiln::DType::I64).mul(1i64 << 33)).to_vec::<i64>().unwrap(), want);
        }
    }
    // Floats have no bits to combine, as in PyTorch.
    let f = Tensor::from_vec(vec![1.0f32], &[1]);
    let (bad, line) = (&f & &f, line!());
    let (op, message, file, at) = op_error(bad.error().unwrap());
    assert_eq!((op, file, at), ("bitwise_and", file!(), line));
    assert!(message.contains("needs bool or integer tensors, got f32"), "{message}");
    let (bad, line) = (!&f, line!());
    assert_eq!(op_error(bad.error().unwrap()).0, "bitwise_not");
    assert_eq!(op_error(bad.error().unwrap()).3, line);
}

#[test]
#[allow(deprecated)]
fn where_cond_is_torch_where_and_where_underscore_is_the_same() {
    for device in support::devices() {
        let cond = on(device, Tensor::from_vec(vec![true, false, true], &[3]));
        let a = on(device, Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]));
        let b = on(device, Tensor::from_vec(vec![-1.0f32, -2.0, -3.0], &[3]));
        // torch.where(cond, a, b) = [1, -2, 3]; torch.where(cond, a, 0.0) = [1, 0, 3].
        assert_eq!(cond.where_cond(&a, &b).to_vec::<f32>().unwrap(), [1.0, -2.0, 3.0]);
        assert_eq!(where_cond(&cond, &a, 0.0).to_vec::<f32>().unwrap(), [1.0, 0.0, 3.0]);
        assert_eq!(kiln::where_(&cond, &a, &b).to_vec::<f32>().unwrap(), [1.0, -2.0, 3.0]);
        assert_eq!(cond.where_(&a, &b).to_vec::<f32>().unwrap(), [1.0, -2.0, 3.0]);
    }
    let a = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    let (bad, line) = (where_cond(&a, &a, &a), line!());
    let (op, message, file, at) = op_error(bad.error().unwrap());
    assert_eq!((op, file, at), ("where", file!(), line));
    assert_eq!(message, "condition must be bool, got f32");
}

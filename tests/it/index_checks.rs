//! Data-dependent errors as PyTorch raises them, on every device: an index out of range in
//! `gather`/`index_select`, and an integer remainder by zero, make the realize fail with a message
//! naming the op and the value (they used to read 0). Also the values and gradient of `gather`.
//!
//! The wgpu device is skipped with a printed reason when this machine has no GPU adapter, unless
//! `KILN_REQUIRE_GPU=1`. Indices are `i32` or `i64` on every device (wgpu emulates `i64`).

use kiln::{Device, Tensor};

/// The devices to test: interp and cpu always, wgpu when an adapter works.
fn devices() -> Vec<Device> {
    let mut out = vec![Device::Interp, Device::Cpu];
    let probe = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).to_device(Device::Wgpu).and_then(|t| {
        t.neg().realize()?;
        Ok(())
    });
    match probe {
        Ok(()) => out.push(Device::Wgpu),
        Err(e) => {
            let required = std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "KILN_REQUIRE_GPU=1 but the wgpu device failed: {e}");
            eprintln!("skipping wgpu: no usable GPU adapter ({e})");
        }
    }
    out
}

fn on<T: kiln::Element>(device: Device, data: Vec<T>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(data, shape).to_device(device).expect("move to device")
}

/// Realizing `t` fails with a message containing `expected`.
#[track_caller]
fn fails_with(t: &Tensor, device: Device, expected: &str) {
    match t.realize() {
        Ok(_) => panic!("{device}: expected an error containing {expected:?}, got {:?}", t.to_vec::<f32>()),
        Err(e) => assert!(e.to_string().contains(expected), "{device}: `{e}` should contain `{expected}`"),
    }
}

#[test]
fn gather_reads_the_indexed_elements() {
    for device in devices() {
        let x = on(device, vec![1.0f32, 2., 3., 4., 5., 6.], &[2, 3]);
        let idx = on(device, vec![2i32, 0, 1, 1], &[2, 2]);
        assert_eq!(x.gather(1, &idx).to_vec::<f32>().unwrap(), vec![3., 1., 5., 5.], "{device}");
        let rows = on(device, vec![1i32, 0, 1], &[1, 3]);
        assert_eq!(x.gather(0, &rows).to_vec::<f32>().unwrap(), vec![4., 2., 6.], "{device}");
        let ids = on(device, vec![2i32, 2, 0], &[3]);
        assert_eq!(x.index_select(1, &ids).to_vec::<f32>().unwrap(), vec![3., 3., 1., 6., 6., 4.], "{device}");
    }
}

#[test]
fn gather_out_of_range_is_an_error() {
    for device in devices() {
        let x = on(device, vec![1.0f32, 2., 3., 4., 5., 6., 7., 8.], &[2, 4]);
        let too_big = on(device, vec![7i32, 0, 1, 2], &[2, 2]);
        fails_with(&x.gather(1, &too_big), device, "index 7 out of range for size 4 in gather");
        // PyTorch's gather rejects negative indices too.
        let negative = on(device, vec![0i32, -1, 1, 2], &[2, 2]);
        fails_with(&x.gather(1, &negative), device, "index -1 out of range for size 4 in gather");
        // The error survives fusion into a consumer, and a good index still works afterwards.
        fails_with(&x.gather(1, &too_big).exp().sum_all(), device, "index 7 out of range");
        let good = on(device, vec![3i32, 0, 1, 2], &[2, 2]);
        assert_eq!(x.gather(1, &good).to_vec::<f32>().unwrap(), vec![4., 1., 6., 7.], "{device}");
    }
}

#[test]
fn index_select_out_of_range_is_an_error() {
    for device in devices() {
        let table = on(device, (0..12).map(|i| i as f32).collect(), &[4, 3]);
        fails_with(&table.index_select(0, &on(device, vec![1i32, 4], &[2])), device, "index 4 out of range for size 4");
        fails_with(&table.index_select(0, &on(device, vec![-1i32], &[1])), device, "index -1 out of range for size 4");
    }
}

#[test]
fn an_index_into_an_empty_axis_reads_nothing() {
    // Every index is out of range for an axis of size 0, and the source has no element at all:
    // the failing read must not fall back to one (the CPU kernel read `buf[base]` of an empty
    // buffer and crashed, found by `fuzz_ops`). Several dtypes and ops, many times over (a
    // crash depended on where the empty buffer pointed).
    for device in devices() {
        for _ in 0..20 {
            let empty = on(device, Vec::<f32>::new(), &[1, 0, 3]);
            fails_with(&empty.index_select(1, &on(device, vec![0i64], &[1])), device, "out of range for size 0");
            // wgpu stores no f16.
            if device != Device::Wgpu {
                let half = empty.to_dtype(kiln::DType::F16);
                fails_with(&half.index_select(1, &on(device, vec![2i32, 0], &[2])), device, "out of range for size 0");
            }
            let idx = on(device, vec![0i32; 3], &[1, 1, 3]);
            fails_with(&empty.gather(1, &idx), device, "out of range for size 0");
        }
    }
}

#[test]
fn i64_indices_work_on_every_device() {
    for device in devices() {
        let x = on(device, vec![1.0f32, 2., 3.], &[3]);
        let idx = on(device, vec![2i64, 0], &[2]);
        assert_eq!(x.index_select(0, &idx).to_vec::<f32>().unwrap(), vec![3., 1.], "{device}");
        let m = on(device, vec![1.0f32, 2., 3., 4., 5., 6.], &[2, 3]);
        let idx = on(device, vec![2i64, 0, 1, 1], &[2, 2]);
        assert_eq!(m.gather(1, &idx).to_vec::<f32>().unwrap(), vec![3., 1., 5., 5.], "{device}");
        // Out of range: negative, and past 2^32, whose low 32 bits alone (1) would be in range.
        let wide = (1i64 << 32) + 1;
        fails_with(&x.index_select(0, &on(device, vec![0i64, -3], &[2])), device, "index -3 out of range for size 3");
        fails_with(
            &x.index_select(0, &on(device, vec![wide], &[1])),
            device,
            &format!("index {wide} out of range for size 3"),
        );
    }
}

#[test]
fn argmax_and_i64_arithmetic_agree_on_every_device() {
    let values = vec![0.5f32, 3.0, -1.0, 3.0, 7.0, 2.0, -4.0, -4.5, 0.0, 1.0, 1.0, 0.25];
    for device in devices() {
        let x = on(device, values.clone(), &[3, 4]);
        assert_eq!(x.argmax(1).to_vec::<i64>().unwrap(), vec![1, 0, 1], "{device}: argmax rows");
        assert_eq!(x.argmax(0).to_vec::<i64>().unwrap(), vec![1, 0, 2, 0], "{device}: argmax columns");
        assert_eq!(x.argmax_all().to_vec::<i64>().unwrap(), vec![4], "{device}: argmax_all");
        // i64 values outside the i32 range are held exactly, and a product that overflows i64
        // wraps as on the CPU (and in PyTorch).
        let big = on(device, vec![i64::MAX, 1 << 40, -(1 << 35) - 7, i64::MIN], &[4]);
        let by = on(device, vec![3i64, 1 << 30, 5_000_000_007, -1], &[4]);
        let want = vec![
            i64::MAX.wrapping_mul(3),
            (1i64 << 40).wrapping_mul(1 << 30),
            (-(1i64 << 35) - 7).wrapping_mul(5_000_000_007),
            i64::MIN.wrapping_mul(-1),
        ];
        assert_eq!(big.mul(&by).to_vec::<i64>().unwrap(), want, "{device}: i64 mul");
        assert_eq!(big.add(&by).to_vec::<i64>().unwrap()[0], i64::MAX.wrapping_add(3), "{device}: i64 add");
        assert_eq!(
            big.cast(kiln::DType::F32).to_vec::<f32>().unwrap(),
            vec![i64::MAX as f32, (1i64 << 40) as f32, (-(1i64 << 35) - 7) as f32, i64::MIN as f32],
            "{device}: i64 to f32"
        );
    }
}

#[test]
fn integer_remainder_by_zero_is_an_error() {
    for device in devices() {
        let a = on(device, vec![7i32, -7, 9], &[3]);
        let b = on(device, vec![2i32, 0, 4], &[3]);
        fails_with(&a.remainder(&b), device, "integer division by zero in mod");
        fails_with(&a.fmod(&b), device, "integer division by zero in mod");
        let ok = on(device, vec![2i32, 3, -4], &[3]);
        assert_eq!(a.remainder(&ok).to_vec::<i32>().unwrap(), vec![1, 2, -3], "{device}");
        // Float division by zero stays IEEE.
        let x = on(device, vec![1.0f32, -1.0], &[2]);
        let zero = on(device, vec![0.0f32, 0.0], &[2]);
        assert_eq!(x.div(&zero).to_vec::<f32>().unwrap(), vec![f32::INFINITY, f32::NEG_INFINITY], "{device}");
    }
}

#[test]
fn gather_gradient_is_a_scatter_add() {
    // PyTorch: x = [[1,2,3],[4,5,6]], (gather(x, 1, [[0,0],[2,1]]) * [[1,2],[3,4]]).sum().backward()
    // gives x.grad = [[3,0,0],[0,4,3]].
    for device in devices() {
        let x = on(device, vec![1.0f32, 2., 3., 4., 5., 6.], &[2, 3]);
        let idx = on(device, vec![0i32, 0, 2, 1], &[2, 2]);
        let c = on(device, vec![1.0f32, 2., 3., 4.], &[2, 2]);
        let loss = x.gather(1, &idx).mul(&c).sum_all();
        let g = kiln::grad(&loss, &[&x]).unwrap();
        assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![3., 0., 0., 0., 4., 3.], "{device}");
        // An index smaller than the source off the axis: the gradient is padded with zeros.
        let small = on(device, vec![1i32, 1], &[1, 2]);
        let g = kiln::grad(&x.gather(0, &small).sum_all(), &[&x]).unwrap();
        assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![0., 0., 0., 1., 1., 0.], "{device}");
    }
}

#[test]
fn gather_gradient_matches_finite_differences() {
    let data: Vec<f64> = (0..12).map(|i| (i as f64 * 0.37).sin()).collect();
    let idx = Tensor::from_vec(vec![3i32, 0, 0, 2, 1, 3, 3, 3], &[2, 4]);
    let f = |d: &[f64]| -> f64 {
        let x = Tensor::from_vec(d.to_vec(), &[3, 4]);
        x.gather(1, &idx.narrow(0, 0, 2)).exp().sum_all().item::<f64>().unwrap()
    };
    let x = Tensor::from_vec(data.clone(), &[3, 4]);
    let loss = x.gather(1, &idx.narrow(0, 0, 2)).exp().sum_all();
    let g = kiln::grad(&loss, &[&x]).unwrap()[0].to_vec::<f64>().unwrap();
    for i in 0..data.len() {
        let (mut up, mut down) = (data.clone(), data.clone());
        up[i] += 1e-6;
        down[i] -= 1e-6;
        let fd = (f(&up) - f(&down)) / 2e-6;
        assert!((fd - g[i]).abs() < 1e-6, "element {i}: finite difference {fd}, gradient {}", g[i]);
    }
}

//! Shapes too large to count or to allocate are errors on every device, never a wrapped-around
//! element count and never an abort (issue #10): ops with such concrete shapes give error tensors,
//! symbolic ones fail at realize, and sizes that count fine but cannot be allocated are an
//! out-of-memory `Err` while the process carries on.
//!
//! The wgpu cases skip with a printed reason when no adapter is usable, unless
//! `KILN_REQUIRE_VULKAN=1`.

use air::{DType, Dim, HostTensor};
use kiln::{Device, Tensor};

const HUGE: usize = 1 << 32;

/// The devices to check: interp and cpu always, wgpu when an adapter works.
fn devices() -> Vec<Device> {
    let mut devices = vec![Device::Interp, Device::Cpu];
    let probe = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).to_device(Device::Wgpu).expect("source tensor");
    match probe.neg().realize() {
        Ok(_) => devices.push(Device::Wgpu),
        Err(e) => {
            let required = std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v.trim() == "1");
            assert!(!required, "KILN_REQUIRE_VULKAN=1 but the wgpu device failed: {e}");
            eprintln!("skipping wgpu: no usable GPU adapter ({e})");
        }
    }
    devices
}

fn on(device: Device, t: Tensor) -> Tensor {
    t.to_device(device).expect("move to device")
}

/// `t` is an error tensor whose message names `op` and contains `needle`; realizing it and
/// asking its element count give that error back.
#[track_caller]
fn assert_size_error(t: &Tensor, op: &str, needle: &str) {
    let e = t.error().unwrap_or_else(|| panic!("expected an error tensor for {op}, got {t:?}")).to_string();
    assert!(e.starts_with(&format!("{op}: ")) && e.contains(needle), "{e}");
    assert!(e.contains("tests/it/sizes.rs"), "the error names the caller's line: {e}");
    assert_eq!(t.numel().unwrap_err().to_string(), e);
    assert_eq!(t.sum_all().to_vec::<f32>().unwrap_err().to_string(), e);
}

#[test]
fn overflowing_shapes_are_error_tensors_on_every_device() {
    let overflow = "[4294967296, 4294967296]";
    for device in devices() {
        let one = on(device, Tensor::from_vec(vec![1.0f32], &[1, 1]));
        assert_size_error(&Tensor::ones(&[HUGE, HUGE], DType::F32), "full", overflow);
        assert_size_error(&Tensor::zeros(&[HUGE, HUGE], DType::I32), "full", overflow);
        assert_size_error(&one.full_like(2.0).expand(&[HUGE, HUGE]), "expand", overflow);
        assert_size_error(&one.expand(&[1usize << 40, 1 << 40]), "expand", "overflows");
        // Broadcasting two views that are fine alone.
        let column = one.expand(&[HUGE, 1]);
        let row = one.expand(&[1, HUGE]);
        assert_eq!(column.numel().unwrap(), Dim::Const(HUGE as i64));
        assert_size_error(&column.add(&row), "add", overflow);
        // A count that fits in i64 but whose bytes no allocation can hold.
        assert_size_error(&one.expand(&[1usize << 31, 1 << 31]), "expand", "more than any allocation");
        assert_size_error(&one.reshape(&[1, 1, 1]).expand(&[HUGE, HUGE, 1]), "expand", "overflows");
        // Matmul broadcasts its operands against each other before reducing.
        let a = one.expand(&[HUGE, HUGE >> 4]);
        let b = one.expand(&[HUGE >> 4, HUGE]);
        assert!(a.error().is_none() && b.error().is_none(), "{a:?} {b:?}");
        assert_size_error(&a.matmul(&b), "matmul", "overflows");
        // Creation from data and from a range.
        assert_size_error(&Tensor::from_vec(vec![1.0f32], &[HUGE, HUGE]), "from_vec", overflow);
        assert_size_error(&Tensor::arange(0, i64::MAX, 1), "arange", "more than any allocation");
        assert_size_error(&Tensor::arange(i64::MIN, i64::MAX, 1), "arange", "past i64");
        assert_size_error(&Tensor::rand(&[HUGE, HUGE]), "rand", overflow);
        assert_size_error(&Tensor::randn(&[HUGE, HUGE]), "randn", overflow);
    }
}

#[test]
fn symbolic_shapes_that_overflow_fail_at_realize() {
    for device in devices() {
        let host = HostTensor::from_vec(vec![1.0f32, 2.0], vec![2, 1]).unwrap();
        let x = on(device, Tensor::from_host_symbolic(host, vec![Dim::sym("n"), Dim::from(1)]));
        // n * 2^62 counts fine as a polynomial; with n = 2 it is 2^63, past i64.
        let y = x.expand(vec![Dim::sym("n"), Dim::from(1i64 << 62)]);
        assert!(y.error().is_none(), "{y:?}");
        assert_eq!(y.numel().unwrap(), Dim::sym("n") * (1i64 << 62));
        let e = y.to_vec::<f32>().expect_err("2^63 elements").to_string();
        // wgpu refuses the 2^62 index constant of its kernel first (its indices are i32).
        let named = ["overflow", "too large", "too many", "do not fit", "does not fit in i32"];
        assert!(named.iter().any(|n| e.contains(n)), "{device}: {e}");
        // The same program with a small value still runs: the error was about the values.
        let host = HostTensor::from_vec(vec![3.0f32], vec![1, 1]).unwrap();
        let z = on(device, Tensor::from_host_symbolic(host, vec![Dim::sym("n"), Dim::from(1)]));
        let z = z.expand(vec![Dim::sym("n"), Dim::from(3)]);
        assert_eq!(z.to_vec::<f32>().unwrap(), vec![3.0; 3], "{device}");
    }
}

#[test]
fn unallocatable_sizes_are_out_of_memory_errors() {
    // 2^40 f32 elements count fine (4 TiB) but no machine here can allocate them.
    let ones = Tensor::ones(&[1usize << 40], DType::F32);
    assert_eq!(ones.numel().unwrap(), Dim::Const(1 << 40));
    let e = ones.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains("out of memory"), "{e}");
    let e = Tensor::rand(&[1usize << 40]).check().unwrap_err().to_string();
    assert!(e.starts_with("rand: out of memory") && e.contains("1099511627776"), "{e}");
    let e = Tensor::randn_seeded(&[1usize << 40], 7).check().unwrap_err().to_string();
    assert!(e.starts_with("randn: out of memory"), "{e}");
    for device in devices() {
        let big = on(device, Tensor::from_vec(vec![1.0f32], &[1])).expand(&[1usize << 40]);
        assert!(big.error().is_none(), "{big:?}");
        // wgpu refuses the kernel's 2^40 index constant first (its indices are i32).
        let refused = |e: &str| e.contains("out of memory") || e.contains("does not fit in i32 on wgpu");
        let e = big.to_vec::<f32>().expect_err("4 TiB").to_string();
        assert!(refused(&e), "{device}: {e}");
        let e = big.neg().to_vec::<f32>().expect_err("4 TiB").to_string();
        assert!(refused(&e), "{device}: {e}");
        // The process (and the device) carry on.
        let small = on(device, Tensor::from_vec(vec![1.0f32, 2.0], &[2]));
        assert_eq!(small.neg().to_vec::<f32>().unwrap(), vec![-1.0, -2.0], "{device}");
    }
}

//! The same facade programs realized on every device agree with the reference interpreter.
//!
//! The wgpu device is skipped with a printed reason when this machine has no GPU adapter, unless
//! `KILN_REQUIRE_VULKAN=1` (CI sets it), which turns a missing adapter into a failure.

use kiln::{Device, Tensor};

/// Builds a few f32 programs (fusion, reductions, views, matmul) from the same seeded data.
fn programs(device: Device) -> Vec<(&'static str, Tensor)> {
    let on = |t: Tensor| t.to_device(device).expect("move to device");
    let x = on(Tensor::randn_seeded(&[4, 6], 1));
    let w = on(Tensor::randn_seeded(&[6, 5], 2));
    let b = on(Tensor::randn_seeded(&[5], 3));
    let seq = on(Tensor::randn_seeded(&[2, 3, 8], 4));
    let mean = seq.mean_keepdim(-1);
    let centered = &seq - &mean;
    let var = (&centered * &centered).mean_keepdim(-1);
    vec![
        ("sigmoid-chain", x.neg().exp().sigmoid()),
        ("sum-all", x.neg().exp().sigmoid().sum_all()),
        ("softmax", x.softmax(-1)),
        ("log-softmax-dim0", x.log_softmax(0)),
        ("linear-gelu", (x.matmul(&w) + &b).gelu()),
        ("transposed-matmul", x.transpose(0, 1).matmul(&x)),
        ("layernorm", &centered * (&var + 1e-5).rsqrt()),
        ("views", x.reshape(&[2, 12]).permute(&[1, 0]).narrow(0, 3, 5).pad(&[(1, 2), (0, 1)], 0.5)),
        ("batched", seq.matmul(&seq.transpose(1, 2)).max(-1)),
    ]
}

fn gpu_required() -> bool {
    std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v == "1")
}

fn check_device(device: Device) {
    let want = programs(Device::Interp);
    let got = programs(device);
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        let w: Vec<f32> = w.to_vec().unwrap_or_else(|e| panic!("{name} on interp: {e}"));
        let g: Vec<f32> = g.to_vec().unwrap_or_else(|e| panic!("{name} on {device}: {e}"));
        air::testing::assert_close(&format!("{name} on {device} vs interp"), &g, &w, air::testing::Tol::both(1e-4));
    }
}

#[test]
fn cpu_matches_interpreter() {
    check_device(Device::Cpu);
}

#[test]
fn wgpu_matches_interpreter() {
    let probe = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).to_device(Device::Wgpu).expect("source tensor");
    if let Err(e) = probe.neg().realize() {
        assert!(!gpu_required(), "KILN_REQUIRE_VULKAN=1 but the wgpu device failed: {e}");
        eprintln!("skipping wgpu_matches_interpreter: no usable GPU adapter ({e})");
        return;
    }
    check_device(Device::Wgpu);
}

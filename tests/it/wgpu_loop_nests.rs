//! A loop kernel whose parallel loop is short (a symbolic batch of 1) runs its nested loops
//! spread over the GPU's invocations, not in one: lavapipe (the CI's Vulkan) ends an
//! invocation's loops after 65,535 iterations without an error, so a nest left to one
//! invocation gave silently wrong results past that point.

use kiln::{Device, Dim, Tensor};

/// `[g, m, k] @ [n, g, k, o]` with `n` symbolic (bound to 1): lowering cannot give the broadcast
/// operand one batch stride, so it is a loop kernel over `n` with the `g, m, o` loops and the
/// `k`-long reduction nested inside, 1,312 outputs of 128 multiply-adds each.
fn batched(device: Device) -> kiln::Result<Vec<f32>> {
    let (g, m, k, o) = (4usize, 8usize, 128usize, 41usize);
    let b = Tensor::from_vec((0..g * k * o).map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0).collect(), &[1, g, k, o])
        .with_dims(vec![Dim::sym("n"), Dim::from(g), Dim::from(k), Dim::from(o)])
        .to_device(device)?;
    let a = Tensor::from_vec((0..g * m * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0).collect(), &[g, m, k])
        .to_device(device)?;
    a.matmul(&b).to_vec::<f32>()
}

#[test]
fn a_nest_under_a_short_parallel_loop_matches_the_interpreter_on_wgpu() {
    if let Err(e) = Device::Wgpu.probe() {
        let required = std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v.trim() == "1");
        assert!(!required || !cfg!(feature = "wgpu"), "wgpu is required here: {e}");
        return;
    }
    let want = batched(Device::Interp).unwrap();
    let got = batched(Device::Wgpu).unwrap();
    assert_eq!(got.len(), want.len());
    let bad = got.iter().zip(&want).filter(|(g, w)| (*g - *w).abs() > 1e-4 * (1.0 + w.abs())).count();
    assert_eq!(bad, 0, "{bad} of {} outputs differ from the interpreter", want.len());
}

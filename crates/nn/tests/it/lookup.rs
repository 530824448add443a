//! `Embedding` as a gather and class losses that validate their labels, on every device:
//! an `inf` in one row of the table touches no other lookup, an out-of-range id or label is an
//! error (PyTorch raises one; these used to read 0 or add a loss of 0), and `ignore_index = -100`
//! matches PyTorch's value and gradient.
//!
//! PyTorch reference values (torch 2.x, printed by this script):
//! ```python
//! logits = torch.tensor([[0.5, -1.0, 2.0, 0.25], [1.5, 0.0, -0.5, 3.0], [-2.0, 1.0, 0.5, 0.0]],
//!                       requires_grad=True)
//! loss = F.cross_entropy(logits, torch.tensor([1, -100, 3])); loss.backward()
//! w = torch.tensor([[1., 2.], [3., 4.], [5., 6.], [7., 8.]], requires_grad=True)
//! ids = torch.tensor([[3, 1, 3], [0, 3, 1]])
//! c = torch.tensor([[[1., -1.], [2., .5], [.25, 4.]], [[3., 3.], [-2., 1.], [1., 1.]]])
//! (F.embedding(ids, w) * c).sum().backward()
//! ```
//! The wgpu device is skipped with a printed reason when this machine has no GPU adapter, unless
//! `KILN_REQUIRE_GPU=1`. Ids are `i32`, and `i64` in `i64_targets_match_i32_targets`.

use kiln::{Device, Tensor};
use kiln_nn::{ClassLossOptions, Embedding, Module, cross_entropy, cross_entropy_with, nll_loss};

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

#[track_caller]
fn fails_with(t: &Tensor, device: Device, expected: &str) {
    match t.realize() {
        Ok(_) => panic!("{device}: expected an error containing {expected:?}"),
        Err(e) => assert!(e.to_string().contains(expected), "{device}: `{e}` should contain `{expected}`"),
    }
}

#[track_caller]
fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "{what}: element {i}: got {g}, want {w}");
    }
}

fn table(device: Device, rows: Vec<f32>, dim: usize) -> Embedding {
    let n = rows.len() / dim;
    Embedding { weight: on(device, rows, &[n, dim]) }
}

#[test]
fn an_inf_row_touches_no_other_lookup() {
    for device in devices() {
        let emb = table(device, vec![f32::INFINITY, f32::NEG_INFINITY, 1., 2., 3., 4.], 2);
        let ids = on(device, vec![1i32, 2, 1, 0], &[2, 2]);
        let out = emb.forward(&ids);
        assert_eq!(out.shape().len(), 3);
        let v = out.to_vec::<f32>().unwrap();
        assert_eq!(&v[..6], &[1., 2., 3., 4., 1., 2.], "{device}: rows 1 and 2 stay finite");
        assert_eq!(&v[6..], &[f32::INFINITY, f32::NEG_INFINITY], "{device}: row 0 is itself");
    }
}

#[test]
fn an_out_of_range_id_is_an_error() {
    for device in devices() {
        let emb = table(device, (0..6).map(|i| i as f32).collect(), 2);
        fails_with(&emb.forward(&on(device, vec![0i32, 3], &[2])), device, "index 3 out of range for size 3");
        fails_with(&emb.forward(&on(device, vec![-1i32], &[1])), device, "index -1 out of range for size 3");
    }
}

#[test]
fn embedding_gradient_matches_pytorch() {
    for device in devices() {
        let emb = table(device, vec![1., 2., 3., 4., 5., 6., 7., 8.], 2);
        let ids = on(device, vec![3i32, 1, 3, 0, 3, 1], &[2, 3]);
        let c = on(device, vec![1.0f32, -1., 2., 0.5, 0.25, 4., 3., 3., -2., 1., 1., 1.], &[2, 3, 2]);
        let loss = emb.forward(&ids).mul(&c).sum_all();
        let g = kiln::grad(&loss, &[&emb.weight]).unwrap();
        let want = [3.0, 3.0, 3.0, 1.5, 0.0, 0.0, -0.75, 4.0];
        assert_close(&g[0].to_vec::<f32>().unwrap(), &want, 1e-6, &format!("{device}: d weight"));
    }
}

#[test]
fn out_of_range_labels_are_errors() {
    for device in devices() {
        let logits = on(device, vec![0.0f32; 6], &[2, 3]);
        fails_with(
            &cross_entropy(&logits, &on(device, vec![1i32, 3], &[2])),
            device,
            "index 3 out of range for size 3",
        );
        // -1 is not the ignored value: an error, as in PyTorch.
        fails_with(&cross_entropy(&logits, &on(device, vec![-1i32, 0], &[2])), device, "index -1 out of range");
        // Without an ignore index, -100 is an ordinary (bad) label.
        let none = ClassLossOptions { ignore_index: None };
        fails_with(&cross_entropy_with(&logits, &on(device, vec![-100i32, 0], &[2]), none), device, "index -100");
    }
}

#[test]
fn ignore_index_matches_pytorch_value_and_gradient() {
    let logits_data = vec![0.5f32, -1.0, 2.0, 0.25, 1.5, 0.0, -0.5, 3.0, -2.0, 1.0, 0.5, 0.0];
    let want_grad = [
        0.077_117_4,
        -0.482_792_8,
        0.345_616_2,
        0.060_059_1,
        0.0,
        0.0,
        0.0,
        0.0,
        0.012_298,
        0.247_011_5,
        0.149_820_1,
        -0.409_129_6,
    ];
    for device in devices() {
        let logits = on(device, logits_data.clone(), &[3, 4]);
        let targets = on(device, vec![1i32, -100, 3], &[3]);
        let loss = cross_entropy(&logits, &targets);
        // Differentiate before realizing: a realized output drops its graph.
        let g = kiln::grad(&loss, &[&logits]).unwrap();
        assert_close(&[loss.item::<f32>().unwrap()], &[2.537_226_2], 1e-5, &format!("{device}: loss"));
        assert_close(&g[0].to_vec::<f32>().unwrap(), &want_grad, 1e-5, &format!("{device}: d logits"));
        // Every target ignored: 0 / 0, NaN as in PyTorch.
        let all = cross_entropy(&logits, &on(device, vec![-100i32; 3], &[3]));
        assert!(all.item::<f32>().unwrap().is_nan(), "{device}");
        // nll_loss of log_softmax is the same loss.
        let nll = nll_loss(&logits.log_softmax(-1), &targets);
        assert_close(&[nll.item::<f32>().unwrap()], &[2.537_226_2], 1e-5, &format!("{device}: nll"));
    }
}

/// PyTorch's default target dtype is i64: the same loss and gradient as with i32 targets, on
/// every device (wgpu included), and an i64 label out of range is the same error.
#[test]
fn i64_targets_match_i32_targets() {
    let logits_data = vec![0.5f32, -1.0, 2.0, 0.25, 1.5, 0.0, -0.5, 3.0, -2.0, 1.0, 0.5, 0.0];
    for device in devices() {
        let logits = on(device, logits_data.clone(), &[3, 4]);
        let narrow = cross_entropy(&logits, &on(device, vec![1i32, -100, 3], &[3]));
        let wide = cross_entropy(&logits, &on(device, vec![1i64, -100, 3], &[3]));
        let g32 = kiln::grad(&narrow, &[&logits]).unwrap();
        let g64 = kiln::grad(&wide, &[&logits]).unwrap();
        assert_close(&[wide.item::<f32>().unwrap()], &[2.537_226_2], 1e-5, &format!("{device}: loss"));
        assert_close(&[narrow.item::<f32>().unwrap()], &[2.537_226_2], 1e-5, &format!("{device}: i32 loss"));
        let want = g32[0].to_vec::<f32>().unwrap();
        assert_close(&g64[0].to_vec::<f32>().unwrap(), &want, 0.0, &format!("{device}: d logits"));
        fails_with(
            &cross_entropy(&logits, &on(device, vec![1i64, 4, 0], &[3])),
            device,
            "index 4 out of range for size 4",
        );
    }
}

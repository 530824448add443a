//! Issue #10's edges, on every device against PyTorch (`tests/fixtures/edges.safetensors`,
//! written by `tests/fixtures/gen_edges.py`): gradients at kinks and ties, `remainder`/`fmod` with
//! infinities, zeros and negative operands, and reductions over empty axes; plus the errors for
//! reductions without an identity and for `backward`/`grad` with nothing to differentiate.
//!
//! The wgpu device is skipped with a printed reason when this machine has no GPU adapter, unless
//! `KILN_REQUIRE_VULKAN=1`. Integer fixtures are `i64` on every device.

use std::collections::{BTreeMap, BTreeSet};

use kiln::{DType, Device, Error, Tensor};
use safetensors::{Dtype, SafeTensors};

/// The fixture file: tensor name -> (shape, values as `f64`, was it an integer tensor).
fn load() -> BTreeMap<String, (Vec<usize>, Vec<f64>, bool)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/edges.safetensors");
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let st = SafeTensors::deserialize(&bytes).expect("edges.safetensors parses");
    st.iter()
        .map(|(name, view)| {
            let data = view.data();
            let (values, int): (Vec<f64>, bool) = match view.dtype() {
                Dtype::F32 => {
                    (data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(), false)
                }
                Dtype::I64 => {
                    (data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(), true)
                }
                other => panic!("{name}: unexpected dtype {other:?}"),
            };
            (name.to_string(), (view.shape().to_vec(), values, int))
        })
        .collect()
}

/// A fixture tensor on `device` (integers as `i64`).
fn tensor(shape: &[usize], values: &[f64], int: bool, device: Device) -> Tensor {
    let t = if !int {
        Tensor::from_vec(values.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape)
    } else {
        Tensor::from_vec(values.iter().map(|&v| v as i64).collect::<Vec<_>>(), shape)
    };
    t.to_device(device).expect("move to device")
}

/// A realized tensor's elements as `f64`.
fn values(t: &Tensor) -> Result<Vec<f64>, Error> {
    Ok(match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::I64 => t.to_vec::<i64>()?.into_iter().map(|v| v as f64).collect(),
        DType::I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        other => panic!("unexpected result dtype {other}"),
    })
}

/// The cases max pooling covers; they need `kiln-nn` and are checked by its `edges` test.
const IN_NN: &[&str] = &["maxpool_tiled_ties", "maxpool_overlap_ties", "maxpool_padded_ties"];

/// Builds case `name` from its inputs with the facade; `None` for an unknown case.
fn build(name: &str, x: &Tensor, y: Option<&Tensor>) -> Option<Tensor> {
    let y = || y.expect("case has a second input");
    Some(match name {
        "relu" => x.relu(),
        "abs" => x.abs(),
        "clamp" => x.clamp(-1.0, 1.0),
        "clamp_min" => x.clamp_min(0.0),
        "clamp_max" => x.clamp_max(0.5),
        "maximum_ties" => x.maximum(y()),
        "minimum_ties" => x.minimum(y()),
        "where_ge" => x.ge(0.0).where_cond(x, x.neg()),
        "amax_ties" => x.max(1),
        "amin_ties" => x.min(0),
        "max_all_ties" => x.max_all(),
        "max_dim_ties" => x.max_dim(1).0,
        "min_dim_ties" => x.min_dim(1).0,
        "max_dim_ties_index" => x.max_dim(1).1,
        "remainder" | "remainder_int" => x.remainder(y()),
        "fmod" | "fmod_int" => x.fmod(y()),
        "remainder_inf" => x.remainder(f64::INFINITY),
        "remainder_neg_inf" => x.remainder(f64::NEG_INFINITY),
        "sum_empty_axis" => x.sum(1),
        "mean_empty_axis" => x.mean(1),
        "mean_empty_all" => x.mean_all(),
        "logsumexp_empty_axis" => x.logsumexp(1),
        _ => return None,
    })
}

/// `got` equals `want` within `1e-6 + 1e-6 |want|`; NaN matches NaN and infinities match exactly.
fn close(got: &[f64], want: &[f64]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, PyTorch has {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-6 + 1e-6 * w.abs();
        if !same {
            return Err(format!("element {i}: got {g}, PyTorch {w} (got {got:?}, want {want:?})"));
        }
    }
    Ok(())
}

/// Runs every case of the file on `device`; returns the failures.
fn check_device(device: Device) -> Vec<String> {
    let file = load();
    let cases: BTreeSet<&str> = file.keys().filter_map(|k| k.strip_suffix(".out")).collect();
    let mut failures = Vec::new();
    for &name in &cases {
        if IN_NN.contains(&name) {
            continue;
        }
        let input = |role: &str| file.get(&format!("{name}.{role}")).map(|(s, v, i)| tensor(s, v, *i, device));
        let x = input("x").unwrap_or_else(|| panic!("{name}: no input x"));
        let y = input("y");
        let Some(out) = build(name, &x, y.as_ref()) else {
            failures.push(format!("{name}: no test builds this case"));
            continue;
        };
        let mut results = vec![("out", out.clone())];
        if file.contains_key(&format!("{name}.grad_x")) {
            let wrt: Vec<&Tensor> = std::iter::once(&x).chain(y.as_ref().filter(|y| y.dtype().is_float())).collect();
            match kiln::grad(&out.sum_all(), &wrt) {
                Ok(grads) => {
                    results.extend(["grad_x", "grad_y"].into_iter().zip(grads));
                }
                Err(e) => failures.push(format!("{name} on {device}: grad: {e}")),
            }
        }
        let refs: Vec<&Tensor> = results.iter().map(|(_, t)| t).collect();
        if let Err(e) = kiln::realize(&refs) {
            failures.push(format!("{name} on {device}: {e}"));
            continue;
        }
        for (role, t) in &results {
            let (shape, want, _) = &file[&format!("{name}.{role}")];
            let got = values(t).expect("realized");
            let dims = t.dims().expect("concrete");
            if dims.iter().product::<usize>() != shape.iter().product::<usize>() {
                failures.push(format!("{name}.{role} on {device}: shape {dims:?}, PyTorch {shape:?}"));
            } else if let Err(e) = close(&got, want) {
                failures.push(format!("{name}.{role} on {device}: {e}"));
            }
        }
    }
    failures
}

fn assert_device(device: Device) {
    let failures = check_device(device);
    assert!(failures.is_empty(), "{} disagreements with PyTorch:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn interp_matches_pytorch_at_the_edges() {
    assert_device(Device::Interp);
}

#[test]
fn cpu_matches_pytorch_at_the_edges() {
    assert_device(Device::Cpu);
}

#[test]
fn wgpu_matches_pytorch_at_the_edges() {
    let probe = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).to_device(Device::Wgpu).expect("source tensor");
    if let Err(e) = probe.neg().realize() {
        let required = std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v == "1");
        assert!(!required, "KILN_REQUIRE_VULKAN=1 but the wgpu device failed: {e}");
        eprintln!("skipping wgpu_matches_pytorch_at_the_edges: no usable GPU adapter ({e})");
        return;
    }
    assert_device(Device::Wgpu);
}

/// `remainder(x, +-inf)` and `fmod` with an infinite divisor on large finite values too: wgpu's
/// float `%` used to give NaN there and lose precision for large quotients.
#[test]
fn fmod_is_exact_for_large_quotients() {
    let x = [1e10f32, -3.0e7, 123456.79, 7.0, -0.0];
    let y = [3.1f32, 0.7, 1e-3, 2.5, 3.0];
    let want: Vec<f64> = x.iter().zip(&y).map(|(a, b)| f64::from(a % b)).collect();
    for &device in Device::ALL {
        let a = Tensor::from_vec(x.to_vec(), &[5]).to_device(device).unwrap();
        let b = Tensor::from_vec(y.to_vec(), &[5]).to_device(device).unwrap();
        let r = a.fmod(&b);
        match r.realize() {
            Ok(_) => close(&values(&r).unwrap(), &want).unwrap_or_else(|e| panic!("fmod on {device}: {e}")),
            Err(e) if device == Device::Wgpu => eprintln!("skipping fmod on wgpu: {e}"),
            Err(e) => panic!("fmod on {device}: {e}"),
        }
    }
}

/// Reductions without an identity over an empty axis (or an empty tensor) are errors naming the
/// op, the shape and this file's line, like PyTorch's; `sum`, `mean` and `logsumexp` are not.
#[test]
fn empty_reductions_without_identity_are_errors() {
    let empty = Tensor::zeros(&[3, 0], DType::F32);
    let empty_ints = Tensor::from_vec(Vec::<i64>::new(), &[0]);
    let cases: Vec<(&str, Tensor)> = vec![
        ("max", empty.max(1)),
        ("min", empty.min_keepdim(-1)),
        ("max", empty.max_all()),
        ("min", empty.min_all()),
        ("argmax", empty.argmax(1)),
        ("argmin", empty.argmin(1)),
        ("argmax", empty.argmax_all()),
        ("argmin", empty_ints.argmin_all()),
        ("max_dim", empty.max_dim(1).0),
        ("min_dim", empty.min_dim(1).1),
        ("max", empty_ints.max(0)),
    ];
    for (op, t) in cases {
        let e = t.realize().expect_err(op).to_string();
        assert!(e.contains(op) && (e.contains("[3, 0]") || e.contains("[0]")), "{op}: {e}");
        assert!(e.contains("empty") && e.contains("torch_edges.rs"), "{op}: {e}");
    }
    // Reducing the non-empty axis of an empty tensor is fine: the result is empty.
    let fine = empty.max(0);
    fine.realize().unwrap();
    assert_eq!(fine.dims().unwrap(), vec![0]);
    // These have an identity (or a value at the empty axis) and stay values.
    let sum = empty.sum(1);
    let mean = empty.mean_all();
    kiln::realize(&[&sum, &mean]).unwrap();
    assert_eq!(sum.to_vec::<f32>().unwrap(), vec![0.0; 3]);
    assert!(mean.item::<f32>().unwrap().is_nan());
}

/// `backward` with no tensor marked `requires_grad_` is an error, as in PyTorch; marking inside
/// `no_grad` marks nothing, so it gives the same error rather than an `Ok` with no gradient.
#[test]
fn backward_without_grad_requiring_leaves_is_an_error() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    let e = x.mul(3.0).sum_all().backward().expect_err("nothing requires grad").to_string();
    assert!(e.contains("does not require grad") && e.contains("torch_edges.rs"), "{e}");

    let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2]);
    let w = kiln::no_grad(|| w.requires_grad_());
    let loss = w.mul(&w).sum_all();
    let e = loss.backward().expect_err("marked inside no_grad").to_string();
    assert!(e.contains("does not require grad"), "{e}");
    assert!(w.grad().is_none());

    // Marked outside no_grad, the same loss has a gradient.
    w.set_requires_grad(true);
    let loss = w.mul(&w).sum_all();
    loss.backward().unwrap();
    assert_eq!(w.grad().expect("gradient").to_vec::<f32>().unwrap(), vec![2.0, 4.0]);

    // `grad` with respect to tensors the output does not depend on is an error too.
    let other = Tensor::from_vec(vec![1.0f32], &[1]);
    let e = kiln::grad(&x.sum_all(), &[&other]).expect_err("unrelated").to_string();
    assert!(e.contains("depends on none"), "{e}");
    assert!(kiln::grad(&x.sum_all(), &[]).unwrap().is_empty(), "nothing asked, nothing to refuse");
}

/// PyTorch's `print(loss.item()); loss.backward()`: a loss realized on its own keeps the graph
/// autodiff needs, so its gradients equal those of a loss never realized first. Realized inside
/// `no_grad` it drops its graph, and differentiating it is an error, not a zero gradient.
#[test]
fn backward_after_realizing_the_loss_alone() {
    let w = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], &[3]).requires_grad_();
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    let loss = w.mul(&x).tanh().sum_all();
    let value: f32 = loss.item().unwrap();
    loss.backward().unwrap();
    let got: Vec<f32> = w.grad().unwrap().to_vec().unwrap();
    let want: Vec<f32> = [0.5f32, -1.0, 2.0]
        .iter()
        .zip([1.0f32, 2.0, 3.0])
        .map(|(w, x)| x * (1.0 - ((w * x) as f64).tanh().powi(2) as f32))
        .collect();
    for (g, e) in got.iter().zip(&want) {
        assert!((g - e).abs() < 1e-6, "{got:?} vs {want:?}");
    }
    let expected_value: f32 = [0.5f32, -2.0, 6.0].iter().map(|v| v.tanh()).sum();
    assert!((value - expected_value).abs() < 1e-6);

    // Through an intermediate realized on its own too: d/dw sum((w x)^2) = 2 w x^2.
    w.zero_grad();
    let h = w.mul(&x);
    h.realize().unwrap();
    let loss = h.square().sum_all();
    loss.item::<f32>().unwrap();
    loss.backward().unwrap();
    let got: Vec<f32> = w.grad().unwrap().to_vec().unwrap();
    assert_eq!(got, vec![1.0f32, -8.0, 36.0]);

    // Realized inside no_grad, the loss drops its graph: then backward says so.
    let loss = w.mul(&x).sum_all();
    kiln::no_grad(|| loss.realize()).unwrap();
    let e = loss.backward().expect_err("graph dropped").to_string();
    assert!(e.contains("realized on its own"), "{e}");
}

//! Composite float ops in `f16` and `bf16` against PyTorch's float64 answers
//! (`tests/fixtures/half.safetensors`, written by `tests/fixtures/gen_half.py`): each op is
//! several IR ops, computed in `f32` and rounded to the half dtype once, so every element is
//! within half an ulp of the exact result (plus `f32`'s own error). Rounding a step to the half
//! dtype instead errs by an ulp or more (bf16 `tanh(3)` was 1.0, not 0.9961).

use std::collections::BTreeSet;

use kiln::{DType, Device, Tensor};
use kiln_nn::functional as F;

use crate::common::{Fixture, fixture_file, values};

/// Half an ulp of the half dtype, and `f32`'s error as a fraction of the case's magnitude: the
/// same bounds as `gen_half.py`'s (see there).
const ULPS: f64 = 0.51;
const SLACK: f64 = 1.0 / (1u64 << 20) as f64;

/// The spacing of `dtype`'s values around `v`.
fn ulp(v: f64, dtype: DType) -> f64 {
    let (mantissa, min_exp) = if dtype == DType::BF16 { (7, -126) } else { (10, -14) };
    let e = if v == 0.0 { min_exp } else { (v.abs().log2().floor() as i32).max(min_exp) };
    2f64.powi(e - mantissa)
}

/// Builds case `name` (its dtype suffix removed) from its inputs; `None` for an unknown case.
fn build(op: &str, f: &Fixture) -> Option<Tensor> {
    let x = f.get("x");
    Some(match op {
        "exp" => x.exp(),
        "log" => x.log(),
        "rsqrt" => x.rsqrt(),
        "cos" => x.cos(),
        "atan" => x.atan(),
        "asin" => x.asin(),
        "acos" => x.acos(),
        "tanh" => x.tanh(),
        "sigmoid" => x.sigmoid(),
        "gelu" => x.gelu(),
        "gelu_tanh" => x.gelu_tanh(),
        "silu" => x.silu(),
        "softmax" => x.softmax(-1),
        "log_softmax" => x.log_softmax(-1),
        "logsumexp" => x.logsumexp(-1),
        "mean" => x.mean(-1),
        "layer_norm" => F::layer_norm(&x, &[20], Some(&f.get("w")), Some(&f.get("b")), 1e-5),
        "rms_norm" => F::rms_norm(&x, &[20], Some(&f.get("w")), Some(1e-5)),
        "group_norm" => F::group_norm(&x, 4, Some(&f.get("w")), Some(&f.get("b")), 1e-5),
        "batch_norm_train" => F::batch_norm(&x, None, None, Some(&f.get("w")), Some(&f.get("b")), true, 0.1, 1e-5),
        "batch_norm_eval" => {
            let (mut mean, mut var) = (f.get("m"), f.get("v"));
            F::batch_norm(&x, Some(&mut mean), Some(&mut var), Some(&f.get("w")), Some(&f.get("b")), false, 0.1, 1e-5)
        }
        _ => return None,
    })
}

/// Runs every case on `device`; returns the failures.
fn check(device: Device) -> Vec<String> {
    let file = fixture_file("half.safetensors");
    let names: BTreeSet<&str> = file.keys().filter_map(|k| k.split_once('.').map(|(n, _)| n)).collect();
    assert_eq!(names.len(), 42, "21 ops in two dtypes");
    let mut failures = Vec::new();
    for name in names {
        let mut f = Fixture::new(&file, name);
        for t in f.tensors.values_mut() {
            *t = t.to_device(device).expect("move to device");
        }
        let (op, dtype) = match name.rsplit_once('_') {
            Some((op, "bf16")) => (op, DType::BF16),
            Some((op, "f16")) => (op, DType::F16),
            _ => panic!("{name}: no dtype suffix"),
        };
        assert_eq!(f.get("x").dtype(), dtype, "{name}");
        let Some(out) = build(op, &f) else {
            failures.push(format!("{name}: no test builds this case"));
            continue;
        };
        if out.dtype() != dtype {
            failures.push(format!("{name} on {device}: result is {}, not {dtype}", out.dtype()));
            continue;
        }
        let got = match out.to_device(Device::Cpu).and_then(|t| t.cast(DType::F64).to_vec::<f64>()) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{name} on {device}: {e}"));
                continue;
            }
        };
        let want = values(name, &f.get("ref"));
        let inputs = ["x", "w", "b", "m", "v"].iter().filter_map(|r| f.tensors.get(*r)).flat_map(|t| values(name, t));
        let scale = inputs.chain(want.iter().copied()).fold(1.0f64, |m, v| m.max(v.abs()));
        assert_eq!(got.len(), want.len(), "{name}");
        let worst = got.iter().zip(&want).map(|(&g, &w)| ((g - w).abs() - SLACK * scale) / ulp(w, dtype));
        let (i, worst) = worst.enumerate().fold((0, 0.0f64), |(i, m), (j, e)| if e > m { (j, e) } else { (i, m) });
        if worst > ULPS || got.iter().any(|g| g.is_nan()) {
            failures.push(format!(
                "{name} on {device}: element {i} is {} where float64 gives {} ({worst:.2} ulp)",
                got[i], want[i]
            ));
        }
    }
    failures
}

#[test]
fn composite_ops_in_half_precision_round_once_on_the_cpu() {
    let failures = check(Device::Cpu);
    assert!(failures.is_empty(), "{} cases off:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn composite_ops_in_half_precision_round_once_on_the_interpreter() {
    let failures = check(Device::Interp);
    assert!(failures.is_empty(), "{} cases off:\n{}", failures.len(), failures.join("\n"));
}

//! The result check of the `kiln bench` suites: each suite's own check passes on the CPU device,
//! and the check fails, with an error naming what differs, when a device's result is wrong (a
//! corrupted output, a value off by a little, a NaN where the reference has a number).

use air::HostTensor;
use kiln::{Device, Tensor};
use kiln_cli::bench::check::{self, Tolerance};
use kiln_cli::bench::{embedding, matmul, models, transformer, tree, unary};
use kiln_cli::model::GptConfig;
use kiln_cli::pipeline::Traced;
use kiln_cli::runner::Runner;

fn cpu() -> Runner {
    Runner::on(Device::Cpu)
}

fn vector(n: usize) -> Tensor {
    Tensor::from_vec((0..n).map(|i| (i as f32 - 20.0) / 8.0).collect::<Vec<f32>>(), &[n])
}

#[test]
fn every_suite_check_passes_on_cpu() {
    matmul::check_product(16, 32, 24, &cpu()).expect("matmul matches the interpreter");
    unary::check_op(unary::UnaryOp::Sigmoid, 729, &cpu()).expect("sigmoid matches the interpreter");
    unary::check_op(unary::UnaryOp::Neg, 729, &cpu()).expect("neg matches the interpreter");
    let small = tree::Args { pairs: 3, m: 8, k: 16, n: 12, budget: kiln_cli::timing::Budget::SMOKE };
    tree::check_variants(&small, &cpu()).expect("tree-matmul matches the interpreter");
    models::check_model("dense-tiny", &cpu()).expect("dense-tiny matches the interpreter");
    transformer::check_forward(GptConfig { layers: 1, ..GptConfig::default() }, &cpu())
        .expect("the transformer forward matches the interpreter");
    let lookups =
        embedding::Args { vocabs: vec![64, 1000], tokens: 16, dim: 8, budget: kiln_cli::timing::Budget::SMOKE };
    embedding::check_lookup(64, &lookups, true, &cpu()).expect("the embedding lookups match the interpreter");
    embedding::check_lookup(1000, &lookups, false, &cpu()).expect("the gather at vocab 1000 matches the interpreter");
}

#[test]
fn a_corrupted_suite_output_is_an_error() {
    // The matmul suite's product, computed on the CPU device, then one element changed.
    let a = Tensor::from_vec((0..48).map(|i| i as f32 / 16.0).collect::<Vec<f32>>(), &[6, 8]);
    let b = Tensor::from_vec((0..40).map(|i| 1.0 - i as f32 / 32.0).collect::<Vec<f32>>(), &[8, 5]);
    let product = a.matmul(&b);
    let traced = Traced::of(&[&product]).expect("the product traces");
    let good = product.to_host().expect("the product runs on cpu");
    check::against_eval("product", &traced, std::slice::from_ref(&good), Tolerance::REDUCTION)
        .expect("the real output matches");

    let mut values = good.as_slice::<f32>().expect("f32 output").to_vec();
    values[7] += 0.5;
    let corrupted = HostTensor::from_vec(values, good.shape.clone()).unwrap();
    let err = check::against_eval("product", &traced, &[corrupted], Tolerance::REDUCTION).unwrap_err();
    assert!(check::is_mismatch(&err), "{err:#}");
    let message = format!("{err:#}");
    assert!(message.contains("product") && message.contains("1 of 30 elements"), "{message}");
    assert!(message.contains("first at index 7"), "{message}");

    let mut values = good.as_slice::<f32>().expect("f32 output").to_vec();
    values[0] = f32::NAN;
    let with_nan = HostTensor::from_vec(values, good.shape.clone()).unwrap();
    let err = check::against_eval("product", &traced, &[with_nan], Tolerance::REDUCTION).unwrap_err();
    assert!(format!("{err:#}").contains("got NaN"), "{err:#}");
}

#[test]
fn a_device_computing_something_else_fails_the_check() {
    // The "device under test" computes sigmoid(x) + 1e-3; the reference computes sigmoid(x).
    let err = check::against_interp("sigmoid", &cpu(), Tolerance::ELEMENTWISE, |r| {
        let y = r.place(vector(40))?.sigmoid();
        Ok(vec![if r.device == Device::Interp { y } else { y + 1e-3 }])
    })
    .unwrap_err();
    assert!(check::is_mismatch(&err), "{err:#}");
    assert!(format!("{err:#}").contains("40 of 40 elements"), "{err:#}");
}

#[test]
fn nan_where_the_reference_has_nan_passes() {
    // sqrt of negative numbers is NaN on both devices: a match, not a mismatch.
    check::against_interp("sqrt", &cpu(), Tolerance::ELEMENTWISE, |r| Ok(vec![r.place(vector(40))?.sqrt()]))
        .expect("NaN matches NaN");
    // A NaN on the device only is a mismatch.
    let err = check::against_interp("sqrt", &cpu(), Tolerance::ELEMENTWISE, |r| {
        let x = r.place(vector(40))?;
        Ok(vec![if r.device == Device::Interp { x.abs().sqrt() } else { x.sqrt() }])
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("20 of 40 elements"), "{err:#}");
}

#[test]
fn every_model_of_the_suite_matches_the_interpreter_on_cpu() {
    for name in nn::zoo::NAMES {
        models::check_model(name, &cpu()).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
}

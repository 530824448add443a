//! The shared benchmark suite (`kiln_nn::zoo`): every model builds with the parameter count
//! `BENCHMARKS.md` records, and one forward on the CPU device gives the target's shape.

use kiln::{Device, Tensor};
use kiln_nn::{Loss, zoo};

/// (name, parameters, input shape, output shape), as `BENCHMARKS.md` records them.
const EXPECTED: [(&str, usize, &[usize], &[usize]); 9] = [
    ("dense-tiny", 2_762, &[32, 32], &[32, 10]),
    ("dense-large", 1_863_690, &[128, 784], &[128, 10]),
    ("conv-1", 6_780, &[8, 1, 28, 28], &[8, 10]),
    ("conv-32", 54_410, &[8, 1, 28, 28], &[8, 10]),
    ("simple-rnn", 1_377, &[16, 10, 8], &[16, 1]),
    ("gru", 4_065, &[16, 10, 8], &[16, 1]),
    ("lstm", 5_409, &[16, 10, 8], &[16, 1]),
    ("mobilenet", 3_002, &[4, 3, 32, 32], &[4, 10]),
    ("attention", 16_640, &[8, 16, 64], &[8, 16, 64]),
];

#[test]
fn names_are_the_suite_in_order() {
    let names: Vec<&str> = EXPECTED.iter().map(|e| e.0).collect();
    assert_eq!(zoo::NAMES.to_vec(), names);
    let built: Vec<&str> = zoo::all().expect("build the suite").iter().map(|c| c.name).collect();
    assert_eq!(built, names);
}

#[test]
fn every_model_has_its_size_and_runs_forward_on_cpu() {
    for (name, params, input, output) in EXPECTED {
        let mut case = zoo::build(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(case.name, name);
        assert_eq!(case.model.num_parameters(), params, "{name}: parameters");
        assert_eq!(case.x.dims().unwrap(), input, "{name}: input");
        assert_eq!(case.y.dims().unwrap(), output, "{name}: target");
        assert!(matches!(case.loss, Loss::Mse), "{name}: loss");

        case.model.to_device(Device::Cpu).unwrap_or_else(|e| panic!("{name}: to cpu: {e}"));
        case.model.set_training(false);
        let x = case.x.to_device(Device::Cpu).unwrap();
        let y: Tensor = kiln::no_grad(|| case.model.forward(&x));
        y.realize().unwrap_or_else(|e| panic!("{name}: forward: {e}"));
        assert_eq!(y.dims().unwrap(), output, "{name}: output");
        let values = y.to_vec::<f32>().unwrap();
        assert!(values.iter().all(|v| v.is_finite()), "{name}: non-finite output");
    }
}

#[test]
fn an_unknown_name_is_an_error() {
    assert!(zoo::build("resnet-152").is_err());
}

//! Every layer's forward and backward against PyTorch (tests/fixtures/nn.safetensors, made by
//! tests/fixtures/gen_nn.py): the layer is loaded with the fixture's weights, run on the
//! fixture's input, and differentiated through `sum(out * cot)` with `kiln::grad`.

use crate::common;

use std::collections::HashMap;
use std::sync::OnceLock;

use common::{Fixture, assert_close, fixture_file};
use kiln::{Device, Tensor};
use kiln_nn::*;

fn fixtures() -> &'static HashMap<String, Tensor> {
    static ALL: OnceLock<HashMap<String, Tensor>> = OnceLock::new();
    ALL.get_or_init(|| fixture_file("nn.safetensors"))
}

const FORWARD_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-4;

/// Loads `name`'s weights into `module` (in eval mode: the fixtures of layers with batch
/// statistics are PyTorch's `eval()`), checks the output and every gradient on the reference
/// interpreter, the CPU device and wgpu (where this machine has an adapter); returns the largest
/// error seen.
fn check(name: &str, mut module: impl Module) -> f64 {
    let f = Fixture::new(fixtures(), name);
    f.load(&mut module);
    module.set_training(false);
    let mut worst = 0.0f64;
    for device in common::devices() {
        module.to_device(device).unwrap();
        worst = worst.max(check_on(&f, &module, device));
    }
    worst
}

fn check_on(f: &Fixture, module: &dyn Module, device: Device) -> f64 {
    let name = format!("{} ({device})", f.name);
    let name = name.as_str();
    let x = f.get("x").to_device(device).unwrap();
    let out = module.forward(&x);
    let loss = out.mul(f.get("cot").to_device(device).unwrap()).sum_all();
    let params = module.named_parameters();
    let mut wrt: Vec<&Tensor> = params.iter().map(|(_, t)| t).collect();
    let float_input = x.dtype().is_float();
    if float_input {
        wrt.push(&x);
    }
    let grads = kiln::grad(&loss, &wrt).expect("grad builds");
    let mut all: Vec<&Tensor> = vec![&out];
    all.extend(grads.iter());
    kiln::realize(&all).expect("realize");
    let mut worst = assert_close(&format!("{name}.out"), &out, &f.get("out"), FORWARD_TOL);
    for ((pname, _), g) in params.iter().zip(&grads) {
        let e = assert_close(&format!("{name}.grad.{pname}"), g, &f.get(&format!("grad.{pname}")), GRAD_TOL);
        worst = worst.max(e);
    }
    if float_input {
        let e = assert_close(&format!("{name}.grad_x"), &grads[grads.len() - 1], &f.get("grad_x"), GRAD_TOL);
        worst = worst.max(e);
    }
    eprintln!("{name}: max error {worst:.2e}");
    worst
}

#[test]
fn linear() {
    check("linear", Linear::new(5, 3, true));
    check("linear_nobias", Linear::new(5, 3, false));
}

#[test]
fn embedding() {
    check("embedding", Embedding::new(7, 4));
}

#[test]
fn norms() {
    check("layernorm", LayerNorm::new(6, 1e-5));
    check("rmsnorm", RmsNorm::new(6, 1e-6));
    check("batchnorm", BatchNorm2d::new(3, 1e-5));
}

#[test]
fn batchnorm_training_mode_uses_batch_statistics_and_moves_the_running_ones() {
    let f = Fixture::new(fixtures(), "batchnorm_train");
    for device in common::devices() {
        let mut bn = BatchNorm2d::new(3, 1e-5);
        f.load(&mut bn);
        bn.to_device(device).unwrap();
        bn.set_training(true);
        // The forward and gradients of `nn.BatchNorm2d.train()`.
        check_on(&f, &bn, device);
        let at = |role: &str| format!("batchnorm_train ({device}).{role}");
        assert_close(&at("after1.running_mean"), &bn.running_mean.borrow(), &f.get("after1.running_mean"), FORWARD_TOL);
        assert_close(&at("after1.running_var"), &bn.running_var.borrow(), &f.get("after1.running_var"), FORWARD_TOL);
        let x2 = f.get("x2").to_device(device).unwrap();
        kiln::no_grad(|| bn.forward(&x2)).realize().unwrap();
        assert_close(&at("after2.running_mean"), &bn.running_mean.borrow(), &f.get("after2.running_mean"), FORWARD_TOL);
        assert_close(&at("after2.running_var"), &bn.running_var.borrow(), &f.get("after2.running_var"), FORWARD_TOL);
        bn.set_training(false);
        assert_close(&at("eval_out"), &bn.forward(&x2), &f.get("eval_out"), FORWARD_TOL);
        // Eval mode leaves the statistics alone.
        let before = bn.running_var.borrow().to_vec::<f32>().unwrap();
        bn.forward(&x2).realize().unwrap();
        assert_eq!(bn.running_var.borrow().to_vec::<f32>().unwrap(), before);
    }
}

#[test]
fn activations() {
    for (name, act) in [
        ("act_relu", Activation::Relu),
        ("act_gelu", Activation::Gelu),
        ("act_gelu_tanh", Activation::GeluTanh),
        ("act_silu", Activation::Silu),
        ("act_tanh", Activation::Tanh),
        ("act_sigmoid", Activation::Sigmoid),
    ] {
        check(name, act);
    }
}

#[test]
fn attention_mlp_block() {
    check("attention", CausalSelfAttention::new(8, 2, 8).unwrap());
    check("mlp", Mlp::new(8, 16, Activation::GeluTanh));
    check("block", Block::new(8, 2, 1e-5, 8).unwrap());
}

#[test]
fn convolutions() {
    check("conv", Conv2d::new(3, 4, (3, 3), (2, 2), (1, 1), 1, true).unwrap());
    check("conv_groups", Conv2d::new(4, 6, (3, 2), (1, 2), (0, 1), 2, true).unwrap());
    check("conv_depthwise", Conv2d::new(4, 4, (3, 3), (1, 1), (1, 1), 4, false).unwrap());
    check("conv_pointwise", Conv2d::new(4, 3, (1, 1), (1, 1), (0, 0), 1, true).unwrap());
}

#[test]
fn pools_and_flatten() {
    check("maxpool", MaxPool2d::new((2, 2)));
    check("maxpool_pad", MaxPool2d { kernel: (3, 3), stride: (2, 2), padding: (1, 1) });
    check("avgpool", AvgPool2d { kernel: (3, 3), stride: (2, 2), padding: (1, 1) });
    check("flatten", Flatten);
}

#[test]
fn recurrent() {
    check("rnn", SimpleRnn::new(3, 4));
    check("gru", Gru::new(3, 4));
    check("lstm", Lstm::new(3, 4));
    check("rnn_bi", SimpleRnn::with_layers(3, 4, 1, true));
    check("gru_2layer_bi", Gru::with_layers(3, 4, 2, true));
    check("lstm_3layer", Lstm::with_layers(3, 4, 3, false));
    let mut last = Lstm::with_layers(3, 4, 2, true);
    last.return_sequences = false;
    check("lstm_bi_final", last);
}

#[test]
fn mobilenet() {
    check("mobilenet", MobileNet::new(3, 4, &[(8, 2), (8, 1)], 5).unwrap());
}

#[test]
fn losses() {
    for (name, loss) in [("loss_mse", Loss::Mse), ("loss_ce", Loss::CrossEntropy)] {
        let f = Fixture::new(fixtures(), name);
        let x = f.get("x");
        let out = loss.compute(&x, &f.get("target"));
        let g = kiln::grad(&out, &[&x]).unwrap().remove(0);
        kiln::realize(&[&out, &g]).unwrap();
        assert_close(&format!("{name}.out"), &out, &f.get("out"), FORWARD_TOL);
        assert_close(&format!("{name}.grad_x"), &g, &f.get("grad_x"), GRAD_TOL);
    }
}

/// Three optimizer steps of a `Linear(4, 3)` on MSE through [`Trainer`], against PyTorch.
fn check_optimizer(name: &str, optimizer: impl Optimizer) {
    let f = Fixture::new(fixtures(), name);
    let mut model = Linear::new(4, 3, true);
    f.load(&mut model);
    let mut trainer = Trainer::new(model, optimizer, Loss::Mse);
    let losses = trainer.fit(&[(f.get("x"), f.get("target"))], 3).unwrap();
    assert_close(&format!("{name}.losses"), &Tensor::from_vec(losses, &[3]), &f.get("losses"), 1e-5);
    for (pname, p) in trainer.model.named_parameters() {
        assert_close(&format!("{name}.step3.{pname}"), &p, &f.get(&format!("step3.{pname}")), 1e-5);
    }
}

#[test]
fn optimizers() {
    check_optimizer("opt_sgd", Sgd::new(0.1, 0.9));
    let mut nesterov = Sgd::new(0.1, 0.9);
    nesterov.nesterov = true;
    nesterov.weight_decay = 0.01;
    check_optimizer("opt_sgd_nesterov", nesterov);
    check_optimizer("opt_adam", Adam::new(0.01));
    check_optimizer("opt_adamw", AdamW::with(0.01, (0.9, 0.999), 1e-8, 0.1));
}

/// Max pooling over windows with tied maxima (tests/fixtures/edges.safetensors, made by
/// tests/fixtures/gen_edges.py): as in PyTorch, each window sends its gradient to one element,
/// its first maximum, on the interpreter, the CPU device and (when there is an adapter) wgpu.
#[test]
fn max_pool_sends_tied_gradients_to_one_element() {
    let edges = fixture_file("edges.safetensors");
    let pools = [
        ("maxpool_tiled_ties", MaxPool2d::new((2, 2))),
        ("maxpool_overlap_ties", MaxPool2d { kernel: (3, 3), stride: (1, 1), padding: (0, 0) }),
        ("maxpool_padded_ties", MaxPool2d { kernel: (3, 3), stride: (2, 2), padding: (1, 1) }),
    ];
    for device in [Device::Interp, Device::Cpu, Device::Wgpu] {
        for (name, pool) in &pools {
            let f = Fixture::new(&edges, name);
            let x = f.get("x").to_device(device).unwrap();
            let out = pool.forward(&x);
            let grad = kiln::grad(&out.sum_all(), &[&x]).unwrap().remove(0);
            if let Err(e) = kiln::realize(&[&out, &grad]) {
                assert!(device == Device::Wgpu, "{name} on {device}: {e}");
                eprintln!("skipping {name} on wgpu: {e}");
                continue;
            }
            for (role, got) in [("out", &out), ("grad_x", &grad)] {
                let got: Vec<f32> = got.to_vec().unwrap();
                let want: Vec<f32> = f.get(role).to_vec().unwrap();
                assert_eq!(got, want, "{name}.{role} on {device}");
            }
        }
    }
}

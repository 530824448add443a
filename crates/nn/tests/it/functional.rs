//! `kiln_nn::functional` against PyTorch (tests/fixtures/functional.safetensors, made by
//! tests/fixtures/gen_functional.py): each fixture's function is called with the fixture's
//! inputs (a `_t` input transposed, so the op reads a non-contiguous view) and the arguments the
//! script used, then differentiated through `sum(out * cot)`, on the interpreter, the CPU and wgpu.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::sync::OnceLock;

use common::{Fixture, assert_close, devices, fixture_file};
use kiln::{DType, Device, Tensor};
use kiln_nn::functional as F;
use kiln_nn::functional::{
    AvgPool2dOptions, BceWithLogitsOptions, Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions, CrossEntropyOptions,
    InterpolateMode, InterpolateSize, MaxPool2dOptions, NllLossOptions, PadMode, Padding, Reduction, SdpaOptions,
};

fn fixtures() -> &'static HashMap<String, Tensor> {
    static ALL: OnceLock<HashMap<String, Tensor>> = OnceLock::new();
    ALL.get_or_init(|| fixture_file("functional.safetensors"))
}

const FORWARD_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-4;

/// A fixture's inputs by the name the script's function received them under.
struct Args(HashMap<String, Tensor>);

impl Args {
    fn get(&self, name: &str) -> &Tensor {
        self.0.get(name).unwrap_or_else(|| panic!("no input `{name}`"))
    }
}

type Call = fn(&Args) -> Tensor;

/// Runs every case on every device (wgpu included, `f64` fixtures too: nothing is skipped).
fn run(cases: &[(&str, Call)]) {
    for device in devices() {
        for &(name, call) in cases {
            let f = Fixture::new(fixtures(), name);
            let stored = f.group("in");
            check(&f, &stored, call, device);
        }
    }
}

fn check(f: &Fixture, stored: &HashMap<String, Tensor>, call: Call, device: Device) {
    let what = format!("{} ({device})", f.name);
    let leaves: HashMap<String, Tensor> =
        stored.iter().map(|(k, t)| (k.clone(), t.to_device(device).unwrap())).collect();
    let args = Args(
        leaves
            .iter()
            .map(|(k, t)| match k.strip_suffix("_t") {
                Some(base) => (base.to_string(), t.transpose(-1, -2)),
                None => (k.clone(), t.clone()),
            })
            .collect(),
    );
    let out = call(&args);
    let mut expected: Vec<(String, Tensor)> = f.group("grad").into_iter().collect();
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    let grads = if expected.is_empty() {
        Vec::new()
    } else {
        let loss = out.mul(f.get("cot").to_device(device).unwrap()).sum_all();
        let wrt: Vec<&Tensor> = expected.iter().map(|(k, _)| &leaves[k]).collect();
        kiln::grad(&loss, &wrt).unwrap_or_else(|e| panic!("{what}: grad: {e}"))
    };
    let mut all = vec![&out];
    all.extend(grads.iter());
    kiln::realize(&all).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(out.dtype(), f.get("out").dtype(), "{what}: dtype");
    // Compared on the host side.
    let host = |t: &Tensor| t.to_device(Device::Cpu).unwrap();
    let mut worst = assert_close(&format!("{what}.out"), &host(&out), &f.get("out"), FORWARD_TOL);
    for ((k, want), got) in expected.iter().zip(&grads) {
        worst = worst.max(assert_close(&format!("{what}.grad.{k}"), &host(got), want, GRAD_TOL));
    }
    eprintln!("{what}: max error {worst:.2e}");
}

const LAYERS: &[(&str, Call)] = &[
    ("linear", |a| F::linear(a.get("x"), a.get("w"), Some(a.get("b")))),
    ("linear_nobias_t", |a| F::linear(a.get("x"), a.get("w"), None)),
    ("embedding", |a| F::embedding(a.get("ids"), a.get("w"))),
    ("embedding_i32", |a| F::embedding(a.get("ids"), a.get("w"))),
    ("softmax_dim0", |a| F::softmax(a.get("x"), 0, None)),
    ("log_softmax_f64", |a| F::log_softmax(a.get("x"), -1, Some(DType::F64))),
    ("log_softmax_t", |a| F::log_softmax(a.get("x"), 1, None)),
];

const NORMS: &[(&str, Call)] = &[
    ("layer_norm_2d", |a| F::layer_norm(a.get("x"), &[3, 4], Some(a.get("w")), Some(a.get("b")), 1e-5)),
    ("layer_norm_plain_t", |a| F::layer_norm(a.get("x"), &[4], None, None, 1e-6)),
    ("rms_norm", |a| F::rms_norm(a.get("x"), &[6], Some(a.get("w")), None)),
    ("rms_norm_2d", |a| F::rms_norm(a.get("x"), &[3, 4], Some(a.get("w")), Some(1e-6))),
    ("group_norm", |a| F::group_norm(a.get("x"), 3, Some(a.get("w")), Some(a.get("b")), 1e-5)),
    ("group_norm_plain", |a| F::group_norm(a.get("x"), 2, None, None, 1e-5)),
];

fn sdpa(a: &Args, options: SdpaOptions) -> Tensor {
    F::scaled_dot_product_attention(a.get("q"), a.get("k"), a.get("v"), options)
}

const ATTENTION: &[(&str, Call)] = &[
    ("sdpa_plain", |a| sdpa(a, SdpaOptions::default())),
    ("sdpa_causal", |a| sdpa(a, SdpaOptions { is_causal: true, ..Default::default() })),
    ("sdpa_causal_rect", |a| sdpa(a, SdpaOptions { is_causal: true, scale: Some(0.7), ..Default::default() })),
    ("sdpa_bool_mask", |a| {
        sdpa(a, SdpaOptions { attn_mask: Some(a.get("mask").clone()), scale: Some(0.3), ..Default::default() })
    }),
    ("sdpa_float_mask", |a| sdpa(a, SdpaOptions { attn_mask: Some(a.get("mask").clone()), ..Default::default() })),
    ("sdpa_gqa", |a| sdpa(a, SdpaOptions { is_causal: true, enable_gqa: true, ..Default::default() })),
    ("sdpa_t", |a| sdpa(a, SdpaOptions::default())),
];

const LOSSES: &[(&str, Call)] = &[
    ("ce_basic", |a| F::cross_entropy(a.get("x"), a.get("t"), CrossEntropyOptions::default())),
    ("ce_options", |a| {
        let options =
            CrossEntropyOptions { weight: Some(a.get("w").clone()), label_smoothing: 0.2, ..Default::default() };
        F::cross_entropy(a.get("x"), a.get("t"), options)
    }),
    ("ce_sum_i32", |a| {
        let options = CrossEntropyOptions { ignore_index: Some(2), reduction: Reduction::Sum, ..Default::default() };
        F::cross_entropy(a.get("x"), a.get("t"), options)
    }),
    ("ce_none_nd", |a| {
        let options = CrossEntropyOptions {
            weight: Some(a.get("w").clone()),
            reduction: Reduction::None,
            label_smoothing: 0.1,
            ..Default::default()
        };
        F::cross_entropy(a.get("x"), a.get("t"), options)
    }),
    ("ce_mean_nd_i32", |a| {
        F::cross_entropy(a.get("x"), a.get("t"), CrossEntropyOptions { label_smoothing: 0.3, ..Default::default() })
    }),
    ("ce_probs", |a| {
        let options =
            CrossEntropyOptions { weight: Some(a.get("w").clone()), label_smoothing: 0.1, ..Default::default() };
        F::cross_entropy(a.get("x"), a.get("t"), options)
    }),
    ("ce_1d", |a| F::cross_entropy(a.get("x"), a.get("t"), CrossEntropyOptions::default())),
    ("nll_weighted", |a| {
        let options = NllLossOptions { weight: Some(a.get("w").clone()), ignore_index: Some(1), ..Default::default() };
        F::nll_loss(a.get("x"), a.get("t"), options)
    }),
    ("nll_none_i32", |a| {
        F::nll_loss(a.get("x"), a.get("t"), NllLossOptions { reduction: Reduction::None, ..Default::default() })
    }),
    ("mse_mean", |a| F::mse_loss(a.get("x"), a.get("y"), Reduction::Mean)),
    ("mse_none", |a| F::mse_loss(a.get("x"), a.get("y"), Reduction::None)),
    ("l1_sum", |a| F::l1_loss(a.get("x"), a.get("y"), Reduction::Sum)),
    ("l1_mean_t", |a| F::l1_loss(a.get("x"), a.get("y"), Reduction::default())),
    ("smooth_l1", |a| F::smooth_l1_loss(a.get("x"), a.get("y"), Reduction::Mean, 0.5)),
    ("smooth_l1_sum", |a| F::smooth_l1_loss(a.get("x"), a.get("y"), Reduction::Sum, 1.0)),
    ("smooth_l1_beta0", |a| F::smooth_l1_loss(a.get("x"), a.get("y"), Reduction::None, 0.0)),
    ("bce", |a| F::binary_cross_entropy(a.get("x"), a.get("y"), Some(a.get("w")), Reduction::Mean)),
    ("bce_none", |a| F::binary_cross_entropy(a.get("x"), a.get("y"), None, Reduction::None)),
    ("bce_logits", |a| {
        let options = BceWithLogitsOptions {
            weight: Some(a.get("w").clone()),
            pos_weight: Some(a.get("pw").clone()),
            ..Default::default()
        };
        F::binary_cross_entropy_with_logits(a.get("x"), a.get("y"), options)
    }),
    ("bce_logits_sum", |a| {
        let options = BceWithLogitsOptions { reduction: Reduction::Sum, ..Default::default() };
        F::binary_cross_entropy_with_logits(a.get("x"), a.get("y"), options)
    }),
];

fn scale(factors: &[f64]) -> InterpolateSize {
    InterpolateSize::Scale(factors.to_vec())
}

const SPATIAL: &[(&str, Call)] = &[
    ("pad_constant", |a| F::pad(a.get("x"), &[1, 2, 0, 1], PadMode::Constant, 0.5)),
    ("pad_reflect", |a| F::pad(a.get("x"), &[2, 1, 1, 2], PadMode::Reflect, 0.0)),
    ("pad_replicate", |a| F::pad(a.get("x"), &[3, 1, 2, 0], PadMode::Replicate, 0.0)),
    ("pad_circular", |a| F::pad(a.get("x"), &[2, 3, 1, 1], PadMode::Circular, 0.0)),
    ("pad_negative_t", |a| F::pad(a.get("x"), &[-1, 2, 1, -2], PadMode::Constant, 0.0)),
    ("pad_reflect_1d", |a| F::pad(a.get("x"), &[3, 5], PadMode::Reflect, 0.0)),
    ("interp_nearest_2x", |a| F::interpolate(a.get("x"), scale(&[2.0, 2.0]), InterpolateMode::Nearest, None)),
    ("interp_nearest_size", |a| {
        F::interpolate(a.get("x"), InterpolateSize::Size(vec![3, 10]), InterpolateMode::Nearest, None)
    }),
    ("interp_bilinear", |a| {
        F::interpolate(a.get("x"), InterpolateSize::Size(vec![7, 3]), InterpolateMode::Bilinear, Some(false))
    }),
    ("interp_bilinear_corners", |a| {
        F::interpolate(a.get("x"), scale(&[2.5, 2.5]), InterpolateMode::Bilinear, Some(true))
    }),
    ("adaptive_avg_pool2d", |a| F::adaptive_avg_pool2d(a.get("x"), (3, 4))),
    ("adaptive_avg_pool2d_divides", |a| F::adaptive_avg_pool2d(a.get("x"), (1, 1))),
    ("batch_norm_eval", |a| {
        let (mut rm, mut rv) = (a.get("rm").clone(), a.get("rv").clone());
        F::batch_norm(a.get("x"), Some(&mut rm), Some(&mut rv), Some(a.get("w")), Some(a.get("b")), false, 0.1, 1e-5)
    }),
    ("batch_norm_train", |a| {
        F::batch_norm(a.get("x"), None, None, Some(a.get("w")), Some(a.get("b")), true, 0.1, 1e-5)
    }),
    ("batch_norm_running", |a| {
        let (mut rm, mut rv) = (a.get("rm").clone(), a.get("rv").clone());
        let y = F::batch_norm(a.get("x"), Some(&mut rm), Some(&mut rv), None, None, true, 0.3, 1e-3);
        y.realize().expect("batch_norm");
        Tensor::cat(&[&rm, &rv], 0)
    }),
];

const CONVS: &[(&str, Call)] = &[
    ("conv2d_dilated", |a| {
        let options = Conv2dOptions { stride: (2, 1), padding: Padding::Explicit((1, 2)), dilation: (2, 1), groups: 2 };
        F::conv2d(a.get("x"), a.get("w"), Some(a.get("b")), options)
    }),
    ("conv2d_same", |a| {
        let options = Conv2dOptions { padding: Padding::Same, dilation: (1, 2), ..Default::default() };
        F::conv2d(a.get("x"), a.get("w"), None, options)
    }),
    ("conv2d_valid_depthwise", |a| {
        let options = Conv2dOptions { padding: Padding::Valid, dilation: (2, 2), groups: 3, ..Default::default() };
        F::conv2d(a.get("x"), a.get("w"), Some(a.get("b")), options)
    }),
    ("conv1d", |a| {
        let options = Conv1dOptions { stride: 2, padding: Padding::Explicit(1), dilation: 2, ..Default::default() };
        F::conv1d(a.get("x"), a.get("w"), Some(a.get("b")), options)
    }),
    ("conv1d_same_t", |a| {
        let options = Conv1dOptions { padding: Padding::Same, groups: 2, ..Default::default() };
        F::conv1d(a.get("x"), a.get("w"), None, options)
    }),
    ("conv_transpose2d", |a| {
        let options = ConvTranspose2dOptions {
            stride: (2, 3),
            padding: (1, 0),
            output_padding: (1, 2),
            groups: 2,
            dilation: (1, 2),
        };
        F::conv_transpose2d(a.get("x"), a.get("w"), Some(a.get("b")), options)
    }),
    ("conv_transpose2d_plain", |a| {
        let options = ConvTranspose2dOptions { stride: (2, 2), padding: (1, 1), ..Default::default() };
        F::conv_transpose2d(a.get("x"), a.get("w"), None, options)
    }),
    ("max_pool2d_ceil", |a| {
        let options = MaxPool2dOptions { stride: Some((2, 2)), padding: (1, 1), ceil_mode: true, ..Default::default() };
        F::max_pool2d(a.get("x"), (3, 3), options)
    }),
    ("max_pool2d_dilated", |a| {
        let options =
            MaxPool2dOptions { stride: Some((2, 3)), padding: (1, 0), dilation: Some((2, 2)), ..Default::default() };
        F::max_pool2d(a.get("x"), (3, 2), options)
    }),
    ("avg_pool2d_ceil_exclude", |a| {
        let options = AvgPool2dOptions {
            stride: Some((2, 2)),
            padding: (1, 1),
            ceil_mode: true,
            count_include_pad: false,
            ..Default::default()
        };
        F::avg_pool2d(a.get("x"), (3, 3), options)
    }),
    ("avg_pool2d_ceil_include", |a| {
        let options = AvgPool2dOptions { stride: Some((2, 2)), padding: (1, 1), ceil_mode: true, ..Default::default() };
        F::avg_pool2d(a.get("x"), (3, 3), options)
    }),
    ("avg_pool2d_divisor", |a| {
        F::avg_pool2d(a.get("x"), (2, 2), AvgPool2dOptions { divisor_override: Some(3), ..Default::default() })
    }),
];

#[test]
fn layers_match_pytorch() {
    run(LAYERS);
}

#[test]
fn norms_match_pytorch() {
    run(NORMS);
}

#[test]
fn attention_matches_pytorch() {
    run(ATTENTION);
}

#[test]
fn losses_match_pytorch() {
    run(LOSSES);
}

#[test]
fn spatial_forms_match_pytorch() {
    run(SPATIAL);
}

#[test]
fn convolutions_and_pooling_match_pytorch() {
    run(CONVS);
}

/// Every fixture in the file has a case above, so none is skipped silently.
#[test]
fn every_fixture_is_tested() {
    let in_file: BTreeSet<String> =
        fixtures().keys().filter_map(|k| k.split_once('.')).map(|(name, _)| name.to_string()).collect();
    let tested: BTreeSet<String> = [LAYERS, NORMS, ATTENTION, LOSSES, SPATIAL, CONVS]
        .iter()
        .flat_map(|c| c.iter())
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(in_file, tested);
}

/// The error of `t`, which must be an `Op` error of `op` whose message contains each of `parts`
/// and which names this file as the caller.
#[track_caller]
fn assert_error(t: &Tensor, op: &str, parts: &[&str]) {
    let e = t.realize().expect_err("an error");
    let text = e.to_string();
    assert!(text.starts_with(&format!("{op}: ")), "{text}");
    for p in parts {
        assert!(text.contains(p), "`{p}` not in: {text}");
    }
    assert!(text.contains("tests/it/functional.rs"), "not the caller's line: {text}");
}

#[test]
fn bad_arguments_are_errors_naming_the_function_and_shapes() {
    let x = Tensor::ones(&[2, 3, 4], DType::F32);
    assert_error(&F::layer_norm(&x, &[3], None, None, 1e-5), "layer_norm", &["[2, 3, 4]", "[3]"]);
    let w = Tensor::ones(&[4, 1], DType::F32);
    assert_error(&F::layer_norm(&x, &[4], Some(&w), None, 1e-5), "layer_norm", &["[4, 1]"]);
    assert_error(&F::rms_norm(&x, &[5], None, None), "rms_norm", &["[2, 3, 4]", "[5]"]);
    assert_error(&F::group_norm(&x, 2, None, None, 1e-5), "group_norm", &["[2, 3, 4]", "num_groups 2"]);
    assert_error(&F::dropout(&x, 1.5, true), "dropout", &["1.5"]);
    assert_error(&F::linear(&x, &Tensor::ones(&[4], DType::F32), None), "linear", &["[4]"]);
    assert_error(&F::embedding(&x, &Tensor::ones(&[5, 2], DType::F32)), "embedding", &["f32", "[2, 3, 4]"]);

    let q = Tensor::ones(&[1, 3, 2, 4], DType::F32);
    let kv = Tensor::ones(&[1, 2, 2, 4], DType::F32);
    let gqa = SdpaOptions { enable_gqa: true, ..Default::default() };
    assert_error(
        &F::scaled_dot_product_attention(&q, &kv, &kv, gqa),
        "scaled_dot_product_attention",
        &["[1, 3, 2, 4]", "multiple"],
    );
    let both =
        SdpaOptions { is_causal: true, attn_mask: Some(Tensor::ones(&[2, 2], DType::Bool)), ..Default::default() };
    assert_error(&F::scaled_dot_product_attention(&q, &q, &q, both), "scaled_dot_product_attention", &["is_causal"]);

    let logits = Tensor::ones(&[4, 5], DType::F32);
    let bad_target = Tensor::from_vec(vec![0i64, 1, 2], &[3]);
    assert_error(
        &F::cross_entropy(&logits, &bad_target, CrossEntropyOptions::default()),
        "cross_entropy",
        &["[4, 5]", "[3]"],
    );
    let target = Tensor::from_vec(vec![0i64, 1, 2, 3], &[4]);
    let bad_weight = CrossEntropyOptions { weight: Some(Tensor::ones(&[4], DType::F32)), ..Default::default() };
    assert_error(&F::cross_entropy(&logits, &target, bad_weight), "cross_entropy", &["[4]", "[5]"]);
    let smoothing = CrossEntropyOptions { label_smoothing: -0.1, ..Default::default() };
    assert_error(&F::cross_entropy(&logits, &target, smoothing), "cross_entropy", &["-0.1"]);
    assert_error(&F::nll_loss(&logits, &logits, NllLossOptions::default()), "nll_loss", &["f32", "[4, 5]"]);
    assert_error(&F::smooth_l1_loss(&logits, &logits, Reduction::Mean, -1.0), "smooth_l1_loss", &["-1"]);
    assert_error(
        &F::binary_cross_entropy(&logits, &x, None, Reduction::Mean),
        "binary_cross_entropy",
        &["[2, 3, 4]", "[4, 5]"],
    );
}

#[test]
fn bad_spatial_arguments_are_errors_naming_the_function_and_shapes() {
    let x = Tensor::ones(&[2, 3, 4, 5], DType::F32);
    assert_error(&F::pad(&x, &[1, 2, 3], PadMode::Constant, 0.0), "pad", &["even", "[2, 3, 4, 5]"]);
    assert_error(&F::pad(&x, &[5, 0, 0, 0], PadMode::Reflect, 0.0), "pad", &["reflect", "below the size 5"]);
    assert_error(&F::pad(&x, &[1, 1], PadMode::Reflect, 0.0), "pad", &["trailing axes of a [C, *] or [N, C, *]"]);
    assert_error(&F::pad(&x, &[-1, 0], PadMode::Replicate, 0.0), "pad", &["negative", "constant mode"]);
    assert_error(&F::pad(&x, &[-3, -3], PadMode::Constant, 0.0), "pad", &["crops 6", "size 5"]);
    assert_error(&F::pad(&x, &[0, 6, 0, 0], PadMode::Circular, 0.0), "pad", &["at most the size 5"]);
    let bilinear = F::interpolate(&x.sum(&[0]), InterpolateSize::Size(vec![2, 2]), InterpolateMode::Bilinear, None);
    assert_error(&bilinear, "interpolate", &["[3, 4, 5]", "2 spatial axes"]);
    let factors = F::interpolate(&x, InterpolateSize::Scale(vec![2.0]), InterpolateMode::Nearest, None);
    assert_error(&factors, "interpolate", &["one positive size or factor per spatial axis"]);
    let corners = F::interpolate(&x, InterpolateSize::Scale(vec![2.0, 2.0]), InterpolateMode::Nearest, Some(true));
    assert_error(&corners, "interpolate", &["align_corners"]);
    assert_error(&F::adaptive_avg_pool2d(&x, (0, 2)), "adaptive_avg_pool2d", &["[2, 3, 4, 5]", "(0, 2)"]);
    assert_error(&F::batch_norm(&x, None, None, None, None, false, 0.1, 1e-5), "batch_norm", &["running_mean"]);
    let w = Tensor::ones(&[2, 3, 3, 3], DType::F32);
    let strided_same = Conv2dOptions { stride: (2, 2), padding: Padding::Same, ..Default::default() };
    assert_error(&F::conv2d(&x, &w, None, strided_same), "conv2d", &["\"same\" needs stride 1"]);
    let wide = Conv2dOptions { dilation: (3, 1), ..Default::default() };
    assert_error(&F::conv2d(&x, &w, None, wide), "conv2d", &["dilated by (3, 1) (extent 7x3)", "input 4x5"]);
    assert_error(&F::conv1d(&x, &w, None, Conv1dOptions::default()), "conv1d", &["[N, C, L]", "[2, 3, 4, 5]"]);
    let big = ConvTranspose2dOptions { stride: (2, 2), output_padding: (2, 0), ..Default::default() };
    let wt = Tensor::ones(&[3, 2, 3, 3], DType::F32);
    assert_error(&F::conv_transpose2d(&x, &wt, None, big), "conv_transpose2d", &["output_padding (2, 0)"]);
    let zero = MaxPool2dOptions { dilation: Some((0, 1)), ..Default::default() };
    assert_error(&F::max_pool2d(&x, (2, 2), zero), "max_pool2d", &["dilation (0, 1)"]);
    let divisor = AvgPool2dOptions { divisor_override: Some(0), ..Default::default() };
    assert_error(&F::avg_pool2d(&x, (2, 2), divisor), "avg_pool2d", &["divisor_override"]);
    let mut short = Tensor::zeros(&[2], DType::F32);
    let bn = F::batch_norm(&x, Some(&mut short), None, None, None, true, 0.1, 1e-5);
    assert_error(&bn, "batch_norm", &["[2]", "[3]"]);
}

/// Batch norm in training mode with a symbolic batch: the running variance's Bessel correction
/// uses the bound batch size.
#[test]
fn batch_norm_running_statistics_with_a_symbolic_batch() {
    let data: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let fixed = Tensor::from_vec(data.clone(), &[4, 3, 2]);
    let symbolic = Tensor::from_vec(data, &[4, 3, 2]).with_dims(vec![kiln::Dim::sym("n"), 3.into(), 2.into()]);
    assert!(symbolic.shape()[0].as_const().is_none());
    let stats = |x: &Tensor| {
        let (mut rm, mut rv) = (Tensor::zeros(&[3], DType::F32), Tensor::ones(&[3], DType::F32));
        let y = F::batch_norm(x, Some(&mut rm), Some(&mut rv), None, None, true, 0.5, 1e-5);
        kiln::realize(&[&y, &rm, &rv]).unwrap();
        Tensor::cat(&[&rm, &rv], 0)
    };
    assert_close("running statistics", &stats(&symbolic), &stats(&fixed), 1e-6);
}

/// Out-of-range class ids fail the realize (as PyTorch raises), other than the ignored value.
#[test]
fn out_of_range_targets_fail_the_realize() {
    let logits = Tensor::ones(&[2, 3], DType::F32);
    let bad = Tensor::from_vec(vec![0i32, 3], &[2]);
    assert!(F::cross_entropy(&logits, &bad, CrossEntropyOptions::default()).realize().is_err());
    let ignored = Tensor::from_vec(vec![0i32, -100], &[2]);
    let loss = F::cross_entropy(&logits, &ignored, CrossEntropyOptions::default());
    assert!((loss.item::<f32>().unwrap() - 3f32.ln()).abs() < 1e-6);
}

#[test]
fn dropout_zeroes_and_scales_in_training_only() {
    let x = Tensor::ones(&[2000], DType::F32);
    assert!(Tensor::ptr_eq(&F::dropout(&x, 0.3, false), &x));
    kiln::manual_seed(7);
    let a: Vec<f32> = F::dropout(&x, 0.25, true).to_vec().unwrap();
    kiln::manual_seed(7);
    let b: Vec<f32> = F::dropout(&x, 0.25, true).to_vec().unwrap();
    assert_eq!(a, b, "the global generator's seed decides the mask");
    let kept = a.iter().filter(|&&v| v != 0.0).count();
    assert!(a.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6), "kept values are scaled by 1/(1-p)");
    assert!((1350..1650).contains(&kept), "about 3/4 kept, got {kept} of 2000");
    let zeros: Vec<f32> = F::dropout(&x, 1.0, true).to_vec().unwrap();
    assert!(zeros.iter().all(|&v| v == 0.0));
    // Attention weights dropped with p = 1 leave nothing.
    let q = Tensor::ones(&[2, 3, 4], DType::F32);
    let all_dropped = SdpaOptions { dropout_p: 1.0, ..Default::default() };
    let out: Vec<f32> = F::scaled_dot_product_attention(&q, &q, &q, all_dropped).to_vec().unwrap();
    assert!(out.iter().all(|&v| v == 0.0));
}

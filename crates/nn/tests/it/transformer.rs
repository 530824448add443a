//! The GPT-style decoder against PyTorch (tests/fixtures/nn_transformer.safetensors: the anchor
//! model of /work/shared/anchors/bench_transformer.py, dim 64, 8 heads, 2 layers, vocab 64,
//! tokens [10, 3]): logits, gradients of the cross-entropy, and three Adam steps.

use crate::common;

use common::{assert_close, transformer_and_fixture};
use kiln::Tensor;
use kiln_nn::*;

#[test]
fn logits_and_gradients_match_pytorch() {
    let (model, f) = transformer_and_fixture();
    let logits = model.forward(&f.get("x"));
    let loss = cross_entropy(&logits, &f.get("targets"));
    let params = model.named_parameters();
    assert_eq!(params.len(), 5 + 2 * 16, "wte, wpe, ln_f (2), head, and 16 per block");
    let refs: Vec<&Tensor> = params.iter().map(|(_, t)| t).collect();
    let grads = kiln::grad(&loss, &refs).unwrap();
    let mut all = vec![&logits, &loss];
    all.extend(grads.iter());
    kiln::realize(&all).unwrap();
    // Logits within 1e-4 (absolute: logits are O(1)).
    let (got, want) = (common::values("logits", &logits), common::values("logits", &f.get("out")));
    let abs = air::testing::assert_close("logits", &got, &want, air::testing::Tol { atol: 1e-4, rtol: 0.0 }).max_abs;
    eprintln!("transformer logits: max abs error {abs:.2e}");
    let mut worst = 0f64;
    for ((name, _), g) in params.iter().zip(&grads) {
        worst = worst.max(assert_close(&format!("grad.{name}"), g, &f.get(&format!("grad.{name}")), 1e-4));
    }
    eprintln!("transformer gradients: max error {worst:.2e}");
}

#[test]
fn three_adam_steps_match_pytorch_and_reuse_one_graph() {
    let (model, f) = transformer_and_fixture();
    let mut trainer = Trainer::new(model, Adam::new(1e-3), Loss::CrossEntropy);
    let (x, y) = (f.get("x"), f.get("targets"));
    let before = kiln::stats::graphs_executed();
    let losses = trainer.fit(&[(x, y)], 3).unwrap();
    // One graph per step (forward + backward + update), and all three have one structure: the
    // program cache key is the same, so only step 1 compiles.
    assert_eq!(kiln::stats::graphs_executed() - before, 3);
    assert_eq!(trainer.distinct_step_graphs(), 1);
    let want = f.get("losses").to_vec::<f32>().unwrap();
    eprintln!("losses {losses:?} (PyTorch {want:?})");
    assert!(losses[2] < losses[0], "the loss goes down");
    assert_close("losses", &Tensor::from_vec(losses, &[3]), &f.get("losses"), 1e-5);
    // Adam divides by sqrt(v): where a gradient is tiny, float rounding of the gradient moves the
    // update by a visible fraction of the step (lr = 1e-3), hence 5e-5 rather than 1e-5.
    let mut worst = 0f64;
    for (name, p) in trainer.model.named_parameters() {
        worst = worst.max(assert_close(&format!("step3.{name}"), &p, &f.get(&format!("step3.{name}")), 5e-5));
    }
    eprintln!("transformer after 3 Adam steps: max parameter error {worst:.2e}");
}

#[test]
fn a_sequence_longer_than_max_seq_len_is_an_error_never_wrong_logits() {
    let config = TransformerConfig { dim: 8, n_heads: 2, n_layers: 1, norm_eps: 1e-5, vocab_size: 16, max_seq_len: 4 };
    let model = Transformer::from_config(config).unwrap();
    let ids = |len: usize| Tensor::from_vec((0..len as i64).map(|i| i % 16).collect::<Vec<_>>(), &[1, len]);
    let symbolic = |len: usize| ids(len).with_dims(vec![kiln::Dim::from(1), kiln::Dim::sym("seq")]);
    let is_narrow_past_the_end = |e: &kiln::Error, len: usize| match e {
        kiln::Error::Op { op: "narrow", message, location } => {
            message.contains(&format!("{len}")) && location.file().contains("nn") && location.file().ends_with(".rs")
        }
        _ => false,
    };
    // Concrete: the narrow of the position embedding fails when the graph is built.
    let e = model.forward(&ids(6)).to_vec::<f32>().unwrap_err();
    assert!(is_narrow_past_the_end(&e, 6), "{e}");
    // Symbolic: one program for every length; a length that fits runs and agrees with the
    // concrete model, a longer one is an error when it runs.
    let fits = model.forward(&symbolic(3)).to_vec::<f32>().unwrap();
    let concrete = model.forward(&ids(3)).to_vec::<f32>().unwrap();
    let worst = fits.iter().zip(&concrete).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(fits.len() == 3 * 16 && worst < 1e-5, "symbolic and concrete logits differ by {worst}");
    assert_eq!(model.forward(&symbolic(4)).to_vec::<f32>().unwrap().len(), 4 * 16);
    for len in [5, 9, 1000] {
        let e = model.forward(&symbolic(len)).to_vec::<f32>().unwrap_err();
        assert!(is_narrow_past_the_end(&e, len), "seq = {len}: {e}");
        assert!(e.to_string().contains(&format!("seq = {len} > size 4")), "{e}");
    }
}

#[test]
fn the_recorded_forward_matches_pytorch_and_differentiates() {
    // From the second call on, the forward is recorded (`Transformer::recorder`): a call adds one
    // node. Its logits and gradients are PyTorch's still, and new weights are seen.
    let (mut model, f) = transformer_and_fixture();
    let want = common::values("logits", &f.get("out"));
    for call in 0..4 {
        let logits = model.forward(&f.get("x"));
        assert!(!logits.is_realized());
        let loss = cross_entropy(&logits, &f.get("targets"));
        let params = model.named_parameters();
        let refs: Vec<&Tensor> = params.iter().map(|(_, t)| t).collect();
        let grads = kiln::grad(&loss, &refs).unwrap();
        let mut all = vec![&logits, &loss];
        all.extend(grads.iter());
        kiln::realize(&all).unwrap();
        let got = common::values("logits", &logits);
        air::testing::assert_close("logits", &got, &want, air::testing::Tol { atol: 1e-4, rtol: 0.0 });
        for ((name, _), g) in params.iter().zip(&grads) {
            assert_close(&format!("call {call}: grad.{name}"), g, &f.get(&format!("grad.{name}")), 1e-4);
        }
        // The block's recording (made at the second block of the first call), then the model's.
        assert_eq!(model.recorder.recordings(), 1 + usize::from(call >= 1), "call {call}");
    }
    // A new head weight (same type) is an argument of the recording, not a stale constant.
    model.head.weight = model.head.weight.mul(0.0f32).to_host().map(Tensor::from_host).unwrap();
    let logits = model.forward(&f.get("x"));
    assert!(logits.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
    assert_eq!(model.recorder.recordings(), 2);
}

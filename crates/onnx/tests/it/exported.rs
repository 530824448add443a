//! Models exported to ONNX by other tools match onnxruntime's recorded outputs, lazily and
//! through a compiled `Session` traced once for two sizes of a symbolic batch:
//! `torch.onnx.export` (`fixtures/gen_onnx.py`: an MLP, a CNN with conv, batch norm, max pooling,
//! a residual add and global average pooling, a recurrent model, a tiny GPT-2, an upsampling
//! decoder with ConvTranspose and Resize, RoBERTa, BLOOM, DeBERTa-v2 and Swin from
//! `transformers`, whose shape arithmetic must stay symbolic, and BERT with an attention mask
//! through the dynamo exporter) within 1e-4 at batch sizes 1 and 3; and skl2onnx
//! (`fixtures/gen_sklearn.py`: scikit-learn models of the `ai.onnx.ml` domain) at 5 and 2 rows.

use std::path::PathBuf;

use air::testing::{Tol, check_host};
use kiln::{Device, Tensor};
use kiln_onnx::Model;
use kiln_onnx::proto::TensorProto;
use prost::Message;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn read(name: &str) -> kiln::HostTensor {
    let bytes = std::fs::read(fixture(name)).unwrap();
    kiln_onnx::from_tensor_proto(&TensorProto::decode(bytes.as_slice()).unwrap(), None).unwrap()
}

/// Checks `name` on the interpreter, the CPU device and (where this machine has an adapter, and
/// always under `CI` or `KILN_REQUIRE_VULKAN=1`) wgpu.
fn check_everywhere(name: &str) {
    on_every_device(name, check_model);
}

/// `check(name, device)` on the CPU device, the interpreter and wgpu (see [`check_everywhere`]).
fn on_every_device(name: &str, check: fn(&str, Device)) {
    check(name, Device::Cpu);
    check(name, Device::Interp);
    match Device::Wgpu.probe() {
        Ok(()) => check(name, Device::Wgpu),
        Err(e) => {
            let required =
                std::env::var_os("CI").is_some() || std::env::var_os("KILN_REQUIRE_VULKAN").is_some_and(|v| v == "1");
            assert!(!required, "wgpu is unavailable where it is required (CI or KILN_REQUIRE_VULKAN=1): {e}");
            eprintln!("skipping {name} on wgpu: {e}");
        }
    }
}

fn check_model(name: &str, device: Device) {
    let model = Model::load(fixture(&format!("{name}.onnx"))).unwrap();
    assert!(model.unsupported().is_empty(), "{:?}", model.unsupported());
    let mut session = model.session();
    for batch in [1, 3] {
        // Input 0 from `_input.pb`, any further ones (an attention mask) from `_input_<i>.pb`.
        let xs: Vec<Tensor> = (0..model.inputs().len())
            .map(|i| {
                let file = match i {
                    0 => format!("{name}_b{batch}_input.pb"),
                    i => format!("{name}_b{batch}_input_{i}.pb"),
                };
                model.input_tensor(i, read(&file), device).unwrap()
            })
            .collect();
        assert_eq!(xs[0].shape()[0].to_string(), "batch", "the batch stays symbolic");
        let want = read(&format!("{name}_b{batch}_output.pb"));
        // The imported graph run lazily, and the compiled session (twice: the second call runs
        // the compiled program directly).
        let args: Vec<&Tensor> = xs.iter().collect();
        let lazy: Tensor = model.run(&xs).unwrap().remove(0);
        let compiled = session.run(&args).unwrap().remove(0);
        let again = session.run(&args).unwrap().remove(0);
        for (how, y) in [("run", lazy), ("session", compiled), ("session, again", again)] {
            check_host(&y.to_host().unwrap(), &want, Tol { atol: 1e-4, rtol: 1e-4 })
                .unwrap_or_else(|e| panic!("{name} ({how}) at batch {batch} on {}: {e}", device.name()));
        }
    }
    assert_eq!(session.traces(), 1, "one trace serves both batch sizes");
}

#[test]
fn exported_mlp_matches_onnxruntime() {
    check_everywhere("mlp");
}

#[test]
fn exported_cnn_matches_onnxruntime() {
    check_everywhere("cnn");
}

#[test]
fn exported_recurrent_model_matches_onnxruntime() {
    // A bidirectional GRU into an LSTM: ONNX's GRU (linear_before_reset) and LSTM ops.
    check_everywhere("rnn");
}

#[test]
fn exported_gpt2_matches_onnxruntime_at_two_batch_sizes_and_sequence_lengths() {
    // transformers' GPT-2 with dynamic batch and sequence axes: its reshapes, masks and position
    // ids are computed from `Shape` ops, so both axes stay symbolic and one trace serves batch 1
    // of 5 tokens and batch 3 of 9.
    check_everywhere("gpt2");
}

#[test]
fn exported_upsampling_decoder_matches_onnxruntime() {
    // ConvTranspose (stride 2, output padding 1), bilinear and nearest Resize, as
    // torch.onnx.export writes them.
    check_everywhere("upsample");
}

// Four `transformers` exports whose shapes are computed over the symbolic batch and sequence in
// ways the importer must follow, each from one trace at two sizes (text: batch 1 of 5 tokens and
// batch 3 of 9; Swin: batch 1 and 3):
// positions as a CumSum over the sequence (RoBERTa), ALiBi slopes tiled over the batch and
// `heads*batch / heads` (BLOOM), a reshape's `-1` that is `batch` (DeBERTa-v2), and a pad of a
// symbolic batch of windows (Swin).

#[test]
fn exported_roberta_matches_onnxruntime() {
    check_everywhere("roberta");
}

#[test]
fn exported_bloom_matches_onnxruntime() {
    check_everywhere("bloom");
}

#[test]
fn exported_deberta_matches_onnxruntime() {
    check_everywhere("deberta");
}

#[test]
fn exported_swin_matches_onnxruntime() {
    check_everywhere("swin");
}

#[test]
fn dynamo_exported_bert_with_a_mask_matches_onnxruntime() {
    // torch.onnx.export's default exporter since torch 2.9: opset 20, LayerNormalization and Gelu
    // ops, and the attention mask indexed by broadcast ranges over batch and sequence (a
    // GatherND over symbolic dims); the last token of the first row is masked out.
    check_everywhere("bert_dynamo");
}

/// A scikit-learn fixture (`fixtures/gen_sklearn.py`): every output (labels, probabilities or
/// values) against onnxruntime's at 5 and 2 rows, with the row count the symbolic `N` (one
/// session trace), on `device`.
fn check_sklearn(name: &str, device: Device) {
    let model = Model::load(fixture(&format!("sk_{name}.onnx"))).unwrap();
    assert!(model.unsupported().is_empty(), "{:?}", model.unsupported());
    let mut session = model.session();
    for rows in [5, 2] {
        let x = model.input_tensor(0, read(&format!("sk_{name}_r{rows}_input.pb")), device).unwrap();
        assert_eq!(x.shape()[0].to_string(), "N", "the row count stays symbolic");
        let lazy = model.run(std::slice::from_ref(&x)).unwrap();
        let compiled = session.run(&[&x]).unwrap();
        for (how, outputs) in [("run", lazy), ("session", compiled)] {
            assert_eq!(outputs.len(), model.outputs().len());
            for (i, y) in outputs.iter().enumerate() {
                let want = read(&format!("sk_{name}_r{rows}_output_{i}.pb"));
                check_host(&y.to_host().unwrap(), &want, Tol { atol: 1e-5, rtol: 1e-4 }).unwrap_or_else(|e| {
                    panic!("sk_{name} ({how}) output {i} at {rows} rows on {}: {e}", device.name())
                });
            }
        }
    }
    assert_eq!(session.traces(), 1, "one trace serves both row counts");
}

#[test]
fn scikit_learn_models_match_onnxruntime() {
    // `ai.onnx.ml` ops as skl2onnx writes them: Scaler, LinearClassifier and Normalizer (a
    // pipeline), TreeEnsembleClassifier (a random forest; gradient boosting, binary),
    // TreeEnsembleRegressor (gradient boosting), SVMClassifier and SVMRegressor (RBF kernels),
    // and a nearest-neighbours regressor (ArrayFeatureExtractor over TopK's indices).
    for name in ["pipeline", "forest", "boosting", "boosting_binary", "svc", "svr", "knn"] {
        on_every_device(name, check_sklearn);
    }
}

#[test]
fn exported_resnet_with_a_dynamic_image_size_matches_onnxruntime() {
    // Batch, height and width all symbolic: the stem's stride-2 convolution and max pool and
    // the stage's strided convolution have floor-division output sizes (`Dim::floor_div`), bound
    // when the program runs; batch 1 at 32x32 and batch 3 at 45x37 from one trace.
    check_everywhere("resnet_hw");
}

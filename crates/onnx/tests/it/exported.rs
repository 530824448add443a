//! Models exported by `torch.onnx.export` (`fixtures/gen_onnx.py`: an MLP, a CNN with conv,
//! batch norm, max pooling, a residual add and global average pooling, a recurrent model, a tiny
//! GPT-2, an upsampling decoder with ConvTranspose and Resize, RoBERTa, BLOOM, DeBERTa-v2 and
//! Swin from `transformers`, whose shape arithmetic must stay symbolic, and BERT with an attention
//! mask through the dynamo exporter) match onnxruntime's
//! recorded outputs within 1e-4 at batch sizes 1 and 3, with the batch a symbolic dim (one
//! program serves both sizes), lazily and through a compiled `Session` traced once.

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
    check_model(name, Device::Cpu);
    check_model(name, Device::Interp);
    match Device::Wgpu.probe() {
        Ok(()) => check_model(name, Device::Wgpu),
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

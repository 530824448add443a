//! Saving and loading parameter trees as safetensors: names, round trips, and all-or-nothing
//! loading with every mismatch reported.

use std::collections::HashMap;

use kiln::{DType, Tensor};
use kiln_nn::*;

fn tiny() -> Transformer {
    Transformer::from_config(TransformerConfig {
        dim: 8,
        n_heads: 2,
        n_layers: 2,
        norm_eps: 1e-5,
        vocab_size: 11,
        max_seq_len: 6,
    })
    .unwrap()
}

fn values(m: &dyn Module) -> Vec<(String, Vec<f32>)> {
    m.state_dict().into_iter().map(|(n, t, _)| (n, t.to_vec::<f32>().unwrap())).collect()
}

#[test]
fn names_form_a_dotted_tree() {
    let names: Vec<String> = tiny().named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(&names[..4], ["wte.weight", "wpe.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias"]);
    assert!(names.contains(&"blocks.1.attn.q.weight".to_string()));
    assert!(names.contains(&"blocks.0.mlp.proj.bias".to_string()));
    assert_eq!(names.last().unwrap(), "head.weight");
    let bn: Vec<(String, ParamKind)> =
        BatchNorm2d::new(3, 1e-5).state_dict().into_iter().map(|(n, _, k)| (n, k)).collect();
    assert_eq!(bn[2], ("running_mean".to_string(), ParamKind::Buffer));
}

#[test]
fn save_then_load_round_trips() {
    kiln::manual_seed(1);
    let a = tiny();
    kiln::manual_seed(2);
    let mut b = tiny();
    assert_ne!(values(&a), values(&b));
    let path = std::env::temp_dir().join(format!("kiln_nn_roundtrip_{}.safetensors", std::process::id()));
    save_safetensors(&a, &path).unwrap();
    load_safetensors(&mut b, &path, true).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(values(&a), values(&b));
    let ids = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2]);
    assert_eq!(a.forward(&ids).to_vec::<f32>().unwrap(), b.forward(&ids).to_vec::<f32>().unwrap());
    // Loaded parameters are trainable.
    assert!(b.parameters().iter().all(Tensor::requires_grad));
}

#[test]
fn mismatches_are_all_reported_and_nothing_loads() {
    let mut model = tiny();
    let original = values(&model);
    let mut tensors = read_safetensors(&to_safetensors_bytes(&tiny()).unwrap()).unwrap();
    tensors.insert("blocks.0.attn.q.weight".into(), Tensor::zeros(&[8, 7], DType::F32).realize().unwrap().clone());
    tensors.insert("head.weight".into(), Tensor::from_vec(vec![0f64; 88], &[11, 8]));
    tensors.remove("ln_f.bias");
    tensors.insert("extra.weight".into(), Tensor::from_vec(vec![0f32], &[1]));
    let err = load_state_dict(&mut model, &tensors, true).unwrap_err();
    let text = err.to_string();
    for needle in [
        "`blocks.0.attn.q.weight` has shape [8, 7] but the model expects [8, 8]",
        "`head.weight` has dtype f64 but the model expects f32",
        "`ln_f.bias` is missing",
        "`extra.weight` is not a tensor of the model",
        "nothing was loaded",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
    assert!(matches!(err, NnError::Mismatch(ref v) if v.len() == 4));
    assert_eq!(values(&model), original, "a failed load changes nothing");
    // Not strict: extra names are fine, but missing and mismatched ones still fail.
    tensors.remove("extra.weight");
    assert!(load_state_dict(&mut model, &tensors, false).is_err());
    assert_eq!(values(&model), original);
}

#[test]
fn bad_files_are_errors() {
    assert!(matches!(read_safetensors(b"not a safetensors file"), Err(NnError::SafeTensors(_))));
    let mut model = Linear::new(2, 2, true);
    assert!(matches!(load_safetensors(&mut model, "/nonexistent/w.safetensors", true), Err(NnError::Io(_))));
    let empty: HashMap<String, Tensor> = HashMap::new();
    assert!(load_state_dict(&mut model, &empty, false).is_err());
}

#[test]
fn bad_configs_are_errors() {
    assert!(matches!(Transformer::new(10, 3, 1, 1e-5, 5), Err(NnError::Config(_))));
    assert!(Conv2d::new(3, 4, (3, 3), (1, 1), (0, 0), 2, true).is_err());
    // A shape error in forward is an error tensor, not a panic.
    let err = Conv2d::new(3, 4, (3, 3), (1, 1), (0, 0), 1, true).unwrap().forward(&Tensor::ones(&[3, 5], DType::F32));
    assert!(err.realize().is_err());
}

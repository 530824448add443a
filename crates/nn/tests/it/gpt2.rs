//! GPT-2 checkpoints against Hugging Face `transformers` (tests/fixtures/gpt2_tiny, written by
//! tests/fixtures/gen_gpt2.py: a tiny random `GPT2LMHeadModel` saved with `save_pretrained`, its
//! logits, and the tokens of its greedy `generate` with the cache on): logits, greedy decoding by
//! full recompute and from the key/value cache (`forward_at`), both name layouts, other dtypes,
//! and the loader's errors.

use crate::common;

use std::collections::HashMap;
use std::path::PathBuf;

use air::testing::{Tol, assert_close};
use kiln::{Device, Tensor};
use kiln_nn::*;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

const HEADS: usize = 4;
const VOCAB: usize = 100;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/gpt2_tiny"))
}

fn weights_path() -> PathBuf {
    dir().join("model.safetensors")
}

/// The reference tensors of `transformers` (`forward.ids`, `forward.logits`, `greedy1.prompt`...).
fn reference() -> HashMap<String, Tensor> {
    let bytes = std::fs::read(dir().join("reference.safetensors")).expect("reference fixture");
    read_safetensors(&bytes).expect("reference parses")
}

fn ids_of(t: &Tensor) -> (Vec<i64>, [usize; 2]) {
    let dims = t.dims().unwrap();
    (t.to_vec::<i64>().unwrap(), [dims[0], dims[1]])
}

fn logits(model: &Transformer, ids: &[i64], shape: [usize; 2], device: Device) -> Vec<f32> {
    let ids = Tensor::from_vec(ids.to_vec(), &shape).to_device(device).unwrap();
    model.forward(&ids).to_vec::<f32>().unwrap()
}

/// One tensor of a safetensors file, owned, to rewrite a checkpoint in memory.
struct Owned {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn file_tensors(bytes: &[u8]) -> Vec<(String, Owned)> {
    let file = SafeTensors::deserialize(bytes).unwrap();
    let mut out: Vec<(String, Owned)> = file
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, Owned { dtype: v.dtype(), shape: v.shape().to_vec(), data: v.data().to_vec() }))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn serialize(tensors: &[(String, Owned)]) -> Vec<u8> {
    let views: Vec<(&str, TensorView)> = tensors
        .iter()
        .map(|(n, t)| (n.as_str(), TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap()))
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// The fixture's weights with `edit` applied to the list of tensors, as safetensors bytes.
fn edited(edit: impl FnOnce(&mut Vec<(String, Owned)>)) -> Vec<u8> {
    let mut tensors = file_tensors(&std::fs::read(weights_path()).unwrap());
    edit(&mut tensors);
    serialize(&tensors)
}

fn f32s(t: &Owned) -> Vec<f32> {
    assert_eq!(t.dtype, Dtype::F32);
    t.data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn owned_f32(shape: &[usize], values: &[f32]) -> Owned {
    Owned { dtype: Dtype::F32, shape: shape.to_vec(), data: values.iter().flat_map(|x| x.to_le_bytes()).collect() }
}

fn load_bytes(bytes: &[u8]) -> Result<Transformer> {
    gpt2_from_safetensors(bytes, &Gpt2Options::with_heads(HEADS))
}

fn load_error(bytes: &[u8]) -> String {
    match load_bytes(bytes) {
        Ok(_) => panic!("the edited checkpoint loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn loads_the_fixture_with_sizes_from_shapes_and_heads_from_config_json() {
    let model = load_gpt2(weights_path()).unwrap();
    let config =
        TransformerConfig { dim: 64, n_heads: 4, n_layers: 2, norm_eps: 1e-5, vocab_size: VOCAB, max_seq_len: 64 };
    assert_eq!(model.config, config);
    assert_eq!(model.blocks.len(), 2);
    assert_eq!(model.blocks[0].attn.n_heads, 4);
    assert_eq!(model.blocks[1].mlp.fc.weight.dims().unwrap(), [256, 64]);
    assert_eq!(model.blocks[1].mlp.activation, Activation::GeluTanh);
    // The head is tied: the same tensor as the token embedding.
    assert_eq!(model.head.weight.to_vec::<f32>().unwrap(), model.wte.weight.to_vec::<f32>().unwrap());
    assert!(model.head.bias.is_none());
}

#[test]
fn the_split_of_the_fused_qkv_follows_conv1d_layout() {
    // c_attn.weight is [in, 3 * out]: q's weight row o, column i is c_attn[i][o], k's is
    // c_attn[i][64 + o], v's c_attn[i][128 + o]; the bias splits in thirds.
    let tensors = file_tensors(&std::fs::read(weights_path()).unwrap());
    let get = |name: &str| f32s(&tensors.iter().find(|(n, _)| n == name).unwrap().1);
    let (w, b) = (get("transformer.h.1.attn.c_attn.weight"), get("transformer.h.1.attn.c_attn.bias"));
    let model = load_gpt2(weights_path()).unwrap();
    let attn = &model.blocks[1].attn;
    for (part, linear) in [&attn.q, &attn.k, &attn.v].into_iter().enumerate() {
        let weight = linear.weight.to_vec::<f32>().unwrap();
        for (o, i) in [(0, 0), (3, 17), (63, 5), (10, 63)] {
            assert_eq!(weight[o * 64 + i], w[i * 192 + part * 64 + o], "part {part} [{o}, {i}]");
        }
        assert_eq!(linear.bias.as_ref().unwrap().to_vec::<f32>().unwrap(), b[part * 64..(part + 1) * 64]);
    }
    let c_proj = get("transformer.h.1.attn.c_proj.weight");
    assert_eq!(attn.o.weight.to_vec::<f32>().unwrap()[5 * 64 + 9], c_proj[9 * 64 + 5]);
}

#[test]
fn logits_match_hugging_face_on_the_interpreter_and_the_cpu() {
    let reference = reference();
    let (ids, shape) = ids_of(&reference["forward.ids"]);
    let want = common::values("forward.logits", &reference["forward.logits"]);
    assert_eq!(want.len(), 2 * 7 * VOCAB);
    let mut model = load_gpt2(weights_path()).unwrap();
    for device in [Device::Interp, Device::Cpu] {
        model.to_device(device).unwrap();
        let got: Vec<f64> = logits(&model, &ids, shape, device).into_iter().map(f64::from).collect();
        let close = assert_close(&format!("logits on {device}"), &got, &want, Tol { atol: 1e-4, rtol: 0.0 });
        eprintln!("GPT-2 logits on {device}: max abs error {:.2e}", close.max_abs);
    }
}

/// The index of the largest logit (the first on ties, as torch's argmax).
fn argmax(logits: &[f32]) -> i64 {
    (0..logits.len()).fold(0, |best, i| if logits[i] > logits[best] { i } else { best }) as i64
}

/// Greedy decoding by full recompute: the whole sequence through the model at every step (on the
/// CPU), the argmax of each row's last position appended.
fn greedy_by_recompute(model: &Transformer, prompt: &[i64], rows: usize, new_tokens: usize) -> Vec<Vec<i64>> {
    let mut seqs: Vec<Vec<i64>> = prompt.chunks(prompt.len() / rows).map(<[i64]>::to_vec).collect();
    let mut out = vec![Vec::new(); rows];
    for _ in 0..new_tokens {
        let len = seqs[0].len();
        let flat: Vec<i64> = seqs.concat();
        // The length is a symbol: one compiled program serves every step.
        let ids =
            Tensor::from_vec(flat, &[rows, len]).with_dims(vec![kiln::Dim::from(rows as i64), kiln::Dim::sym("seq")]);
        let all = model.forward(&ids).to_vec::<f32>().unwrap();
        for (row, seq) in seqs.iter_mut().enumerate() {
            let best = argmax(&all[(row * len + len - 1) * VOCAB..(row * len + len) * VOCAB]);
            seq.push(best);
            out[row].push(best);
        }
    }
    out
}

#[test]
fn greedy_decoding_by_recompute_reproduces_hugging_face_generate() {
    let reference = reference();
    let model = load_gpt2(weights_path()).unwrap();
    for case in ["greedy1", "greedy2"] {
        let (prompt, [rows, _]) = ids_of(&reference[&format!("{case}.prompt")]);
        let (want, [want_rows, new_tokens]) = ids_of(&reference[&format!("{case}.tokens")]);
        assert_eq!((want_rows, new_tokens), (rows, 20));
        let got = greedy_by_recompute(&model, &prompt, rows, new_tokens);
        assert_eq!(got.concat(), want, "{case}: Kiln's greedy tokens vs transformers' generate");
    }
}

#[test]
fn both_name_layouts_and_an_explicit_head_load_the_same_model() {
    let reference = reference();
    let (ids, shape) = ids_of(&reference["forward.ids"]);
    let want = logits(&load_gpt2(weights_path()).unwrap(), &ids, shape, Device::Cpu);
    // `GPT2Model`'s names: no `transformer.` prefix.
    let bare = edited(|tensors| {
        for (name, _) in tensors.iter_mut() {
            *name = name.strip_prefix("transformer.").unwrap().to_string();
        }
    });
    assert!(!SafeTensors::deserialize(&bare).unwrap().names().iter().any(|n| n.starts_with("transformer.")));
    assert_eq!(logits(&load_bytes(&bare).unwrap(), &ids, shape, Device::Cpu), want);
    // An explicit `lm_head.weight` is the head: equal to `wte` it changes nothing; twice `wte` doubles
    // every logit (the head is linear and has no bias).
    for (scale, name_prefix) in [(1.0f32, "transformer."), (2.0, "transformer."), (2.0, "")] {
        let bytes = edited(|tensors| {
            let wte = tensors.iter().find(|(n, _)| n == "transformer.wte.weight").unwrap();
            let head: Vec<f32> = f32s(&wte.1).iter().map(|x| x * scale).collect();
            let head = owned_f32(&[VOCAB, 64], &head);
            for (name, _) in tensors.iter_mut() {
                *name = format!("{name_prefix}{}", name.strip_prefix("transformer.").unwrap());
            }
            tensors.push(("lm_head.weight".into(), head));
        });
        let model = load_bytes(&bytes).unwrap();
        let got = logits(&model, &ids, shape, Device::Cpu);
        let scaled: Vec<f64> = want.iter().map(|&x| f64::from(x * scale)).collect();
        let got: Vec<f64> = got.into_iter().map(f64::from).collect();
        assert_close(&format!("lm_head = {scale} wte, prefix `{name_prefix}`"), &got, &scaled, Tol::both(1e-5));
    }
}

#[test]
fn tie_word_embeddings_decides_the_head() {
    let wte_times = |scale: f32| {
        edited(|tensors| {
            let wte = tensors.iter().find(|(n, _)| n == "transformer.wte.weight").unwrap();
            let head: Vec<f32> = f32s(&wte.1).iter().map(|x| x * scale).collect();
            tensors.push(("lm_head.weight".into(), owned_f32(&[VOCAB, 64], &head)));
        })
    };
    let tied =
        |tie: bool| Gpt2Options { n_heads: Some(HEADS), tie_word_embeddings: Some(tie), ..Gpt2Options::default() };
    let without_head = std::fs::read(weights_path()).unwrap();
    // Untied: the head must be stored.
    let e = gpt2_from_safetensors(&without_head, &tied(false)).err().expect("untied, no head").to_string();
    assert!(e.contains("`lm_head.weight` is missing") && e.contains("tie_word_embeddings is false"), "{e}");
    let model = gpt2_from_safetensors(&wte_times(2.0), &tied(false)).unwrap();
    let (head, wte) = (model.head.weight.to_vec::<f32>().unwrap(), model.wte.weight.to_vec::<f32>().unwrap());
    assert!(head.iter().zip(&wte).all(|(h, w)| *h == 2.0 * w));
    // Tied: a stored head must be the embedding.
    let e = gpt2_from_safetensors(&wte_times(2.0), &tied(true)).err().expect("tied, other head").to_string();
    assert!(e.contains("`lm_head.weight` differs from `transformer.wte.weight`"), "{e}");
    let model = gpt2_from_safetensors(&wte_times(1.0), &tied(true)).unwrap();
    assert_eq!(model.head.weight.to_vec::<f32>().unwrap(), model.wte.weight.to_vec::<f32>().unwrap());
    // The fixture's config.json says tied (Hugging Face's default).
    assert_eq!(
        Gpt2Options::from_config_json(&std::fs::read_to_string(dir().join("config.json")).unwrap())
            .unwrap()
            .tie_word_embeddings,
        Some(true)
    );
}

#[test]
fn half_precision_weights_load_as_their_f32_values() {
    let reference = reference();
    let (ids, shape) = ids_of(&reference["forward.ids"]);
    type Convert = fn(f32) -> ([u8; 2], f32);
    let f16: Convert = |x| (half::f16::from_f32(x).to_le_bytes(), half::f16::from_f32(x).to_f32());
    let bf16: Convert = |x| (half::bf16::from_f32(x).to_le_bytes(), half::bf16::from_f32(x).to_f32());
    for (dtype, convert) in [(Dtype::F16, f16), (Dtype::BF16, bf16)] {
        let mut rounded = Vec::new();
        let half = edited(|tensors| {
            for (name, t) in tensors.iter_mut() {
                let values = f32s(t);
                let (bytes, back): (Vec<[u8; 2]>, Vec<f32>) = values.iter().map(|&x| convert(x)).unzip();
                rounded.push((name.clone(), owned_f32(&t.shape, &back)));
                *t = Owned { dtype, shape: t.shape.clone(), data: bytes.concat() };
            }
        });
        let want = logits(&load_bytes(&serialize(&rounded)).unwrap(), &ids, shape, Device::Cpu);
        let model = load_bytes(&half).unwrap();
        assert_eq!(model.wte.weight.dtype(), kiln::DType::F32);
        assert_eq!(logits(&model, &ids, shape, Device::Cpu), want, "{dtype:?} weights");
    }
}

#[test]
fn a_missing_tensor_is_an_error_naming_it_and_its_shape() {
    let bytes = edited(|tensors| tensors.retain(|(n, _)| n != "transformer.h.1.mlp.c_fc.bias"));
    let e = load_error(&bytes);
    assert!(e.contains("`transformer.h.1.mlp.c_fc.bias` is missing (GPT-2 needs shape [256])"), "{e}");
    // Without the prefix, the missing name is spelt without it.
    let bytes = edited(|tensors| {
        tensors.retain(|(n, _)| n != "transformer.ln_f.weight");
        for (name, _) in tensors.iter_mut() {
            *name = name.strip_prefix("transformer.").unwrap().to_string();
        }
    });
    let e = load_error(&bytes);
    assert!(e.contains("`ln_f.weight` is missing") && !e.contains("transformer."), "{e}");
    // Without the token embedding there are no sizes to infer.
    let e = load_error(&edited(|tensors| tensors.retain(|(n, _)| n != "transformer.wte.weight")));
    assert!(e.contains("`transformer.wte.weight` is missing"), "{e}");
}

#[test]
fn a_wrong_shape_or_dtype_is_an_error_naming_the_tensor_and_shapes() {
    let bytes = edited(|tensors| {
        let t = tensors.iter_mut().find(|(n, _)| n == "transformer.h.0.attn.c_attn.weight").unwrap();
        t.1 = owned_f32(&[64, 190], &vec![0.5; 64 * 190]);
    });
    let e = load_error(&bytes);
    assert!(e.contains("`transformer.h.0.attn.c_attn.weight` has shape [64, 190] but GPT-2 needs [64, 192]"), "{e}");
    // Every problem is reported at once.
    let bytes = edited(|tensors| {
        for (name, t) in tensors.iter_mut() {
            if name == "transformer.wpe.weight" {
                *t = owned_f32(&[64, 32], &vec![0.0; 64 * 32]);
            }
            if name == "transformer.h.1.ln_2.bias" {
                *t = Owned { dtype: Dtype::I32, shape: vec![64], data: vec![0; 256] };
            }
        }
    });
    let e = load_error(&bytes);
    assert!(e.contains("`transformer.wpe.weight` has shape [64, 32] but GPT-2 needs [64, 64]"), "{e}");
    assert!(e.contains("`transformer.h.1.ln_2.bias` has dtype I32"), "{e}");
}

#[test]
fn unknown_tensors_are_errors_and_old_mask_buffers_are_ignored() {
    let bytes = edited(|tensors| {
        tensors.push(("transformer.h.0.crossattention.c_attn.weight".into(), owned_f32(&[2], &[1.0, 2.0])));
    });
    let e = load_error(&bytes);
    assert!(e.contains("`transformer.h.0.crossattention.c_attn.weight` (shape [2]) is not a tensor of GPT-2"), "{e}");
    // Older checkpoints store the causal mask as `attn.bias` and `attn.masked_bias`: not weights.
    let bytes = edited(|tensors| {
        tensors.push(("transformer.h.0.attn.bias".into(), owned_f32(&[1, 1, 2, 2], &[1.0, 0.0, 1.0, 1.0])));
        tensors.push(("transformer.h.1.attn.masked_bias".into(), owned_f32(&[], &[-1e4])));
    });
    assert_eq!(load_bytes(&bytes).unwrap().config.n_layers, 2);
    // A block that is not there is missing everything.
    let bytes = edited(|tensors| tensors.push(("transformer.h.3.ln_1.weight".into(), owned_f32(&[64], &[1.0; 64]))));
    let e = load_error(&bytes);
    assert!(e.contains("`transformer.h.2.attn.c_attn.weight` is missing"), "{e}");
}

#[test]
fn the_number_of_heads_must_come_from_somewhere_and_agree() {
    let bytes = std::fs::read(weights_path()).unwrap();
    let e = gpt2_from_safetensors(&bytes, &Gpt2Options::default()).err().expect("no heads").to_string();
    assert!(e.contains("number of attention heads") && e.contains("config.json"), "{e}");
    let e = gpt2_from_safetensors(&bytes, &Gpt2Options::with_heads(3)).err().expect("3 heads").to_string();
    assert!(e.contains("width 64") && e.contains("n_heads 3"), "{e}");
    // The options and config.json must agree.
    let e = load_gpt2_with(weights_path(), &Gpt2Options::with_heads(8)).err().expect("8 heads").to_string();
    assert!(e.contains("n_heads: the options say 8 but") && e.contains("config.json says 4"), "{e}");
    let wrong_size = Gpt2Options { n_heads: Some(4), n_layers: Some(3), ..Gpt2Options::default() };
    let e = gpt2_from_safetensors(&bytes, &wrong_size).err().expect("3 layers").to_string();
    assert!(e.contains("n_layers (n_layer) is declared 3 but the file has blocks h.0 to h.1"), "{e}");
    // Without a config.json beside the file, the options alone.
    let lone = std::env::temp_dir().join(format!("kiln-gpt2-test-{}", std::process::id()));
    std::fs::create_dir_all(&lone).unwrap();
    let path = lone.join("model.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    let e = load_gpt2(&path).err().expect("no config.json").to_string();
    assert!(e.contains("number of attention heads"), "{e}");
    assert_eq!(load_gpt2_with(&path, &Gpt2Options::with_heads(4)).unwrap().config.n_heads, 4);
    std::fs::remove_dir_all(&lone).unwrap();
}

#[test]
fn a_bad_file_is_an_error_naming_it() {
    let e = gpt2_from_safetensors(b"not a safetensors file", &Gpt2Options::with_heads(4)).err().expect("garbage");
    assert!(matches!(e, NnError::SafeTensors(_)), "{e}");
    let missing = dir().join("no-such-model.safetensors");
    let e = load_gpt2_with(&missing, &Gpt2Options::with_heads(4)).err().expect("no file").to_string();
    assert!(e.contains("no-such-model.safetensors"), "{e}");
    let empty = serialize(&[]);
    let e = load_error(&empty);
    assert!(e.contains("no tensors"), "{e}");
}

#[test]
fn cached_decoding_reproduces_hugging_face_logits_and_generate() {
    let reference = reference();
    let mut model = load_gpt2(weights_path()).unwrap();
    // The prefill's logits are the plain forward's.
    let (ids, [rows, len]) = ids_of(&reference["forward.ids"]);
    let mut cache = model.kv_cache(rows).unwrap();
    let prefill = model.forward_at(&Tensor::from_vec(ids, &[rows, len]), 0, &mut cache).unwrap();
    let want = common::values("forward.logits", &reference["forward.logits"]);
    let got = common::values("cached logits", &prefill);
    let close = assert_close("cached prefill logits", &got, &want, Tol { atol: 1e-4, rtol: 0.0 });
    eprintln!("GPT-2 cached prefill logits: max abs error {:.2e}", close.max_abs);
    // Greedy decoding one token at a time from the cache gives transformers' tokens.
    for case in ["greedy1", "greedy2"] {
        let (prompt, [rows, len]) = ids_of(&reference[&format!("{case}.prompt")]);
        let (want, [_, new_tokens]) = ids_of(&reference[&format!("{case}.tokens")]);
        let mut cache = model.kv_cache(rows).unwrap();
        let mut next = Tensor::from_vec(prompt, &[rows, len]);
        let mut got = vec![Vec::new(); rows];
        for _ in 0..new_tokens {
            let start = cache.len();
            let logits = model.forward_at(&next, start, &mut cache).unwrap();
            let seq = logits.dims().unwrap()[1];
            let all = logits.to_vec::<f32>().unwrap();
            let mut step = Vec::new();
            for (row, tokens) in got.iter_mut().enumerate() {
                let best = argmax(&all[(row * seq + seq - 1) * VOCAB..(row * seq + seq) * VOCAB]);
                tokens.push(best);
                step.push(best);
            }
            next = Tensor::from_vec(step, &[rows, 1]);
        }
        assert_eq!(got.concat(), want, "{case}: Kiln's cached greedy tokens vs transformers' generate");
        assert_eq!(cache.traces(), 1, "{case}: one compiled program for the prefill and every step");
    }
}

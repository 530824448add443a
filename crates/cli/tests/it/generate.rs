//! `kiln generate` on a GPT-2 checkpoint written here (GPT-2's vocabulary and Hugging Face's
//! names and `Conv1D` layout, tiny width, random weights): the streamed text is the decoded
//! tokens, greedy decoding with the KV cache picks the tokens a full recompute picks, and the
//! binary prints the prompt and its continuation.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::Tensor;
use kiln_cli::generate_cmd::{GenerateArgs, generate};
use nn::{GenerateConfig, Module, ModuleParams, ParamKind, RecomputeDecoder};

/// Named tensors saved under their names.
struct Named(Vec<(String, Tensor)>);

impl ModuleParams for Named {
    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        for (n, t) in &self.0 {
            f(n, t, ParamKind::Weight);
        }
    }
    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        for (n, t) in &mut self.0 {
            f(n, t, ParamKind::Weight);
        }
    }
}

impl Module for Named {
    fn forward(&self, x: &Tensor) -> Tensor {
        x.clone()
    }
}

const VOCAB: usize = 50257;
const DIM: usize = 16;

/// A deterministic `[shape]` tensor of scale `scale`.
fn weights(shape: &[usize], seed: usize, scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.5 - 1.0) * scale).collect();
    Tensor::from_vec(v, shape)
}

/// A one-block GPT-2 with GPT-2's vocabulary in `dir` (`model.safetensors` + `config.json`).
fn checkpoint(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let (d, h) = (DIM, 4 * DIM);
    let mut t = vec![
        ("transformer.wte.weight".to_string(), weights(&[VOCAB, d], 1, 0.5)),
        ("transformer.wpe.weight".to_string(), weights(&[32, d], 2, 0.1)),
        ("transformer.ln_f.weight".to_string(), weights(&[d], 3, 0.2).add(1.0f32)),
        ("transformer.ln_f.bias".to_string(), weights(&[d], 4, 0.1)),
    ];
    let block = [
        ("ln_1.weight", vec![d], 1.0),
        ("ln_1.bias", vec![d], 0.1),
        ("attn.c_attn.weight", vec![d, 3 * d], 0.3),
        ("attn.c_attn.bias", vec![3 * d], 0.1),
        ("attn.c_proj.weight", vec![d, d], 0.3),
        ("attn.c_proj.bias", vec![d], 0.1),
        ("ln_2.weight", vec![d], 1.0),
        ("ln_2.bias", vec![d], 0.1),
        ("mlp.c_fc.weight", vec![d, h], 0.3),
        ("mlp.c_fc.bias", vec![h], 0.1),
        ("mlp.c_proj.weight", vec![h, d], 0.3),
        ("mlp.c_proj.bias", vec![d], 0.1),
    ];
    for (i, (name, shape, scale)) in block.into_iter().enumerate() {
        t.push((format!("transformer.h.0.{name}"), weights(&shape, 10 + i, scale)));
    }
    let path = dir.join("model.safetensors");
    nn::save_safetensors(&Named(t), &path).unwrap();
    std::fs::write(dir.join("config.json"), r#"{"model_type": "gpt2", "n_head": 2, "n_embd": 16, "n_layer": 1}"#)
        .unwrap();
    path
}

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

#[test]
fn generated_text_streams_the_greedy_tokens_of_a_full_recompute() {
    let weights = checkpoint(&dir("generate-lib"));
    let args = GenerateArgs {
        weights: weights.clone(),
        n_heads: None,
        prompt: "The kiln fires".into(),
        max_new_tokens: 12,
        temperature: None,
        top_k: None,
        top_p: None,
        seed: 0,
    };
    let mut streamed = String::new();
    let got = generate(&args, |s| streamed.push_str(s)).unwrap();
    assert_eq!(streamed, got.text);
    assert!(!got.tokens.is_empty() && got.tokens.len() <= 12);

    let model = nn::load_gpt2(&weights).unwrap();
    let prompt = kiln_cli::tokenizer::encode("The kiln fires");
    let mut reference = RecomputeDecoder::new(&model);
    let config = GenerateConfig { stop_tokens: vec![50256], ..GenerateConfig::greedy(12) };
    let want = nn::generate(&mut reference, &[prompt], &config, |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(got.tokens, want[0]);

    // Sampling is seeded: the same seed gives the same text.
    let sampled = GenerateArgs { temperature: Some(0.8), top_k: Some(40), seed: 7, ..args };
    let a = generate(&sampled, |_| {}).unwrap();
    let b = generate(&sampled, |_| {}).unwrap();
    assert_eq!(a.tokens, b.tokens);
}

#[test]
fn the_command_prints_the_prompt_and_its_continuation() {
    let weights = checkpoint(&dir("generate-bin"));
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["generate", "--weights", weights.to_str().unwrap(), "--prompt", "Hello world", "--max-new-tokens", "5"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("Hello world"), "{stdout}");
    assert!(stderr.contains("2 prompt tokens"), "{stderr}");
    // A bad file is an error naming it, not a panic.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["generate", "--weights", "/nonexistent/model.safetensors", "--prompt", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonexistent"));
}

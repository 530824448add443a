//! Decoding with a key/value cache (`Transformer::forward_at`): the cached logits match a full
//! recompute of the whole prefix, on the CPU, the interpreter and (when present) wgpu; 64 decoding
//! steps after the prefill compile nothing (the CPU device's program counter) and update the cache
//! in place; a rewind recomputes from an earlier position; past `max_seq_len` is an error.
//! The compile counter belongs to the process-wide CPU device: no other test binary shares it and
//! the one test here that counts compiles is the only one that compiles this model's graph.

use std::sync::Mutex;

use kiln::{DType, Device, Tensor};
use kiln_nn::*;

/// Held by every test: one of them counts the CPU device's compiles.
static SERIAL: Mutex<()> = Mutex::new(());

fn data_ptr(t: &Tensor) -> *const u8 {
    t.to_host().unwrap().data.as_bytes().as_ptr()
}

fn model(max_seq_len: usize, device: Device) -> Transformer {
    model_of(2, max_seq_len, device)
}

fn model_of(n_layers: usize, max_seq_len: usize, device: Device) -> Transformer {
    kiln::manual_seed(7);
    let config = TransformerConfig { dim: 64, n_heads: 8, n_layers, norm_eps: 1e-5, vocab_size: 64, max_seq_len };
    let mut m = Transformer::from_config(config).unwrap();
    m.to_device(device).unwrap();
    m
}

fn tokens(rows: &[Vec<i64>], device: Device) -> Tensor {
    let seq = rows[0].len();
    let ids: Vec<i32> = rows.concat().into_iter().map(|t| t as i32).collect();
    Tensor::from_vec_on(ids, &[rows.len(), seq], device)
}

/// The logits of the last position of each row, `[batch][vocab]`.
fn last_logits(logits: &Tensor) -> Vec<Vec<f32>> {
    let dims = logits.dims().unwrap();
    let (seq, vocab) = (dims[1], dims[2]);
    let all = logits.to_vec::<f32>().unwrap();
    all.chunks(seq * vocab).map(|row| row[(seq - 1) * vocab..].to_vec()).collect()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn argmax(row: &[f32]) -> i64 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as i64
}

fn devices() -> Vec<Device> {
    let mut d = vec![Device::Cpu, Device::Interp];
    if Device::probe(Device::Wgpu).is_ok() {
        d.push(Device::Wgpu);
    }
    d
}

/// Prefill 5 tokens of 2 rows, then greedy steps: every step's logits equal the full forward of
/// the prefix within 1e-5. With 4 blocks, the third and fourth are calls of the recording of the
/// second (`Transformer::recorder`).
#[test]
fn cached_decoding_matches_a_full_recompute() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (device, layers) in devices().into_iter().flat_map(|d| [(d, 2), (d, 4)]) {
        let steps = if device == Device::Cpu { 12 } else { 4 };
        let mut m = model_of(layers, 32, device);
        let mut cache = m.kv_cache(2).unwrap();
        let mut rows: Vec<Vec<i64>> = vec![vec![3, 14, 15, 9, 26], vec![5, 35, 8, 9, 7]];
        let prefill = m.forward_at(&tokens(&rows, device), 0, &mut cache).unwrap();
        assert_eq!(prefill.dims().unwrap(), vec![2, 5, 64]);
        let full = m.forward(&tokens(&rows, device)).to_vec::<f32>().unwrap();
        let got = prefill.to_vec::<f32>().unwrap();
        let worst = got.iter().zip(&full).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-5, "{device}: prefill differs by {worst}");
        let mut next = last_logits(&prefill);
        for step in 0..steps {
            let new: Vec<Vec<i64>> = next.iter().map(|l| vec![argmax(l)]).collect();
            for (r, n) in rows.iter_mut().zip(&new) {
                r.push(n[0]);
            }
            let pos = cache.len();
            let cached = last_logits(&m.forward_at(&tokens(&new, device), pos, &mut cache).unwrap());
            let full = last_logits(&m.forward(&tokens(&rows, device)));
            let d = max_diff(&cached, &full);
            assert!(d < 1e-5, "{device} step {step}: cached logits differ from a full recompute by {d}");
            next = cached;
        }
        assert_eq!(cache.len(), 5 + steps);
        assert_eq!(cache.traces(), 1, "{device}: prefill and steps share one trace");
        assert!(m.recorder.recordings() >= 1, "{device}: the blocks are recorded");
    }
}

/// 64 decoding steps after the prefill: no program compiled, the same kernels launched every
/// step, and every block's key and value arrays updated in place (the same arrays every step).
#[test]
fn sixty_four_decoding_steps_compile_nothing() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = kiln::backend::cpu_device().unwrap();
    let mut m = model(80, Device::Cpu);
    let mut cache = m.kv_cache(1).unwrap();
    let prompt = tokens(&[vec![1, 2, 3, 4, 5, 6, 7, 8]], Device::Cpu);
    let mut logits = m.forward_at(&prompt, 0, &mut cache).unwrap();
    let compiled = cpu.stats().programs_compiled;
    let arrays = |c: &KvCache| -> Vec<*const u8> {
        (0..2).flat_map(|b| [data_ptr(&c.keys(b).unwrap()), data_ptr(&c.values(b).unwrap())]).collect()
    };
    let first = arrays(&cache);
    let mut launched = Vec::new();
    for _ in 0..64 {
        let next = argmax(&last_logits(&logits)[0]);
        let before = kiln::stats::cpu_launches();
        logits = m.forward_at(&tokens(&[vec![next]], Device::Cpu), cache.len(), &mut cache).unwrap();
        launched.push(kiln::stats::cpu_launches() - before);
    }
    assert_eq!(cpu.stats().programs_compiled - compiled, 0, "decoding compiled a program");
    assert_eq!(arrays(&cache), first, "a step copied the cache");
    assert_eq!(cache.len(), 72);
    assert_eq!(cache.traces(), 1);
    assert!(launched.iter().all(|&n| n == launched[0] && n > 0), "launches per step: {launched:?}");
}

/// Feeding a different token at an earlier position gives the logits of the edited prefix.
#[test]
fn a_rewind_recomputes_from_an_earlier_position() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = model(16, Device::Cpu);
    let mut cache = m.kv_cache(1).unwrap();
    let _ = m.forward_at(&tokens(&[vec![1, 2, 3, 4, 5]], Device::Cpu), 0, &mut cache).unwrap();
    let got = last_logits(&m.forward_at(&tokens(&[vec![9, 10]], Device::Cpu), 3, &mut cache).unwrap());
    assert_eq!(cache.len(), 5);
    let want = last_logits(&m.forward(&tokens(&[vec![1, 2, 3, 9, 10]], Device::Cpu)));
    assert!(max_diff(&got, &want) < 1e-5);
}

#[test]
fn positions_past_the_cache_are_errors() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = model(8, Device::Cpu);
    let mut cache = m.kv_cache(1).unwrap();
    let e = m.forward_at(&tokens(&[vec![1; 9]], Device::Cpu), 0, &mut cache).unwrap_err();
    assert!(e.to_string().contains("do not fit the cache's 8 positions"), "{e}");
    let _ = m.forward_at(&tokens(&[vec![1; 6]], Device::Cpu), 0, &mut cache).unwrap();
    let e = m.forward_at(&tokens(&[vec![1; 3]], Device::Cpu), 6, &mut cache).unwrap_err();
    assert!(e.to_string().contains("8 positions"), "{e}");
    let e = m.forward_at(&tokens(&[vec![1]], Device::Cpu), 7, &mut cache).unwrap_err();
    assert!(e.to_string().contains("past the 6 positions"), "{e}");
    let e = m.forward_at(&tokens(&[vec![1], vec![2]], Device::Cpu), 6, &mut cache).unwrap_err();
    assert!(e.to_string().contains("batch 1"), "{e}");
    // The cache still works after the errors.
    let _ = m.forward_at(&tokens(&[vec![1, 2]], Device::Cpu), 6, &mut cache).unwrap();
    assert_eq!(cache.len(), 8);
    let e = m.forward_at(&Tensor::zeros(&[1, 1, 1], DType::I32), 0, &mut cache).unwrap_err();
    assert!(e.to_string().contains("[batch, seq]"), "{e}");
}

/// `generate` with the cache picks what it picks with a full recompute every step: greedy on a
/// batch of two, and seeded top-k sampling (one compiled program for the prompt and the steps).
#[test]
fn generating_with_the_cache_matches_the_recompute_decoder() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = model(48, Device::Cpu);
    // Embeddings of std 1 so that the greedy chain varies (the 0.02 init repeats one token).
    m.wte.weight = kiln_nn::Embedding::new(64, 64).weight;
    let prompts = vec![vec![3u32, 14, 15, 9], vec![2, 7, 1, 8]];
    let configs = [
        GenerateConfig::greedy(10),
        GenerateConfig {
            sampling: Sampling::Sample { temperature: 0.9, top_k: Some(8), top_p: None },
            seed: 5,
            ..GenerateConfig::greedy(10)
        },
    ];
    for config in &configs {
        let want = generate(&mut RecomputeDecoder::new(&m), &prompts, config, |_| std::ops::ControlFlow::Continue(()))
            .unwrap();
        let mut cached = CachedDecoder::new(&mut m);
        let got = generate(&mut cached, &prompts, config, |_| std::ops::ControlFlow::Continue(())).unwrap();
        assert_eq!(got, want, "{:?}", config.sampling);
        assert_eq!(cached.cache().unwrap().len(), 4 + 9);
        assert_eq!(cached.cache().unwrap().traces(), 1);
    }
}

/// The facade adds every traced node as checked when it was recorded (`Graph::add_inferred`), so
/// `lower::compile` skips the verifier in a release build: the traced cached forward (symbolic
/// position, length and sequence, slices of the cache, in-place updates) must pass it.
#[test]
fn the_traced_cached_forward_is_verified_by_construction() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = model(32, Device::Cpu);
    let kv: Vec<Tensor> = (0..4).map(|_| Tensor::zeros(&[2, 8, 32, 8], DType::F32)).collect();
    let ids = tokens(&[vec![1, 2, 3], vec![4, 5, 6]], Device::Cpu)
        .with_dims(vec![kiln::Dim::Const(2), kiln::Dim::sym("seq")]);
    let (start, len) = (kiln::Dim::sym("start_pos"), kiln::Dim::sym("kv_len"));
    let outputs = kiln::no_grad(|| m.forward_cached(&ids, &start, &len, &kv)).unwrap();
    let program = kiln::trace(&outputs.iter().collect::<Vec<_>>()).unwrap();
    assert!(program.graph.len() > 100);
    assert!(program.graph.is_verified());
    air::verify(&program.graph).unwrap();
}

/// The attended length covers the context, wastes at most half of it below one bucket, and
/// takes few distinct values (each is a memory plan and set of launches of its own).
#[test]
fn attended_lengths_cover_the_context_in_few_sizes() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = model(200, Device::Cpu);
    let mut sizes = Vec::new();
    for need in 1..=200 {
        let len = m.attended_len(need - 1, 1);
        assert_eq!(len, m.attended_len(0, need), "only start + seq matters");
        assert!(need <= len && len <= 200, "{need} positions attend over {len}");
        assert!(len <= (2 * need).max(Transformer::KV_MIN) || len < need + Transformer::KV_BUCKET, "{need}: {len}");
        if sizes.last() != Some(&len) {
            sizes.push(len);
        }
    }
    assert_eq!(sizes, [8, 16, 32, 64, 128, 192, 200]);
}

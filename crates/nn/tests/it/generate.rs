//! `generate` and its sampling: greedy decoding of a tiny Transformer through `RecomputeDecoder`
//! against an argmax chain computed with plain forward passes, and the sampler, stop tokens,
//! batching, streaming and errors through fake decoders with fixed logits (fast and exact).

use crate::common;

use std::ops::ControlFlow;

use common::devices;
use kiln::Tensor;
use kiln_nn::*;

/// Never stops the stream.
fn go_on(_: &[Option<u32>]) -> ControlFlow<()> {
    ControlFlow::Continue(())
}

/// A tiny model: dim 16, 2 heads, 1 layer, vocabulary 11, 24 positions.
fn tiny_transformer(seed: u64) -> Transformer {
    kiln::manual_seed(seed);
    let config =
        TransformerConfig { dim: 16, n_heads: 2, n_layers: 1, norm_eps: 1e-5, vocab_size: 11, max_seq_len: 24 };
    let mut model = Transformer::from_config(config).unwrap();
    // Embeddings of std 1 (not GPT-2's 0.02), so that the tokens and positions steer the logits
    // and greedy chains vary.
    model.wte.weight = Tensor::randn_seeded(&[11, 16], seed + 100);
    model.wpe.weight = Tensor::randn_seeded(&[24, 16], seed + 200);
    model
}

/// The index of the largest value, the lowest among equals, and the gap to the runner-up.
fn argmax_with_margin(row: &[f32]) -> (u32, f32) {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    let runner_up =
        row.iter().enumerate().filter(|&(i, _)| i != best).map(|(_, &v)| v).fold(f32::NEG_INFINITY, f32::max);
    (best as u32, row[best] - runner_up)
}

/// Greedy decoding by hand: a plain (uncompiled, concrete-shape) forward over the whole sequence
/// each step, the argmax of the last position appended.
fn argmax_chain(model: &Transformer, prompt: &[u32], steps: usize) -> Vec<u32> {
    let vocab = model.config.vocab_size;
    let mut seq: Vec<u32> = prompt.to_vec();
    let mut new = Vec::new();
    for _ in 0..steps {
        let ids = Tensor::from_vec(seq.iter().map(|&t| t as i64).collect::<Vec<_>>(), &[1, seq.len()]);
        let logits = model.forward(&ids).to_vec::<f32>().unwrap();
        let (token, margin) = argmax_with_margin(&logits[logits.len() - vocab..]);
        assert!(margin > 1e-4, "a near tie ({margin}) would make the comparison fragile: pick another model seed");
        seq.push(token);
        new.push(token);
    }
    new
}

#[test]
fn greedy_decoding_equals_the_argmax_chain_of_plain_forward_passes() {
    let model = tiny_transformer(5);
    let prompt = vec![3, 1, 4, 1, 5];
    let want = argmax_chain(&model, &prompt, 8);
    let mut decoder = RecomputeDecoder::new(&model);
    let got = generate(&mut decoder, std::slice::from_ref(&prompt), &GenerateConfig::greedy(8), go_on).unwrap();
    eprintln!("greedy after {prompt:?}: {want:?}");
    assert_eq!(got, vec![want.clone()]);
    // The prompt and the first 7 new tokens were fed (the last one is not): every length ran the
    // one program traced for the symbolic sequence length.
    assert_eq!(decoder.tokens()[0], [&prompt[..], &want[..7]].concat());
    assert_eq!(decoder.traces(), 1, "one compiled forward for every sequence length");
    // A second run resets the decoder and reuses the program.
    let again = generate(&mut decoder, &[prompt], &GenerateConfig::greedy(8), go_on).unwrap();
    assert_eq!(again, vec![want]);
    assert_eq!(decoder.traces(), 1);
}

#[test]
fn top_k_one_and_a_tiny_top_p_equal_greedy_on_a_transformer() {
    let model = tiny_transformer(5);
    let prompts = vec![vec![2, 7, 1], vec![9, 9, 0]];
    let mut decoder = RecomputeDecoder::new(&model);
    let greedy = generate(&mut decoder, &prompts, &GenerateConfig::greedy(6), go_on).unwrap();
    for (seed, sampling) in [
        (1, Sampling::Sample { temperature: 0.7, top_k: Some(1), top_p: None }),
        (2, Sampling::Sample { temperature: 1.3, top_k: None, top_p: Some(1e-6) }),
        (3, Sampling::Sample { temperature: 2.0, top_k: Some(4), top_p: Some(1e-6) }),
    ] {
        let config = GenerateConfig { max_new_tokens: 6, sampling: sampling.clone(), seed, stop_tokens: vec![] };
        assert_eq!(generate(&mut decoder, &prompts, &config, go_on).unwrap(), greedy, "{sampling:?}");
    }
}

#[test]
fn a_batch_of_two_prompts_equals_two_single_runs_for_greedy() {
    let model = tiny_transformer(5);
    let prompts = vec![vec![1, 2, 3, 4], vec![10, 0, 6, 6]];
    let mut decoder = RecomputeDecoder::new(&model);
    let batched = generate(&mut decoder, &prompts, &GenerateConfig::greedy(7), go_on).unwrap();
    let single: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| generate(&mut decoder, std::slice::from_ref(p), &GenerateConfig::greedy(7), go_on).unwrap().remove(0))
        .collect();
    assert_eq!(batched, single);
    assert_eq!(single[1], argmax_chain(&model, &prompts[1], 7));
    assert_eq!(decoder.traces(), 2, "one program per batch size");
}

/// Sampling draws the same tokens from the same seed (through the Transformer too), different
/// tokens from different seeds, and row 0 of a batch draws what a batch-1 run with the seed does.
#[test]
fn sampling_reproduces_with_a_seed_and_differs_across_seeds() {
    let mut fake = Fixed::new(vec![0.3, 0.1, -0.2, 0.0, 0.25, 0.05, -0.1, 0.2]);
    let config =
        |seed| GenerateConfig { max_new_tokens: 64, sampling: Sampling::temperature(1.5), seed, stop_tokens: vec![] };
    let run = |fake: &mut Fixed, seed, rows: usize| generate(fake, &vec![vec![0]; rows], &config(seed), go_on).unwrap();
    let a = run(&mut fake, 42, 1);
    assert_eq!(run(&mut fake, 42, 1), a);
    assert_ne!(run(&mut fake, 43, 1), a);
    let batch = run(&mut fake, 42, 3);
    assert_eq!(batch[0], a[0], "row 0 draws from the seed itself");
    assert_ne!(batch[1], batch[0], "each row has its own stream");
    assert_ne!(batch[2], batch[1]);
    let model = tiny_transformer(5);
    let mut decoder = RecomputeDecoder::new(&model);
    let mut sampled = |seed| {
        let config =
            GenerateConfig { max_new_tokens: 10, sampling: Sampling::temperature(3.0), seed, stop_tokens: vec![] };
        generate(&mut decoder, &[vec![4, 2]], &config, go_on).unwrap()
    };
    let first = sampled(7);
    assert_eq!(sampled(7), first);
    assert!((8..12).any(|seed| sampled(seed) != first), "other seeds draw other tokens");
}

/// 20,000 draws from fixed probabilities 0.5, 0.25, 0.15, 0.1 (logits their logs): the frequencies
/// are within 5 standard deviations of the probabilities computed by hand for each setting, and
/// top-k and top-p never emit a token outside their set.
#[test]
fn sampled_frequencies_match_the_distribution() {
    const DRAWS: usize = 20_000;
    let probs = [0.5f64, 0.25, 0.15, 0.1];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let squares: Vec<f64> = probs.iter().map(|p| p * p).collect();
    let cases: Vec<(Sampling, Vec<f64>)> = vec![
        (Sampling::temperature(1.0), probs.to_vec()),
        (Sampling::temperature(0.5), squares.iter().map(|s| s / squares.iter().sum::<f64>()).collect()),
        (Sampling::Sample { temperature: 1.0, top_k: Some(2), top_p: None }, vec![2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0]),
        // The nucleus of 0.7 is {0, 1} (0.75 >= 0.7); of 0.8 it is {0, 1, 2} (0.9 >= 0.8).
        (Sampling::Sample { temperature: 1.0, top_k: None, top_p: Some(0.7) }, vec![2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0]),
        (
            Sampling::Sample { temperature: 1.0, top_k: None, top_p: Some(0.8) },
            vec![0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0.0],
        ),
        // Top-3 first ({0, 1, 2}, renormalized: 0.5/0.9 ≈ 0.556, 0.278, 0.167), then the nucleus of
        // 0.6 of that: {0, 1}.
        (Sampling::Sample { temperature: 1.0, top_k: Some(3), top_p: Some(0.6) }, vec![2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0]),
    ];
    let mut fake = Fixed::new(logits.clone());
    for (sampling, want) in cases {
        let config =
            GenerateConfig { max_new_tokens: DRAWS, sampling: sampling.clone(), seed: 2026, stop_tokens: vec![] };
        let tokens = generate(&mut fake, &[vec![0]], &config, go_on).unwrap().remove(0);
        assert_eq!(tokens.len(), DRAWS);
        let mut counts = [0usize; 4];
        for &t in &tokens {
            counts[t as usize] += 1;
        }
        for (t, (&count, &p)) in counts.iter().zip(&want).enumerate() {
            let freq = count as f64 / DRAWS as f64;
            if p == 0.0 {
                assert_eq!(count, 0, "{sampling:?}: token {t} is excluded but was drawn {count} times");
            } else {
                let sigma = (p * (1.0 - p) / DRAWS as f64).sqrt();
                assert!((freq - p).abs() < 5.0 * sigma, "{sampling:?}: token {t} drawn {freq:.4}, want {p:.4}");
            }
        }
        // The sampler's own account of the distribution agrees with the one worked out above.
        let d = sampling.distribution(&logits).unwrap();
        for (t, p) in d {
            assert!((p - want[t as usize]).abs() < 1e-6, "{sampling:?}: token {t} has probability {p}");
        }
    }
}

/// A row stops at its stop token (kept as its last token) while the other row goes on; its
/// stream then sees `None`; decoding ends once every row stopped, feeding nothing more.
#[test]
fn stop_tokens_end_a_row_and_all_rows_end_decoding() {
    // The chain 0 -> 1 -> 2 -> ... -> 7 -> 0; row 0 starts at 3, row 1 at 0.
    let mut chain = Chain::new(8);
    let config = GenerateConfig { max_new_tokens: 20, sampling: Sampling::Greedy, seed: 0, stop_tokens: vec![5, 6] };
    let mut streamed = Vec::new();
    let got = generate(&mut chain, &[vec![1, 3], vec![4, 0]], &config, |step| {
        streamed.push(step.to_vec());
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(got, vec![vec![4, 5], vec![1, 2, 3, 4, 5]]);
    assert_eq!(
        streamed,
        vec![
            vec![Some(4), Some(1)],
            vec![Some(5), Some(2)],
            vec![None, Some(3)],
            vec![None, Some(4)],
            vec![None, Some(5)],
        ]
    );
    // The prompt, then 4 steps (the last step's tokens are not fed); the stopped row is fed its
    // stop token again.
    assert_eq!(
        chain.fed,
        vec![
            vec![vec![1, 3], vec![4, 0]],
            vec![vec![4], vec![1]],
            vec![vec![5], vec![2]],
            vec![vec![5], vec![3]],
            vec![vec![5], vec![4]]
        ]
    );
    // Without stop tokens: exactly max_new_tokens, around the cycle (through a `dyn Decoder`).
    let dyn_chain: &mut dyn Decoder = &mut chain;
    let got = generate(dyn_chain, &[vec![6]], &GenerateConfig::greedy(10), go_on).unwrap();
    assert_eq!(got, vec![vec![7, 0, 1, 2, 3, 4, 5, 6, 7, 0]]);
    assert_eq!(chain.fed.len(), 10, "the prompt and 9 steps");
    // A stop token emitted first ends at once; zero new tokens feed nothing.
    let config = GenerateConfig { stop_tokens: vec![7], ..GenerateConfig::greedy(10) };
    assert_eq!(generate(&mut chain, &[vec![6]], &config, go_on).unwrap(), vec![vec![7]]);
    assert_eq!(chain.fed.len(), 1);
    assert_eq!(
        generate(&mut chain, &[vec![6], vec![1]], &GenerateConfig::greedy(0), go_on).unwrap(),
        vec![Vec::<u32>::new(), vec![]]
    );
    assert_eq!((chain.fed.len(), chain.resets), (1, 3), "nothing fed, not even a reset");
}

/// The callback sees every token in order, once, on a real model; breaking stops after that step.
#[test]
fn the_stream_sees_every_token_in_order_and_can_stop_early() {
    let model = tiny_transformer(5);
    let mut decoder = RecomputeDecoder::new(&model);
    let prompts = vec![vec![0, 1], vec![5, 3]];
    let config =
        GenerateConfig { max_new_tokens: 6, sampling: Sampling::temperature(1.0), seed: 9, stop_tokens: vec![] };
    let mut streamed: Vec<Vec<u32>> = vec![Vec::new(); 2];
    let mut calls = 0;
    let got = generate(&mut decoder, &prompts, &config, |step| {
        calls += 1;
        for (row, t) in streamed.iter_mut().zip(step) {
            row.push(t.expect("no stop tokens: every row emits every step"));
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(calls, 6);
    assert_eq!(streamed, got);
    let mut seen = 0;
    let early = generate(&mut decoder, &prompts, &config, |_| {
        seen += 1;
        if seen == 3 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    })
    .unwrap();
    assert_eq!(early, got.iter().map(|row| row[..3].to_vec()).collect::<Vec<_>>(), "same seed, same first 3 tokens");
    assert_eq!(decoder.tokens()[0].len(), 2 + 2, "the prompt and 2 steps were fed, not the third");
}

/// The message and kind of a `generate` error, checking it points at this file.
#[track_caller]
fn generate_error<T: std::fmt::Debug>(result: Result<T>) -> (GenerateErrorKind, String) {
    match result {
        Err(e @ NnError::Generate { kind, .. }) => {
            let message = e.to_string();
            assert!(message.contains("tests/it/generate.rs"), "names the caller's line: {message}");
            (kind, message)
        }
        other => panic!("expected a generate error, got {other:?}"),
    }
}

#[test]
fn bad_configs_are_errors() {
    let mut fake = Fixed::new(vec![0.0; 4]);
    let sample = |temperature, top_k, top_p| GenerateConfig {
        max_new_tokens: 3,
        sampling: Sampling::Sample { temperature, top_k, top_p },
        seed: 0,
        stop_tokens: vec![],
    };
    for (config, needle) in [
        (sample(0.0, None, None), "temperature must be finite and above 0, got 0"),
        (sample(-1.0, None, None), "temperature must be finite and above 0, got -1"),
        (sample(f32::NAN, None, None), "got NaN"),
        (sample(f32::INFINITY, None, None), "got inf"),
        (sample(1.0, Some(0), None), "top_k must be at least 1, got 0"),
        (sample(1.0, None, Some(0.0)), "top_p must be in (0, 1], got 0"),
        (sample(1.0, None, Some(1.5)), "top_p must be in (0, 1], got 1.5"),
        (sample(1.0, None, Some(f32::NAN)), "top_p must be in (0, 1], got NaN"),
        (
            GenerateConfig { stop_tokens: vec![2, 4], ..GenerateConfig::greedy(3) },
            "stop token 4 is not below the vocabulary size 4",
        ),
    ] {
        let (kind, message) = generate_error(generate(&mut fake, &[vec![0]], &config, go_on));
        assert_eq!(kind, GenerateErrorKind::Config, "{message}");
        assert!(message.contains(needle), "{message} lacks {needle:?}");
        if config.stop_tokens.is_empty() {
            let (kind, _) = generate_error(config.validate());
            assert_eq!(kind, GenerateErrorKind::Config);
        }
    }
    assert!(fake.fed.is_empty(), "nothing is fed for a bad config");
    assert!(GenerateConfig::greedy(1).validate().is_ok());
    assert!(Sampling::Sample { temperature: 0.1, top_k: Some(1), top_p: Some(1.0) }.validate().is_ok());
}

#[test]
fn bad_prompts_are_errors() {
    let mut fake = Fixed::new(vec![0.0; 4]);
    let config = GenerateConfig::greedy(2);
    for (prompts, needle) in [
        (vec![], "no prompt: the batch has no rows"),
        (vec![vec![]], "prompt row 0 is empty"),
        (vec![vec![1, 2], vec![]], "prompt row 1 is empty"),
        (vec![vec![1, 2], vec![3]], "prompt rows must have equal lengths, got [2, 1]"),
        (vec![vec![1, 2], vec![3, 4]], "prompt row 1, position 1: token 4 is not below the vocabulary size 4"),
    ] {
        let (kind, message) = generate_error(generate(&mut fake, &prompts, &config, go_on));
        assert_eq!(kind, GenerateErrorKind::Tokens, "{message}");
        assert!(message.contains(needle), "{message} lacks {needle:?}");
    }
    assert!(fake.fed.is_empty(), "nothing is fed for bad prompts");
}

#[test]
fn bad_logits_are_errors() {
    for (bad, needle) in
        [(f32::NAN, "logit 2 of 4 is NaN"), (f32::INFINITY, "logit 2 of 4 is inf"), (f32::NEG_INFINITY, "is -inf")]
    {
        for sampling in [Sampling::Greedy, Sampling::temperature(1.0)] {
            let mut fake = Fixed::new(vec![0.0, 1.0, bad, 0.5]);
            let config = GenerateConfig { max_new_tokens: 2, sampling, seed: 0, stop_tokens: vec![] };
            let (kind, message) = generate_error(generate(&mut fake, &[vec![0], vec![1]], &config, go_on));
            assert_eq!(kind, GenerateErrorKind::Logits, "{message}");
            assert!(message.contains(needle) && message.contains("step 0, row 0: logit 2"), "{message}");
        }
    }
    // A decoder that returns logits of the wrong size.
    let mut short = Fixed::new(vec![0.0; 4]);
    short.truncate_to = Some(3);
    let (kind, message) = generate_error(generate(&mut short, &[vec![0]], &GenerateConfig::greedy(2), go_on));
    assert_eq!(kind, GenerateErrorKind::Logits);
    assert!(message.contains("step 0: the decoder returned 3 logits, not batch 1 x vocabulary 4"), "{message}");
}

#[test]
fn the_recompute_decoder_checks_its_tokens_and_context() {
    let model = tiny_transformer(5);
    let mut decoder = RecomputeDecoder::new(&model);
    // 20 prompt tokens, 24 positions: the 5th new token would be fed as the 25th.
    let prompt: Vec<u32> = (0..20).map(|i| i % 11).collect();
    let (kind, message) =
        generate_error(generate(&mut decoder, std::slice::from_ref(&prompt), &GenerateConfig::greedy(6), go_on));
    assert_eq!(kind, GenerateErrorKind::Tokens);
    assert!(message.contains("24 tokens fed and 1 more exceed the model's max_seq_len 24"), "{message}");
    // 5 new tokens need 24 positions: they fit, and match the chain computed by hand.
    let five = generate(&mut decoder, std::slice::from_ref(&prompt), &GenerateConfig::greedy(5), go_on).unwrap();
    assert_eq!(five, vec![argmax_chain(&model, &prompt, 5)]);
    decoder.reset().unwrap();
    let e = decoder.feed(&[vec![11]]).unwrap_err();
    assert!(e.to_string().contains("token 11 is not below the vocabulary size 11"), "{e}");
    decoder.feed(&[vec![1, 2], vec![3, 4]]).unwrap();
    let e = decoder.feed(&[vec![1]]).unwrap_err();
    assert!(e.to_string().contains("fed 1 rows after 2 rows"), "{e}");
    let logits = decoder.feed(&[vec![5], vec![6]]).unwrap();
    assert_eq!(logits.len(), 2 * 11);
    assert_eq!(decoder.tokens(), [vec![1, 2, 5], vec![3, 4, 6]]);
}

/// The same decoding on every device: the first step's logits agree within 1e-4 and the greedy
/// tokens of a batch of two are the argmax chains computed on the CPU device by hand.
#[test]
fn the_recompute_decoder_decodes_alike_on_every_device() {
    let prompts = vec![vec![3, 1, 4], vec![2, 7, 1]];
    let reference = tiny_transformer(5);
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| argmax_chain(&reference, p, 4)).collect();
    let first = RecomputeDecoder::new(&reference).feed(&prompts).unwrap();
    for device in devices() {
        let mut model = tiny_transformer(5);
        model.to_device(device).unwrap();
        let mut decoder = RecomputeDecoder::new(&model);
        let logits = decoder.feed(&prompts).unwrap();
        let worst = logits.iter().zip(&first).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(logits.len() == first.len() && worst < 1e-4, "{device}: logits differ by {worst}");
        let got = generate(&mut decoder, &prompts, &GenerateConfig::greedy(4), go_on).unwrap();
        assert_eq!(got, want, "{device}");
        assert_eq!(decoder.traces(), 1, "{device}: one compiled forward");
    }
}

/// A decoder whose logits are the same every step; records what it was fed.
struct Fixed {
    logits: Vec<f32>,
    fed: Vec<Vec<Vec<u32>>>,
    truncate_to: Option<usize>,
}

impl Fixed {
    fn new(logits: Vec<f32>) -> Fixed {
        Fixed { logits, fed: Vec::new(), truncate_to: None }
    }
}

impl Decoder for Fixed {
    fn vocab_size(&self) -> usize {
        self.logits.len()
    }

    fn reset(&mut self) -> Result<()> {
        self.fed.clear();
        Ok(())
    }

    fn feed(&mut self, tokens: &[Vec<u32>]) -> Result<Vec<f32>> {
        self.fed.push(tokens.to_vec());
        let mut out: Vec<f32> = tokens.iter().flat_map(|_| self.logits.iter().copied()).collect();
        if let Some(n) = self.truncate_to {
            out.truncate(n);
        }
        Ok(out)
    }
}

/// A decoder over `vocab` tokens whose next token is surely `(last + 1) % vocab`.
struct Chain {
    vocab: usize,
    fed: Vec<Vec<Vec<u32>>>,
    resets: usize,
}

impl Chain {
    fn new(vocab: usize) -> Chain {
        Chain { vocab, fed: Vec::new(), resets: 0 }
    }
}

impl Decoder for Chain {
    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn reset(&mut self) -> Result<()> {
        self.fed.clear();
        self.resets += 1;
        Ok(())
    }

    fn feed(&mut self, tokens: &[Vec<u32>]) -> Result<Vec<f32>> {
        self.fed.push(tokens.to_vec());
        let mut out = vec![0.0; tokens.len() * self.vocab];
        for (r, row) in tokens.iter().enumerate() {
            let next = (*row.last().unwrap() as usize + 1) % self.vocab;
            out[r * self.vocab + next] = 10.0;
        }
        Ok(out)
    }
}

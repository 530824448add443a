//! Autoregressive decoding: the [`Decoder`] trait a model implements to be driven token by
//! token, [`RecomputeDecoder`] (the reference: the full forward pass over every token so far, each
//! step), [`Sampling`] (greedy, or temperature, top-k and top-p from a seeded generator) and
//! [`generate`], the loop that feeds a batch of prompts and streams the new tokens.
//!
//! The loop knows nothing of how logits are computed: a decoder with a key/value cache and the
//! reference decoder are driven the same way, so one can be checked against the other.
//!
//! Randomness is this module's own, so that a seed gives the same tokens whatever version of a
//! random-number crate is linked: row `r` of a batch draws from an xoshiro256** generator
//! (Blackman and Vigna) whose state is four SplitMix64 outputs from `seed ^ mix64(r)`, where
//! `mix64` is SplitMix64's output function (`mix64(0) = 0`, so row 0 of a batch and a batch-1 run
//! with the same seed draw the same numbers). Each row has its own stream, so one row's draws do
//! not depend on when the other rows stop.

use std::ops::ControlFlow;
use std::panic::Location;

use kiln::{Dim, JitCache, Tensor};

use crate::error::{GenerateErrorKind, NnError, Result};
use crate::module::Module;
use crate::transformer::{KvCache, Transformer};

/// A model that decodes step by step and keeps its own state (a KV cache, or the tokens so far).
pub trait Decoder {
    /// The vocabulary size (the logits' last axis).
    fn vocab_size(&self) -> usize;
    /// Forgets every token fed so far.
    fn reset(&mut self) -> Result<()>;
    /// Feeds `tokens` (`batch` rows of equal length, appended after the tokens fed so far) and
    /// returns the logits of each row's last position, `[batch][vocab]` flattened row-major.
    fn feed(&mut self, tokens: &[Vec<u32>]) -> Result<Vec<f32>>;
}

/// An error of kind `kind` at `location`.
fn fail<T>(kind: GenerateErrorKind, location: &'static Location<'static>, message: String) -> Result<T> {
    Err(NnError::Generate { kind, message, location })
}

/// Checks that `rows` is a batch of `vocab`-sized token ids: at least one row, every row
/// non-empty and of the same length, every id below `vocab`. Returns `(batch, length)`.
fn check_rows(
    rows: &[Vec<u32>],
    vocab: usize,
    what: &str,
    location: &'static Location<'static>,
) -> Result<(usize, usize)> {
    let Some(first) = rows.first() else {
        return fail(GenerateErrorKind::Tokens, location, format!("no {what}: the batch has no rows"));
    };
    let len = first.len();
    for (r, row) in rows.iter().enumerate() {
        if row.is_empty() {
            return fail(GenerateErrorKind::Tokens, location, format!("{what} row {r} is empty"));
        }
        if row.len() != len {
            let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
            return fail(
                GenerateErrorKind::Tokens,
                location,
                format!("{what} rows must have equal lengths, got {lengths:?} (row {r} differs from row 0)"),
            );
        }
        if let Some((i, &t)) = row.iter().enumerate().find(|&(_, &t)| t as usize >= vocab) {
            return fail(
                GenerateErrorKind::Tokens,
                location,
                format!("{what} row {r}, position {i}: token {t} is not below the vocabulary size {vocab}"),
            );
        }
    }
    Ok((rows.len(), len))
}

/// How the next token is chosen from a row of logits.
#[derive(Clone, Debug, PartialEq)]
pub enum Sampling {
    /// The most likely token (the lowest id among equal logits). Draws nothing from the generator.
    Greedy,
    /// A draw from `softmax(logits / temperature)`, restricted first to the `top_k` most likely
    /// tokens, then to the nucleus: the smallest set of most likely tokens whose probability sums
    /// to at least `top_p` (probabilities renormalized after each restriction, as Hugging Face's
    /// `generate` applies them). Equal logits are ordered by id, lowest first.
    Sample {
        /// Divides the logits: below 1 sharpens, above 1 flattens. Finite and above 0.
        temperature: f32,
        /// Keep only the `k` most likely tokens (`k >= 1`; a `k` above the vocabulary keeps all).
        top_k: Option<usize>,
        /// Keep only the nucleus of probability `p`, with `0 < p <= 1` (1 keeps every token).
        top_p: Option<f32>,
    },
}

impl Sampling {
    /// Temperature sampling over the whole vocabulary.
    pub fn temperature(temperature: f32) -> Sampling {
        Sampling::Sample { temperature, top_k: None, top_p: None }
    }

    /// Checks the parameters: temperature finite and above 0, `top_k >= 1`, `top_p` in `(0, 1]`.
    #[track_caller]
    pub fn validate(&self) -> Result<()> {
        self.check(Location::caller())
    }

    fn check(&self, location: &'static Location<'static>) -> Result<()> {
        let Sampling::Sample { temperature, top_k, top_p } = *self else { return Ok(()) };
        let bad = |message: String| fail(GenerateErrorKind::Config, location, message);
        if !(temperature.is_finite() && temperature > 0.0) {
            return bad(format!("temperature must be finite and above 0, got {temperature}"));
        }
        if top_k == Some(0) {
            return bad("top_k must be at least 1, got 0".into());
        }
        if let Some(p) = top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return bad(format!("top_p must be in (0, 1], got {p}"));
        }
        Ok(())
    }

    /// The distribution the next token is drawn from, for one row of `logits`: each candidate
    /// token with its probability (they sum to 1), most likely first, equal probabilities by id.
    /// [`Sampling::Greedy`] gives the one most likely token with probability 1. A NaN or
    /// infinite logit, or no logits at all, is an error.
    #[track_caller]
    pub fn distribution(&self, logits: &[f32]) -> Result<Vec<(u32, f64)>> {
        let location = Location::caller();
        self.check(location)?;
        let mut scratch = Scratch::default();
        self.candidates(logits, location, &mut scratch)?;
        let mut candidates = scratch.weights;
        let total: f64 = candidates.iter().map(|&(_, w)| w).sum();
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(candidates.into_iter().map(|(t, w)| (t, w / total)).collect())
    }

    /// Fills `scratch.weights` with the tokens a draw may return and positive weights
    /// proportional to their probabilities (not normalized). The parameters are valid.
    ///
    /// Nothing is sorted that need not be: greedy is one pass over the logits; plain temperature
    /// sampling draws in id order; top-k selects its `k` in linear time and sorts only those; top-p
    /// sorts growing prefixes (64, 256, ... tokens, each selected in linear time) until one
    /// reaches `p`, so a nucleus of a few hundred tokens out of 50,257 costs a few linear passes,
    /// not a sort of the vocabulary. Every order is the one total order below, so the tokens kept
    /// do not depend on how they were found.
    fn candidates(&self, logits: &[f32], location: &'static Location<'static>, scratch: &mut Scratch) -> Result<()> {
        scratch.weights.clear();
        if logits.is_empty() {
            return fail(GenerateErrorKind::Logits, location, "no logits to sample from (vocabulary size 0)".into());
        }
        let best = match first_largest(logits) {
            Ok(best) => best,
            Err(i) => {
                let message = format!("logit {i} of {} is {}", logits.len(), logits[i]);
                return fail(GenerateErrorKind::Logits, location, message);
            }
        };
        let Sampling::Sample { temperature, top_k, top_p } = *self else {
            scratch.weights.push((best as u32, 1.0));
            return Ok(());
        };
        // A nucleus of 1 is every token: no cut (a sum in another order could stop short of
        // the total, dropping a tail of weights below its rounding).
        let top_p = top_p.filter(|&p| p < 1.0);
        // softmax in f64, shifted by the largest logit: every weight is in [0, 1], the largest's 1.
        let (max, t) = (logits[best] as f64, temperature as f64);
        let weight = |l: f32| ((l as f64 - max) / t).exp();
        if top_k.is_none() && top_p.is_none() {
            scratch.weights.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, weight(l))));
        } else {
            let kept = &mut scratch.order;
            kept.clear();
            kept.extend(logits.iter().enumerate().map(|(i, &l)| order_key(i as u32, l)));
            if let Some(k) = top_k
                && k < kept.len()
            {
                kept.select_nth_unstable(k - 1);
                kept.truncate(k);
            }
            let logit = |key: u64| logits[key as u32 as usize];
            let m = kept.len();
            let mut n = m;
            if let Some(p) = top_p {
                let target = p as f64 * kept.iter().map(|&key| weight(logit(key))).sum::<f64>();
                let mut prefix = m.min(64);
                n = loop {
                    if prefix < m {
                        kept.select_nth_unstable(prefix - 1);
                    }
                    kept[..prefix].sort_unstable();
                    let mut sum = 0.0;
                    let reached = kept[..prefix].iter().position(|&key| {
                        sum += weight(logit(key));
                        sum >= target
                    });
                    match reached {
                        Some(j) => break j + 1,
                        // Rounding can leave the sum of all just below `p` times the total.
                        None if prefix == m => break m,
                        None => prefix = m.min(prefix * 4),
                    }
                };
            } else {
                kept.sort_unstable();
            }
            scratch.weights.extend(kept[..n].iter().map(|&key| (key as u32, weight(logit(key)))));
        }
        // A weight that underflowed to 0 (a logit far below the largest at a low temperature) is
        // never drawn; the largest has weight 1, so some weight is positive.
        scratch.weights.retain(|&(_, w)| w > 0.0);
        Ok(())
    }

    /// Draws a token from `candidates` (positive weights) with `rng`.
    fn draw(candidates: &[(u32, f64)], rng: &mut Xoshiro256) -> u32 {
        if let [(only, _)] = candidates {
            return *only;
        }
        let total: f64 = candidates.iter().map(|&(_, w)| w).sum();
        let u = rng.next_f64() * total;
        let mut sum = 0.0;
        for &(t, w) in candidates {
            sum += w;
            if u < sum {
                return t;
            }
        }
        // Rounding can leave `u` at the very top of the sum: the last candidate.
        candidates.last().expect("at least one candidate").0
    }
}

/// The index of the first largest of `logits` (not empty), or `Err(i)` for the first that is NaN
/// or infinite. Lane-wise maxima and a lane-wise sum of `x * 0.0` (NaN exactly when `x` is not
/// finite) that the compiler can vectorize, then a scan for the first index of the maximum.
fn first_largest(logits: &[f32]) -> std::result::Result<usize, usize> {
    const LANES: usize = 8;
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut not_finite = [0f32; LANES];
    let chunks = logits.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for j in 0..LANES {
            max[j] = if chunk[j] > max[j] { chunk[j] } else { max[j] };
            not_finite[j] += chunk[j] * 0.0;
        }
    }
    for &x in rest {
        max[0] = if x > max[0] { x } else { max[0] };
        not_finite[0] += x * 0.0;
    }
    if not_finite.iter().any(|x| x.is_nan()) {
        return Err(logits.iter().position(|l| !l.is_finite()).expect("a logit is not finite"));
    }
    let largest = max.into_iter().fold(f32::NEG_INFINITY, f32::max);
    Ok(logits.iter().position(|&l| l == largest).expect("the largest is one of the logits"))
}

/// A key whose ascending order is the sampling order: larger logits first, equal logits by id
/// (lowest first; `-0.0` equals `0.0`, as in the greedy choice). The logit's bits, mapped to an
/// unsigned integer that grows with the logit and inverted, above the id: integer keys select and
/// sort faster than `(id, logit)` pairs under a comparison closure (about 1.5x for top-k and
/// top-p over 50,257 logits, measured on a loaded 2-core machine).
fn order_key(id: u32, logit: f32) -> u64 {
    let bits = (logit + 0.0).to_bits();
    let increasing = if bits >> 31 == 1 { !bits } else { bits | 1 << 31 };
    (u64::from(!increasing) << 32) | u64::from(id)
}

/// The sampler's buffers, kept across the steps of a [`generate`] call so that a step allocates
/// nothing once they have grown to the vocabulary size.
#[derive(Default)]
struct Scratch {
    /// The [`order_key`]s of the tokens being selected and ordered (top-k, top-p).
    order: Vec<u64>,
    /// The candidates of the last row and their weights.
    weights: Vec<(u32, f64)>,
}

/// What [`generate`] does.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateConfig {
    /// The most tokens generated per row.
    pub max_new_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// The seed of the generators tokens are drawn from (unused by [`Sampling::Greedy`]).
    pub seed: u64,
    /// A row that emits one of these stops; the stop token is the last token of its output.
    pub stop_tokens: Vec<u32>,
}

impl GenerateConfig {
    /// Greedy decoding of up to `max_new_tokens` tokens, no stop tokens.
    pub fn greedy(max_new_tokens: usize) -> GenerateConfig {
        GenerateConfig { max_new_tokens, sampling: Sampling::Greedy, seed: 0, stop_tokens: Vec::new() }
    }

    /// Checks the sampling parameters (see [`Sampling::validate`]).
    #[track_caller]
    pub fn validate(&self) -> Result<()> {
        self.sampling.check(Location::caller())
    }
}

/// Decodes up to `config.max_new_tokens` tokens after each of `prompts` (a batch of rows of equal,
/// non-zero length, every id below the decoder's vocabulary) and returns each row's new tokens.
///
/// The decoder is [reset](Decoder::reset), fed the prompts, then fed each step's tokens. A row
/// that emits one of `config.stop_tokens` is finished: the stop token is the last token of its
/// output and the row emits nothing more (the decoder keeps being fed the stop token for it, so
/// the rows stay of equal length). Decoding ends when every row is finished, after
/// `max_new_tokens` steps, or when `on_token` breaks; the decoder is not fed the last step's
/// tokens.
///
/// `on_token` is called once per step, in order, with that step's token per row (`None` for a
/// row finished at an earlier step): every token returned is passed to it exactly once, so it can
/// stream them. Returning [`ControlFlow::Break`] stops after that step (its tokens are kept).
///
/// Errors (with the caller's source line): an invalid config, bad prompts, a stop token outside
/// the vocabulary, logits that are not `[batch][vocab]` or hold a NaN or infinity, and whatever
/// the decoder returns.
///
/// ```
/// use std::ops::ControlFlow;
/// use kiln_nn::{GenerateConfig, RecomputeDecoder, Sampling, Transformer, generate};
///
/// kiln::manual_seed(0);
/// let model = Transformer::new(16, 2, 1, 1e-5, 32)?;
/// let mut decoder = RecomputeDecoder::new(&model);
/// let config = GenerateConfig {
///     max_new_tokens: 5,
///     sampling: Sampling::Sample { temperature: 0.8, top_k: Some(10), top_p: Some(0.95) },
///     seed: 42,
///     stop_tokens: vec![0],
/// };
/// let mut streamed: Vec<u32> = Vec::new();
/// let new = generate(&mut decoder, &[vec![1, 2, 3]], &config, |step| {
///     streamed.extend(step.iter().flatten());
///     ControlFlow::Continue(())
/// })?;
/// assert_eq!(new[0], streamed);
/// assert!(new[0].len() <= 5 && new[0].iter().all(|&t| t < 32));
/// // The same seed draws the same tokens.
/// assert_eq!(generate(&mut decoder, &[vec![1, 2, 3]], &config, |_| ControlFlow::Continue(()))?, new);
/// # Ok::<(), kiln_nn::NnError>(())
/// ```
#[track_caller]
pub fn generate<D: Decoder + ?Sized>(
    decoder: &mut D,
    prompts: &[Vec<u32>],
    config: &GenerateConfig,
    mut on_token: impl FnMut(&[Option<u32>]) -> ControlFlow<()>,
) -> Result<Vec<Vec<u32>>> {
    let location = Location::caller();
    config.sampling.check(location)?;
    let vocab = decoder.vocab_size();
    let (batch, _) = check_rows(prompts, vocab, "prompt", location)?;
    if let Some(&t) = config.stop_tokens.iter().find(|&&t| t as usize >= vocab) {
        return fail(
            GenerateErrorKind::Config,
            location,
            format!("stop token {t} is not below the vocabulary size {vocab}"),
        );
    }
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); batch];
    if config.max_new_tokens == 0 {
        return Ok(out);
    }
    let mut rngs: Vec<Xoshiro256> =
        (0..batch as u64).map(|r| Xoshiro256::seed_from_u64(config.seed ^ mix64(r))).collect();
    let mut finished = vec![false; batch];
    let mut scratch = Scratch::default();
    decoder.reset()?;
    let mut logits = decoder.feed(prompts)?;
    let mut step_tokens: Vec<Option<u32>> = vec![None; batch];
    let mut next: Vec<Vec<u32>> = vec![Vec::with_capacity(1); batch];
    for step in 0..config.max_new_tokens {
        if logits.len() != batch * vocab {
            return fail(
                GenerateErrorKind::Logits,
                location,
                format!(
                    "step {step}: the decoder returned {} logits, not batch {batch} x vocabulary {vocab}",
                    logits.len()
                ),
            );
        }
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            step_tokens[r] = None;
            if finished[r] {
                continue;
            }
            config.sampling.candidates(row, location, &mut scratch).map_err(|e| match e {
                NnError::Generate { kind, message, location } => {
                    NnError::Generate { kind, message: format!("step {step}, row {r}: {message}"), location }
                }
                other => other,
            })?;
            let token = Sampling::draw(&scratch.weights, &mut rngs[r]);
            out[r].push(token);
            step_tokens[r] = Some(token);
            finished[r] = config.stop_tokens.contains(&token);
        }
        let stop = on_token(&step_tokens).is_break();
        if stop || step + 1 == config.max_new_tokens || finished.iter().all(|&f| f) {
            break;
        }
        for (r, row) in next.iter_mut().enumerate() {
            row.clear();
            row.push(*out[r].last().expect("every row emitted a token at step 0"));
        }
        logits = decoder.feed(&next)?;
    }
    Ok(out)
}

/// The reference [`Decoder`] over a [`Transformer`]: keeps the tokens fed so far and runs the
/// full forward pass on all of them every step (no cache: step `n` costs a forward of `n`
/// tokens). The forward is one `kiln::jit` function of the token ids `[batch, seq]` with `seq`
/// symbolic, so every step of every length runs one compiled program (per batch size); the
/// model's weights are constants of it, which the shared borrow keeps unchanged.
pub struct RecomputeDecoder<'a> {
    model: &'a Transformer,
    tokens: Vec<Vec<u32>>,
    jit: JitCache,
}

impl<'a> RecomputeDecoder<'a> {
    /// A decoder over `model` with nothing fed yet.
    pub fn new(model: &'a Transformer) -> RecomputeDecoder<'a> {
        RecomputeDecoder { model, tokens: Vec::new(), jit: JitCache::new() }
    }

    /// The tokens fed since the last reset, per row.
    pub fn tokens(&self) -> &[Vec<u32>] {
        &self.tokens
    }

    /// How many times the forward pass was traced and compiled: once per batch size.
    pub fn traces(&self) -> usize {
        self.jit.traces()
    }
}

impl Decoder for RecomputeDecoder<'_> {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn reset(&mut self) -> Result<()> {
        self.tokens.clear();
        Ok(())
    }

    /// Errors (kind [`GenerateErrorKind::Tokens`]) for bad tokens, a batch size other than the
    /// one fed since the reset, and more tokens in all than the model's `max_seq_len`.
    #[track_caller]
    fn feed(&mut self, tokens: &[Vec<u32>]) -> Result<Vec<f32>> {
        let location = Location::caller();
        let vocab = self.vocab_size();
        let (batch, len) = check_rows(tokens, vocab, "token", location)?;
        let past = self.tokens.first().map_or(0, Vec::len);
        if past > 0 && batch != self.tokens.len() {
            return fail(
                GenerateErrorKind::Tokens,
                location,
                format!("fed {batch} rows after {} rows (reset to change the batch size)", self.tokens.len()),
            );
        }
        let max = self.model.config.max_seq_len;
        if past + len > max {
            return fail(
                GenerateErrorKind::Tokens,
                location,
                format!("{past} tokens fed and {len} more exceed the model's max_seq_len {max}"),
            );
        }
        let total = past + len;
        let mut ids: Vec<i32> = Vec::with_capacity(batch * total);
        for (r, new) in tokens.iter().enumerate() {
            let old = self.tokens.get(r).map_or(&[][..], Vec::as_slice);
            // An id above `i32::MAX` (a vocabulary of 2^31 rows) becomes one the embedding's
            // lookup reports as out of range.
            ids.extend(old.iter().chain(new).map(|&t| i32::try_from(t).unwrap_or(i32::MAX)));
        }
        let device = self.model.wte.weight.device();
        let ids = Tensor::from_vec_on(ids, &[batch, total], device).with_dims(vec![Dim::from(batch), Dim::sym("seq")]);
        let model = self.model;
        let out = self.jit.call(&[&ids], |a: &[Tensor]| {
            let logits = kiln::no_grad(|| model.forward(&a[0]));
            let seq = a[0].shape()[1];
            logits.narrow(1, seq - Dim::from(1), 1)
        })?;
        let logits = out[0].to_vec::<f32>()?;
        if past == 0 {
            self.tokens = tokens.to_vec();
        } else {
            for (row, new) in self.tokens.iter_mut().zip(tokens) {
                row.extend_from_slice(new);
            }
        }
        Ok(logits)
    }
}

/// SplitMix64's output function (Steele, Lea and Flood): a bijection of `u64` with `mix64(0) = 0`.
fn mix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The next SplitMix64 output from `state`.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    mix64(*state)
}

/// xoshiro256** (Blackman and Vigna, 2018): a small, fast generator with 256 bits of state.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    /// The generator whose state is the next four SplitMix64 outputs from `seed` (never all zero:
    /// SplitMix64's outputs from consecutive states are distinct).
    fn seed_from_u64(seed: u64) -> Xoshiro256 {
        let mut state = seed;
        Xoshiro256 { s: [(); 4].map(|_| splitmix64(&mut state)) }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`: the top 53 bits as a fraction.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The [`Decoder`] that decoding uses: a [`Transformer`] with a [`KvCache`]. Each step feeds only
/// the new tokens ([`Transformer::forward_at_last`]: one compiled program for the prompt and
/// every step, the cache updated in place), so step `n` costs one token's forward whatever `n`.
pub struct CachedDecoder<'a> {
    model: &'a mut Transformer,
    cache: Option<KvCache>,
}

impl<'a> CachedDecoder<'a> {
    /// A decoder over `model` with nothing fed yet (the cache is allocated on the first feed,
    /// for its batch size).
    pub fn new(model: &'a mut Transformer) -> CachedDecoder<'a> {
        CachedDecoder { model, cache: None }
    }

    /// The cache, once something was fed.
    pub fn cache(&self) -> Option<&KvCache> {
        self.cache.as_ref()
    }
}

impl Decoder for CachedDecoder<'_> {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn reset(&mut self) -> Result<()> {
        if let Some(cache) = &mut self.cache {
            cache.reset();
        }
        Ok(())
    }

    /// Errors (kind [`GenerateErrorKind::Tokens`]) for bad tokens and a batch size other than
    /// the one fed since the reset; past the model's `max_seq_len`, the cache's error.
    #[track_caller]
    fn feed(&mut self, tokens: &[Vec<u32>]) -> Result<Vec<f32>> {
        let location = Location::caller();
        let (batch, len) = check_rows(tokens, self.vocab_size(), "token", location)?;
        let cache = match &mut self.cache {
            Some(c) if c.batch() == batch => c,
            Some(c) if !c.is_empty() => {
                return fail(
                    GenerateErrorKind::Tokens,
                    location,
                    format!("fed {batch} rows after {} rows (reset to change the batch size)", c.batch()),
                );
            }
            _ => self.cache.insert(self.model.kv_cache(batch)?),
        };
        let ids: Vec<i32> = tokens.iter().flatten().map(|&t| i32::try_from(t).unwrap_or(i32::MAX)).collect();
        let ids = Tensor::from_vec_on(ids, &[batch, len], self.model.wte.weight.device());
        let start = cache.len();
        Ok(self.model.forward_at_last(&ids, start, cache)?.to_vec::<f32>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published outputs of the reference xoshiro256** from the state {1, 2, 3, 4} (the
    /// reference test of the `rand_xoshiro` crate).
    #[test]
    fn xoshiro256_matches_the_reference_outputs() {
        let mut rng = Xoshiro256 { s: [1, 2, 3, 4] };
        let want: [u64; 10] = [
            11520,
            0,
            1509978240,
            1215971899390074240,
            1216172134540287360,
            607988272756665600,
            16172922978634559625,
            8476171486693032832,
            10595114339597558777,
            2904607092377533576,
        ];
        assert_eq!(want.map(|_| rng.next_u64()), want);
    }

    /// SplitMix64's published outputs from the seeds 0 and 1234567.
    #[test]
    fn splitmix64_matches_the_reference_outputs() {
        let mut state = 0;
        let want = [0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f, 0xf88bb8a8724c81ec];
        assert_eq!(want.map(|_| splitmix64(&mut state)), want);
        let mut state = 1234567;
        let want: [u64; 5] =
            [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821];
        assert_eq!(want.map(|_| splitmix64(&mut state)), want);
        assert_eq!(mix64(0), 0, "row 0 draws from the seed itself");
        let mut seeded = Xoshiro256::seed_from_u64(0);
        assert_eq!(seeded.s, [0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f, 0xf88bb8a8724c81ec]);
        let u: Vec<f64> = (0..1000).map(|_| seeded.next_f64()).collect();
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = u.iter().sum::<f64>() / u.len() as f64;
        assert!((mean - 0.5).abs() < 0.05, "mean of 1000 uniforms {mean}");
    }

    #[test]
    fn greedy_takes_the_lowest_id_among_equal_largest_logits() {
        let d = Sampling::Greedy.distribution(&[0.5, 2.0, -1.0, 2.0]).unwrap();
        assert_eq!(d, vec![(1, 1.0)]);
        let mut rng = Xoshiro256::seed_from_u64(3);
        let before = rng.clone();
        let mut scratch = Scratch::default();
        Sampling::Greedy.candidates(&[0.5, 2.0, -1.0, 2.0], Location::caller(), &mut scratch).unwrap();
        assert_eq!(Sampling::draw(&scratch.weights, &mut rng), 1);
        assert_eq!(rng, before, "greedy draws nothing");
    }

    /// The order keys sort as (logit descending, id ascending) over every kind of finite f32, and
    /// the greedy choice finds the first largest logit and the first non-finite one, in every lane.
    #[test]
    fn order_keys_and_the_greedy_scan_agree_with_plain_comparisons() {
        let values = [f32::MAX, 1e30, 3.5, 1.0, f32::MIN_POSITIVE, 1e-45, 0.0, -0.0, -1e-45, -2.0, -1e30, f32::MIN];
        let mut pairs: Vec<(u32, f32)> = Vec::new();
        for (i, &v) in values.iter().cycle().take(40).enumerate() {
            pairs.push(((i * 7 % 40) as u32, v));
        }
        let mut by_keys = pairs.clone();
        by_keys.sort_by_key(|&(i, l)| order_key(i, l));
        let mut by_compare = pairs.clone();
        by_compare.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
        assert_eq!(by_keys, by_compare);
        for n in 1..40 {
            for at in 0..n {
                let mut logits: Vec<f32> = (0..n).map(|i| ((i * 13) % 7) as f32 - 3.0).collect();
                logits[at] = 10.0;
                let want = logits.iter().position(|&l| l == 10.0).unwrap();
                assert_eq!(first_largest(&logits), Ok(want), "n {n}");
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut with_bad = logits.clone();
                    with_bad[at] = bad;
                    assert_eq!(first_largest(&with_bad), Err(at), "n {n}, {bad} at {at}");
                }
            }
        }
        assert_eq!(first_largest(&[-0.0, 0.0, -1.0]), Ok(0), "-0.0 equals 0.0: the first");
        assert_eq!(first_largest(&[f32::MIN, f32::MIN]), Ok(0));
    }

    /// Probabilities 0.4, 0.3, 0.2, 0.1 (logits their logs): the nucleus is the smallest prefix
    /// whose sum reaches `p`, ties ordered by id.
    #[test]
    fn the_nucleus_is_the_smallest_prefix_reaching_p() {
        let logits: Vec<f32> = [0.1f32, 0.4, 0.2, 0.3].iter().map(|p| p.ln()).collect();
        let nucleus = |p: f32| {
            let s = Sampling::Sample { temperature: 1.0, top_k: None, top_p: Some(p) };
            s.distribution(&logits).unwrap().into_iter().map(|(t, _)| t).collect::<Vec<_>>()
        };
        assert_eq!(nucleus(1e-6), [1]);
        assert_eq!(nucleus(0.39), [1]);
        assert_eq!(nucleus(0.41), [1, 3]);
        assert_eq!(nucleus(0.69), [1, 3]);
        assert_eq!(nucleus(0.71), [1, 3, 2]);
        assert_eq!(nucleus(1.0), [1, 3, 2, 0]);
        let s = Sampling::Sample { temperature: 1.0, top_k: None, top_p: Some(0.71) };
        let d = s.distribution(&logits).unwrap();
        for ((_, got), want) in d.iter().zip([0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9]) {
            assert!((got - want).abs() < 1e-6, "{d:?}");
        }
        // Equal logits: the lower id first, so a nucleus of one is the greedy token.
        let tied = Sampling::Sample { temperature: 1.0, top_k: None, top_p: Some(0.1) };
        assert_eq!(tied.distribution(&[1.0, 3.0, 3.0, 3.0]).unwrap().len(), 1);
        assert_eq!(tied.distribution(&[1.0, 3.0, 3.0, 3.0]).unwrap()[0].0, 1);
        let tied_k = Sampling::Sample { temperature: 1.0, top_k: Some(2), top_p: None };
        let ids: Vec<u32> = tied_k.distribution(&[3.0, 1.0, 3.0, 3.0]).unwrap().into_iter().map(|(t, _)| t).collect();
        assert_eq!(ids, [0, 2]);
    }

    /// Over a vocabulary of 5,000 logits with many ties, top-k and top-p (found by growing
    /// prefixes) keep exactly what a full sort of the vocabulary by (logit descending, id) keeps,
    /// with the same probabilities.
    #[test]
    fn top_k_and_top_p_agree_with_a_full_sort() {
        let mut rng = Xoshiro256::seed_from_u64(11);
        // Logits on a grid of 0.25 in [-8, 8): ties everywhere.
        let logits: Vec<f32> = (0..5000).map(|_| ((rng.next_f64() * 64.0).floor() * 0.25 - 8.0) as f32).collect();
        for temperature in [0.3f32, 1.0, 2.5] {
            for top_k in [None, Some(1), Some(7), Some(300), Some(4999), Some(5000), Some(9000)] {
                for top_p in [None, Some(1e-9f32), Some(0.05), Some(0.5), Some(0.9), Some(0.999), Some(1.0)] {
                    let sampling = Sampling::Sample { temperature, top_k, top_p };
                    let got = sampling.distribution(&logits).unwrap();
                    // The reference: sort everything, cut at k, softmax, cut at the nucleus.
                    let mut all: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
                    all.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
                    all.truncate(top_k.unwrap_or(usize::MAX).min(all.len()));
                    let w: Vec<f64> =
                        all.iter().map(|&(_, l)| ((l as f64 - all[0].1 as f64) / temperature as f64).exp()).collect();
                    let total: f64 = w.iter().sum();
                    let mut n = all.len();
                    if let Some(p) = top_p.filter(|&p| p < 1.0) {
                        let mut sum = 0.0;
                        if let Some(j) = w.iter().position(|&x| {
                            sum += x;
                            sum >= p as f64 * total
                        }) {
                            n = j + 1;
                        }
                    }
                    let kept_total: f64 = w[..n].iter().sum();
                    let want: Vec<(u32, f64)> =
                        all[..n].iter().zip(&w).map(|(&(i, _), &x)| (i, x / kept_total)).collect();
                    let what = format!("t {temperature}, top_k {top_k:?}, top_p {top_p:?}");
                    assert_eq!(got.len(), want.len(), "{what}");
                    for ((gi, gp), (wi, wp)) in got.iter().zip(&want) {
                        assert_eq!(gi, wi, "{what}");
                        assert!((gp - wp).abs() < 1e-12, "{what}: token {gi}: {gp} vs {wp}");
                    }
                }
            }
        }
    }

    /// Temperature divides the logits: at 0.5 the probabilities are the squares, renormalized; a
    /// logit whose weight underflows at a tiny temperature is dropped, not a NaN.
    #[test]
    fn temperature_scales_the_logits_in_f64() {
        let logits: Vec<f32> = [0.5f32, 0.25, 0.15, 0.1].iter().map(|p| p.ln()).collect();
        let d = Sampling::temperature(0.5).distribution(&logits).unwrap();
        let total = 0.25 + 0.0625 + 0.0225 + 0.01;
        for ((_, got), want) in d.iter().zip([0.25 / total, 0.0625 / total, 0.0225 / total, 0.01 / total]) {
            assert!((got - want).abs() < 1e-6, "{d:?}");
        }
        let d = Sampling::temperature(1e-30).distribution(&[1.0, 1000.0, -3e38]).unwrap();
        assert_eq!(d, vec![(1, 1.0)]);
        let d = Sampling::temperature(1e30).distribution(&[3e38, -3e38]).unwrap();
        assert!(d.iter().all(|&(_, p)| p.is_finite() && p > 0.0), "{d:?}");
    }
}

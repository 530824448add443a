//! The GPT-style decoder the `kiln` command profiles and benchmarks: `nn::Transformer` in the
//! configuration of the anchor benchmark (`shared/anchors/bench_transformer.py`: dim 64, 8 heads,
//! vocab 64, 64 positions, token ids of shape (10, 3)), with weights from a fixed seed.

use kiln::{Bindings, Dim, Symbol, Tensor};
use nn::{KvCache, Module, Transformer, TransformerConfig};

/// Sizes of the model and of its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    pub layers: usize,
    pub dim: usize,
    pub heads: usize,
    pub vocab: usize,
    pub max_seq: usize,
    pub batch: usize,
    pub seq: usize,
    /// `Some(p)`: the forward with a key/value cache, its tokens at positions `[p, p + seq)`
    /// (`Transformer::forward_cached`, `start_pos` and `seq` symbols); `None`: the plain forward.
    pub start_pos: Option<usize>,
}

impl Default for GptConfig {
    /// The anchor benchmark's configuration with 2 layers.
    fn default() -> GptConfig {
        GptConfig { layers: 2, dim: 64, heads: 8, vocab: 64, max_seq: 64, batch: 10, seq: 3, start_pos: None }
    }
}

impl GptConfig {
    /// Checks the sizes fit together (the heads divide the width, the sequence fits).
    pub fn validate(&self) -> Result<(), String> {
        if self.dim == 0 || self.heads == 0 || !self.dim.is_multiple_of(self.heads) {
            return Err(format!("--dim {} must be a positive multiple of --heads {}", self.dim, self.heads));
        }
        if self.seq == 0 || self.seq > self.max_seq {
            return Err(format!("--seq {} must be in 1..={}", self.seq, self.max_seq));
        }
        if let Some(p) = self.start_pos
            && p + self.seq > self.max_seq
        {
            return Err(format!("--start-pos {p} + --seq {} must be at most --max-seq {}", self.seq, self.max_seq));
        }
        if self.batch == 0 || self.vocab == 0 {
            return Err("--batch and --vocab must be positive".into());
        }
        Ok(())
    }
}

/// The decoder with its weights (realized source tensors), ready to record forward passes.
pub struct Gpt {
    pub config: GptConfig,
    pub model: Transformer,
    /// With `start_pos`: the zeroed key/value cache the cached forward reads and updates, made
    /// with the weights (model state, as they are: not part of a forward's compile).
    pub cache: Option<KvCache>,
}

impl Gpt {
    /// Builds the weights from the facade's generator reset to `seed`.
    pub fn new(config: GptConfig, seed: u64) -> anyhow::Result<Gpt> {
        kiln::manual_seed(seed);
        let model = Transformer::from_config(TransformerConfig {
            dim: config.dim,
            n_heads: config.heads,
            n_layers: config.layers,
            norm_eps: 1e-5,
            vocab_size: config.vocab,
            max_seq_len: config.max_seq,
        })?;
        let cache = config.start_pos.map(|_| model.kv_cache(config.batch)).transpose()?;
        Ok(Gpt { config, model, cache })
    }

    /// Token ids `(batch, seq)` as `i32`, from `seed` ([`random_ids`]).
    pub fn tokens(&self, seed: u64) -> Tensor {
        let c = &self.config;
        Tensor::from_vec(random_ids(c.batch * c.seq, c.vocab, seed), &[c.batch, c.seq])
    }

    /// Records the forward pass (nothing runs): logits `(batch, seq, vocab)`, without gradients.
    pub fn forward(&self, tokens: &Tensor) -> Tensor {
        kiln::no_grad(|| self.model.forward(tokens))
    }

    /// Records the forward the configuration names: the plain [`Gpt::forward`], or with
    /// `start_pos` the cached forward on the zeroed key/value cache [`Gpt::cache`], its tokens' sequence
    /// length the symbol `seq`, its position the symbol `start_pos` and the attended length the
    /// symbol `kv_len`: logits, then every block's updated keys and values. Returns the outputs
    /// and the symbol values a run needs beyond what its inputs bind (`start_pos`, `kv_len`).
    pub fn outputs(&self, tokens: &Tensor) -> anyhow::Result<(Vec<Tensor>, Bindings)> {
        let (Some(start), Some(cache)) = (self.config.start_pos, &self.cache) else {
            return Ok((vec![self.forward(tokens)], Bindings::new()));
        };
        let kv: Vec<Tensor> = (0..self.config.layers)
            .flat_map(|b| [cache.keys(b), cache.values(b)])
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow::anyhow!("the cache has fewer blocks than the model"))?;
        let tokens = tokens.with_dims(vec![Dim::Const(self.config.batch as i64), Dim::sym("seq")]);
        let (start_pos, kv_len) = (Dim::sym("start_pos"), Dim::sym("kv_len"));
        let outputs = kiln::no_grad(|| self.model.forward_cached(&tokens, &start_pos, &kv_len, &kv))?;
        let len = self.model.attended_len(start, self.config.seq);
        Ok((outputs, Bindings::from([(Symbol::new("start_pos"), start as i64), (Symbol::new("kv_len"), len as i64)])))
    }
}

/// `n` token ids below `vocab` from `seed` (splitmix64): the benchmarks' deterministic inputs.
pub fn random_ids(n: usize, vocab: usize, seed: u64) -> Vec<i32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % vocab as u64) as i32
        })
        .collect()
}

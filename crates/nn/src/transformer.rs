//! The GPT-style decoder: `Mlp`, the pre-norm `Block`, and `Transformer`.
//!
//! Parameter names (what `save_safetensors` writes):
//! `wte.weight`, `wpe.weight`, `blocks.{i}.ln1.{weight,bias}`, `blocks.{i}.attn.{q,k,v,o}.{weight,bias}`,
//! `blocks.{i}.ln2.{weight,bias}`, `blocks.{i}.mlp.{fc,proj}.{weight,bias}`, `ln_f.{weight,bias}`,
//! `head.weight`.

use kiln::{DType, Device, Dim, HostData, HostTensor, JitCache, Scalar, Symbol, Tensor};

use crate::Module;
use crate::activation::Activation;
use crate::attention::CausalSelfAttention;
use crate::error::{NnError, Result};
use crate::linear::{Embedding, Linear};
use crate::module::ModuleParams;
use crate::norm::LayerNorm;
use crate::train::{model_tensors, with_tensors};

/// `proj(act(fc(x)))` with a hidden width of `hidden` (GPT-2: `4 * dim`, tanh-approximated GELU).
#[derive(Module)]
pub struct Mlp {
    /// `dim -> hidden`.
    #[module]
    pub fc: Linear,
    /// `hidden -> dim`.
    #[module]
    pub proj: Linear,
    /// The activation between the two.
    pub activation: Activation,
}

impl Mlp {
    /// An MLP `dim -> hidden -> dim` with biases.
    pub fn new(dim: usize, hidden: usize, activation: Activation) -> Mlp {
        Mlp { fc: Linear::new(dim, hidden, true), proj: Linear::new(hidden, dim, true), activation }
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.proj.forward(&self.activation.apply(&self.fc.forward(x)))
    }
}

/// A pre-norm Transformer block: `x += attn(ln1(x)); x += mlp(ln2(x))`.
#[derive(Module)]
pub struct Block {
    /// Norm before attention.
    #[module]
    pub ln1: LayerNorm,
    /// Causal self-attention.
    #[module]
    pub attn: CausalSelfAttention,
    /// Norm before the MLP.
    #[module]
    pub ln2: LayerNorm,
    /// The MLP.
    #[module]
    pub mlp: Mlp,
}

impl Block {
    /// A block of width `dim` with `n_heads` heads and a `4 * dim` GELU (tanh) MLP.
    pub fn new(dim: usize, n_heads: usize, norm_eps: f64, max_seq_len: usize) -> Result<Block> {
        Ok(Block {
            ln1: LayerNorm::new(dim, norm_eps),
            attn: CausalSelfAttention::new(dim, n_heads, max_seq_len)?,
            ln2: LayerNorm::new(dim, norm_eps),
            mlp: Mlp::new(dim, 4 * dim, Activation::GeluTanh),
        })
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Tensor {
        let x = x.add(self.attn.forward(&self.ln1.forward(x)));
        x.add(self.mlp.forward(&self.ln2.forward(&x)))
    }
}

/// The sizes of a [`Transformer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransformerConfig {
    /// Model width.
    pub dim: usize,
    /// Attention heads per block.
    pub n_heads: usize,
    /// Number of blocks.
    pub n_layers: usize,
    /// LayerNorm epsilon.
    pub norm_eps: f64,
    /// Vocabulary size (token ids are `0..vocab_size`).
    pub vocab_size: usize,
    /// Number of learned positions (the longest sequence).
    pub max_seq_len: usize,
}

/// A GPT-style decoder: token ids `[batch, seq]` to logits `[batch, seq, vocab]`.
///
/// `x = wte(ids) + wpe(0..seq)`, then the blocks, the final LayerNorm `ln_f` and the vocabulary
/// projection `head` (no bias).
#[derive(Module)]
pub struct Transformer {
    /// Token embedding `[vocab, dim]`.
    #[module]
    pub wte: Embedding,
    /// Learned position embedding `[max_seq_len, dim]`.
    #[module]
    pub wpe: Embedding,
    /// The blocks.
    #[module]
    pub blocks: Vec<Block>,
    /// Final norm.
    #[module]
    pub ln_f: LayerNorm,
    /// `dim -> vocab`, no bias.
    #[module]
    pub head: Linear,
    /// The sizes.
    pub config: TransformerConfig,
    /// The forward pass as recorded per input signature, and a block as recorded once per
    /// model (`kiln::Recorder`): a forward called again with tokens of a type seen before adds
    /// one node instead of recording ~180 per block, and a first forward (or a cached forward's
    /// first trace) records two blocks and makes the others one node each. The weights are the
    /// recordings' arguments, so new weights need no new recording; the sizes, epsilons and
    /// activations are their key.
    pub recorder: kiln::Recorder,
}

impl Transformer {
    /// The default number of learned positions of [`Transformer::new`].
    pub const DEFAULT_MAX_SEQ_LEN: usize = 64;

    /// A decoder with [`Transformer::DEFAULT_MAX_SEQ_LEN`] positions; see
    /// [`Transformer::from_config`] to choose `max_seq_len`.
    pub fn new(dim: usize, n_heads: usize, n_layers: usize, norm_eps: f64, vocab_size: usize) -> Result<Transformer> {
        Transformer::from_config(TransformerConfig {
            dim,
            n_heads,
            n_layers,
            norm_eps,
            vocab_size,
            max_seq_len: Transformer::DEFAULT_MAX_SEQ_LEN,
        })
    }

    /// A decoder of the given sizes, initialised like GPT-2 (normal, std 0.02, for embeddings).
    pub fn from_config(config: TransformerConfig) -> Result<Transformer> {
        let TransformerConfig { dim, n_heads, n_layers, norm_eps, vocab_size, max_seq_len } = config;
        let mut wte = Embedding::new(vocab_size, dim);
        let mut wpe = Embedding::new(max_seq_len, dim);
        wte.weight = wte.weight.mul(0.02f32).to_host().map(kiln::Tensor::from_host)?.requires_grad_();
        wpe.weight = wpe.weight.mul(0.02f32).to_host().map(kiln::Tensor::from_host)?.requires_grad_();
        let blocks = (0..n_layers).map(|_| Block::new(dim, n_heads, norm_eps, max_seq_len)).collect::<Result<_>>()?;
        Ok(Transformer {
            wte,
            wpe,
            blocks,
            ln_f: LayerNorm::new(dim, norm_eps),
            head: Linear::new(dim, vocab_size, false),
            config,
            recorder: kiln::Recorder::new(),
        })
    }
}

impl Module for Transformer {
    fn forward(&self, ids: &Tensor) -> Tensor {
        let [logits] = self.recorded("forward", self.structure_key(), &[ids], self, || [self.record_forward(ids)]);
        logits
    }
}

impl Transformer {
    /// What the forward pass depends on besides its tensors: the sizes, each norm's epsilon and
    /// each block's heads and activation.
    fn structure_key(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let c = &self.config;
        (c.dim, c.n_heads, c.n_layers, c.vocab_size, c.max_seq_len, c.norm_eps.to_bits()).hash(&mut h);
        self.ln_f.eps.to_bits().hash(&mut h);
        for b in &self.blocks {
            b.structure_key(&mut h);
        }
        h.finish()
    }

    /// The forward pass, recorded op by op.
    fn record_forward(&self, ids: &Tensor) -> Tensor {
        let seq = ids.shape().get(1).cloned().unwrap_or(kiln::Dim::Const(1));
        let positions = self.wpe.weight.narrow(0, 0, seq);
        let mut x = self.wte.forward(ids).add(positions);
        for block in &self.blocks {
            x = self.block(block, &x);
        }
        self.head.forward(&self.ln_f.forward(&x))
    }

    /// `block.forward(x)`, the blocks of a model being one function of their own tensors,
    /// recorded once ([`Transformer::recorder`]): the third block on is one node each.
    fn block(&self, block: &Block, x: &Tensor) -> Tensor {
        let [y] = self.recorded("forward", block.key("block"), &[x], block, || [block.forward(x)]);
        y
    }

    /// `f()` through [`Transformer::recorder`]: `lead`, then `module`'s tensors, are the
    /// arguments of the recording, and `key` stands for everything else `f` reads. A failed call
    /// is `N` error tensors naming `op`.
    fn recorded<const N: usize>(
        &self,
        op: &'static str,
        key: u64,
        lead: &[&Tensor],
        module: &(impl ModuleParams + ?Sized),
        f: impl FnOnce() -> [Tensor; N],
    ) -> [Tensor; N] {
        let tensors = model_tensors(module);
        let mut args: Vec<&Tensor> = Vec::with_capacity(lead.len() + tensors.len());
        args.extend(lead);
        args.extend(&tensors);
        let outputs = self.recorder.call_keyed(key, &args, |_| f().to_vec());
        match outputs.map(<[Tensor; N]>::try_from) {
            Ok(Ok(out)) => out,
            Ok(Err(_)) => {
                std::array::from_fn(|_| Tensor::op_error(op, format!("a recorded call gave other than {N} outputs")))
            }
            Err(e) => std::array::from_fn(|_| Tensor::op_error(op, e.to_string())),
        }
    }
}

/// The keys and values of the positions a [`Transformer`] has seen, per block, for decoding one
/// token at a time without recomputing the prefix: see [`Transformer::forward_at`].
///
/// Each block's keys and values are `[batch, n_heads, max_seq_len, head_dim]` arrays allocated
/// once. A call writes its tokens' keys and values at `[start_pos, start_pos + seq)` *in place*
/// (the arrays are the compiled forward's state, `kiln::JitCache::call_with_state`: given to
/// each call and put back, with only the new rows written) and attends over
/// `[0, start_pos + seq)`. The cache also holds the compiled forward: `start_pos` and `seq` are
/// symbols of one program, so a prefill and every decoding step run without compiling again.
pub struct KvCache {
    /// Keys, then values, per block: host arrays, not tensors, so that a decoding step touches
    /// no tensor node for them.
    kv: Vec<HostTensor>,
    device: Device,
    batch: usize,
    max_seq_len: usize,
    /// The number of positions filled.
    len: usize,
    jit: JitCache,
    /// The forward returning the last position's logits only.
    jit_last: JitCache,
    /// The model's tensors (`visit_tensors` order) of the last call.
    weights: Vec<Tensor>,
    /// The forward's symbols, made once: the tokens' `seq`, then `start_pos` and `kv_len`, whose
    /// values each call binds directly (`kiln::JitCache::call_with_state`'s `symbols`).
    seq: Dim,
    start: (Dim, Symbol),
    kv_len: (Dim, Symbol),
}

impl KvCache {
    /// The number of positions filled (the next call's usual `start_pos`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The batch size the cache holds.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The most positions the cache holds.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// Block `block`'s keys, `[batch, n_heads, max_seq_len, head_dim]` (positions from
    /// [`KvCache::len`] on are stale): a tensor sharing the cache's array (while it is held, the
    /// next call copies the array rather than update it under it).
    pub fn keys(&self, block: usize) -> Option<Tensor> {
        self.array(2 * block)
    }

    /// Block `block`'s values, laid out as [`KvCache::keys`].
    pub fn values(&self, block: usize) -> Option<Tensor> {
        self.array(2 * block + 1)
    }

    fn array(&self, i: usize) -> Option<Tensor> {
        self.kv.get(i).map(|h| Tensor::from_host_on(h.clone(), self.device))
    }

    /// Forgets every position (the arrays are kept; the next call starts at position 0).
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// How many times the cached forward was traced and compiled: 1 for every prefill and
    /// decoding step of one batch size and token dtype (per kind of call:
    /// [`Transformer::forward_at`], [`Transformer::forward_at_last`]).
    pub fn traces(&self) -> usize {
        self.jit.traces() + self.jit_last.traces()
    }
}

impl Transformer {
    /// An empty key/value cache for `batch` sequences on the model's device.
    pub fn kv_cache(&self, batch: usize) -> Result<KvCache> {
        let c = &self.config;
        let head_dim = c.dim / c.n_heads;
        let device = self.wte.weight.device();
        let dtype = self.wte.weight.dtype();
        let shape = vec![batch, c.n_heads, c.max_seq_len, head_dim];
        let numel = shape.iter().product();
        let kv = (0..2 * c.n_layers)
            .map(|_| HostTensor::new(HostData::filled(dtype, numel, Scalar::Int(0)), shape.clone()))
            .collect::<std::result::Result<_, _>>()
            .map_err(NnError::Cache)?;
        Ok(KvCache {
            kv,
            device,
            batch,
            max_seq_len: c.max_seq_len,
            len: 0,
            jit: JitCache::new(),
            jit_last: JitCache::new(),
            weights: Vec::new(),
            seq: Dim::sym("seq"),
            start: symbol("start_pos"),
            kv_len: symbol("kv_len"),
        })
    }

    /// The logits `[batch, seq, vocab]` of `tokens` (`[batch, seq]` ids) at positions
    /// `[start_pos, start_pos + seq)`, attending over the cache's positions before `start_pos`
    /// and over each other (causally); the tokens' keys and values are written into the cache,
    /// whose length becomes `start_pos + seq`. Decoding feeds the prompt (`start_pos = 0`), then
    /// one token at a time at `start_pos = cache.len()`; a smaller `start_pos` rewinds.
    ///
    /// Compiled once per batch size and token dtype (`kiln::jit`, with `start_pos` and `seq`
    /// symbols): later calls run the program on the new tokens and the model's current weights.
    /// Errors: `start_pos` past the cache's length, `start_pos + seq` past `max_seq_len`, a batch
    /// other than the cache's, or a cache of another model's sizes.
    pub fn forward_at(&mut self, tokens: &Tensor, start_pos: usize, cache: &mut KvCache) -> Result<Tensor> {
        self.forward_at_impl(tokens, start_pos, cache, false)
    }

    /// [`Transformer::forward_at`] returning only the last position's logits, `[batch, 1,
    /// vocab]`: what decoding needs, without the vocabulary projection of every prompt token
    /// (a second compiled program, in the same cache).
    pub fn forward_at_last(&mut self, tokens: &Tensor, start_pos: usize, cache: &mut KvCache) -> Result<Tensor> {
        self.forward_at_impl(tokens, start_pos, cache, true)
    }

    fn forward_at_impl(
        &mut self,
        tokens: &Tensor,
        start_pos: usize,
        cache: &mut KvCache,
        last: bool,
    ) -> Result<Tensor> {
        let dims = tokens.dims()?;
        let [batch, seq] = dims[..] else {
            return Err(NnError::Cache(format!("tokens must be [batch, seq], got {dims:?}")));
        };
        if batch != cache.batch
            || cache.kv.len() != 2 * self.blocks.len()
            || cache.max_seq_len != self.config.max_seq_len
        {
            return Err(NnError::Cache(format!(
                "a cache for batch {} and {} blocks of {} positions cannot take tokens {dims:?} of a model with {} \
                 blocks of {} positions",
                cache.batch,
                cache.kv.len() / 2,
                cache.max_seq_len,
                self.blocks.len(),
                self.config.max_seq_len
            )));
        }
        if start_pos > cache.len {
            return Err(NnError::Cache(format!(
                "start position {start_pos} is past the {} positions the cache holds",
                cache.len
            )));
        }
        if seq == 0 || start_pos + seq > cache.max_seq_len {
            return Err(NnError::Cache(format!(
                "{seq} tokens at start position {start_pos} do not fit the cache's {} positions",
                cache.max_seq_len
            )));
        }
        let tokens = tokens.with_dims(vec![Dim::Const(batch as i64), cache.seq]);
        // The model's tensors as of the last call, collected again only when one was replaced
        // (compared by handle: no tensor is touched, see `kiln::JitCache::call_with_state`).
        let mut unchanged = true;
        let mut count = 0;
        self.visit_tensors(&mut |t, _| {
            unchanged &= cache.weights.get(count).is_some_and(|w| Tensor::ptr_eq(w, t));
            count += 1;
        });
        if !unchanged || count != cache.weights.len() {
            cache.weights = model_tensors(self);
        }
        let n_kv = cache.kv.len();
        let symbols = [
            (cache.start.1.clone(), start_pos as i64),
            (cache.kv_len.1.clone(), self.attended_len(start_pos, seq) as i64),
        ];
        let (start, len) = (cache.start.0, cache.kv_len.0);
        let model = &mut *self;
        let jit = if last { &mut cache.jit_last } else { &mut cache.jit };
        // The cache arrays are the call's state: given to the program, which updates them in
        // place, and put back.
        let (kv_arrays, weights) = (&mut cache.kv, &cache.weights);
        let result =
            jit.call_with_state(vec![tokens], kv_arrays, weights, &symbols, |a: &[Tensor]| -> Result<Vec<Tensor>> {
                let kv = &a[1..1 + n_kv];
                let mut out = with_tensors(model, &a[1 + n_kv..], |m| {
                    kiln::no_grad(|| m.forward_cached(&a[0], &start, &len, kv))
                })??;
                if last {
                    let seq = a[0].shape()[1];
                    out[0] = out[0].narrow(1, seq - Dim::Const(1), 1);
                }
                Ok(out)
            });
        let mut out = match result {
            Ok(out) => out,
            Err(e) => {
                // The arrays went to the failed call: start again from fresh ones (the compiled
                // programs stay).
                let fresh = self.kv_cache(batch)?;
                cache.kv = fresh.kv;
                cache.len = 0;
                return Err(e);
            }
        };
        cache.len = start_pos + seq;
        out.pop().ok_or_else(|| NnError::Cache("the compiled forward returned nothing".into()))
    }

    /// The positions of the cache a call with `seq` tokens at `start_pos` attends over (at most
    /// `max_seq_len`), the positions past `start_pos + seq` masked out: `start_pos + seq` rounded
    /// up to a power of two of at least [`Transformer::KV_MIN`] while that is at most
    /// [`Transformer::KV_BUCKET`], else to a multiple of `KV_BUCKET`. The program's sizes depend
    /// on this length and not on `start_pos`, so decoding reuses one memory plan and one set of
    /// launches for many positions (`start_pos` is only an index offset), while a short context
    /// computes at most twice the attention it needs (a fixed bucket of 64 made a call at
    /// position 2 of 3 tokens score 64 positions: half the depth-8 forward's time).
    pub fn attended_len(&self, start_pos: usize, seq: usize) -> usize {
        let need = start_pos.saturating_add(seq);
        let len = if need <= Self::KV_BUCKET {
            need.next_power_of_two().max(Self::KV_MIN)
        } else {
            need.div_ceil(Self::KV_BUCKET).saturating_mul(Self::KV_BUCKET)
        };
        len.min(self.config.max_seq_len)
    }

    /// The granularity of [`Transformer::attended_len`] past its powers of two.
    pub const KV_BUCKET: usize = 64;

    /// The shortest length [`Transformer::attended_len`] gives.
    pub const KV_MIN: usize = 8;

    /// The lazy forward of [`Transformer::forward_at`], for tracing it yourself: the logits of
    /// `ids` (`[batch, seq]`) at positions `[start, start + seq)`, then each block's keys and
    /// values with this call's written at those positions. `kv` holds each block's keys then
    /// values, `[batch, n_heads, max_len, head_dim]`; attention reads their positions
    /// `[0, len)`, which must cover `[0, start + seq)` (see [`Transformer::attended_len`]).
    /// `start` and `len` are usually symbols (`Dim::sym("start_pos")`, `Dim::sym("kv_len")`)
    /// whose values the program's bindings give.
    pub fn forward_cached(&self, ids: &Tensor, start: &Dim, len: &Dim, kv: &[Tensor]) -> Result<Vec<Tensor>> {
        if kv.len() != 2 * self.blocks.len() {
            return Err(NnError::Cache(format!("{} cache arrays for {} blocks", kv.len(), self.blocks.len())));
        }
        let seq = ids.shape().get(1).cloned().unwrap_or(Dim::Const(1));
        let positions = self.wpe.weight.narrow(0, *start, seq);
        let mut x = self.wte.forward(ids).add(positions);
        let mut out = vec![Tensor::zeros(&[0], DType::F32)];
        // One causal mask for every block (the same positions and lengths).
        let mask = self.blocks.first().map(|b| b.attn.mask(start, &seq, len, x.device()));
        for (block, kv) in self.blocks.iter().zip(kv.chunks(2)) {
            let [y, keys, values] = self.block_cached(block, &x, start, len, [&kv[0], &kv[1]], mask.as_ref());
            x = y;
            out.push(keys);
            out.push(values);
        }
        out[0] = self.head.forward(&self.ln_f.forward(&x));
        Ok(out)
    }
}

impl Transformer {
    /// One block of [`Transformer::forward_cached`]: the block's output, keys and values. The
    /// blocks of a model are one function of their own tensors, recorded once
    /// ([`Transformer::recorder`]): the third block on is one node each, so a deep model's first
    /// trace records two blocks' graphs, not every one.
    fn block_cached(
        &self,
        block: &Block,
        x: &Tensor,
        start: &Dim,
        len: &Dim,
        kv: [&Tensor; 2],
        mask: Option<&Tensor>,
    ) -> [Tensor; 3] {
        let run = |x: &Tensor| {
            let (y, keys, values) =
                block.attn.forward_cached_masked(&block.ln1.forward(x), start, len, kv[0], kv[1], mask);
            let x = x.add(y);
            let x = x.add(block.mlp.forward(&block.ln2.forward(&x)));
            [x, keys, values]
        };
        let mut lead = vec![x, kv[0], kv[1]];
        lead.extend(mask);
        let key = block.key(("block_cached", start, len, mask.is_some()));
        self.recorded("forward_cached", key, &lead, block, || run(x))
    }
}

impl Block {
    /// What the block computes besides its tensors (see [`Transformer::recorder`]).
    fn structure_key(&self, h: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        (self.ln1.eps.to_bits(), self.ln2.eps.to_bits(), self.attn.n_heads, self.attn.max_seq_len).hash(h);
        self.mlp.activation.hash(h);
    }

    /// The recorder's key for a call of this block: `call` (which function, and what else it
    /// reads) and the block's [`Block::structure_key`].
    fn key(&self, call: impl std::hash::Hash) -> u64 {
        use std::hash::Hasher;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        call.hash(&mut h);
        self.structure_key(&mut h);
        h.finish()
    }
}

/// A symbolic dim named `name` and its symbol.
fn symbol(name: &str) -> (Dim, Symbol) {
    let dim = Dim::sym(name);
    let symbol = dim.as_symbol().expect("a name is a plain symbol").clone();
    (dim, symbol)
}

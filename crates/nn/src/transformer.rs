//! The GPT-style decoder: `Mlp`, the pre-norm `Block`, and `Transformer`.
//!
//! Parameter names (what `save_safetensors` writes):
//! `wte.weight`, `wpe.weight`, `blocks.{i}.ln1.{weight,bias}`, `blocks.{i}.attn.{q,k,v,o}.{weight,bias}`,
//! `blocks.{i}.ln2.{weight,bias}`, `blocks.{i}.mlp.{fc,proj}.{weight,bias}`, `ln_f.{weight,bias}`,
//! `head.weight`.

use kiln::Tensor;

use crate::Module;
use crate::activation::Activation;
use crate::attention::CausalSelfAttention;
use crate::error::Result;
use crate::linear::{Embedding, Linear};
use crate::norm::LayerNorm;

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
        })
    }
}

impl Module for Transformer {
    fn forward(&self, ids: &Tensor) -> Tensor {
        let seq = ids.shape().get(1).cloned().unwrap_or(kiln::Dim::Const(1));
        let positions = self.wpe.weight.narrow(0, 0, seq);
        let mut x = self.wte.forward(ids).add(positions);
        for block in &self.blocks {
            x = block.forward(&x);
        }
        self.head.forward(&self.ln_f.forward(&x))
    }
}

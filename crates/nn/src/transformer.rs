//! The GPT-style decoder: `Mlp`, the pre-norm `Block`, and `Transformer`.
//!
//! Parameter names (what `save_safetensors` writes):
//! `wte.weight`, `wpe.weight`, `blocks.{i}.ln1.{weight,bias}`, `blocks.{i}.attn.{q,k,v,o}.{weight,bias}`,
//! `blocks.{i}.ln2.{weight,bias}`, `blocks.{i}.mlp.{fc,proj}.{weight,bias}`, `ln_f.{weight,bias}`,
//! `head.weight`.

use kiln::Tensor;

use crate::activation::Activation;
use crate::attention::CausalSelfAttention;
use crate::error::Result;
use crate::linear::{Embedding, Linear};
use crate::module::{Module, ParamKind, join, visit_child, visit_child_mut};
use crate::norm::LayerNorm;

/// `proj(act(fc(x)))` with a hidden width of `hidden` (GPT-2: `4 * dim`, tanh-approximated GELU).
pub struct Mlp {
    /// `dim -> hidden`.
    pub fc: Linear,
    /// `hidden -> dim`.
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

    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        visit_child(&self.fc, "fc", f);
        visit_child(&self.proj, "proj", f);
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        visit_child_mut(&mut self.fc, "fc", f);
        visit_child_mut(&mut self.proj, "proj", f);
    }
}

/// A pre-norm Transformer block: `x += attn(ln1(x)); x += mlp(ln2(x))`.
pub struct Block {
    /// Norm before attention.
    pub ln1: LayerNorm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// Norm before the MLP.
    pub ln2: LayerNorm,
    /// The MLP.
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

    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        visit_child(&self.ln1, "ln1", f);
        visit_child(&self.attn, "attn", f);
        visit_child(&self.ln2, "ln2", f);
        visit_child(&self.mlp, "mlp", f);
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        visit_child_mut(&mut self.ln1, "ln1", f);
        visit_child_mut(&mut self.attn, "attn", f);
        visit_child_mut(&mut self.ln2, "ln2", f);
        visit_child_mut(&mut self.mlp, "mlp", f);
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
pub struct Transformer {
    /// Token embedding `[vocab, dim]`.
    pub wte: Embedding,
    /// Learned position embedding `[max_seq_len, dim]`.
    pub wpe: Embedding,
    /// The blocks.
    pub blocks: Vec<Block>,
    /// Final norm.
    pub ln_f: LayerNorm,
    /// `dim -> vocab`, no bias.
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

    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        visit_child(&self.wte, "wte", f);
        visit_child(&self.wpe, "wpe", f);
        for (i, block) in self.blocks.iter().enumerate() {
            visit_child(block, &join("blocks", &i.to_string()), f);
        }
        visit_child(&self.ln_f, "ln_f", f);
        visit_child(&self.head, "head", f);
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        visit_child_mut(&mut self.wte, "wte", f);
        visit_child_mut(&mut self.wpe, "wpe", f);
        for (i, block) in self.blocks.iter_mut().enumerate() {
            visit_child_mut(block, &join("blocks", &i.to_string()), f);
        }
        visit_child_mut(&mut self.ln_f, "ln_f", f);
        visit_child_mut(&mut self.head, "head", f);
    }
}

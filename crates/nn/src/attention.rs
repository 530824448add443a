//! Causal multi-head self-attention with separate `q`, `k`, `v`, `o` projections; the attention
//! itself is `functional::scaled_dot_product_attention` with the causal block of a cached mask.

use std::sync::{Mutex, PoisonError};

use kiln::{Device, Dim, Tensor};

use crate::Module;
use crate::error::{NnError, Result};
use crate::functional::{self, SdpaOptions};
use crate::linear::Linear;

/// `o(softmax(q k^T / sqrt(head_dim) + causal mask) v)` over `n_heads` heads, for input
/// `[batch, seq, dim]` (the GPT-2 attention, written out: no fused kernel). `seq` may be
/// symbolic up to `max_seq_len`: the mask is a lazy `[max_seq_len, max_seq_len]` constant narrowed
/// to `[seq, seq]`.
#[derive(Module)]
pub struct CausalSelfAttention {
    /// Query projection `dim -> dim` (with bias).
    #[module]
    pub q: Linear,
    /// Key projection.
    #[module]
    pub k: Linear,
    /// Value projection.
    #[module]
    pub v: Linear,
    /// Output projection.
    #[module]
    pub o: Linear,
    /// The number of heads; `dim / n_heads` is the head size.
    pub n_heads: usize,
    /// The longest sequence the mask covers.
    pub max_seq_len: usize,
    /// The full mask realized on a device other than the default one, kept for reuse.
    mask_on_device: Mutex<Option<Tensor>>,
}

impl CausalSelfAttention {
    /// An attention layer of width `dim` with `n_heads` heads; `dim` must be a multiple of
    /// `n_heads`.
    pub fn new(dim: usize, n_heads: usize, max_seq_len: usize) -> Result<CausalSelfAttention> {
        if n_heads == 0 || !dim.is_multiple_of(n_heads) {
            return Err(NnError::Config(format!("dim {dim} is not a multiple of n_heads {n_heads}")));
        }
        Ok(CausalSelfAttention {
            q: Linear::new(dim, dim, true),
            k: Linear::new(dim, dim, true),
            v: Linear::new(dim, dim, true),
            o: Linear::new(dim, dim, true),
            n_heads,
            max_seq_len,
            mask_on_device: Mutex::new(None),
        })
    }

    /// An attention layer over given projections (e.g. loaded weights), each `dim -> dim`; `dim`
    /// (the rows of `q.weight`) must be a multiple of `n_heads`.
    pub fn from_projections(
        [q, k, v, o]: [Linear; 4],
        n_heads: usize,
        max_seq_len: usize,
    ) -> Result<CausalSelfAttention> {
        let dim = q.weight.dims()?.first().copied().unwrap_or(0);
        if n_heads == 0 || !dim.is_multiple_of(n_heads) {
            return Err(NnError::Config(format!("dim {dim} is not a multiple of n_heads {n_heads}")));
        }
        Ok(CausalSelfAttention { q, k, v, o, n_heads, max_seq_len, mask_on_device: Mutex::new(None) })
    }

    /// `true` where a query may see a key, for queries at positions `[start, start + seq)`
    /// and keys at `[0, len)` on `device` (key not after query): the full
    /// `[max_seq_len, max_seq_len]` mask narrowed to that block. On the default device it is a
    /// lazy constant (iota compare); on another device the full mask is realized once and moved
    /// there. The positions are `f32`, exact below 2^24: a block only reads positions below
    /// `max_seq_len`, and a score matrix that long would have 2^48 elements. An `i64` iota would
    /// keep the softmax kernels that compute the mask inline out of 4-lane vectors.
    pub(crate) fn mask(&self, start: &Dim, seq: &Dim, len: &Dim, device: Device) -> Tensor {
        let n = self.max_seq_len as i64;
        let full = || {
            let positions = Tensor::arange(0.0, n as f64, 1.0);
            let rows = positions.reshape(&[n, 1]);
            let cols = positions.reshape(&[1, n]);
            // `col <= row` as one compare: `col < row + 1` (exact for these integer positions).
            cols.lt(rows.add(1.0))
        };
        let mut full = full();
        if full.device() != device {
            let mut cached = self.mask_on_device.lock().unwrap_or_else(PoisonError::into_inner);
            match cached.as_ref().filter(|m| m.device() == device) {
                Some(m) => full = m.clone(),
                None => {
                    if let Ok(moved) = full.to_device(device) {
                        *cached = Some(moved.clone());
                        full = moved;
                    }
                }
            }
        }
        full.narrow(0, *start, *seq).narrow(1, 0, *len)
    }

    /// The input's `[batch, seq, dim]` and the head size (`-1` where unknown: the reshapes that
    /// use it then report the shape).
    fn sizes(&self, x: &Tensor) -> ([Dim; 3], i64) {
        let [batch, seq, dim] = match x.shape().as_slice() {
            [b, s, d] => [*b, *s, *d],
            // Not `[batch, seq, dim]`: let the reshape below report the shape.
            _ => [Dim::Const(-1), Dim::Const(1), Dim::Const(1)],
        };
        let head_dim = match dim.as_const() {
            Some(d) => d / self.n_heads as i64,
            None => -1,
        };
        ([batch, seq, dim], head_dim)
    }

    /// `[batch, seq, dim]` to `[batch, n_heads, seq, head_dim]`.
    #[track_caller]
    fn heads(&self, t: Tensor, batch: &Dim, seq: &Dim, head_dim: i64) -> Tensor {
        t.reshape(vec![*batch, *seq, Dim::Const(self.n_heads as i64), Dim::Const(head_dim)]).transpose(1, 2)
    }

    /// Attention of the queries `q` (at positions `[start, start + seq)`) over `k` and `v` (at
    /// `[0, len)`, `len` their length), then the output projection: `[batch, seq, dim]`.
    /// `mask`: the block of [`Self::mask`] for these positions (`None`: made here).
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        start: &Dim,
        sizes: &[Dim; 3],
        head_dim: i64,
        device: Device,
        mask: Option<&Tensor>,
    ) -> Tensor {
        let [batch, seq, dim] = *sizes;
        let len = k.shape().get(2).cloned().unwrap_or(Dim::Const(0));
        // The mask is passed explicitly (not `is_causal`): its block may sit at a symbolic start.
        let mask = match mask {
            Some(m) => m.clone(),
            None => self.mask(start, &seq, &len, device),
        };
        let options = SdpaOptions {
            attn_mask: Some(mask),
            scale: Some(1.0 / (head_dim.max(1) as f64).sqrt()),
            ..Default::default()
        };
        let y = functional::scaled_dot_product_attention(q, k, v, options);
        self.o.forward(&y.transpose(1, 2).reshape(vec![batch, seq, dim]))
    }

    /// The forward pass of `x` (`[batch, seq, dim]`, the tokens at positions
    /// `[start, start + seq)`) with a key/value cache: `keys` and `values`
    /// (`[batch, n_heads, max_len, head_dim]`) hold the earlier positions' keys and values.
    /// Returns the output and the caches with this call's keys and values written at
    /// `[start, start + seq)`. Attention reads positions `[0, len)` of them, the ones from
    /// `start + seq` on masked out: `len >= start + seq` must hold (a `len` rounded up keeps
    /// the program's sizes the same over many positions). `start`, `seq` and `len` may be
    /// symbolic; a range past `max_len` makes the program fail when it runs.
    pub fn forward_cached(
        &self,
        x: &Tensor,
        start: &Dim,
        len: &Dim,
        keys: &Tensor,
        values: &Tensor,
    ) -> (Tensor, Tensor, Tensor) {
        self.forward_cached_masked(x, start, len, keys, values, None)
    }

    /// [`Self::forward_cached`] with the mask's block for these positions made once by the
    /// caller (`Self::mask`), shared by the layers of a model rather than built in each.
    pub(crate) fn forward_cached_masked(
        &self,
        x: &Tensor,
        start: &Dim,
        len: &Dim,
        keys: &Tensor,
        values: &Tensor,
        mask: Option<&Tensor>,
    ) -> (Tensor, Tensor, Tensor) {
        let (sizes, head_dim) = self.sizes(x);
        let [batch, seq, _] = &sizes;
        let q = self.heads(self.q.forward(x), batch, seq, head_dim);
        let k = self.heads(self.k.forward(x), batch, seq, head_dim);
        let v = self.heads(self.v.forward(x), batch, seq, head_dim);
        let keys = keys.slice_scatter(&k, 2, *start);
        let values = values.slice_scatter(&v, 2, *start);
        let (k_all, v_all) = (keys.narrow(2, 0, *len), values.narrow(2, 0, *len));
        let y = self.attend(&q, &k_all, &v_all, start, &sizes, head_dim, x.device(), mask);
        (y, keys, values)
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Tensor {
        let (sizes, head_dim) = self.sizes(x);
        let [batch, seq, _] = &sizes;
        let q = self.heads(self.q.forward(x), batch, seq, head_dim);
        let k = self.heads(self.k.forward(x), batch, seq, head_dim);
        let v = self.heads(self.v.forward(x), batch, seq, head_dim);
        self.attend(&q, &k, &v, &Dim::Const(0), &sizes, head_dim, x.device(), None)
    }
}

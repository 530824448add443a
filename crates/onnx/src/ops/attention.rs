//! The attention ops of opset 23, built from Kiln's tensor ops: Attention (opset 24's
//! `nonpad_kv_seqlen` input too), scaled dot-product attention over `[batch, heads, seq,
//! head_size]` (or 3-D `[batch, seq, heads * head_size]`) queries, keys and values, with an
//! optional key/value cache, mask, causal mask, softcap and grouped-query heads; and
//! RotaryEmbedding.
//!
//! The order of the steps is that of ONNX's reference implementation, whose outputs the node
//! tests record: `Q * sqrt(scale)` against `K * sqrt(scale)`, then the softcap, then the mask
//! (so that a masked `-inf` stays `-inf`), then the softmax and the product with `V`.

use kiln::{DType, Dim, Tensor};

use super::{Ctx, OpResult, show};

/// The node's attributes and optional inputs, as the steps use them.
struct Spec {
    causal: bool,
    scale: Option<f64>,
    softcap: f64,
    /// `qk_matmul_output_mode`: which intermediate the fourth output is.
    qk_mode: i64,
    /// The dtype the softmax runs in (`softmax_precision`), if not the inputs'.
    softmax_dtype: Option<DType>,
}

pub(super) fn attention(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (q, k, v) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let rank = q.ndim();
    if k.ndim() != rank || v.ndim() != rank || !(rank == 3 || rank == 4) {
        return Err(format!("Q {}, K {} and V {} must all be 3-D or all 4-D", show(q), show(k), show(v)).into());
    }
    let spec = Spec {
        causal: ctx.int("is_causal", 0)? != 0,
        scale: ctx.attr("scale").map(|_| ctx.float("scale", 1.0)).transpose()?.map(f64::from),
        softcap: f64::from(ctx.float("softcap", 0.0)?),
        qk_mode: ctx.int("qk_matmul_output_mode", 0)?,
        softmax_dtype: match ctx.attr("softmax_precision") {
            Some(_) => {
                let code = ctx.int("softmax_precision", 0)?;
                let dtype = kiln_dtype(code)?;
                (dtype != q.dtype()).then_some(dtype)
            }
            None => None,
        },
    };
    if !(0..=3).contains(&spec.qk_mode) {
        return Err(format!("qk_matmul_output_mode {} is not 0, 1, 2 or 3", spec.qk_mode).into());
    }
    // Everything in 4-D: [batch, heads, seq, head_size].
    let (q4, k4, v4) = if rank == 3 {
        let (qh, kvh) = (ctx.head_count("q_num_heads")?, ctx.head_count("kv_num_heads")?);
        (split_heads(q, qh, "Q")?, split_heads(k, kvh, "K")?, split_heads(v, kvh, "V")?)
    } else {
        (q.clone(), k.clone(), v.clone())
    };
    // The cache: present = past ++ new along the sequence.
    let extend = |past: Option<&Tensor>, new: &Tensor, name: &str| -> OpResult<Tensor> {
        match past {
            None => Ok(new.clone()),
            Some(p) if p.ndim() == 4 => Ok(Tensor::cat(&[p, new], 2)),
            Some(p) => Err(format!("past_{name} {} must be 4-D", show(p)).into()),
        }
    };
    let present_k = extend(ctx.opt(4), &k4, "key")?;
    let present_v = extend(ctx.opt(5), &v4, "value")?;
    let past_len = match ctx.opt(4) {
        Some(p) => p.shape()[2],
        None => Dim::from(0),
    };

    let (qh, kvh) = (concrete(&q4, 1, "Q's heads")?, concrete(&present_k, 1, "K's heads")?);
    let vh = concrete(&present_v, 1, "V's heads")?;
    let (k_all, v_all) = if qh == kvh && vh == kvh {
        (present_k.clone(), present_v.clone())
    } else if kvh > 0 && vh == kvh && qh % kvh == 0 {
        // Grouped-query attention: each key/value head serves `qh / kvh` consecutive query heads.
        (repeat_heads(&present_k, qh / kvh), repeat_heads(&present_v, qh / kvh))
    } else {
        return Err(format!(
            "{qh} query heads cannot share {kvh} key and {vh} value heads (grouped-query attention needs a multiple)"
        )
        .into());
    };

    let head_size = concrete(&q4, 3, "Q's head size")?;
    let scale = spec.scale.unwrap_or(1.0 / (head_size as f64).sqrt()).sqrt();
    let mut qk = q4.mul(scale).matmul(&k_all.mul(scale).transpose(2, 3));
    if spec.softcap > 0.0 {
        qk = qk.div(spec.softcap).tanh().mul(spec.softcap);
    }
    let bias = bias(ctx, &spec, &q4, &present_k, &past_len)?;
    let with_bias = match &bias {
        Some(b) => qk.add(b),
        None => qk.clone(),
    };
    let logits = match spec.softmax_dtype {
        Some(d) => with_bias.cast(d),
        None => with_bias.clone(),
    };
    let probs = logits.softmax(-1);
    let mut y = match spec.softmax_dtype {
        Some(d) => probs.matmul(&v_all.cast(d)).cast(q.dtype()),
        None => probs.matmul(&v_all),
    };
    if rank == 3 {
        // Back to [batch, seq, heads * v_head_size].
        let d = y.shape().clone();
        let hv = concrete(&y, 3, "V's head size")?;
        y = y.transpose(1, 2).reshape(vec![d[0], d[2], Dim::from((qh * hv) as i64)]);
    }
    let qk_out = match spec.qk_mode {
        2 => with_bias,
        3 => probs.cast(q.dtype()),
        _ => qk,
    };
    Ok(vec![y, present_k, present_v, qk_out])
}

/// `[batch, seq, heads * size]` as `[batch, heads, seq, size]`.
fn split_heads(x: &Tensor, heads: usize, name: &str) -> OpResult<Tensor> {
    let hidden = concrete(x, 2, name)?;
    if hidden % heads != 0 {
        return Err(format!("{name} {}: hidden size {hidden} is not a multiple of {heads} heads", show(x)).into());
    }
    let d = x.shape().clone();
    let split = vec![d[0], d[1], Dim::from(heads as i64), Dim::from((hidden / heads) as i64)];
    Ok(x.reshape(split).transpose(1, 2))
}

/// `[batch, heads, seq, size]` with each head repeated `times` times in place (`h0, h0, h1, h1`).
fn repeat_heads(x: &Tensor, times: usize) -> Tensor {
    let d = x.shape().clone();
    let heads = d[1].as_const().unwrap_or(0) * times as i64;
    let mut wide = d.to_vec();
    wide.insert(2, Dim::from(times as i64));
    x.unsqueeze(2).expand(wide).reshape(vec![d[0], Dim::from(heads), d[2], d[3]])
}

/// Dim `axis` of `x`, which must be concrete.
fn concrete(x: &Tensor, axis: usize, what: &str) -> OpResult<usize> {
    x.shape()[axis]
        .as_const()
        .map(|n| n as usize)
        .ok_or_else(|| format!("{what} must be concrete, got {}", show(x)).into())
}

/// The additive bias on the `[batch, heads, q_seq, total_seq]` scores: the mask (a boolean one as
/// 0 / -inf, padded with -inf to the total length), the causal mask (query `i` sees keys up to
/// `past + i`) and opset 24's per-batch key lengths, added together; `None` when there is none.
fn bias(ctx: &Ctx, spec: &Spec, q: &Tensor, present_k: &Tensor, past_len: &Dim) -> OpResult<Option<Tensor>> {
    let dtype = q.dtype();
    let (q_len, total) = (q.shape()[2], present_k.shape()[2]);
    let additive = |allowed: &Tensor| allowed.where_cond(0.0, f64::NEG_INFINITY).cast(dtype);
    let mut terms = Vec::new();
    if let Some(mask) = ctx.opt(3) {
        let mut mask = mask.clone();
        let last = mask.ndim().checked_sub(1).ok_or("attn_mask must have rank >= 1")?;
        let (have, want) = (mask.shape()[last].as_const(), total.as_const());
        if have != want {
            let (Some(have), Some(want)) = (have, want) else {
                return Err(
                    format!("attn_mask {} against {total} keys: lengths must be concrete to pad", show(&mask)).into()
                );
            };
            if have > want {
                return Err(format!("attn_mask {} is longer than the {want} keys", show(&mask)).into());
            }
            let mut padding = vec![(0, 0); mask.ndim()];
            padding[last] = (0, (want - have) as usize);
            mask = if mask.dtype() == DType::Bool {
                mask.pad(&padding, false)
            } else {
                mask.pad(&padding, f64::NEG_INFINITY)
            };
        }
        terms.push(if mask.dtype() == DType::Bool { additive(&mask) } else { mask.cast(dtype) });
    }
    if spec.causal {
        let Some(past) = past_len.as_const() else {
            return Err(format!("is_causal with a past of symbolic length {past_len} is not supported").into());
        };
        let rows = Tensor::iota_on(q_len, DType::I64, ctx.device).add(past).unsqueeze(1);
        let cols = Tensor::iota_on(total, DType::I64, ctx.device).unsqueeze(0);
        terms.push(additive(&cols.le(&rows)));
    }
    if let Some(lengths) = ctx.opt(6) {
        // Keys at or past `nonpad_kv_seqlen[b]` are padding: [batch, 1, 1, total].
        let cols = Tensor::iota_on(total, DType::I64, ctx.device).unsqueeze(0);
        let valid = cols.lt(lengths.cast(DType::I64).unsqueeze(1));
        terms.push(additive(&valid.unsqueeze(1).unsqueeze(1)));
    }
    Ok(terms.into_iter().reduce(|a, b| a.add(b)))
}

/// The Kiln dtype of an ONNX `TensorProto.DataType` code (`softmax_precision`).
fn kiln_dtype(code: i64) -> OpResult<DType> {
    i32::try_from(code)
        .ok()
        .and_then(crate::data::to_dtype)
        .ok_or_else(|| format!("softmax_precision {code} is not a data type Kiln has").into())
}

/// RotaryEmbedding (opset 23): rotates the first `rotary_embedding_dim` features of each head
/// (all by default) by the angles whose cosines and sines the caches hold, at each token's
/// position (`position_ids` rows of the caches, or caches already `[batch, seq, dim / 2]`). The
/// pairs rotated are the two halves of those features, or neighbours with `interleaved`.
pub(super) fn rotary_embedding(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    // As [batch, seq, heads, head_size].
    let work = match x.ndim() {
        4 => x.transpose(1, 2),
        3 => split_heads(x, ctx.head_count("num_heads")?, "input")?.transpose(1, 2),
        _ => return Err(format!("input {} must be 3-D or 4-D", show(x)).into()),
    };
    let head_size = concrete(&work, 3, "the head size")?;
    let rotated = match ctx.int("rotary_embedding_dim", 0)? {
        0 => head_size,
        r if r > 0 && r as usize <= head_size && r % 2 == 0 => r as usize,
        r => return Err(format!("rotary_embedding_dim {r} is not an even size of at most {head_size}").into()),
    };
    let half = rotated / 2;
    let angle = |cache: &Tensor, name: &str| -> OpResult<Tensor> {
        let picked = match ctx.opt(3) {
            Some(ids) => {
                let mut shape = ids.shape().to_vec();
                shape.extend(cache.shape().iter().skip(1).copied());
                cache.index_select(0, &ids.cast(DType::I64).reshape(&[-1])).reshape(shape)
            }
            None => cache.clone(),
        };
        if picked.ndim() != 3 || picked.shape()[2].as_const() != Some(half as i64) {
            return Err(format!("{name} {} does not give [batch, seq, {half}] angles", show(cache)).into());
        }
        // [batch, seq, 1, half]: the same angle for every head.
        Ok(picked.cast(x.dtype()).unsqueeze(2))
    };
    let (cos, sin) = (angle(ctx.input(1)?, "cos_cache")?, angle(ctx.input(2)?, "sin_cache")?);
    let part = work.narrow(3, 0, rotated as i64);
    let d = work.shape().clone();
    let (x1, x2) = if ctx.int("interleaved", 0)? != 0 {
        let pairs = part.reshape(vec![d[0], d[1], d[2], Dim::from(half as i64), Dim::from(2)]);
        (pairs.narrow(4, 0, 1).squeeze(4), pairs.narrow(4, 1, 1).squeeze(4))
    } else {
        (part.narrow(3, 0, half as i64), part.narrow(3, half as i64, half as i64))
    };
    let real = cos.mul(&x1).sub(sin.mul(&x2));
    let imag = sin.mul(&x1).add(cos.mul(&x2));
    let mut out = if ctx.int("interleaved", 0)? != 0 {
        Tensor::stack(&[&real, &imag], 4).reshape(vec![d[0], d[1], d[2], Dim::from(rotated as i64)])
    } else {
        Tensor::cat(&[&real, &imag], 3)
    };
    if rotated < head_size {
        out = Tensor::cat(&[&out, &work.narrow(3, rotated as i64, (head_size - rotated) as i64)], 3);
    }
    Ok(vec![match x.ndim() {
        4 => out.transpose(1, 2),
        _ => out.reshape(x.shape().clone()),
    }])
}

/// LinearAttention (opset 27): a recurrent state `[batch, kv_heads, d_k, d_v]` updated per token
/// by the outer product of its key and value (`linear`), first decayed by `exp(decay)` (`gated`),
/// with the value replaced by `beta * (v - state^T k)` (`delta`), or both (`gated_delta`, the
/// default); each token's output is `scale * q^T state` (the state repeated for grouped query
/// heads). Unrolled over the concrete sequence length in f32, as the recurrent ops are.
pub(super) fn linear_attention(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (q, k, v) = (ctx.input(0)?, ctx.input(1)?, ctx.input(2)?);
    let rule = ctx.string("update_rule")?.unwrap_or_else(|| "gated_delta".into());
    let (gated, delta) = match rule.as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        other => return Err(format!("update_rule {other:?} is not linear, gated, delta or gated_delta").into()),
    };
    let (qh, kvh) = (ctx.head_count("q_num_heads")?, ctx.head_count("kv_num_heads")?);
    if qh % kvh != 0 {
        return Err(format!("{qh} query heads cannot share {kvh} key/value heads").into());
    }
    for (name, t) in [("query", q), ("key", k), ("value", v)] {
        if t.ndim() != 3 {
            return Err(format!("{name} {} must be [batch, seq, heads * size]", show(t)).into());
        }
    }
    let (decay, beta) = (ctx.opt(4), ctx.opt(5));
    if gated != decay.is_some() || delta != beta.is_some() {
        return Err(format!("update_rule {rule:?} takes decay: {gated}, beta: {delta}").into());
    }
    let f32s = |t: &Tensor| t.cast(DType::F32);
    let (q4, k4, v4) =
        (f32s(&split_heads(q, qh, "query")?), f32s(&split_heads(k, kvh, "key")?), f32s(&split_heads(v, kvh, "value")?));
    let (d_k, d_v) = (concrete(&q4, 3, "the key size")?, concrete(&v4, 3, "the value size")?);
    let steps = concrete(&q4, 2, "the sequence length")?;
    let batch = q.shape()[0];
    // Per-token gates as [batch, kv_heads, seq, 1 or d_k] and betas as [batch, 1 or kv_heads, seq, 1].
    let decay4 = match decay {
        Some(g) if g.shape()[2].as_const() == Some(kvh as i64) => Some(f32s(g).transpose(1, 2).unsqueeze(3)),
        Some(g) if g.shape()[2].as_const() == Some((kvh * d_k) as i64) => Some(f32s(&split_heads(g, kvh, "decay")?)),
        Some(g) => return Err(format!("decay {} must end in kv_num_heads or kv_num_heads * d_k", show(g)).into()),
        None => None,
    };
    let beta4 = beta.map(|b| f32s(b).transpose(1, 2).unsqueeze(3));
    let mut state = match ctx.opt(3) {
        Some(s) => f32s(s),
        None => Tensor::zeros(&[1, kvh, d_k, d_v], DType::F32).to_device(ctx.device)?.expand(vec![
            batch,
            Dim::from(kvh as i64),
            Dim::from(d_k as i64),
            Dim::from(d_v as i64),
        ]),
    };
    let scale = match f64::from(ctx.float("scale", 0.0)?) {
        0.0 => 1.0 / (d_k as f64).sqrt(),
        s => s,
    };
    let group = qh / kvh;
    let step = |t: &Tensor, i: usize| t.narrow(2, i as i64, 1).squeeze(2);
    let mut outputs = Vec::with_capacity(steps);
    for i in 0..steps {
        let (k_t, mut v_t) = (step(&k4, i), step(&v4, i));
        if let Some(g) = &decay4 {
            state = state.mul(step(g, i).exp().unsqueeze(3));
        }
        if let Some(b) = &beta4 {
            // The value the state already holds for this key: state^T k, [batch, kv_heads, d_v].
            let retrieved = k_t.unsqueeze(2).matmul(&state).squeeze(2);
            v_t = step(b, i).mul(v_t.sub(&retrieved));
        }
        state = state.add(k_t.unsqueeze(3).mul(v_t.unsqueeze(2)));
        let read = if group == 1 { state.clone() } else { repeat_heads(&state, group) };
        outputs.push(step(&q4, i).unsqueeze(2).matmul(&read).mul(scale));
    }
    let refs: Vec<&Tensor> = outputs.iter().collect();
    // [batch, q_heads, seq, d_v] -> [batch, seq, q_heads * d_v].
    let y = Tensor::cat(&refs, 2).transpose(1, 2).reshape(vec![
        batch,
        Dim::from(steps as i64),
        Dim::from((qh * d_v) as i64),
    ]);
    let state_dtype = ctx.opt(3).map_or(q.dtype(), |s| s.dtype());
    Ok(vec![y.cast(q.dtype()), state.cast(state_dtype)])
}

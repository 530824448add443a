//! The recurrent ops RNN, GRU and LSTM, unrolled over their (concrete) sequence length: the
//! input projections of every step are one matmul, each step adds its recurrent matmul and the
//! gate math, and `sequence_lens` masks the steps past each sequence's end.

use kiln::{Dim, Tensor};

use super::{Ctx, OpResult, show};

/// Which of the three ops, with its gate count and default activations.
#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }

    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// One of the activation functions the recurrent ops accept, with its parameters.
#[derive(Clone, Copy)]
enum Activation {
    Sigmoid,
    Tanh,
    Relu,
    LeakyRelu(f64),
    ThresholdedRelu(f64),
    ScaledTanh(f64, f64),
    HardSigmoid(f64, f64),
    Elu(f64),
    Softsign,
    Softplus,
    Affine(f64, f64),
}

impl Activation {
    /// `name` with its parameters taken from `alphas`/`betas` in order (the functions that take
    /// one consume one; ONNX's defaults when the lists run out).
    fn parse(
        name: &str,
        alphas: &mut impl Iterator<Item = f64>,
        betas: &mut impl Iterator<Item = f64>,
    ) -> OpResult<Activation> {
        let mut alpha = |d: f64| alphas.next().unwrap_or(d);
        Ok(match name.to_ascii_lowercase().as_str() {
            "sigmoid" => Activation::Sigmoid,
            "tanh" => Activation::Tanh,
            "relu" => Activation::Relu,
            "leakyrelu" => Activation::LeakyRelu(alpha(0.01)),
            "thresholdedrelu" => Activation::ThresholdedRelu(alpha(1.0)),
            "scaledtanh" => Activation::ScaledTanh(alpha(1.0), betas.next().unwrap_or(1.0)),
            "hardsigmoid" => Activation::HardSigmoid(alpha(0.2), betas.next().unwrap_or(0.5)),
            "elu" => Activation::Elu(alpha(1.0)),
            "softsign" => Activation::Softsign,
            "softplus" => Activation::Softplus,
            "affine" => Activation::Affine(alpha(1.0), betas.next().unwrap_or(0.0)),
            other => return Err(format!("activation {other:?} is not one of ONNX's recurrent activations").into()),
        })
    }

    fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Sigmoid => x.sigmoid(),
            Activation::Tanh => x.tanh(),
            Activation::Relu => x.relu(),
            Activation::LeakyRelu(a) => x.lt(0.0).where_cond(x.mul(a), x),
            Activation::ThresholdedRelu(a) => x.gt(a).where_cond(x, 0.0),
            Activation::ScaledTanh(a, b) => x.mul(b).tanh().mul(a),
            Activation::HardSigmoid(a, b) => x.mul(a).add(b).clamp(0.0, 1.0),
            Activation::Elu(a) => x.lt(0.0).where_cond(x.exp().sub(1.0).mul(a), x),
            Activation::Softsign => x.div(x.abs().add(1.0)),
            Activation::Softplus => super::elementwise::softplus(x),
            Activation::Affine(a, b) => x.mul(a).add(b),
        }
    }
}

/// The parts of one direction's weights: `w` `[gates * h, in]`, `r` `[gates * h, h]`, the two
/// biases `[gates * h]`, and the LSTM's peepholes `[3 * h]`.
struct Weights {
    w_t: Tensor,
    r_t: Tensor,
    bias: Option<(Tensor, Tensor)>,
    /// The bias the input projection takes (`wb` plus the recurrent bias of every gate but
    /// GRU's third), computed at import where `B` holds data (see `host_bias`).
    input_bias: Option<Tensor>,
    peepholes: Option<Tensor>,
}

/// How many of the recurrent bias's elements the input projection takes: all of them but GRU's
/// third gate's (added under the reset gate, see `Run::step`).
fn recurrent_in_projection(cell: Cell, hidden: usize, gates: usize) -> usize {
    match cell {
        Cell::Gru => 2 * hidden,
        Cell::Rnn | Cell::Lstm => gates,
    }
}

/// Direction `d`'s input bias, `wb + rb` over the first `recurrent` elements and `wb` alone past
/// them, computed now from `b`'s data (`[dirs, 2 * gates]`) where it holds some (an initializer:
/// reading it realizes nothing), with the same f32 additions the program would make: the program
/// then adds one bias row to the input projection rather than summing two per element, under a
/// mask (a kernel to compile in every recurrent import). `None` for a computed `B` or another
/// dtype.
fn host_bias(b: &Tensor, d: usize, gates: usize, recurrent: usize) -> Option<Tensor> {
    if !b.is_realized() || b.dtype() != kiln::DType::F32 {
        return None;
    }
    let all = b.to_vec::<f32>().ok()?;
    let row = all.get(d * 2 * gates..(d + 1) * 2 * gates)?;
    let (wb, rb) = row.split_at(gates);
    let sum: Vec<f32> =
        wb.iter().zip(rb).enumerate().map(|(i, (&w, &r))| if i < recurrent { w + r } else { w }).collect();
    Tensor::from_vec(sum, &[gates]).to_device(b.device()).ok()
}

/// RNN, GRU and LSTM (opsets 7 to 22): `layout` 0 (`[seq, batch, ...]`) or 1 (batch first),
/// every direction, `clip`, `sequence_lens`, initial states, GRU's `linear_before_reset` and the
/// LSTM's peepholes. The LSTM's `input_forget` coupling is refused.
pub(super) fn recurrent(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let cell = match ctx.op() {
        "RNN" => Cell::Rnn,
        "GRU" => Cell::Gru,
        _ => Cell::Lstm,
    };
    let batch_first = ctx.int("layout", 0)? != 0;
    let x = ctx.input(0)?;
    let x = if batch_first { x.transpose(0, 1) } else { x.clone() };
    let shape = x.shape().clone();
    if shape.len() != 3 {
        return Err(format!("X must be rank 3, got {}", show(&x)).into());
    }
    let concrete = |d: &Dim, what: &str| -> OpResult<usize> {
        d.as_const()
            .map(|v| v as usize)
            .ok_or_else(|| format!("the {what} of X {} must be concrete (the steps are unrolled)", show(&x)).into())
    };
    let (seq, batch, input) = (concrete(&shape[0], "sequence length")?, shape[1], concrete(&shape[2], "input size")?);
    let hidden = usize::try_from(ctx.int("hidden_size", 0)?).map_err(|_| "hidden_size must be positive")?;
    let direction = ctx.string("direction")?.unwrap_or_else(|| "forward".into());
    let reverse: &[bool] = match direction.as_str() {
        "forward" => &[false],
        "reverse" => &[true],
        "bidirectional" => &[false, true],
        other => return Err(format!("direction {other:?} is not forward, reverse or bidirectional").into()),
    };
    let dirs = reverse.len();
    if cell == Cell::Lstm && ctx.int("input_forget", 0)? != 0 {
        return Err("input_forget = 1 (coupled input and forget gates) is not supported".into());
    }
    let linear_before_reset = ctx.int("linear_before_reset", 0)? != 0;
    let clip = ctx.attr("clip").map(|_| ctx.float("clip", 0.0)).transpose()?.map(f64::from);
    let gates = cell.gates() * hidden;
    let expect = |t: &Tensor, what: &str, want: &[Dim]| -> OpResult<()> {
        if t.shape().as_slice() != want {
            let want: Vec<String> = want.iter().map(|d| d.to_string()).collect();
            return Err(format!("{what} is {}, expected [{}]", show(t), want.join(", ")).into());
        }
        Ok(())
    };
    let c = Dim::from;
    let (w, r) = (ctx.input(1)?, ctx.input(2)?);
    expect(w, "W", &[c(dirs), c(gates), c(input)])?;
    expect(r, "R", &[c(dirs), c(gates), c(hidden)])?;
    if let Some(b) = ctx.opt(3) {
        expect(b, "B", &[c(dirs), c(2 * gates)])?;
    }
    let state_input = |i: usize, what: &str| -> OpResult<Option<Tensor>> {
        let Some(t) = ctx.opt(i) else { return Ok(None) };
        let t = if batch_first { t.transpose(0, 1) } else { t.clone() };
        expect(&t, what, &[c(dirs), batch, c(hidden)])?;
        Ok(Some(t))
    };
    let initial_h = state_input(5, "initial_h")?;
    let initial_c = if cell == Cell::Lstm { state_input(6, "initial_c")? } else { None };
    let peepholes = if cell == Cell::Lstm { ctx.opt(7) } else { None };
    if let Some(p) = peepholes {
        expect(p, "P", &[c(dirs), c(3 * hidden)])?;
    }
    // `[seq, batch, 1]`: whether step t is inside sequence b.
    let valid = match ctx.opt(4) {
        None => None,
        Some(lens) => {
            expect(lens, "sequence_lens", std::slice::from_ref(&batch))?;
            let steps = Tensor::arange_on(0i64, seq as i64, 1i64, lens.device()).reshape(&[seq, 1]).cast(lens.dtype());
            Some(steps.lt(lens.unsqueeze(0)).unsqueeze(2))
        }
    };

    let names = ctx.strings("activations")?.unwrap_or_default();
    let per_dir = cell.default_activations().len();
    let names: Vec<String> = if names.is_empty() {
        reverse.iter().flat_map(|_| cell.default_activations().iter().map(|s| s.to_string())).collect()
    } else {
        names
    };
    if names.len() != per_dir * dirs {
        return Err(format!("{} activations given, {} expected", names.len(), per_dir * dirs).into());
    }
    let mut alphas = ctx.floats("activation_alpha")?.unwrap_or_default().into_iter().map(f64::from);
    let mut betas = ctx.floats("activation_beta")?.unwrap_or_default().into_iter().map(f64::from);
    let activations: Vec<Activation> =
        names.iter().map(|n| Activation::parse(n, &mut alphas, &mut betas)).collect::<OpResult<_>>()?;

    let mut ys = Vec::with_capacity(dirs);
    let mut hs = Vec::with_capacity(dirs);
    let mut cs = Vec::with_capacity(dirs);
    for (d, &backwards) in reverse.iter().enumerate() {
        let weights = Weights {
            w_t: w.narrow(0, d, 1).squeeze(0).transpose(0, 1),
            r_t: r.narrow(0, d, 1).squeeze(0).transpose(0, 1),
            bias: ctx.opt(3).map(|b| {
                let b = b.narrow(0, d, 1).squeeze(0);
                (b.narrow(0, 0, gates), b.narrow(0, gates, gates))
            }),
            input_bias: ctx.opt(3).and_then(|b| host_bias(b, d, gates, recurrent_in_projection(cell, hidden, gates))),
            peepholes: peepholes.map(|p| p.narrow(0, d, 1).squeeze(0)),
        };
        let first = |s: &Option<Tensor>| match s {
            Some(s) => s.narrow(0, d, 1).squeeze(0),
            None => Tensor::zeros_on(vec![batch, c(hidden)], x.dtype(), x.device()),
        };
        let acts = &activations[d * per_dir..(d + 1) * per_dir];
        let zero_h0 = initial_h.is_none();
        let run =
            Run { cell, hidden, clip, linear_before_reset, acts, weights: &weights, valid: valid.as_ref(), zero_h0 };
        let (y, h, cell_state) = run.direction(&x, seq, backwards, first(&initial_h), first(&initial_c));
        ys.push(y);
        hs.push(h);
        cs.push(cell_state);
    }
    // Y `[seq, dirs, batch, hidden]`, Y_h and Y_c `[dirs, batch, hidden]` (batch first in layout 1).
    let y = Tensor::stack(&ys.iter().collect::<Vec<_>>(), 1);
    let h = Tensor::stack(&hs.iter().collect::<Vec<_>>(), 0);
    let c = Tensor::stack(&cs.iter().collect::<Vec<_>>(), 0);
    Ok(if batch_first { vec![y.permute(&[2, 0, 1, 3]), h.transpose(0, 1), c.transpose(0, 1)] } else { vec![y, h, c] })
}

/// One direction of one op.
struct Run<'a> {
    cell: Cell,
    hidden: usize,
    clip: Option<f64>,
    linear_before_reset: bool,
    acts: &'a [Activation],
    weights: &'a Weights,
    valid: Option<&'a Tensor>,
    /// No `initial_h` was given: the first step's recurrent product is zero, and is skipped.
    zero_h0: bool,
}

impl Run<'_> {
    /// The outputs of every step `[seq, batch, hidden]` (zero past a sequence's end), and the
    /// final hidden and cell states.
    fn direction(&self, x: &Tensor, seq: usize, backwards: bool, h0: Tensor, c0: Tensor) -> (Tensor, Tensor, Tensor) {
        let wt = &self.weights;
        // Every step's input projection at once: `[seq, batch, gates * hidden]`, with the input
        // bias and the recurrent bias, which is the same every step, except GRU's third gate's
        // (applied with the recurrent product, under the reset gate: see `step`).
        let mut projected = x.matmul(&wt.w_t);
        if let Some(bias) = &wt.input_bias {
            projected = projected.add(bias);
        } else if let Some((wb, rb)) = &wt.bias {
            let rb = match self.cell {
                Cell::Gru => rb.narrow(0, 0, 2 * self.hidden).pad(&[(0, self.hidden)], 0.0),
                Cell::Rnn | Cell::Lstm => rb.clone(),
            };
            projected = projected.add(wb.add(&rb));
        }
        let (mut h, mut c) = (h0, c0);
        let mut outputs: Vec<Option<Tensor>> = vec![None; seq];
        let order: Vec<usize> = if backwards { (0..seq).rev().collect() } else { (0..seq).collect() };
        for (n, t) in order.into_iter().enumerate() {
            let xw = projected.narrow(0, t, 1).squeeze(0);
            let (h_new, c_new) = self.step(&xw, &h, &c, n == 0 && self.zero_h0);
            let (h_next, c_next, out) = match self.valid {
                None => (h_new.clone(), c_new, h_new),
                Some(valid) => {
                    let v = valid.narrow(0, t, 1).squeeze(0);
                    (v.where_cond(&h_new, &h), v.where_cond(&c_new, &c), v.where_cond(&h_new, 0.0))
                }
            };
            outputs[t] = Some(out);
            (h, c) = (h_next, c_next);
        }
        let outputs: Vec<Tensor> = outputs.into_iter().map(|o| o.expect("every step ran")).collect();
        (Tensor::stack(&outputs.iter().collect::<Vec<_>>(), 0), h, c)
    }

    /// The gate pre-activation `z` with `clip` applied.
    fn clipped(&self, z: Tensor) -> Tensor {
        match self.clip {
            Some(c) => z.clamp(-c, c),
            None => z,
        }
    }

    /// Gate `k` (of the op's gate order) of a `[batch, gates * hidden]` tensor.
    fn gate(&self, t: &Tensor, k: usize) -> Tensor {
        t.narrow(1, k * self.hidden, self.hidden)
    }

    /// One step: the new hidden state and (LSTM) cell state from the step's input projection
    /// (which holds the recurrent bias too, see `direction`). With `h_is_zero` (the first step
    /// from a zero state), the RNN and the LSTM skip the recurrent product.
    fn step(&self, xw: &Tensor, h: &Tensor, c: &Tensor, h_is_zero: bool) -> (Tensor, Tensor) {
        let wt = self.weights;
        let hr = h.matmul(&wt.r_t);
        let with_hr = |xw: &Tensor| if h_is_zero { xw.clone() } else { xw.add(&hr) };
        let f = self.acts[0];
        match self.cell {
            Cell::Rnn => (f.apply(&self.clipped(with_hr(xw))), c.clone()),
            Cell::Gru => {
                let g = self.acts[1];
                let z = f.apply(&self.clipped(self.gate(xw, 0).add(self.gate(&hr, 0))));
                let r = f.apply(&self.clipped(self.gate(xw, 1).add(self.gate(&hr, 1))));
                let candidate = if self.linear_before_reset {
                    let hr_h = match &wt.bias {
                        Some((_, rb)) => self.gate(&hr, 2).add(rb.narrow(0, 2 * self.hidden, self.hidden)),
                        None => self.gate(&hr, 2),
                    };
                    self.gate(xw, 2).add(r.mul(hr_h))
                } else {
                    // `(r * h) @ Rh^T + Rbh`: the reset gate applies before the recurrent matmul.
                    let rh_t = wt.r_t.narrow(1, 2 * self.hidden, self.hidden);
                    let mut rec = r.mul(h).matmul(&rh_t);
                    if let Some((_, rb)) = &wt.bias {
                        rec = rec.add(rb.narrow(0, 2 * self.hidden, self.hidden));
                    }
                    self.gate(xw, 2).add(rec)
                };
                let n = g.apply(&self.clipped(candidate));
                // `(1 - z) * n + z * h`.
                (n.add(z.mul(h.sub(&n))), c.clone())
            }
            Cell::Lstm => {
                let (g, hact) = (self.acts[1], self.acts[2]);
                // One sum for the four gates: the recurrent product then accumulates onto the
                // step's projection (`lower`'s matmul bias) instead of being read back per gate.
                let sum = with_hr(xw);
                let pre = |k: usize| self.gate(&sum, k);
                let peep = |k: usize, state: &Tensor, z: Tensor| match &wt.peepholes {
                    Some(p) => z.add(p.narrow(0, k * self.hidden, self.hidden).mul(state)),
                    None => z,
                };
                // Gate order i, o, f, c; peepholes i, o, f.
                let i = f.apply(&self.clipped(peep(0, c, pre(0))));
                let fg = f.apply(&self.clipped(peep(2, c, pre(2))));
                let cand = g.apply(&self.clipped(pre(3)));
                let c_new = fg.mul(c).add(i.mul(&cand));
                let o = f.apply(&self.clipped(peep(1, &c_new, pre(1))));
                (o.mul(hact.apply(&c_new)), c_new)
            }
        }
    }
}

//! Recurrent layers unrolled over time: `SimpleRnn` (tanh), `Gru` and `Lstm`, one layer each,
//! batch first (`[batch, seq, input]`), with PyTorch's equations, gate order and parameter names
//! (`weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`, `bias_hh_l0`). The sequence length must be
//! concrete: the loop is unrolled when the graph is built. The initial state is zero.

use kiln::Tensor;

use crate::Module;
use crate::conv::{bad_input, show_shape};
use crate::init;

/// The four tensors of one recurrent layer with `gates` gates of width `hidden`.
#[derive(Module)]
struct Cell {
    #[param(rename = "weight_ih_l0")]
    weight_ih: Tensor,
    #[param(rename = "weight_hh_l0")]
    weight_hh: Tensor,
    #[param(rename = "bias_ih_l0")]
    bias_ih: Tensor,
    #[param(rename = "bias_hh_l0")]
    bias_hh: Tensor,
    hidden: usize,
}

impl Cell {
    fn new(input: usize, hidden: usize, gates: usize) -> Cell {
        let bound = 1.0 / (hidden.max(1) as f32).sqrt();
        Cell {
            weight_ih: init::uniform(&[gates * hidden, input], bound),
            weight_hh: init::uniform(&[gates * hidden, hidden], bound),
            bias_ih: init::uniform(&[gates * hidden], bound),
            bias_hh: init::uniform(&[gates * hidden], bound),
            hidden,
        }
    }

    /// `x W_ih^T + b_ih` for every step at once, `[batch, seq, gates * hidden]`, and the number of
    /// steps; `None` if `x` is not `[batch, seq, input]` with a concrete `seq`.
    #[track_caller]
    fn input_part(&self, x: &Tensor) -> Option<(Tensor, usize)> {
        let seq = match x.shape().as_ref() {
            [_, s, _] => s.as_const()? as usize,
            _ => return None,
        };
        Some((x.matmul(&self.weight_ih.transpose(0, 1)).add(&self.bias_ih), seq))
    }

    /// `x W_ih^T + b_ih + b_hh` for every step at once: the input part with the hidden bias folded
    /// in, for cells whose gates only ever use the sum `x_t W_ih^T + h W_hh^T + b_ih + b_hh` (so
    /// no step adds a bias of its own).
    #[track_caller]
    fn input_part_both_biases(&self, x: &Tensor) -> Option<(Tensor, usize)> {
        let seq = match x.shape().as_ref() {
            [_, s, _] => s.as_const()? as usize,
            _ => return None,
        };
        let bias = self.bias_ih.add(&self.bias_hh);
        Some((x.matmul(&self.weight_ih.transpose(0, 1)).add(bias), seq))
    }

    /// `xw_t + h W_hh^T` (the biases are in `xw_t`), or `xw_t` for the zero initial state.
    fn pre_activation(&self, xw_t: Tensor, h: Option<&Tensor>) -> Tensor {
        match h {
            Some(h) => xw_t.add(h.matmul(&self.weight_hh.transpose(0, 1))),
            None => xw_t,
        }
    }

    /// Step `t` of the input part, `[batch, gates * hidden]`.
    fn at(xw: &Tensor, t: usize) -> Tensor {
        xw.narrow(1, t as i64, 1).squeeze(1)
    }

    /// `h W_hh^T + b_hh`, or just `b_hh` for the zero initial state.
    fn hidden_part(&self, h: Option<&Tensor>) -> Tensor {
        match h {
            Some(h) => h.matmul(&self.weight_hh.transpose(0, 1)).add(&self.bias_hh),
            None => self.bias_hh.clone(),
        }
    }

    /// Gate `i` of a `[batch, gates * hidden]` (or `[gates * hidden]`) tensor.
    fn gate(&self, t: &Tensor, i: usize) -> Tensor {
        t.narrow(-1, (i * self.hidden) as i64, self.hidden as i64)
    }
}

/// The output of a recurrent layer: every step's hidden state `[batch, seq, hidden]`, or the last
/// one `[batch, hidden]`.
fn output(states: &[Tensor], return_sequences: bool) -> Tensor {
    if return_sequences {
        let refs: Vec<&Tensor> = states.iter().collect();
        Tensor::stack(&refs, 1)
    } else {
        states[states.len() - 1].clone()
    }
}

/// An empty sequence has no last state: an error of layer `op` naming the problem.
#[track_caller]
fn empty(op: &'static str, x: &Tensor) -> Tensor {
    bad_input(x, op, format!("input {} has no steps (the sequence axis is 0)", show_shape(x)))
}

/// The error of layer `op` for an input that is not `[batch, seq, input]` with a concrete `seq`.
#[track_caller]
fn not_batch_seq_input(op: &'static str, x: &Tensor) -> Tensor {
    bad_input(x, op, format!("input must be [batch, seq, input] with a concrete seq, got {}", show_shape(x)))
}

macro_rules! recurrent_module {
    ($t:ty) => {
        impl Module for $t {
            fn forward(&self, x: &Tensor) -> Tensor {
                self.run(x)
            }
        }
    };
}

/// The Elman RNN: `h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)` (PyTorch's `nn.RNN`,
/// Keras's `SimpleRNN`).
#[derive(Module)]
pub struct SimpleRnn {
    #[module(flatten)]
    cell: Cell,
    /// Return every step's state (`[batch, seq, hidden]`, the default) or only the last.
    pub return_sequences: bool,
}

impl SimpleRnn {
    /// A layer `input -> hidden`.
    pub fn new(input: usize, hidden: usize) -> SimpleRnn {
        SimpleRnn { cell: Cell::new(input, hidden, 1), return_sequences: true }
    }

    #[track_caller]
    fn run(&self, x: &Tensor) -> Tensor {
        let Some((xw, seq)) = self.cell.input_part_both_biases(x) else {
            return not_batch_seq_input("rnn", x);
        };
        if seq == 0 {
            return empty("rnn", x);
        }
        let mut states: Vec<Tensor> = Vec::with_capacity(seq);
        for t in 0..seq {
            let h = self.cell.pre_activation(Cell::at(&xw, t), states.last()).tanh();
            states.push(h);
        }
        output(&states, self.return_sequences)
    }
}
recurrent_module!(SimpleRnn);

/// The GRU (PyTorch's `nn.GRU`, gates `r, z, n`): `r = s(x_r + h_r)`, `z = s(x_z + h_z)`,
/// `n = tanh(x_n + r * h_n)`, `h = (1 - z) * n + z * h_prev`.
#[derive(Module)]
pub struct Gru {
    #[module(flatten)]
    cell: Cell,
    /// Return every step's state (the default) or only the last.
    pub return_sequences: bool,
}

impl Gru {
    /// A layer `input -> hidden`.
    pub fn new(input: usize, hidden: usize) -> Gru {
        Gru { cell: Cell::new(input, hidden, 3), return_sequences: true }
    }

    #[track_caller]
    fn run(&self, x: &Tensor) -> Tensor {
        let Some((xw, seq)) = self.cell.input_part(x) else { return not_batch_seq_input("gru", x) };
        if seq == 0 {
            return empty("gru", x);
        }
        let c = &self.cell;
        let mut states: Vec<Tensor> = Vec::with_capacity(seq);
        for t in 0..seq {
            let xt = Cell::at(&xw, t);
            let hh = c.hidden_part(states.last());
            let r = c.gate(&xt, 0).add(c.gate(&hh, 0)).sigmoid();
            let z = c.gate(&xt, 1).add(c.gate(&hh, 1)).sigmoid();
            let n = c.gate(&xt, 2).add(r.mul(c.gate(&hh, 2))).tanh();
            let keep_new = z.neg().add(1.0).mul(&n);
            let h = match states.last() {
                Some(prev) => keep_new.add(z.mul(prev)),
                None => keep_new,
            };
            states.push(h);
        }
        output(&states, self.return_sequences)
    }
}
recurrent_module!(Gru);

/// The LSTM (PyTorch's `nn.LSTM`, gates `i, f, g, o`): `c = s(f) * c_prev + s(i) * tanh(g)`,
/// `h = s(o) * tanh(c)`.
#[derive(Module)]
pub struct Lstm {
    #[module(flatten)]
    cell: Cell,
    /// Return every step's state (the default) or only the last.
    pub return_sequences: bool,
}

impl Lstm {
    /// A layer `input -> hidden`.
    pub fn new(input: usize, hidden: usize) -> Lstm {
        Lstm { cell: Cell::new(input, hidden, 4), return_sequences: true }
    }

    #[track_caller]
    fn run(&self, x: &Tensor) -> Tensor {
        let Some((xw, seq)) = self.cell.input_part_both_biases(x) else {
            return not_batch_seq_input("lstm", x);
        };
        if seq == 0 {
            return empty("lstm", x);
        }
        let c = &self.cell;
        let mut states: Vec<Tensor> = Vec::with_capacity(seq);
        let mut cell_state: Option<Tensor> = None;
        for t in 0..seq {
            let pre = c.pre_activation(Cell::at(&xw, t), states.last());
            let i = c.gate(&pre, 0).sigmoid();
            let f = c.gate(&pre, 1).sigmoid();
            let g = c.gate(&pre, 2).tanh();
            let o = c.gate(&pre, 3).sigmoid();
            let ig = i.mul(&g);
            let next = match &cell_state {
                Some(prev) => f.mul(prev).add(&ig),
                None => ig,
            };
            states.push(o.mul(next.tanh()));
            cell_state = Some(next);
        }
        output(&states, self.return_sequences)
    }
}
recurrent_module!(Lstm);

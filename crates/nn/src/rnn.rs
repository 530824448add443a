//! Recurrent layers unrolled over time: `SimpleRnn` (tanh), `Gru` and `Lstm`, batch first
//! (`[batch, seq, input]`), stacked (`num_layers`) and optionally bidirectional, with PyTorch's
//! equations, gate order and parameter names (`weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`,
//! `bias_hh_l0`, then `..._l0_reverse` for the backward direction, then `..._l1`, in PyTorch's
//! order). The sequence length must be concrete: the loop is unrolled when the graph is built.
//! The initial state is zero.

use kiln::Tensor;

use crate::Module;
use crate::conv::{bad_input, show_shape};
use crate::init;
use crate::module::{ModuleParams, ParamKind};

/// The four tensors of one direction of one recurrent layer with `gates` gates of width `hidden`,
/// named with PyTorch's suffix (`l0`, `l1_reverse`).
struct Cell {
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor,
    bias_hh: Tensor,
    hidden: usize,
    suffix: String,
}

impl ModuleParams for Cell {
    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        let s = &self.suffix;
        f(&format!("weight_ih_{s}"), &self.weight_ih, ParamKind::Weight);
        f(&format!("weight_hh_{s}"), &self.weight_hh, ParamKind::Weight);
        f(&format!("bias_ih_{s}"), &self.bias_ih, ParamKind::Weight);
        f(&format!("bias_hh_{s}"), &self.bias_hh, ParamKind::Weight);
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        let s = &self.suffix;
        f(&format!("weight_ih_{s}"), &mut self.weight_ih, ParamKind::Weight);
        f(&format!("weight_hh_{s}"), &mut self.weight_hh, ParamKind::Weight);
        f(&format!("bias_ih_{s}"), &mut self.bias_ih, ParamKind::Weight);
        f(&format!("bias_hh_{s}"), &mut self.bias_hh, ParamKind::Weight);
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor, ParamKind)) {
        for t in [&self.weight_ih, &self.weight_hh, &self.bias_ih, &self.bias_hh] {
            f(t, ParamKind::Weight);
        }
    }
}

/// Every cell of a recurrent layer stack, layer by layer, forward direction first: what PyTorch
/// lists, in its order, under the layer's own names (no `0.`, `1.` prefixes).
struct Cells(Vec<Cell>);

impl ModuleParams for Cells {
    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor, ParamKind)) {
        self.0.iter().for_each(|c| c.visit(f));
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor, ParamKind)) {
        self.0.iter_mut().for_each(|c| c.visit_mut(f));
    }

    fn visit_tensors(&self, f: &mut dyn FnMut(&Tensor, ParamKind)) {
        self.0.iter().for_each(|c| c.visit_tensors(f));
    }
}

impl Cells {
    /// `num_layers` layers (at least one) of one or two directions, PyTorch's initialisation.
    fn new(input: usize, hidden: usize, gates: usize, num_layers: usize, bidirectional: bool) -> Cells {
        let dirs = if bidirectional { 2 } else { 1 };
        let mut cells = Vec::with_capacity(num_layers.max(1) * dirs);
        for layer in 0..num_layers.max(1) {
            let width = if layer == 0 { input } else { hidden * dirs };
            for dir in 0..dirs {
                let suffix = if dir == 0 { format!("l{layer}") } else { format!("l{layer}_reverse") };
                cells.push(Cell::new(width, hidden, gates, suffix));
            }
        }
        Cells(cells)
    }

    /// How many directions each layer has.
    fn directions(&self) -> usize {
        if self.0.len() > 1 && self.0[1].suffix.ends_with("_reverse") { 2 } else { 1 }
    }
}

impl Cell {
    fn new(input: usize, hidden: usize, gates: usize, suffix: String) -> Cell {
        let bound = 1.0 / (hidden.max(1) as f32).sqrt();
        Cell {
            weight_ih: init::uniform(&[gates * hidden, input], bound),
            weight_hh: init::uniform(&[gates * hidden, hidden], bound),
            bias_ih: init::uniform(&[gates * hidden], bound),
            bias_hh: init::uniform(&[gates * hidden], bound),
            hidden,
            suffix,
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

/// The three recurrences, one step each.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rnn,
    Gru,
    Lstm,
}

impl Kind {
    fn op(self) -> &'static str {
        match self {
            Kind::Rnn => "rnn",
            Kind::Gru => "gru",
            Kind::Lstm => "lstm",
        }
    }

    fn gates(self) -> usize {
        match self {
            Kind::Rnn => 1,
            Kind::Gru => 3,
            Kind::Lstm => 4,
        }
    }

    /// The input part of every step at once: with both biases folded in where the gates only use
    /// their sum (RNN, LSTM), with the input bias only for the GRU (whose `n` gate scales the
    /// hidden part, bias included, by `r`).
    #[track_caller]
    fn input_part(self, c: &Cell, x: &Tensor) -> Option<(Tensor, usize)> {
        match self {
            Kind::Gru => c.input_part(x),
            Kind::Rnn | Kind::Lstm => c.input_part_both_biases(x),
        }
    }

    /// One step: the new hidden state (and the LSTM's new cell state) from the step's input part
    /// and the previous states (`None` at the first step: zeros).
    fn step(self, c: &Cell, xt: Tensor, h: Option<&Tensor>, cell: Option<&Tensor>) -> (Tensor, Option<Tensor>) {
        match self {
            Kind::Rnn => (c.pre_activation(xt, h).tanh(), None),
            Kind::Gru => {
                let hh = c.hidden_part(h);
                let r = c.gate(&xt, 0).add(c.gate(&hh, 0)).sigmoid();
                let z = c.gate(&xt, 1).add(c.gate(&hh, 1)).sigmoid();
                let n = c.gate(&xt, 2).add(r.mul(c.gate(&hh, 2))).tanh();
                let keep_new = z.neg().add(1.0).mul(&n);
                let h = match h {
                    Some(prev) => keep_new.add(z.mul(prev)),
                    None => keep_new,
                };
                (h, None)
            }
            Kind::Lstm => {
                let pre = c.pre_activation(xt, h);
                let i = c.gate(&pre, 0).sigmoid();
                let f = c.gate(&pre, 1).sigmoid();
                let g = c.gate(&pre, 2).tanh();
                let o = c.gate(&pre, 3).sigmoid();
                let ig = i.mul(&g);
                let next = match cell {
                    Some(prev) => f.mul(prev).add(&ig),
                    None => ig,
                };
                (o.mul(next.tanh()), Some(next))
            }
        }
    }

    /// Runs the stack over `x`: each layer's directions over the whole sequence (the reverse one
    /// from the last step back), their states concatenated per step as the next layer's input.
    /// Returns every step's output `[batch, seq, dirs * hidden]`, or, without
    /// `return_sequences`, the final state of each direction of the last layer concatenated
    /// `[batch, dirs * hidden]` (PyTorch's `h_n` of the last layer; the last step's output when
    /// there is one direction).
    #[track_caller]
    fn run(self, cells: &Cells, x: &Tensor, return_sequences: bool) -> Tensor {
        let dirs = cells.directions();
        let mut input = x.clone();
        let mut finals: Vec<Tensor> = Vec::new();
        for layer in cells.0.chunks(dirs) {
            let mut outputs: Vec<Vec<Tensor>> = Vec::with_capacity(dirs);
            finals.clear();
            for (d, c) in layer.iter().enumerate() {
                let Some((xw, seq)) = self.input_part(c, &input) else {
                    return not_batch_seq_input(self.op(), x);
                };
                if seq == 0 {
                    return empty(self.op(), x);
                }
                let mut states: Vec<Tensor> = Vec::with_capacity(seq);
                let mut cell_state: Option<Tensor> = None;
                let steps: Box<dyn Iterator<Item = usize>> =
                    if d == 0 { Box::new(0..seq) } else { Box::new((0..seq).rev()) };
                for t in steps {
                    let (h, next) = self.step(c, Cell::at(&xw, t), states.last(), cell_state.as_ref());
                    states.push(h);
                    cell_state = next;
                }
                finals.push(states[seq - 1].clone());
                if d == 1 {
                    states.reverse();
                }
                outputs.push(states);
            }
            let per_step: Vec<Tensor> =
                (0..outputs[0].len())
                    .map(|t| {
                        if dirs == 1 {
                            outputs[0][t].clone()
                        } else {
                            Tensor::cat(&[&outputs[0][t], &outputs[1][t]], -1)
                        }
                    })
                    .collect();
            let refs: Vec<&Tensor> = per_step.iter().collect();
            input = Tensor::stack(&refs, 1);
        }
        if return_sequences {
            input
        } else if finals.len() == 1 {
            finals.pop().expect("one final state")
        } else {
            Tensor::cat(&[&finals[0], &finals[1]], -1)
        }
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

macro_rules! recurrent_layer {
    ($(#[$doc:meta])* $t:ident, $kind:expr) => {
        $(#[$doc])*
        ///
        /// `new` builds one unidirectional layer; `with_layers` a stack of `num_layers`, each
        /// optionally bidirectional (the next layer reads both directions' states, concatenated).
        #[derive(Module)]
        pub struct $t {
            #[module(flatten)]
            cells: Cells,
            /// Return every step's output (`[batch, seq, dirs * hidden]`, the default) or only the
            /// final state of each direction of the last layer, concatenated (`[batch, dirs * hidden]`).
            pub return_sequences: bool,
        }

        impl $t {
            /// A layer `input -> hidden`.
            pub fn new(input: usize, hidden: usize) -> $t {
                $t::with_layers(input, hidden, 1, false)
            }

            /// `num_layers` (at least 1) stacked layers `input -> hidden`, each with a backward
            /// direction too when `bidirectional` (PyTorch's `num_layers` and `bidirectional`).
            pub fn with_layers(input: usize, hidden: usize, num_layers: usize, bidirectional: bool) -> $t {
                $t {
                    cells: Cells::new(input, hidden, $kind.gates(), num_layers, bidirectional),
                    return_sequences: true,
                }
            }
        }

        impl Module for $t {
            #[track_caller]
            fn forward(&self, x: &Tensor) -> Tensor {
                $kind.run(&self.cells, x, self.return_sequences)
            }
        }
    };
}

recurrent_layer!(
    /// The Elman RNN: `h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)` (PyTorch's `nn.RNN`,
    /// Keras's `SimpleRNN`).
    SimpleRnn,
    Kind::Rnn
);

recurrent_layer!(
    /// The GRU (PyTorch's `nn.GRU`, gates `r, z, n`): `r = s(x_r + h_r)`, `z = s(x_z + h_z)`,
    /// `n = tanh(x_n + r * h_n)`, `h = (1 - z) * n + z * h_prev`.
    Gru,
    Kind::Gru
);

recurrent_layer!(
    /// The LSTM (PyTorch's `nn.LSTM`, gates `i, f, g, o`): `c = s(f) * c_prev + s(i) * tanh(g)`,
    /// `h = s(o) * tanh(c)`.
    Lstm,
    Kind::Lstm
);

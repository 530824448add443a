//! Reverse-mode automatic differentiation as a graph transform: the gradient nodes are appended to
//! the same `air::Graph` as the forward nodes, so that forward and backward compile and fuse
//! together like any other graph.
//!
//! # How it works
//!
//! [`grad`] (or [`grad_with_seed`] for a given output gradient) walks the ancestors of the output
//! once, in topological order, and marks the *active* nodes: float nodes that are a `wrt` node or
//! read an active node. Only active nodes carry a gradient, so integer and bool nodes, and float
//! nodes that do not depend on any `wrt` node, add nothing to the graph. It then visits the active
//! nodes in reverse topological order, applies each op's vector-Jacobian product (VJP) rule to the
//! node's complete gradient, and accumulates the contributions of every use of an input with `add`.
//! Each active node is visited once and each rule adds a bounded number of nodes, so the backward
//! graph has O(N) nodes for N forward nodes. Constants the rules need (`ln 2`, `0.5`, zeros) are
//! shared: one `const` node per value and type.
//!
//! # VJP rules
//!
//! `g` is the node's gradient, `x` (or `a`, `b`) its inputs and `y` its value.
//!
//! | op | gradient of the inputs |
//! |----|------------------------|
//! | `neg` | `-g` |
//! | `exp2` | `g * y * ln 2` |
//! | `log2` | `g / (x * ln 2)` |
//! | `sin` | `g * sin(x + pi/2)` (there is no `cos` primitive) |
//! | `sqrt` | `g * 0.5 / y` |
//! | `recip` | `-(g * y * y)` |
//! | `erf` | `g * 2/sqrt(pi) * exp2(-x^2 * log2 e)` |
//! | `trunc` | zero |
//! | `add`, `sub` | `g`; `g` and `-g` |
//! | `mul` | `g * b`, `g * a` |
//! | `div` (floats) | `g / b`, `-(g / b) * y` |
//! | `max`, `min` | `g` to the selected operand; on a tie **half to each** (PyTorch's `maximum`), but against a `const` operand the constant wins ties, so the other gets nothing there (PyTorch's `relu`, `clamp_min`, `clamp_max`) |
//! | `pow` | `g * b * a^(b-1)` (zero where `b == 0`); `g * y * log2(a) * ln 2` (zero where `a == 0` and `b >= 0`), like PyTorch |
//! | `mod` (floats) | `g`; `-g * trunc(a / b)` (PyTorch's `fmod`) |
//! | comparisons, `and`, `or`, `not` | none: their results are bool or int |
//! | `where(c, a, b)` | `where(c, g, 0)`, `where(c, 0, g)`; nothing to `c` |
//! | `cast` | float to float: `g` cast back to the input dtype; none to or from int/bool |
//! | `reduce sum` | `g` expanded back to the input shape |
//! | `reduce max` | `g` **split evenly among the positions equal to the max** (PyTorch's `amax`, not `max(dim)`): `where(x == expand(y), expand(g / count), 0)` |
//! | `reshape` | `g` reshaped back |
//! | `permute` | `g` permuted by the inverse permutation |
//! | `expand` | `g` summed over the expanded axes (the reduced axes keep size 1, so no reshape is needed) |
//! | `pad` | `g` shrunk to the unpadded region (the pad value gets no gradient) |
//! | `shrink` | `g` padded back with zeros |
//! | `gather(src, index)` | `scatter_add(index, g)` into `src`'s axis size (f16/bf16 through f32), padded with zeros where the index is smaller than `src` off the axis; nothing to `index` |
//! | `scatter_add(index, v)` | `gather(g, index)` to `v`; nothing to `index` |
//! | `input`, `const`, `iota` | leaves |
//!
//! NaN conventions: a `max`/`min` with a NaN operand routes no gradient to either operand (every
//! comparison with NaN is false), and a `reduce max` whose result is NaN routes none.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use air::dim::Dim;
use air::op::{Cast, Const, Expand, Gather, Pad, Permute, Reduce, ReduceOp, Reshape, ScatterAdd, Shrink};
use air::{AirError, BinaryOp, DType, Graph, NodeId, Op, Scalar, TensorType, UnaryOp};
use smallvec::SmallVec;

/// Why a gradient could not be built. User graphs never make `grad` panic; they get one of these.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AutodiffError {
    /// A node passed to `grad` is not (or no longer) in the graph.
    #[error("autodiff: {role} node {node} is not in the graph")]
    NotInGraph {
        /// Which argument named the node: `"output"`, `"wrt"` or `"seed"`.
        role: &'static str,
        /// The missing node.
        node: NodeId,
    },
    /// Only float outputs can be differentiated.
    #[error("autodiff: output {node} has dtype {dtype}; only float outputs have gradients")]
    OutputNotFloat {
        /// The output node.
        node: NodeId,
        /// Its (non-float) dtype.
        dtype: DType,
    },
    /// Gradients exist only with respect to float nodes.
    #[error("autodiff: cannot differentiate with respect to {node} of dtype {dtype}; only float nodes have gradients")]
    WrtNotFloat {
        /// The `wrt` node.
        node: NodeId,
        /// Its (non-float) dtype.
        dtype: DType,
    },
    /// The seed gradient must have exactly the output's type.
    #[error("autodiff: seed {seed} has type {seed_ty}, but output {output} has type {output_ty}")]
    SeedType {
        /// The seed node.
        seed: NodeId,
        /// The seed's type.
        seed_ty: Box<TensorType>,
        /// The output node.
        output: NodeId,
        /// The output's type, which the seed must match.
        output_ty: Box<TensorType>,
    },
    /// The graph is malformed (a cycle, a wrong arity or type left by `add_unchecked`, ...).
    #[error("autodiff: invalid graph at {node}: {msg}")]
    InvalidGraph {
        /// The node where the problem was found.
        node: NodeId,
        /// What is wrong.
        msg: String,
    },
    /// Adding a gradient node failed; the forward graph has a type the rules cannot invert.
    #[error("autodiff: building the gradient of {node}: {source}")]
    Build {
        /// The forward node whose gradient was being built.
        node: NodeId,
        /// The error from adding the gradient node.
        source: AirError,
    },
}

type Result<T> = std::result::Result<T, AutodiffError>;

/// Appends to `graph` the gradient of `output` with respect to each node of `wrt`, seeding the
/// output's gradient with ones (for a loss of shape `[1, ..., 1]` this is the usual gradient; for
/// other outputs it is the gradient of the sum of the output).
///
/// Returns, per `wrt` node and in order, a node of exactly that node's type: the gradient, or a
/// zeros `const` if `output` does not depend on it. The new nodes are not made outputs.
pub fn grad(graph: &mut Graph, output: NodeId, wrt: &[NodeId]) -> Result<Vec<NodeId>> {
    let ty = match graph.get(output) {
        Some(node) => node.ty.clone(),
        None => return Err(AutodiffError::NotInGraph { role: "output", node: output }),
    };
    if !ty.dtype.is_float() {
        return Err(AutodiffError::OutputNotFloat { node: output, dtype: ty.dtype });
    }
    let mut builder = Builder::new(graph);
    let seed = builder.scalar(1.0, &ty).map_err(|source| AutodiffError::Build { node: output, source })?;
    backward(builder, output, seed, wrt)
}

/// Like [`grad`], with the output's gradient given as the node `seed` (of the output's type): the
/// vector-Jacobian product `seed^T * d output / d wrt`. The seed is treated as a constant: no
/// gradient flows through it, even if it depends on a `wrt` node.
pub fn grad_with_seed(graph: &mut Graph, output: NodeId, seed: NodeId, wrt: &[NodeId]) -> Result<Vec<NodeId>> {
    let Some(out_node) = graph.get(output) else {
        return Err(AutodiffError::NotInGraph { role: "output", node: output });
    };
    if !out_node.ty.dtype.is_float() {
        return Err(AutodiffError::OutputNotFloat { node: output, dtype: out_node.ty.dtype });
    }
    let Some(seed_node) = graph.get(seed) else {
        return Err(AutodiffError::NotInGraph { role: "seed", node: seed });
    };
    if seed_node.ty != out_node.ty {
        return Err(AutodiffError::SeedType {
            seed,
            seed_ty: Box::new(seed_node.ty.clone()),
            output,
            output_ty: Box::new(out_node.ty.clone()),
        });
    }
    backward(Builder::new(graph), output, seed, wrt)
}

fn backward(mut b: Builder<'_>, output: NodeId, seed: NodeId, wrt: &[NodeId]) -> Result<Vec<NodeId>> {
    for &w in wrt {
        let Some(node) = b.graph.get(w) else {
            return Err(AutodiffError::NotInGraph { role: "wrt", node: w });
        };
        if !node.ty.dtype.is_float() {
            return Err(AutodiffError::WrtNotFloat { node: w, dtype: node.ty.dtype });
        }
    }
    let order = ancestors_in_topo_order(b.graph, output)?;

    // Active nodes: float nodes that are a wrt node or read an active node.
    let wrt_set: HashSet<NodeId> = wrt.iter().copied().collect();
    let mut active: HashSet<NodeId> = HashSet::default();
    for &id in &order {
        let node = b.graph.node(id);
        if node.ty.dtype.is_float() && (wrt_set.contains(&id) || node.inputs.iter().any(|i| active.contains(i))) {
            active.insert(id);
        }
    }

    let mut grads: HashMap<NodeId, NodeId> = HashMap::default();
    if active.contains(&output) {
        grads.insert(output, seed);
    }
    for &id in order.iter().rev() {
        if !active.contains(&id) {
            continue;
        }
        // Every user of `id` comes later in the order, so its gradient is complete here.
        let Some(&g) = grads.get(&id) else { continue };
        let node = b.graph.node(id).clone();
        if node.op.is_leaf() {
            continue;
        }
        let needs: SmallVec<[bool; 3]> = node.inputs.iter().map(|i| active.contains(i)).collect();
        if !needs.contains(&true) {
            // A wrt node whose own inputs need no gradient.
            continue;
        }
        let contributions = vjp(&mut b, id, &node, g, &needs)?;
        for (input, contribution) in contributions {
            if b.graph.ty(contribution) != b.graph.ty(input) {
                let msg = format!(
                    "the gradient of input {input} has type {}, but the input has type {}",
                    b.graph.ty(contribution),
                    b.graph.ty(input)
                );
                return Err(AutodiffError::InvalidGraph { node: id, msg });
            }
            let total = match grads.get(&input) {
                Some(&previous) => b.add(id, Op::Binary(BinaryOp::Add), &[previous, contribution])?,
                None => contribution,
            };
            grads.insert(input, total);
        }
    }

    let mut out = Vec::with_capacity(wrt.len());
    for &w in wrt {
        let ty = b.graph.ty(w).clone();
        let g = match grads.get(&w) {
            Some(&g) => g,
            None => b.scalar(0.0, &ty).map_err(|source| AutodiffError::Build { node: w, source })?,
        };
        if *b.graph.ty(g) != ty {
            let msg = format!("its gradient has type {}, but the node has type {ty}", b.graph.ty(g));
            return Err(AutodiffError::InvalidGraph { node: w, msg });
        }
        out.push(g);
    }
    Ok(out)
}

/// The ancestors of `output` (and `output`), inputs before users, by an iterative depth-first
/// post-order. O(size of the cone). A cycle is an error.
fn ancestors_in_topo_order(graph: &Graph, output: NodeId) -> Result<Vec<NodeId>> {
    const ON_STACK: bool = false;
    const DONE: bool = true;
    let mut state: HashMap<NodeId, bool> = HashMap::default();
    let mut order = Vec::new();
    let mut stack: Vec<(NodeId, usize)> = vec![(output, 0)];
    state.insert(output, ON_STACK);
    while let Some((id, next)) = stack.last_mut() {
        let id = *id;
        if let Some(&input) = graph.inputs(id).get(*next) {
            *next += 1;
            match state.get(&input) {
                None => {
                    state.insert(input, ON_STACK);
                    stack.push((input, 0));
                }
                Some(&ON_STACK) => {
                    let msg = format!("the graph has a cycle through {input}");
                    return Err(AutodiffError::InvalidGraph { node: id, msg });
                }
                Some(_) => {}
            }
        } else {
            state.insert(id, DONE);
            order.push(id);
            stack.pop();
        }
    }
    Ok(order)
}

/// Adds gradient nodes to the graph, sharing constants.
struct Builder<'g> {
    graph: &'g mut Graph,
    consts: HashMap<(TensorType, Scalar), NodeId>,
}

impl<'g> Builder<'g> {
    fn new(graph: &'g mut Graph) -> Builder<'g> {
        Builder { graph, consts: HashMap::default() }
    }

    /// A `const` of type `ty` filled with `value`.
    fn scalar(&mut self, value: f64, ty: &TensorType) -> std::result::Result<NodeId, AirError> {
        let value = Scalar::Float(value);
        if let Some(&id) = self.consts.get(&(ty.clone(), value)) {
            return Ok(id);
        }
        let id = self.graph.add_leaf(Op::Const(Const { value }), ty.clone())?;
        self.consts.insert((ty.clone(), value), id);
        Ok(id)
    }

    /// Adds `op(inputs)`; a failure is blamed on the forward node `node`.
    fn add(&mut self, node: NodeId, op: Op, inputs: &[NodeId]) -> Result<NodeId> {
        self.graph.add(op, inputs).map_err(|source| AutodiffError::Build { node, source })
    }

    fn constant(&mut self, node: NodeId, value: f64, like: NodeId) -> Result<NodeId> {
        let ty = self.graph.ty(like).clone();
        self.scalar(value, &ty).map_err(|source| AutodiffError::Build { node, source })
    }

    fn unary(&mut self, node: NodeId, op: UnaryOp, x: NodeId) -> Result<NodeId> {
        self.add(node, Op::Unary(op), &[x])
    }

    fn binary(&mut self, node: NodeId, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.add(node, Op::Binary(op), &[a, b])
    }

    fn mul(&mut self, node: NodeId, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(node, BinaryOp::Mul, a, b)
    }

    /// `x * value`, the constant shaped like `x`.
    fn mul_scalar(&mut self, node: NodeId, x: NodeId, value: f64) -> Result<NodeId> {
        let c = self.constant(node, value, x)?;
        self.mul(node, x, c)
    }

    fn select(&mut self, node: NodeId, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.add(node, Op::Where, &[cond, a, b])
    }

    fn expand(&mut self, node: NodeId, x: NodeId, shape: &[Dim]) -> Result<NodeId> {
        if self.graph.ty(x).shape.as_slice() == shape {
            return Ok(x);
        }
        self.add(node, Op::Expand(Expand { shape: shape.into() }), &[x])
    }
}

/// The contributions of node `id` (whose gradient is `g`) to the gradients of its inputs, for the
/// inputs whose `needs` entry is set. An op of one input is only asked when its input needs it.
fn vjp(b: &mut Builder<'_>, id: NodeId, node: &air::Node, g: NodeId, needs: &[bool]) -> Result<Vec<(NodeId, NodeId)>> {
    let inputs = &node.inputs;
    if inputs.len() != node.op.arity() {
        let msg = format!("{} expects {} inputs, has {}", node.op.mnemonic(), node.op.arity(), inputs.len());
        return Err(AutodiffError::InvalidGraph { node: id, msg });
    }
    let in_ty = |b: &Builder<'_>, k: usize| b.graph.ty(inputs[k]).clone();
    let mut out: Vec<(NodeId, NodeId)> = Vec::with_capacity(2);
    match &node.op {
        Op::Input(_) | Op::Const(_) | Op::Iota(_) => {}
        Op::Unary(u) => {
            let x = inputs[0];
            let gx = match u {
                UnaryOp::Neg => Some(b.unary(id, UnaryOp::Neg, g)?),
                UnaryOp::Exp2 => {
                    let gy = b.mul(id, g, id)?;
                    Some(b.mul_scalar(id, gy, std::f64::consts::LN_2)?)
                }
                UnaryOp::Log2 => {
                    let x_ln2 = b.mul_scalar(id, x, std::f64::consts::LN_2)?;
                    Some(b.binary(id, BinaryOp::Div, g, x_ln2)?)
                }
                UnaryOp::Sin => {
                    let half_pi = b.constant(id, std::f64::consts::FRAC_PI_2, x)?;
                    let shifted = b.binary(id, BinaryOp::Add, x, half_pi)?;
                    let cos = b.unary(id, UnaryOp::Sin, shifted)?;
                    Some(b.mul(id, g, cos)?)
                }
                UnaryOp::Sqrt => {
                    let half_g = b.mul_scalar(id, g, 0.5)?;
                    Some(b.binary(id, BinaryOp::Div, half_g, id)?)
                }
                UnaryOp::Recip => {
                    let y2 = b.mul(id, id, id)?;
                    let gy2 = b.mul(id, g, y2)?;
                    Some(b.unary(id, UnaryOp::Neg, gy2)?)
                }
                UnaryOp::Erf => {
                    let x2 = b.mul(id, x, x)?;
                    let e = b.mul_scalar(id, x2, -std::f64::consts::LOG2_E)?;
                    let gauss = b.unary(id, UnaryOp::Exp2, e)?;
                    let scaled = b.mul_scalar(id, g, std::f64::consts::FRAC_2_SQRT_PI)?;
                    Some(b.mul(id, scaled, gauss)?)
                }
                // Piecewise constant, or not a float op.
                UnaryOp::Trunc | UnaryOp::Not => None,
            };
            if let Some(gx) = gx {
                out.push((x, gx));
            }
        }
        Op::Binary(op) => binary_vjp(b, id, *op, inputs[0], inputs[1], g, needs, &mut out)?,
        Op::Where => {
            let (cond, x, y) = (inputs[0], inputs[1], inputs[2]);
            let zero = b.constant(id, 0.0, g)?;
            if needs[1] {
                out.push((x, b.select(id, cond, g, zero)?));
            }
            if needs[2] {
                out.push((y, b.select(id, cond, zero, g)?));
            }
        }
        Op::Cast(_) => {
            let from = in_ty(b, 0);
            if from.dtype.is_float() && node.ty.dtype.is_float() {
                let gx =
                    if from.dtype == node.ty.dtype { g } else { b.add(id, Op::Cast(Cast { to: from.dtype }), &[g])? };
                out.push((inputs[0], gx));
            }
        }
        Op::Reduce(r) => {
            let x = inputs[0];
            let x_shape = in_ty(b, 0).shape;
            match r.op {
                ReduceOp::Sum => out.push((x, b.expand(id, g, &x_shape)?)),
                ReduceOp::Max => {
                    // Even split among the positions equal to the max (PyTorch's `amax`).
                    let y_wide = b.expand(id, id, &x_shape)?;
                    let is_max = b.binary(id, BinaryOp::CmpEq, x, y_wide)?;
                    let dtype = node.ty.dtype;
                    let ones = b.add(id, Op::Cast(Cast { to: dtype }), &[is_max])?;
                    let count = b.add(id, Op::Reduce(Reduce { op: ReduceOp::Sum, axes: r.axes.clone() }), &[ones])?;
                    let share = b.binary(id, BinaryOp::Div, g, count)?;
                    let share_wide = b.expand(id, share, &x_shape)?;
                    let zero = b.constant(id, 0.0, x)?;
                    out.push((x, b.select(id, is_max, share_wide, zero)?));
                }
            }
        }
        Op::Reshape(_) => {
            let shape = in_ty(b, 0).shape;
            let gx = if b.graph.ty(g).shape == shape { g } else { b.add(id, Op::Reshape(Reshape { shape }), &[g])? };
            out.push((inputs[0], gx));
        }
        Op::Permute(p) => {
            let rank = p.perm.len();
            let mut inverse: SmallVec<[usize; 4]> = smallvec::smallvec![usize::MAX; rank];
            for (i, &axis) in p.perm.iter().enumerate() {
                match inverse.get_mut(axis) {
                    Some(slot) if *slot == usize::MAX => *slot = i,
                    _ => {
                        let msg = format!("permute: {:?} is not a permutation", p.perm.as_slice());
                        return Err(AutodiffError::InvalidGraph { node: id, msg });
                    }
                }
            }
            out.push((inputs[0], b.add(id, Op::Permute(Permute { perm: inverse }), &[g])?));
        }
        Op::Expand(_) => {
            let x_shape = in_ty(b, 0).shape;
            let axes: SmallVec<[usize; 4]> =
                x_shape.iter().zip(&node.ty.shape).enumerate().filter(|(_, (a, o))| a != o).map(|(k, _)| k).collect();
            let gx = if axes.is_empty() { g } else { b.add(id, Op::Reduce(Reduce { op: ReduceOp::Sum, axes }), &[g])? };
            out.push((inputs[0], gx));
        }
        Op::Pad(p) => {
            let x_shape = in_ty(b, 0).shape;
            let ranges = p.padding.iter().zip(&x_shape).map(|((before, _), d)| (*before, before + d)).collect();
            out.push((inputs[0], b.add(id, Op::Shrink(Shrink { ranges }), &[g])?));
        }
        Op::Shrink(s) => {
            let x_shape = in_ty(b, 0).shape;
            let padding = s.ranges.iter().zip(&x_shape).map(|((start, end), d)| (*start, d - end)).collect();
            let value = Scalar::Float(0.0);
            out.push((inputs[0], b.add(id, Op::Pad(Pad { padding, value }), &[g])?));
        }
        Op::Gather(ga) => {
            let (src, index) = (in_ty(b, 0), in_ty(b, 1));
            let mut shape = index.shape.clone();
            shape[ga.axis] = src.shape[ga.axis];
            let half = src.dtype.is_half();
            let gf = if half { b.add(id, Op::Cast(Cast { to: DType::F32 }), &[g])? } else { g };
            let scatter = Op::ScatterAdd(Box::new(ScatterAdd { axis: ga.axis, shape: shape.clone() }));
            let mut gx = b.add(id, scatter, &[inputs[1], gf])?;
            if half {
                gx = b.add(id, Op::Cast(Cast { to: src.dtype }), &[gx])?;
            }
            if shape != src.shape {
                let padding = shape.iter().zip(&src.shape).map(|(have, want)| (Dim::Const(0), want - have)).collect();
                gx = b.add(id, Op::Pad(Pad { padding, value: Scalar::Float(0.0) }), &[gx])?;
            }
            out.push((inputs[0], gx));
        }
        Op::ScatterAdd(sa) => {
            if needs[1] {
                out.push((inputs[1], b.add(id, Op::Gather(Gather { axis: sa.axis }), &[g, inputs[0]])?));
            }
        }
    }
    Ok(out)
}

/// The VJP of a binary op `y = op(x, z)` (node `id`) with gradient `g`.
#[allow(clippy::too_many_arguments)]
fn binary_vjp(
    b: &mut Builder<'_>,
    id: NodeId,
    op: BinaryOp,
    x: NodeId,
    z: NodeId,
    g: NodeId,
    needs: &[bool],
    out: &mut Vec<(NodeId, NodeId)>,
) -> Result<()> {
    let (need_x, need_z) = (needs[0], needs[1]);
    let float = b.graph.ty(id).dtype.is_float();
    match op {
        BinaryOp::Add => {
            if need_x {
                out.push((x, g));
            }
            if need_z {
                out.push((z, g));
            }
        }
        BinaryOp::Sub => {
            if need_x {
                out.push((x, g));
            }
            if need_z {
                out.push((z, b.unary(id, UnaryOp::Neg, g)?));
            }
        }
        BinaryOp::Mul => {
            if need_x {
                out.push((x, b.mul(id, g, z)?));
            }
            if need_z {
                out.push((z, b.mul(id, g, x)?));
            }
        }
        BinaryOp::Div if float => {
            let gx = b.binary(id, BinaryOp::Div, g, z)?;
            if need_x {
                out.push((x, gx));
            }
            if need_z {
                let gxy = b.mul(id, gx, id)?;
                out.push((z, b.unary(id, UnaryOp::Neg, gxy)?));
            }
        }
        BinaryOp::Max | BinaryOp::Min if float => {
            // `x` wins where `z < x` (max) or `x < z` (min); ties give half to each operand.
            let (x_wins, z_wins) = if op == BinaryOp::Max {
                (b.binary(id, BinaryOp::CmpLt, z, x)?, b.binary(id, BinaryOp::CmpLt, x, z)?)
            } else {
                (b.binary(id, BinaryOp::CmpLt, x, z)?, b.binary(id, BinaryOp::CmpLt, z, x)?)
            };
            let zero = b.constant(id, 0.0, g)?;
            let is_const = |n: NodeId| matches!(b.graph.node(n).op, Op::Const(_));
            let (x_const, z_const) = (is_const(x), is_const(z));
            if x_const != z_const {
                // Against a constant, the constant wins ties (PyTorch's `relu`, `clamp_min`).
                let (var, var_wins) = if z_const { (x, x_wins) } else { (z, z_wins) };
                if (z_const && need_x) || (x_const && need_z) {
                    out.push((var, b.select(id, var_wins, g, zero)?));
                }
                return Ok(());
            }
            let tie = b.binary(id, BinaryOp::CmpEq, x, z)?;
            let half = b.mul_scalar(id, g, 0.5)?;
            let tie_share = b.select(id, tie, half, zero)?;
            if need_x {
                out.push((x, b.select(id, x_wins, g, tie_share)?));
            }
            if need_z {
                out.push((z, b.select(id, z_wins, g, tie_share)?));
            }
        }
        BinaryOp::Mod if float => {
            if need_x {
                out.push((x, g));
            }
            if need_z {
                let ratio = b.binary(id, BinaryOp::Div, x, z)?;
                let whole = b.unary(id, UnaryOp::Trunc, ratio)?;
                let gw = b.mul(id, g, whole)?;
                out.push((z, b.unary(id, UnaryOp::Neg, gw)?));
            }
        }
        BinaryOp::Pow => {
            let zero = b.constant(id, 0.0, x)?;
            if need_x {
                // g * z * x^(z-1), zero where z == 0 (so 0^0 has gradient 0, like PyTorch).
                let one = b.constant(id, 1.0, z)?;
                let z_minus_1 = b.binary(id, BinaryOp::Sub, z, one)?;
                let power = b.binary(id, BinaryOp::Pow, x, z_minus_1)?;
                let dydx = b.mul(id, z, power)?;
                let gx = b.mul(id, g, dydx)?;
                let z_is_0 = b.binary(id, BinaryOp::CmpEq, z, zero)?;
                out.push((x, b.select(id, z_is_0, zero, gx)?));
            }
            if need_z {
                // g * y * ln x, zero where x == 0 and z >= 0 (like PyTorch).
                let log = b.unary(id, UnaryOp::Log2, x)?;
                let ln = b.mul_scalar(id, log, std::f64::consts::LN_2)?;
                let dydz = b.mul(id, id, ln)?;
                let gz = b.mul(id, g, dydz)?;
                let x_is_0 = b.binary(id, BinaryOp::CmpEq, x, zero)?;
                let z_neg = b.binary(id, BinaryOp::CmpLt, z, zero)?;
                let z_nonneg = b.unary(id, UnaryOp::Not, z_neg)?;
                let masked = b.binary(id, BinaryOp::And, x_is_0, z_nonneg)?;
                out.push((z, b.select(id, masked, zero, gz)?));
            }
        }
        // Integer ops, comparisons and logic carry no gradient (and are never active).
        BinaryOp::Div
        | BinaryOp::Max
        | BinaryOp::Min
        | BinaryOp::Mod
        | BinaryOp::CmpLt
        | BinaryOp::CmpEq
        | BinaryOp::CmpNe
        | BinaryOp::And
        | BinaryOp::Or => {}
    }
    Ok(())
}

//! The reference interpreter: evaluates a `Graph` on host tensors, one node at a time. It is the
//! oracle every backend is tested against, so it is written for obvious correctness, not speed.
//!
//! # Evaluation
//!
//! [`eval`] evaluates the nodes the outputs need (`Graph::live_order`) in topological order and
//! drops each intermediate value as soon as its last user has run. Every value is a contiguous
//! row-major [`HostTensor`]. First the conditions of the symbolic shapes are checked for the
//! bindings (`crate::constraints`): a violation is the [`AirError::Bounds`] every backend reports.
//! Symbolic dims are evaluated with the given [`Bindings`]; an unbound
//! symbol, a negative dim, a missing input or an input of the wrong type is an
//! [`AirError::Interp`] naming the node. The interpreter never panics on a graph or on inputs: a
//! graph built with `add_unchecked` whose types are wrong gets an error too, and every computed
//! value is checked against its node's type.
//!
//! # Semantics (every backend must match these)
//!
//! Floats
//! - `f32` computes in `f32` and `f64` in `f64`. `f16` and `bf16` compute in `f32` and round to
//!   storage (nearest, ties to even) after every op.
//! - `exp2`, `log2`, `sin`, `erf` and `pow` come from the `libm` crate (the same bits on every
//!   platform); `sqrt` is correctly rounded; `recip(x)` is `1 / x`; `trunc` rounds toward zero.
//! - `max` and `min` are IEEE 754-2019 `maximum`/`minimum` (like PyTorch's `torch.maximum`): NaN
//!   if either operand is NaN, and `+0 > -0`.
//! - `mod` is the remainder with the sign of the dividend (C `fmod`, Rust `%`, `torch.fmod`),
//!   computed exactly: `mod(x, +-inf) = x` for finite `x`; `mod(+-inf, y)`, `mod(x, 0)` and NaN
//!   operands give NaN; a zero result has the sign of `x`. (PyTorch's `remainder`, with the sign
//!   of the divisor, is built on it by the facade: `remainder(-5, inf) = inf`.)
//! - Comparisons follow IEEE 754: any comparison with NaN is false except `cmpne`, which is true.
//!
//! Integers (`i32`, `i64`)
//! - `add`, `sub`, `mul` and `neg` wrap around (two's complement), never trap.
//! - `div` truncates toward zero; `mod` has the sign of the dividend (Rust `%`). Division or
//!   remainder by zero is an error of the op ("integer division by zero in div"), as PyTorch
//!   raises one; compiled backends report it through their per-run error word. `MIN / -1` wraps
//!   to `MIN`, and `MIN % -1` is 0.
//! - `not`, `and`, `or` are bitwise.
//!
//! Bools: `not`, `and`, `or` are logical; `max` is `or` and `min` is `and`. (`cmplt` on bools
//! is rejected by the type rules; the evaluator itself would order `false < true`.)
//!
//! `where(c, a, b)` picks `a` where `c` is true, else `b`.
//!
//! Casts
//! - bool to a number gives 0 or 1; a number to bool is `x != 0` (NaN gives true).
//! - float to int truncates toward zero and saturates at the int's range; NaN gives 0 (Rust `as`).
//! - `i64` to `i32` keeps the low 32 bits (Rust `as`).
//! - int to `f32`/`f64` rounds to nearest even.
//! - anything to `f16`/`bf16` first becomes `f32` (rounding as above), then rounds to storage.
//!   `const`, `pad` values and `iota` indices convert to the node's dtype by these same rules.
//!
//! Leaves: `const` fills with its value; `iota { axis }` holds at each element its index along
//! `axis`, converted to the node's dtype.
//!
//! Reductions keep the reduced axes with size 1 and visit the reduced elements in row-major order.
//! - Float `sum` (every float dtype) accumulates in `f64`, left to right, then rounds once to the
//!   node's dtype (to `f32` first for `f16`/`bf16`). Integer `sum` wraps in the node's dtype.
//! - `max` of floats propagates NaN (as `max` above).
//! - An empty reduction gives 0 for `sum`, and `-inf` (floats) or the int's minimum for `max`
//!   (its identity). The facade never builds a `max` over an axis it knows is empty (PyTorch
//!   raises there); only a symbolic extent bound to 0 reaches this case.
//!
//! Indexing: `gather` and `scatter_add` (see their attribute structs) check every index against
//! the size of its axis; a negative or too large index is an error of the op ("index 7 out of
//! range for size 4 in gather"). `scatter_add` adds in the values' dtype in row-major order of
//! the index positions (floats round after every add; ints wrap).
//!
//! Movement: `reshape` keeps the row-major element order; `permute` makes output axis `i` input
//! axis `perm[i]`; `expand` repeats size-1 axes; `pad` adds `(before, after)` elements of `value`
//! around each axis; `shrink` keeps `start..end` of each axis.

mod elementwise;
mod index;
mod layout;

pub use index::index_error;

use std::sync::Arc;

use slotmap::SecondaryMap;
use smallvec::SmallVec;

use crate::dim::{Bindings, Dim, ShapeDisplay};
use crate::error::{AirError, Result};
use crate::graph::{Graph, NodeId};
use crate::host::HostTensor;
use crate::op::{BinaryOp, Op, TensorType};

/// Evaluates `graph.outputs()` (in order; repeats allowed) on `inputs`, where an `Input { slot }`
/// node takes `inputs[slot]`. See the module docs for the semantics of every op.
pub fn eval(graph: &Graph, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>> {
    graph.check_acyclic()?;
    // The conditions of the symbolic shapes first, as every compiled backend checks them.
    crate::constraints::check(&crate::constraints::collect(graph), bindings)?;
    let order = graph.live_order();

    // How many more reads each value has to serve. Outputs get one extra read that is never
    // served, so that they stay until the end.
    let mut reads_left: SecondaryMap<NodeId, usize> = SecondaryMap::with_capacity(order.len());
    for &id in &order {
        reads_left.insert(id, 0);
    }
    for &id in &order {
        for &input in graph.inputs(id) {
            if let Some(r) = reads_left.get_mut(input) {
                *r += 1;
            }
        }
    }
    for &out in graph.outputs() {
        if let Some(r) = reads_left.get_mut(out) {
            *r += 1;
        }
    }

    let mut values: SecondaryMap<NodeId, HostTensor> = SecondaryMap::new();
    for &id in &order {
        let node = graph.node(id);
        let fail = |msg: String| AirError::Interp(format!("{id} ({}): {msg}", node.op.mnemonic()));
        let value = match &node.op {
            Op::Input(input) => bind_input(input.slot, &node.ty, inputs, bindings).map_err(fail)?,
            op => {
                let mut args: SmallVec<[&HostTensor; 3]> = SmallVec::new();
                for &input in &node.inputs {
                    args.push(values.get(input).ok_or_else(|| fail(format!("input {input} has no value")))?);
                }
                eval_op(op, &node.ty, &args, bindings).map_err(fail)?
            }
        };
        for &input in &node.inputs {
            if let Some(r) = reads_left.get_mut(input) {
                *r -= 1;
                if *r == 0 {
                    values.remove(input);
                }
            }
        }
        values.insert(id, value);
    }

    graph
        .outputs()
        .iter()
        .map(|&out| values.get(out).cloned().ok_or_else(|| AirError::Interp(format!("output {out} has no value"))))
        .collect()
}

/// Evaluates the dims of `shape`; each must be bound and non-negative.
pub fn eval_dims(shape: &[Dim], bindings: &Bindings) -> Result<Vec<usize>, String> {
    shape.iter().map(|d| eval_dim(d, bindings)).collect()
}

fn eval_dim(dim: &Dim, bindings: &Bindings) -> Result<usize, String> {
    let value = dim.eval(bindings).map_err(|e| format!("{e} (in dim `{dim}`)"))?;
    usize::try_from(value).map_err(|_| format!("dim `{dim}` evaluates to {value}, which is negative"))
}

fn eval_pairs(pairs: &[(Dim, Dim)], bindings: &Bindings) -> Result<Vec<(usize, usize)>, String> {
    pairs.iter().map(|(a, b)| Ok((eval_dim(a, bindings)?, eval_dim(b, bindings)?))).collect()
}

fn bind_input(slot: u32, ty: &TensorType, inputs: &[HostTensor], bindings: &Bindings) -> Result<HostTensor, String> {
    let given = inputs
        .get(slot as usize)
        .ok_or_else(|| format!("input slot {slot} is missing ({} inputs given), expected {ty}", inputs.len()))?;
    let shape = eval_dims(&ty.shape, bindings).map_err(|e| format!("input slot {slot} of type {ty}: {e}"))?;
    let fits = layout::checked_numel(&given.shape).is_ok_and(|n| n == given.numel());
    if given.dtype() != ty.dtype || given.shape != shape || !fits {
        return Err(format!(
            "input slot {slot}: expected {ty} (= {}{shape:?}), got {}{:?} with {} elements",
            ty.dtype,
            given.dtype(),
            given.shape,
            given.numel()
        ));
    }
    Ok(given.clone())
}

/// The message of an integer division or remainder by zero (shared wording with the compiled
/// backends; PyTorch raises `ZeroDivisionError` there).
pub fn division_error(op: &str) -> String {
    format!("integer division by zero in {op}")
}

/// Evaluates one non-input op on its argument values; `ty` is the node's type, which the result
/// is checked against. Errors name what went wrong but not the node (`eval` adds that).
pub fn eval_op(op: &Op, ty: &TensorType, args: &[&HostTensor], bindings: &Bindings) -> Result<HostTensor, String> {
    if args.len() != op.arity() {
        return Err(format!("expects {} inputs, got {}", op.arity(), args.len()));
    }
    let shape = eval_dims(&ty.shape, bindings)?;
    let numel = layout::checked_numel(&shape)?;
    layout::check_allocation(numel, ty.dtype.size_bytes())?;
    let same_shapes = || {
        if args.iter().all(|a| a.shape == args[0].shape) {
            Ok(args[0].shape.clone())
        } else {
            let shapes: Vec<_> = args.iter().map(|a| &a.shape).collect();
            Err(format!("operand shapes differ: {shapes:?}"))
        }
    };
    let tensor = |data, shape| HostTensor { data: Arc::new(data), shape };
    let out = match op {
        Op::Input(_) => return Err("input nodes take their value from `eval`'s inputs".into()),
        Op::Const(c) => tensor(elementwise::fill(ty.dtype, numel, c.value), shape.clone()),
        Op::Iota(iota) => {
            if iota.axis >= shape.len() {
                return Err(format!("axis {} out of range for shape {shape:?}", iota.axis));
            }
            tensor(elementwise::ints_to(layout::iota_indices(&shape, iota.axis), ty.dtype), shape.clone())
        }
        Op::Unary(u) => tensor(elementwise::unary(*u, &args[0].data)?, args[0].shape.clone()),
        Op::Binary(b) => {
            let s = same_shapes()?;
            if matches!(b, BinaryOp::Div | BinaryOp::Mod) && args[1].dtype().is_int() {
                let zero = args[1].data.to_f64_vec().contains(&0.0);
                if zero {
                    return Err(division_error(b.name()));
                }
            }
            tensor(elementwise::binary(*b, &args[0].data, &args[1].data)?, s)
        }
        Op::Where => {
            let s = same_shapes()?;
            tensor(elementwise::select(&args[0].data, &args[1].data, &args[2].data)?, s)
        }
        Op::Cast(c) => tensor(elementwise::cast(&args[0].data, c.to), args[0].shape.clone()),
        Op::Reduce(r) => layout::reduce(args[0], r.op, &r.axes)?,
        Op::Reshape(r) => layout::reshape(args[0], eval_dims(&r.shape, bindings)?)?,
        Op::Permute(p) => layout::permute(args[0], &p.perm)?,
        Op::Expand(e) => layout::expand(args[0], eval_dims(&e.shape, bindings)?)?,
        Op::Pad(p) => layout::pad(args[0], &eval_pairs(&p.padding, bindings)?, p.value)?,
        Op::Shrink(s) => layout::shrink(args[0], &eval_pairs(&s.ranges, bindings)?)?,
        Op::Gather(g) => index::gather(args[0], args[1], g.axis)?,
        Op::ScatterAdd(s) => index::scatter_add(args[0], args[1], s.axis, eval_dims(&s.shape, bindings)?)?,
    };
    if out.dtype() != ty.dtype || out.shape != shape {
        return Err(format!(
            "computed {}{:?}, but the node's type is {}{} (= {shape:?})",
            out.dtype(),
            out.shape,
            ty.dtype,
            ShapeDisplay(&ty.shape)
        ));
    }
    Ok(out)
}

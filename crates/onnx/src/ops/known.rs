//! Shape values known at import: small integer tensors (a `Shape`'s output, constants, and what
//! Gather/Concat/Slice/arithmetic make of them) tracked as [`Dim`]s, which may be symbolic. An
//! exported model computes its `Reshape`/`Expand`/`ConstantOfShape`/`Range`/`Slice` arguments
//! from `Shape(x)`; with a dynamic batch or sequence axis those values are symbols, so the
//! importer reads them from here rather than by realizing the tensor (which a compiled session
//! could not do before its inputs exist).
//!
//! The tensors themselves are still built by the op importers (a symbolic dim of `Shape` is a
//! sum of ones over it), so a shape value used as data computes the right number when it runs.
//! A tensor built from symbolic values alone (a `Range` up to a sequence length, a
//! `ConstantOfShape`) is tied to the tensor the symbols came from ([`Known::anchor`], through
//! [`tie`]), so that realizing it binds the symbols from that tensor's data.

use kiln::{DType, Dim, HostData, HostTensor, Tensor};

use super::Ctx;
use super::shape::slice_positions;

/// Known values of an integer tensor: its elements (row-major) and whether it is a scalar.
#[derive(Clone, Debug)]
pub(crate) struct Known {
    pub values: Vec<Dim>,
    pub scalar: bool,
    /// A tensor whose shape holds the symbols of `values` (a `Shape`'s input).
    pub anchor: Option<Tensor>,
}

/// A zero of `dtype` computed from `anchor` (a sum over none of its elements): added to a tensor
/// built from symbols alone, it puts `anchor`'s data in the program, which binds the symbols.
pub(crate) fn tie(anchor: Option<&Tensor>, dtype: DType) -> Option<Tensor> {
    anchor.map(|a| a.flatten(0, -1).narrow(0, 0, 0).sum(0).cast(dtype))
}

/// Integer tensors with at most this many elements are tracked.
pub(crate) const MAX_LEN: usize = 64;

impl Known {
    fn vector(values: Vec<Dim>, anchor: Option<Tensor>) -> Known {
        Known { values, scalar: false, anchor }
    }

    /// The values of a small integer constant.
    pub fn of_host(host: &HostTensor) -> Option<Known> {
        let values: Vec<Dim> = match &*host.data {
            HostData::I64(v) if v.len() <= MAX_LEN => v.iter().map(|&x| Dim::Const(x)).collect(),
            HostData::I32(v) if v.len() <= MAX_LEN => v.iter().map(|&x| Dim::Const(i64::from(x))).collect(),
            _ => return None,
        };
        match host.shape.len() {
            0 => Some(Known { values, scalar: true, anchor: None }),
            1 => Some(Known::vector(values, None)),
            _ => None,
        }
    }

    /// The values as concrete integers, if none is symbolic.
    pub fn consts(&self) -> Option<Vec<i64>> {
        self.values.iter().map(Dim::as_const).collect()
    }
}

/// The known values of the outputs of `ctx`'s node, computed from its inputs' known values
/// (`None` for an output that is not a tracked shape value).
pub(crate) fn propagate(ctx: &Ctx) -> Vec<Option<Known>> {
    let out = match ctx.op() {
        "Shape" => shape(ctx),
        "Size" => ctx.input(0).ok().and_then(|x| {
            let n = x.shape().iter().try_fold(Dim::Const(1), |n, d| n.checked_mul(d))?;
            Some(Known { values: vec![n], scalar: true, anchor: Some(x.clone()) })
        }),
        "Identity" | "Cast" if is_integer_cast(ctx) => ctx.known(0).cloned(),
        "Unsqueeze" | "Reshape" => ctx.known(0).map(|k| Known::vector(k.values.clone(), k.anchor.clone())),
        "Squeeze" => ctx.known(0).map(|k| Known { scalar: k.values.len() == 1, ..k.clone() }),
        "Concat" => concat(ctx),
        "ConstantOfShape" => constant_of_shape(ctx),
        "Gather" => gather(ctx),
        "Slice" => slice(ctx),
        "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Equal" | "Where" => arithmetic(ctx),
        _ => None,
    };
    // Concrete values need no anchor: a tensor built from them must not read the anchor's data
    // (in a traced function that data is an argument, not yet known).
    let out = out.map(|k| if k.consts().is_some() { Known { anchor: None, ..k } } else { k });
    vec![out]
}

fn is_integer_cast(ctx: &Ctx) -> bool {
    ctx.op() == "Identity" || ctx.dtype_attr("to").is_ok_and(|d| matches!(d, DType::I64 | DType::I32))
}

fn shape(ctx: &Ctx) -> Option<Known> {
    let x = ctx.input(0).ok()?;
    let dims = x.shape().clone();
    let r = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(ctx.int("start", 0).ok()?);
    let end = clamp(ctx.int("end", r).ok()?);
    Some(Known::vector(dims[start..end.max(start)].to_vec(), Some(x.clone())))
}

/// The first anchor among `known`.
fn anchor_of<'a>(known: impl IntoIterator<Item = &'a Known>) -> Option<Tensor> {
    known.into_iter().find_map(|k| k.anchor.clone())
}

fn concat(ctx: &Ctx) -> Option<Known> {
    let mut parts = Vec::new();
    for i in 0..ctx.inputs.len() {
        if ctx.opt(i).is_some() {
            parts.push(ctx.known(i)?);
        }
    }
    let values = parts.iter().flat_map(|k| k.values.iter().cloned()).collect();
    Some(Known::vector(values, anchor_of(parts)))
}

/// A short integer vector filled with one value (`where(shape == -1, ones, shape)` in exports).
fn constant_of_shape(ctx: &Ctx) -> Option<Known> {
    let shape = ctx.known(0)?.consts()?;
    let [n] = shape[..] else { return None };
    let value = match ctx.tensor_attr("value").ok()? {
        Some(t) => *Known::of_host(&HostTensor::new((*t.data).clone(), vec![]).ok()?)?.values.first()?,
        None => return None,
    };
    let n = usize::try_from(n).ok().filter(|&n| n <= MAX_LEN)?;
    Some(Known::vector(vec![value; n], ctx.known(0)?.anchor.clone()))
}

fn gather(ctx: &Ctx) -> Option<Known> {
    if ctx.int("axis", 0).ok()? != 0 {
        return None;
    }
    let (data, index) = (ctx.known(0)?, ctx.known(1)?);
    let n = data.values.len() as i64;
    let values = index
        .consts()?
        .into_iter()
        .map(|i| {
            let i = if i < 0 { i + n } else { i };
            data.values.get(usize::try_from(i).ok()?).cloned()
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Known { values, scalar: index.scalar, anchor: data.anchor.clone() })
}

fn slice(ctx: &Ctx) -> Option<Known> {
    let data = ctx.known(0)?;
    let (starts, ends) = (ctx.known(1)?.consts()?, ctx.known(2)?.consts()?);
    let axes = ctx.opt(3).map(|_| ctx.known(3).and_then(Known::consts)).unwrap_or(Some(vec![0]))?;
    let steps = ctx.opt(4).map(|_| ctx.known(4).and_then(Known::consts)).unwrap_or(Some(vec![1]))?;
    if starts.len() != 1 || ends.len() != 1 || !matches!(axes[..], [0] | [-1]) || steps.len() != 1 || steps[0] == 0 {
        return None;
    }
    let positions = slice_positions(data.values.len() as i64, starts[0], ends[0], steps[0]);
    Some(Known::vector(positions.into_iter().map(|p| data.values[p as usize]).collect(), data.anchor.clone()))
}

/// Element-wise integer arithmetic with numpy broadcasting of one-element operands: `+ - *` and
/// exact division on symbolic values, the rest on concrete ones.
fn arithmetic(ctx: &Ctx) -> Option<Known> {
    let n_inputs = if ctx.op() == "Where" { 3 } else { 2 };
    let args: Vec<&Known> = (0..n_inputs).map(|i| ctx.known(i)).collect::<Option<_>>()?;
    let len = args.iter().map(|k| k.values.len()).max()?;
    if args.iter().any(|k| k.values.len() != len && k.values.len() != 1) {
        return None;
    }
    let at = |k: &Known, i: usize| k.values[if k.values.len() == 1 { 0 } else { i }];
    let values = (0..len)
        .map(|i| {
            let (a, b) = (at(args[0], i), at(args[1], i));
            match ctx.op() {
                "Add" => a.checked_add(&b),
                "Sub" => a.checked_sub(&b),
                "Mul" => a.checked_mul(&b),
                // Sizes are never negative: a symbolic size differs from -1 (exports test a shape
                // for -1 before expanding to it), and equals itself.
                "Equal" if a == b => Some(Dim::Const(1)),
                "Equal"
                    if [(&a, &b), (&b, &a)]
                        .iter()
                        .any(|(x, y)| !x.is_const() && y.as_const().is_some_and(|v| v < 0)) =>
                {
                    Some(Dim::Const(0))
                }
                // A symbolic quotient: exact for every symbol value (BLOOM's `4*batch / 4` heads
                // back to the batch), or by a positive constant a floor-division symbol (a
                // strided window's output size as torch.export computes it; sizes are not
                // negative, where ONNX's truncation and the floor agree); else concrete operands
                // below.
                "Div" if !a.is_const() => {
                    a.exact_div_dim(&b).or_else(|| b.as_const().filter(|&d| d > 0).and_then(|d| a.floor_div(d)))
                }
                "Where" => {
                    let c = at(args[2], i);
                    Some(if a.as_const()? != 0 { b } else { c })
                }
                op => {
                    let (x, y) = (a.as_const()?, b.as_const()?);
                    Some(Dim::Const(match op {
                        "Div" if y != 0 => x.wrapping_div(y),
                        "Max" => x.max(y),
                        "Min" => x.min(y),
                        "Equal" => i64::from(x == y),
                        _ => return None,
                    }))
                }
            }
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Known { values, scalar: args.iter().all(|k| k.scalar), anchor: anchor_of(args) })
}

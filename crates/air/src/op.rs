//! The primitive op set: one enum, one attribute struct per op kind, and the type rule of each op.
//!
//! Every higher-level op (sigmoid, softmax, matmul, layernorm, conv2d, ...) is built from these by
//! the front end; later passes recognise the patterns they need (matmul is expand-mul-sum).

use std::fmt;

use smallvec::SmallVec;

use crate::constraints::{Subject, op_conditions};
use crate::dim::{Dim, Shape, ShapeDisplay, numel};
use crate::dtype::{DType, Scalar};

/// The type of a node's value: element type and shape.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Size of each axis, possibly symbolic.
    pub shape: Shape,
}

impl Clone for TensorType {
    /// A copy of the dims at once (`Dim` is `Copy`): the derived clone went element by element,
    /// and every traced node clones its type.
    fn clone(&self) -> TensorType {
        TensorType { dtype: self.dtype, shape: Shape::from_slice(&self.shape) }
    }
}

impl TensorType {
    /// The type with the given dtype and shape.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType { dtype, shape: shape.into() }
    }
    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements: the product of the dims (symbolic if any dim is), wrapping on
    /// overflow; see [`TensorType::checked_numel`].
    pub fn numel(&self) -> Dim {
        numel(&self.shape)
    }
    /// Number of elements, or an error naming the type if the count overflows or a constant
    /// count's bytes could never be allocated (see [`crate::dim::checked_size`]).
    pub fn checked_numel(&self) -> Result<Dim, String> {
        crate::dim::checked_size(&self.shape, self.dtype.size_bytes())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, ShapeDisplay(&self.shape))
    }
}

/// Element-wise ops of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x` (ints and floats).
    Neg,
    /// `2^x` (floats only).
    Exp2,
    /// Base-2 logarithm (floats only).
    Log2,
    /// Sine (floats only).
    Sin,
    /// Square root (floats only).
    Sqrt,
    /// `1 / x` (floats only).
    Recip,
    /// The error function; a primitive so that exact GELU keeps PyTorch's accuracy.
    Erf,
    /// Logical not for bools, bitwise not for ints.
    Not,
    /// Rounds toward zero (floats only).
    Trunc,
}

/// Element-wise ops of two operands of the same dtype and shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b` (ints and floats).
    Add,
    /// `a - b` (ints and floats).
    Sub,
    /// `a * b` (ints and floats).
    Mul,
    /// Float division, or integer division rounding toward zero (C semantics).
    Div,
    /// Element-wise maximum (every dtype).
    Max,
    /// Element-wise minimum (every dtype).
    Min,
    /// Remainder with the sign of the dividend (C semantics), ints and floats.
    Mod,
    /// `a ** b` for floats.
    Pow,
    /// `a < b`, as `bool` (ints and floats).
    CmpLt,
    /// `a == b`, as `bool` (every dtype).
    CmpEq,
    /// `a != b`, as `bool` (every dtype).
    CmpNe,
    /// Logical and for bools, bitwise and for ints.
    And,
    /// Logical or for bools, bitwise or for ints.
    Or,
}

/// Reductions over axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum of the elements.
    Sum,
    /// Largest element.
    Max,
}

macro_rules! names {
    ($ty:ident { $($v:ident => $s:literal),* $(,)? }) => {
        impl $ty {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$v),*];
            /// The name used by the text form.
            pub fn name(self) -> &'static str {
                match self { $($ty::$v => $s),* }
            }
            /// The variant whose text-form name is `name` (the inverse of `name`), or `None`.
            pub fn from_name(name: &str) -> Option<$ty> {
                match name { $($s => Some($ty::$v),)* _ => None }
            }
        }
    };
}
names!(UnaryOp { Neg => "neg", Exp2 => "exp2", Log2 => "log2", Sin => "sin", Sqrt => "sqrt",
    Recip => "recip", Erf => "erf", Not => "not", Trunc => "trunc" });
names!(BinaryOp { Add => "add", Sub => "sub", Mul => "mul", Div => "div", Max => "max", Min => "min",
    Mod => "mod", Pow => "pow", CmpLt => "cmplt", CmpEq => "cmpeq", CmpNe => "cmpne", And => "and",
    Or => "or" });
names!(ReduceOp { Sum => "sum", Max => "max" });

impl BinaryOp {
    /// Whether this is a comparison (`cmplt`, `cmpeq`, `cmpne`), whose result is `bool`.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::CmpLt | BinaryOp::CmpEq | BinaryOp::CmpNe)
    }
    /// Whether swapping the operands leaves the result unchanged (`add`, `mul`, `max`, `min`,
    /// `cmpeq`, `cmpne`, `and`, `or`).
    pub fn is_commutative(self) -> bool {
        matches!(
            self,
            BinaryOp::Add
                | BinaryOp::Mul
                | BinaryOp::Max
                | BinaryOp::Min
                | BinaryOp::CmpEq
                | BinaryOp::CmpNe
                | BinaryOp::And
                | BinaryOp::Or
        )
    }
}

/// A program input (activation or parameter), bound to data when the program runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Input {
    /// Position in the program's input list.
    pub slot: u32,
}

/// A tensor filled with one value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Const {
    /// The value of every element; its kind must fit the node's dtype.
    pub value: Scalar,
}

/// A tensor whose value at every index is the index along `axis` (arange, masks, one-hot).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Iota {
    /// The axis whose index each element holds; less than the rank. The dtype must not be `bool`.
    pub axis: usize,
}

/// Converts every element to another dtype (the conversion rules are in [`crate::interp`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cast {
    /// The target dtype.
    pub to: DType,
}

/// Reduces `axes` (sorted, unique); the reduced axes stay in the shape with size 1.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reduce {
    /// How the reduced elements are combined.
    pub op: ReduceOp,
    /// The reduced axes, sorted, unique and in range.
    pub axes: SmallVec<[usize; 4]>,
}

/// Same elements in row-major order, new shape of equal element count.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reshape {
    /// The new shape; its element count equals the input's.
    pub shape: Shape,
}

/// Output axis `i` is input axis `perm[i]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Permute {
    /// The permutation of the input axes.
    pub perm: SmallVec<[usize; 4]>,
}

/// Broadcasts size-1 axes to `shape` (same rank).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Expand {
    /// The target shape; each input axis equals its target or is 1.
    pub shape: Shape,
}

/// Adds `(before, after)` elements of `value` around each axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pad {
    /// `(before, after)` element counts for each axis, non-negative.
    pub padding: Vec<(Dim, Dim)>,
    /// The fill value; its kind must fit the input's dtype.
    pub value: Scalar,
}

/// Keeps `start..end` of each axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shrink {
    /// `(start, end)` for each axis, with `0 <= start <= end <= size`.
    pub ranges: Vec<(Dim, Dim)>,
}

/// `torch.gather` along `axis`: inputs `(src, index)`; the output has the index's shape and
/// `out[p] = src[p with coordinate axis replaced by index[p]]`. `index` is `i32` or `i64` of the
/// rank of `src`; along the other axes it is no larger than `src`. An index outside
/// `0..src.shape[axis]` is a run-time error of the op (see [`crate::interp`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Gather {
    /// The axis of `src` that the index selects along; less than the rank.
    pub axis: usize,
}

/// The adjoint of [`Gather`]: inputs `(index, values)` of one shape; the output, of `shape`, is
/// zero except that `out[p with coordinate axis replaced by index[p]] += values[p]` for every
/// position `p` of `index` (in the values' dtype: `i32`, `i64`, `f32` or `f64`). Along the other axes `index` has exactly the output's size. An index
/// outside `0..shape[axis]` is a run-time error of the op.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScatterAdd {
    /// The axis of the output that the index selects along; less than the rank.
    pub axis: usize,
    /// The output shape.
    pub shape: Shape,
}

/// An op with its typed attributes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    // Leaves: their type is given when they are created.
    /// A program input; see [`Input`].
    Input(Input),
    /// A tensor filled with one value; see [`Const`].
    Const(Const),
    /// Indices along an axis; see [`Iota`].
    Iota(Iota),
    // Element-wise.
    /// An element-wise op of one operand; the type is the operand's.
    Unary(UnaryOp),
    /// An element-wise op of two operands of equal type; comparisons give `bool`.
    Binary(BinaryOp),
    /// `where(cond, a, b)`: `cond` is bool, `a` and `b` share a dtype; all shapes equal.
    Where,
    /// Element-wise conversion to another dtype; see [`Cast`].
    Cast(Cast),
    // Reduction.
    /// A reduction over axes; see [`Reduce`].
    Reduce(Reduce),
    // Movement (views: backends turn them into index arithmetic).
    /// See [`Reshape`].
    Reshape(Reshape),
    /// See [`Permute`].
    Permute(Permute),
    /// See [`Expand`].
    Expand(Expand),
    /// See [`Pad`].
    Pad(Pad),
    /// See [`Shrink`].
    Shrink(Shrink),
    // Data-dependent indexing.
    /// `(src, index)`; see [`Gather`].
    Gather(Gather),
    /// `(index, values)`; see [`ScatterAdd`] (boxed: it is rare, and keeps `Node` small).
    ScatterAdd(Box<ScatterAdd>),
}

/// Coarse classes of ops, for passes that treat every member alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// No inputs: `input`, `const`, `iota`.
    Leaf,
    /// Unary and binary ops, `where` and `cast`: output element `i` reads input elements `i` only.
    Elementwise,
    /// `reduce`.
    Reduce,
    /// Views that move, repeat or fill elements without arithmetic: `reshape`, `permute`,
    /// `expand`, `pad`, `shrink`.
    Movement,
    /// Reads or writes at positions computed from data: `gather`, `scatter_add`.
    Index,
}

/// Which op a node is, without its attributes: a `Copy` discriminant with one variant per [`Op`]
/// variant (unary and binary ops carry which one). Code that dispatches on ops (rewrite rule
/// heads, indexes, parsers) uses it instead of mnemonic strings; [`OpKind::name`] is the text
/// form's mnemonic, for display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`Op::Input`].
    Input,
    /// [`Op::Const`].
    Const,
    /// [`Op::Iota`].
    Iota,
    /// [`Op::Unary`] with this op.
    Unary(UnaryOp),
    /// [`Op::Binary`] with this op.
    Binary(BinaryOp),
    /// [`Op::Where`].
    Where,
    /// [`Op::Cast`].
    Cast,
    /// [`Op::Reduce`].
    Reduce,
    /// [`Op::Reshape`].
    Reshape,
    /// [`Op::Permute`].
    Permute,
    /// [`Op::Expand`].
    Expand,
    /// [`Op::Pad`].
    Pad,
    /// [`Op::Shrink`].
    Shrink,
    /// [`Op::Gather`].
    Gather,
    /// [`Op::ScatterAdd`].
    ScatterAdd,
}

impl OpKind {
    /// The kinds without a unary or binary op inside, in declaration order.
    const PLAIN: [OpKind; 13] = [
        OpKind::Input,
        OpKind::Const,
        OpKind::Iota,
        OpKind::Where,
        OpKind::Cast,
        OpKind::Reduce,
        OpKind::Reshape,
        OpKind::Permute,
        OpKind::Expand,
        OpKind::Pad,
        OpKind::Shrink,
        OpKind::Gather,
        OpKind::ScatterAdd,
    ];

    /// Every kind: the plain ones, then each unary op, then each binary op.
    pub fn all() -> impl Iterator<Item = OpKind> {
        OpKind::PLAIN
            .into_iter()
            .chain(UnaryOp::ALL.iter().map(|&u| OpKind::Unary(u)))
            .chain(BinaryOp::ALL.iter().map(|&b| OpKind::Binary(b)))
    }

    /// The mnemonic of the text form (`input`, `neg`, `reduce`, `scatter_add`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Input => "input",
            OpKind::Const => "const",
            OpKind::Iota => "iota",
            OpKind::Unary(u) => u.name(),
            OpKind::Binary(b) => b.name(),
            OpKind::Where => "where",
            OpKind::Cast => "cast",
            OpKind::Reduce => "reduce",
            OpKind::Reshape => "reshape",
            OpKind::Permute => "permute",
            OpKind::Expand => "expand",
            OpKind::Pad => "pad",
            OpKind::Shrink => "shrink",
            OpKind::Gather => "gather",
            OpKind::ScatterAdd => "scatter_add",
        }
    }

    /// How many inputs an op of this kind takes.
    pub fn arity(self) -> usize {
        match self {
            OpKind::Input | OpKind::Const | OpKind::Iota => 0,
            OpKind::Binary(_) | OpKind::Gather | OpKind::ScatterAdd => 2,
            OpKind::Where => 3,
            _ => 1,
        }
    }

    /// The kind whose mnemonic is `name` (the inverse of [`OpKind::name`]), or `None`.
    pub fn from_name(name: &str) -> Option<OpKind> {
        if let Some(&k) = OpKind::PLAIN.iter().find(|k| k.name() == name) {
            return Some(k);
        }
        UnaryOp::from_name(name).map(OpKind::Unary).or_else(|| BinaryOp::from_name(name).map(OpKind::Binary))
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed type rule: which op, the types of its inputs, and what is wrong. It displays as
/// `op: message` (`add: operands must have equal types, got f32[2], f32[3]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeError {
    /// The op whose rule failed.
    pub op: OpKind,
    /// The types of the inputs it was given, in order.
    pub inputs: Vec<TensorType>,
    /// What is wrong, without the op's name (`operands must have equal types, got ...`).
    pub message: String,
}

impl fmt::Display for TypeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op.name(), self.message)
    }
}

impl std::error::Error for TypeError {}

impl Op {
    /// Which op this is, without its attributes.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Input(_) => OpKind::Input,
            Op::Const(_) => OpKind::Const,
            Op::Iota(_) => OpKind::Iota,
            Op::Unary(u) => OpKind::Unary(*u),
            Op::Binary(b) => OpKind::Binary(*b),
            Op::Where => OpKind::Where,
            Op::Cast(_) => OpKind::Cast,
            Op::Reduce(_) => OpKind::Reduce,
            Op::Reshape(_) => OpKind::Reshape,
            Op::Permute(_) => OpKind::Permute,
            Op::Expand(_) => OpKind::Expand,
            Op::Pad(_) => OpKind::Pad,
            Op::Shrink(_) => OpKind::Shrink,
            Op::Gather(_) => OpKind::Gather,
            Op::ScatterAdd(_) => OpKind::ScatterAdd,
        }
    }

    /// The mnemonic of the text form (`input`, `neg`, `reduce`, `reshape`, ...): the name of
    /// [`Op::kind`].
    pub fn mnemonic(&self) -> &'static str {
        self.kind().name()
    }

    /// The coarse class of this op.
    pub fn class(&self) -> OpClass {
        match self {
            Op::Input(_) | Op::Const(_) | Op::Iota(_) => OpClass::Leaf,
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_) => OpClass::Elementwise,
            Op::Reduce(_) => OpClass::Reduce,
            Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) | Op::Pad(_) | Op::Shrink(_) => OpClass::Movement,
            Op::Gather(_) | Op::ScatterAdd(_) => OpClass::Index,
        }
    }

    /// Whether this op is a leaf (takes no inputs).
    pub fn is_leaf(&self) -> bool {
        self.class() == OpClass::Leaf
    }

    /// How many inputs the op takes.
    pub fn arity(&self) -> usize {
        self.kind().arity()
    }

    /// Checks the attributes of a leaf against the type it is created with.
    pub fn check_leaf(&self, ty: &TensorType) -> Result<(), String> {
        match self {
            Op::Input(_) => Ok(()),
            Op::Const(c) if !c.value.fits(ty.dtype) => {
                Err(format!("const: value {} does not fit dtype {}", c.value, ty.dtype))
            }
            Op::Iota(i) if i.axis >= ty.rank() => {
                Err(format!("iota: axis {} out of range for shape {}", i.axis, ShapeDisplay(&ty.shape)))
            }
            Op::Iota(_) if ty.dtype.is_bool() => Err("iota: dtype bool has no indices".into()),
            Op::Const(_) | Op::Iota(_) => Ok(()),
            _ => Err(format!("{}: not a leaf op", self.mnemonic())),
        }
    }

    /// The output type of this (non-leaf) op applied to inputs of the given types, or an error
    /// naming the op and the offending types.
    pub fn infer(&self, inputs: &[&TensorType]) -> Result<TensorType, TypeError> {
        self.infer_type(inputs).map_err(|message| TypeError {
            op: self.kind(),
            inputs: inputs.iter().map(|&t| t.clone()).collect(),
            message,
        })
    }

    /// [`Op::infer`], with the message alone.
    fn infer_type(&self, inputs: &[&TensorType]) -> Result<TensorType, String> {
        if inputs.len() != self.arity() {
            return Err(format!("expects {} inputs, got {}", self.arity(), inputs.len()));
        }
        let types = || inputs.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
        match self {
            Op::Input(_) | Op::Const(_) | Op::Iota(_) => Err("a leaf's type is given, not inferred".into()),
            Op::Unary(u) => {
                let t = inputs[0];
                let ok = match u {
                    UnaryOp::Neg => !t.dtype.is_bool(),
                    UnaryOp::Not => !t.dtype.is_float(),
                    _ => t.dtype.is_float(),
                };
                if !ok {
                    return Err(format!("unsupported dtype {}", t.dtype));
                }
                Ok(t.clone())
            }
            Op::Binary(b) => {
                let (x, y) = (inputs[0], inputs[1]);
                if x != y {
                    return Err(format!("operands must have equal types, got {}", types()));
                }
                let ok = match b {
                    BinaryOp::And | BinaryOp::Or => !x.dtype.is_float(),
                    BinaryOp::Pow => x.dtype.is_float(),
                    BinaryOp::CmpEq | BinaryOp::CmpNe | BinaryOp::Max | BinaryOp::Min => true,
                    _ => !x.dtype.is_bool(),
                };
                if !ok {
                    return Err(format!("unsupported dtype {}", x.dtype));
                }
                let dtype = if b.is_comparison() { DType::Bool } else { x.dtype };
                Ok(TensorType { dtype, shape: x.shape.clone() })
            }
            Op::Where => {
                let (c, a, b) = (inputs[0], inputs[1], inputs[2]);
                if c.dtype != DType::Bool || a != b || c.shape != a.shape {
                    return Err(format!("needs (bool, T, T) of one shape, got {}", types()));
                }
                Ok(a.clone())
            }
            Op::Cast(c) => Ok(TensorType { dtype: c.to, shape: inputs[0].shape.clone() }),
            Op::Reduce(r) => {
                let t = inputs[0];
                check_axes(&r.axes, t.rank(), true)?;
                if t.dtype.is_bool() {
                    return Err(format!("unsupported dtype {}", t.dtype));
                }
                let mut shape = t.shape.clone();
                for &a in &r.axes {
                    shape[a] = Dim::Const(1);
                }
                Ok(TensorType { dtype: t.dtype, shape })
            }
            Op::Reshape(r) => {
                let t = inputs[0];
                if numel(&r.shape) != t.numel() {
                    return Err(format!("cannot reshape {} to {} (element counts differ)", t, ShapeDisplay(&r.shape)));
                }
                if r.shape.iter().any(|d| d.as_const().is_some_and(|c| c < 0)) {
                    return Err(format!("negative dim in {}", ShapeDisplay(&r.shape)));
                }
                Ok(TensorType { dtype: t.dtype, shape: r.shape.clone() })
            }
            Op::Permute(p) => {
                let t = inputs[0];
                let mut seen = vec![false; t.rank()];
                if p.perm.len() != t.rank()
                    || p.perm.iter().any(|&a| a >= t.rank() || std::mem::replace(&mut seen[a], true))
                {
                    return Err(format!("{:?} is not a permutation of the axes of {}", p.perm.as_slice(), t));
                }
                Ok(TensorType { dtype: t.dtype, shape: p.perm.iter().map(|&a| t.shape[a]).collect() })
            }
            Op::Expand(e) => {
                let t = inputs[0];
                let ok = e.shape.len() == t.rank()
                    && t.shape.iter().zip(&e.shape).all(|(a, b)| a == b || *a == Dim::Const(1));
                if !ok {
                    return Err(format!("cannot expand {} to {}", t, ShapeDisplay(&e.shape)));
                }
                Ok(TensorType { dtype: t.dtype, shape: e.shape.clone() })
            }
            Op::Pad(p) => {
                let t = inputs[0];
                if p.padding.len() != t.rank() {
                    return Err(format!("{} pairs for {}", p.padding.len(), t));
                }
                if !p.value.fits(t.dtype) {
                    return Err(format!("value {} does not fit dtype {}", p.value, t.dtype));
                }
                if op_conditions(self, inputs).iter().any(|c| c.decide() == Some(false)) {
                    return Err(format!("negative padding on {}", t));
                }
                let shape = t.shape.iter().zip(&p.padding).map(|(d, (a, b))| &(d + a) + b).collect();
                Ok(TensorType { dtype: t.dtype, shape })
            }
            Op::Shrink(s) => {
                let t = inputs[0];
                if s.ranges.len() != t.rank() {
                    return Err(format!("{} ranges for {}", s.ranges.len(), t));
                }
                // Conditions that hold for no symbol value are errors; the undecided ones are
                // checked per binding set (`crate::constraints`).
                if let Some(c) = op_conditions(self, inputs).iter().find(|c| c.decide() == Some(false)) {
                    let axis = match c.subject {
                        Subject::RangeStart { axis } | Subject::RangeOrder { axis } | Subject::RangeEnd { axis } => {
                            axis
                        }
                        _ => 0,
                    };
                    let (start, end) = &s.ranges[axis];
                    return Err(format!("range {start}..{end} out of bounds for {t}"));
                }
                let shape = s.ranges.iter().map(|(a, b)| b - a).collect();
                Ok(TensorType { dtype: t.dtype, shape })
            }
            Op::Gather(g) => {
                let (src, index) = (inputs[0], inputs[1]);
                check_index(g.axis, index, &src.shape, true)?;
                Ok(TensorType { dtype: src.dtype, shape: index.shape.clone() })
            }
            Op::ScatterAdd(s) => {
                let (index, values) = (inputs[0], inputs[1]);
                let numeric = matches!(values.dtype, DType::I32 | DType::I64 | DType::F32 | DType::F64);
                if !numeric || values.shape != index.shape {
                    return Err(format!("values must be i32/i64/f32/f64 of the index's shape, got {}", types()));
                }
                check_index(s.axis, index, &s.shape, false)?;
                Ok(TensorType { dtype: values.dtype, shape: s.shape.clone() })
            }
        }
    }
}

/// Checks the index operand of `gather` (`smaller`: along the other axes it may be smaller than
/// `shape`) or `scatter_add` (it must equal `shape` there).
fn check_index(axis: usize, index: &TensorType, shape: &[Dim], smaller: bool) -> Result<(), String> {
    if !matches!(index.dtype, DType::I32 | DType::I64) {
        return Err(format!("index must be i32 or i64, got {index}"));
    }
    if index.rank() != shape.len() || axis >= shape.len() {
        return Err(format!("axis {axis} and index {index} do not fit shape {}", ShapeDisplay(shape)));
    }
    for (d, (i, s)) in index.shape.iter().zip(shape).enumerate() {
        let fits =
            d == axis || i == s || (smaller && matches!((i.as_const(), s.as_const()), (Some(a), Some(b)) if a <= b));
        if !fits {
            return Err(format!("index {index} does not fit shape {} along axis {d}", ShapeDisplay(shape)));
        }
    }
    Ok(())
}

fn check_axes(axes: &[usize], rank: usize, sorted: bool) -> Result<(), String> {
    if axes.iter().any(|&a| a >= rank) || (sorted && axes.windows(2).any(|w| w[0] >= w[1])) {
        return Err(format!("axes {axes:?} invalid for rank {rank} (need sorted, unique, in range)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dim::shape_of;

    #[test]
    fn op_kinds_name_round_trip_and_match_ops() {
        let kinds: Vec<OpKind> = OpKind::all().collect();
        assert_eq!(kinds.len(), 13 + UnaryOp::ALL.len() + BinaryOp::ALL.len());
        for k in kinds {
            assert_eq!(OpKind::from_name(k.name()), Some(k), "{k}");
        }
        assert_eq!(OpKind::from_name("frobnicate"), None);
        assert_eq!(Op::Unary(UnaryOp::Sin).kind(), OpKind::Unary(UnaryOp::Sin));
        assert_eq!(Op::Gather(Gather { axis: 0 }).kind().arity(), 2);
        assert_eq!(Op::Where.mnemonic(), "where");
    }

    #[test]
    fn type_errors_name_the_op_and_keep_the_input_types() {
        let a = TensorType::new(DType::F32, shape_of(&[2]));
        let b = TensorType::new(DType::F32, shape_of(&[3]));
        let e = Op::Binary(BinaryOp::Add).infer(&[&a, &b]).unwrap_err();
        assert_eq!(e.op, OpKind::Binary(BinaryOp::Add));
        assert_eq!(e.inputs, [a.clone(), b]);
        assert_eq!(e.to_string(), "add: operands must have equal types, got f32[2], f32[3]");
        let e = Op::Unary(UnaryOp::Sin).infer(&[&a, &a]).unwrap_err();
        assert_eq!(e.to_string(), "sin: expects 1 inputs, got 2");
    }
}

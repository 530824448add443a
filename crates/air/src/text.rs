//! The text form of a graph: a printer and a parser that read each other's output exactly.
//!
//! One node per line in topological order, every typed attribute spelled out, the node's type after
//! ` : `, and the outputs on a closing `return` line:
//!
//! ```text
//! graph {
//!   n0 = input 0 : f32[4, seq]
//!   n1 = const 1.0 : f32[4, seq]
//!   n2 = add n0, n1 : f32[4, seq]
//!   n3 = reduce sum axes=[1] n2 : f32[4, 1]
//!   n4 = reshape [2, 2*seq] n2 : f32[2, 2*seq]
//!   n5 = pad [(0, 1), (2, seq)] value=0.0 n3 : f32[5, seq + 3]
//!   return n3, n4
//! }
//! ```
//!
//! The attributes of each op, in the order they are printed:
//!
//! | op | form |
//! |----|------|
//! | input | `input 0` (the input slot) |
//! | const | `const 1.5` (`true`, `3`, `1.0`, `-0.0`, `1e-7`, `inf`, `-inf`, `nan`, `nan(0x7ff8000000000001)`) |
//! | iota | `iota axis=1` |
//! | unary, binary, where | `neg n0`, `add n0, n1`, `where n0, n1, n2` |
//! | cast | `cast f16 n0` |
//! | reduce | `reduce max axes=[0, 2] n0` |
//! | reshape, expand | `reshape [2, 2*seq] n0` |
//! | permute | `permute [1, 0] n0` |
//! | pad | `pad [(0, 1), (2, seq)] value=0.0 n0` |
//! | shrink | `shrink [(0, 2), (1, seq - 1)] n0` |
//!
//! Node names are `n` plus the node's slot index (the spelling of `NodeId`'s `Display`, so verifier
//! messages name the same nodes), or with [`PrintOptions::renumber`] `n0, n1, ...` in print order,
//! which golden tests want. The parser accepts any identifier as a name; `//` starts a comment.
//!
//! Floats print with Rust's shortest round-trip formatting, so `print(parse(print(g)))` equals
//! `print(g)` bit for bit, NaN payloads included. Parsed leaves go through `Graph::add_leaf`
//! (a bad leaf is a parse error); other nodes are added unchecked with their printed type, so a
//! hand-written graph with a wrong type parses and the verifier then names the problem.

use std::collections::HashMap;
use std::fmt;

use slotmap::SecondaryMap;

use crate::dim::{Dim, Shape, ShapeDisplay};
use crate::dtype::{DType, Scalar};
use crate::error::{AirError, Result};
use crate::graph::{Graph, Inputs, Node, NodeId};
use crate::op::{
    Cast, Const, Expand, Gather, Input, Iota, Op, OpKind, Pad, Permute, Reduce, ReduceOp, Reshape, ScatterAdd, Shrink,
    TensorType,
};

/// How the printer names nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrintOptions {
    /// Name nodes `n0, n1, ...` in print order instead of by slot index. Stable across edits that
    /// leave the printed graph alone, so golden tests use it.
    pub renumber: bool,
}

/// A graph's text form, printed lazily by `Display`.
pub struct Text<'a> {
    graph: &'a Graph,
    options: PrintOptions,
}

impl<'a> Text<'a> {
    /// A printer for `graph` with `options`; format it with `Display` (or `to_string`).
    pub fn new(graph: &'a Graph, options: PrintOptions) -> Text<'a> {
        Text { graph, options }
    }
}

/// Prints `graph`, naming nodes by slot index.
pub fn print(graph: &Graph) -> String {
    Text::new(graph, PrintOptions::default()).to_string()
}

/// Prints `graph`, naming nodes `n0, n1, ...` in print order.
pub fn print_renumbered(graph: &Graph) -> String {
    Text::new(graph, PrintOptions { renumber: true }).to_string()
}

impl Graph {
    /// The text form, naming nodes by slot index (see the `text` module).
    pub fn to_text(&self) -> String {
        print(self)
    }

    /// The text form with the given options, as a `Display` value.
    pub fn text(&self, options: PrintOptions) -> Text<'_> {
        Text::new(self, options)
    }

    /// Parses the text form (see [`parse`]).
    pub fn from_text(text: &str) -> Result<Graph> {
        parse(text)
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Text::new(self, PrintOptions::default()), f)
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Text::new(self, PrintOptions::default()), f)
    }
}

impl fmt::Display for Text<'_> {
    /// Panics only if the graph has a cycle (see `Graph::topo_order`), which no parsed graph and no
    /// graph built with `Graph::add` has.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.graph;
        let order = g.topo_order();
        let mut numbers: SecondaryMap<NodeId, usize> = SecondaryMap::new();
        if self.options.renumber {
            for (i, &id) in order.iter().enumerate() {
                numbers.insert(id, i);
            }
        }
        let name = |id: NodeId| NodeName(id, numbers.get(id).copied());
        f.write_str("graph {\n")?;
        for &id in order {
            let node = g.node(id);
            write!(f, "  {} = {}", name(id), OpHead(&node.op))?;
            for (i, &input) in node.inputs.iter().enumerate() {
                f.write_str(if i == 0 { " " } else { ", " })?;
                write!(f, "{}", name(input))?;
            }
            writeln!(f, " : {}", node.ty)?;
        }
        f.write_str("  return")?;
        for (i, &out) in g.outputs().iter().enumerate() {
            f.write_str(if i == 0 { " " } else { ", " })?;
            write!(f, "{}", name(out))?;
        }
        f.write_str("\n}\n")
    }
}

/// A node's printed name: its sequential number if renumbering, else its slot index.
struct NodeName(NodeId, Option<usize>);

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(n) => write!(f, "n{n}"),
            None => write!(f, "{}", self.0),
        }
    }
}

/// An op's mnemonic and attributes as the text form prints them (`reduce sum axes=[1]`). The
/// Graphviz export labels its boxes with the same text.
pub struct OpHead<'a>(pub &'a Op);

impl fmt::Display for OpHead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = self.0;
        f.write_str(op.mnemonic())?;
        match op {
            Op::Input(i) => write!(f, " {}", i.slot),
            Op::Const(c) => write!(f, " {}", ScalarText(c.value)),
            Op::Iota(i) => write!(f, " axis={}", i.axis),
            Op::Unary(_) | Op::Binary(_) | Op::Where => Ok(()),
            Op::Cast(c) => write!(f, " {}", c.to),
            Op::Reduce(r) => write!(f, " {} axes={}", r.op.name(), UsizeList(&r.axes)),
            Op::Reshape(r) => write!(f, " {}", ShapeDisplay(&r.shape)),
            Op::Permute(p) => write!(f, " {}", UsizeList(&p.perm)),
            Op::Expand(e) => write!(f, " {}", ShapeDisplay(&e.shape)),
            Op::Pad(p) => write!(f, " {} value={}", PairList(&p.padding), ScalarText(p.value)),
            Op::Shrink(s) => write!(f, " {}", PairList(&s.ranges)),
            Op::Gather(g) => write!(f, " axis={}", g.axis),
            Op::ScatterAdd(s) => write!(f, " axis={} {}", s.axis, ShapeDisplay(&s.shape)),
        }
    }
}

struct UsizeList<'a>(&'a [usize]);

impl fmt::Display for UsizeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{a}")?;
        }
        f.write_str("]")
    }
}

struct PairList<'a>(&'a [(Dim, Dim)]);

impl fmt::Display for PairList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, (a, b)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "({a}, {b})")?;
        }
        f.write_str("]")
    }
}

/// `Scalar`'s `Display`, except that a NaN other than the canonical one prints its bits
/// (`nan(0x7ff8000000000001)`) so that the constant round-trips exactly.
struct ScalarText(Scalar);

const CANONICAL_NAN_BITS: u64 = 0x7ff8_0000_0000_0000;

impl fmt::Display for ScalarText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Scalar::Float(x) if x.is_nan() && x.to_bits() != CANONICAL_NAN_BITS => {
                write!(f, "nan(0x{:016x})", x.to_bits())
            }
            s => write!(f, "{s}"),
        }
    }
}

/// Parses the text form. Every error is `AirError::Parse` naming the 1-based line; no input
/// panics. See the module docs for the syntax.
pub fn parse(text: &str) -> Result<Graph> {
    let mut parser = Parser { graph: Graph::new(), names: HashMap::new(), outputs: None };
    let mut stage = Stage::Header;
    let mut last_line = 0;
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        last_line = line_no;
        let line = raw.split("//").next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |msg: String| AirError::Parse { line: line_no, msg };
        stage = match stage {
            Stage::Header => {
                let mut c = Cursor::new(line);
                if c.ident() != Some("graph") || !c.eat(b'{') || !c.at_end() {
                    return Err(err(format!("expected `graph {{`, found `{line}`")));
                }
                Stage::Body
            }
            Stage::Body if line == "}" => {
                if parser.outputs.is_none() {
                    return Err(err("expected a `return` line before `}`".into()));
                }
                Stage::Done
            }
            Stage::Body if parser.outputs.is_some() => {
                return Err(err(format!("expected `}}` after the `return` line, found `{line}`")));
            }
            Stage::Body => {
                parser.line(line).map_err(err)?;
                Stage::Body
            }
            Stage::Done => return Err(err(format!("unexpected `{line}` after the closing `}}`"))),
        };
    }
    match stage {
        Stage::Done => {}
        Stage::Header => {
            return Err(AirError::Parse {
                line: last_line.max(1),
                msg: "expected `graph {`, found end of input".into(),
            });
        }
        Stage::Body => {
            return Err(AirError::Parse { line: last_line.max(1), msg: "expected `}`, found end of input".into() });
        }
    }
    let Parser { mut graph, outputs, .. } = parser;
    graph.set_outputs(outputs.unwrap_or_default());
    Ok(graph)
}

#[derive(Clone, Copy)]
enum Stage {
    Header,
    Body,
    Done,
}

struct Parser<'t> {
    graph: Graph,
    names: HashMap<&'t str, NodeId>,
    outputs: Option<Vec<NodeId>>,
}

impl<'t> Parser<'t> {
    /// One line of the body: a node definition or the `return` line.
    fn line(&mut self, line: &'t str) -> Result<(), String> {
        let mut c = Cursor::new(line);
        let name = c.ident().ok_or_else(|| format!("expected a node name or `return`, found `{line}`"))?;
        if name == "return" && c.peek() != Some(b'=') {
            let outputs = if c.at_end() { Vec::new() } else { self.operands(&mut c)? };
            c.end()?;
            self.outputs = Some(outputs);
            return Ok(());
        }
        if self.names.contains_key(name) {
            return Err(format!("node `{name}` is defined twice"));
        }
        c.expect(b'=')?;
        let mnemonic = c.ident().ok_or_else(|| c.unexpected("an op name"))?;
        let op = op_with_attrs(mnemonic, &mut c)?;
        let inputs: Inputs = if c.peek() == Some(b':') { Inputs::new() } else { self.operands(&mut c)?.into() };
        c.expect(b':')?;
        let ty = tensor_type(&mut c)?;
        c.end()?;
        let id = if op.is_leaf() {
            if !inputs.is_empty() {
                return Err(format!("{mnemonic}: a leaf takes no operands, got {}", inputs.len()));
            }
            self.graph.add_leaf(op, ty).map_err(|e| e.to_string())?
        } else {
            self.graph.add_unchecked(Node { op, inputs, ty })
        };
        self.names.insert(name, id);
        Ok(())
    }

    /// A comma-separated list of names of nodes defined above.
    fn operands(&self, c: &mut Cursor<'t>) -> Result<Vec<NodeId>, String> {
        let mut ids = Vec::new();
        loop {
            let name = c.ident().ok_or_else(|| c.unexpected("a node name"))?;
            let id = self.names.get(name).ok_or_else(|| format!("unknown node `{name}`"))?;
            ids.push(*id);
            if !c.eat(b',') {
                return Ok(ids);
            }
        }
    }
}

/// The op named `mnemonic` with its attributes read from `c`.
fn op_with_attrs(mnemonic: &str, c: &mut Cursor<'_>) -> Result<Op, String> {
    let kind = OpKind::from_name(mnemonic).ok_or_else(|| format!("unknown op `{mnemonic}`"))?;
    Ok(match kind {
        OpKind::Input => {
            let slot = c.word();
            Op::Input(Input { slot: slot.parse().map_err(|_| format!("input: bad slot `{slot}`"))? })
        }
        OpKind::Const => Op::Const(Const { value: scalar(c)? }),
        OpKind::Iota => {
            c.keyword("axis")?;
            Op::Iota(Iota { axis: usize_attr(c)? })
        }
        OpKind::Where => Op::Where,
        OpKind::Cast => {
            let name = c.ident().ok_or_else(|| c.unexpected("a dtype"))?;
            Op::Cast(Cast { to: DType::from_name(name).ok_or_else(|| format!("unknown dtype `{name}`"))? })
        }
        OpKind::Reduce => {
            let name = c.ident().ok_or_else(|| c.unexpected("`sum` or `max`"))?;
            let op = ReduceOp::from_name(name).ok_or_else(|| format!("unknown reduction `{name}`"))?;
            c.keyword("axes")?;
            Op::Reduce(Reduce { op, axes: usize_list(c)?.into() })
        }
        OpKind::Reshape => Op::Reshape(Reshape { shape: shape(c)? }),
        OpKind::Expand => Op::Expand(Expand { shape: shape(c)? }),
        OpKind::Permute => Op::Permute(Permute { perm: usize_list(c)?.into() }),
        OpKind::Pad => {
            let padding = pair_list(c)?;
            c.keyword("value")?;
            Op::Pad(Pad { padding, value: scalar(c)? })
        }
        OpKind::Shrink => Op::Shrink(Shrink { ranges: pair_list(c)? }),
        OpKind::Gather => {
            c.keyword("axis")?;
            Op::Gather(Gather { axis: usize_attr(c)? })
        }
        OpKind::ScatterAdd => {
            c.keyword("axis")?;
            let axis = usize_attr(c)?;
            Op::ScatterAdd(Box::new(ScatterAdd { axis, shape: shape(c)? }))
        }
        OpKind::Unary(u) => Op::Unary(u),
        OpKind::Binary(b) => Op::Binary(b),
    })
}

/// `f32[4, seq]`.
fn tensor_type(c: &mut Cursor<'_>) -> Result<TensorType, String> {
    let name = c.ident().ok_or_else(|| c.unexpected("a dtype"))?;
    let dtype = DType::from_name(name).ok_or_else(|| format!("unknown dtype `{name}`"))?;
    Ok(TensorType { dtype, shape: shape(c)? })
}

/// `[4, 2*seq + 1]`.
fn shape(c: &mut Cursor<'_>) -> Result<Shape, String> {
    c.expect(b'[')?;
    let mut dims = Shape::new();
    if c.eat(b']') {
        return Ok(dims);
    }
    loop {
        dims.push(c.dim(b",]")?);
        if c.eat(b']') {
            return Ok(dims);
        }
        c.expect(b',')?;
    }
}

/// `[(0, 1), (2, seq)]`.
fn pair_list(c: &mut Cursor<'_>) -> Result<Vec<(Dim, Dim)>, String> {
    c.expect(b'[')?;
    let mut pairs = Vec::new();
    if c.eat(b']') {
        return Ok(pairs);
    }
    loop {
        c.expect(b'(')?;
        let a = c.dim(b",")?;
        c.expect(b',')?;
        let b = c.dim(b")")?;
        c.expect(b')')?;
        pairs.push((a, b));
        if c.eat(b']') {
            return Ok(pairs);
        }
        c.expect(b',')?;
    }
}

/// `[0, 2]`.
fn usize_list(c: &mut Cursor<'_>) -> Result<Vec<usize>, String> {
    c.expect(b'[')?;
    let mut items = Vec::new();
    if c.eat(b']') {
        return Ok(items);
    }
    loop {
        items.push(usize_attr(c)?);
        if c.eat(b']') {
            return Ok(items);
        }
        c.expect(b',')?;
    }
}

fn usize_attr(c: &mut Cursor<'_>) -> Result<usize, String> {
    let word = c.word();
    word.parse().map_err(|_| format!("expected an axis, found `{word}`"))
}

/// A scalar as `ScalarText` prints it: `true`, `3`, `1.0`, `1e-7`, `inf`, `nan(0x...)`.
fn scalar(c: &mut Cursor<'_>) -> Result<Scalar, String> {
    let word = c.word();
    let bad = || format!("bad scalar `{word}`");
    Ok(match word {
        "true" => Scalar::Bool(true),
        "false" => Scalar::Bool(false),
        "nan" => Scalar::Float(f64::NAN),
        "inf" => Scalar::Float(f64::INFINITY),
        "-inf" => Scalar::Float(f64::NEG_INFINITY),
        _ => {
            if let Some(hex) = word.strip_prefix("nan(0x").and_then(|w| w.strip_suffix(')')) {
                let x = f64::from_bits(u64::from_str_radix(hex, 16).map_err(|_| bad())?);
                if !x.is_nan() {
                    return Err(format!("`{word}` is not a NaN"));
                }
                Scalar::Float(x)
            } else if word.bytes().any(|b| b.is_ascii_digit())
                && word.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b))
            {
                if word.bytes().any(|b| b"eE.".contains(&b)) {
                    Scalar::Float(word.parse().map_err(|_| bad())?)
                } else {
                    Scalar::Int(word.parse().map_err(|_| bad())?)
                }
            } else {
                return Err(bad());
            }
        }
    })
}

/// A position in one line. Moves only over ASCII bytes or up to ASCII delimiters, so every
/// position is a char boundary and slicing never panics.
struct Cursor<'t> {
    s: &'t str,
    i: usize,
}

impl<'t> Cursor<'t> {
    fn new(s: &'t str) -> Cursor<'t> {
        Cursor { s, i: 0 }
    }

    fn skip_ws(&mut self) {
        while self.s.as_bytes().get(self.i).is_some_and(|b| b.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.as_bytes().get(self.i).copied()
    }

    fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }

    fn rest(&self) -> &'t str {
        self.s.get(self.i..).unwrap_or("")
    }

    fn unexpected(&mut self, wanted: &str) -> String {
        if self.at_end() {
            format!("expected {wanted}, found end of line")
        } else {
            format!("expected {wanted}, found `{}`", self.rest())
        }
    }

    fn end(&mut self) -> Result<(), String> {
        if self.at_end() { Ok(()) } else { Err(format!("unexpected `{}` at end of line", self.rest())) }
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, b: u8) -> Result<(), String> {
        if self.eat(b) { Ok(()) } else { Err(self.unexpected(&format!("`{}`", b as char))) }
    }

    /// `[A-Za-z_][A-Za-z0-9_]*`.
    fn ident(&mut self) -> Option<&'t str> {
        self.skip_ws();
        let bytes = self.s.as_bytes();
        let start = self.i;
        if !bytes.get(start).is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_') {
            return None;
        }
        while bytes.get(self.i).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_') {
            self.i += 1;
        }
        self.s.get(start..self.i)
    }

    /// `name=`.
    fn keyword(&mut self, name: &str) -> Result<(), String> {
        let save = self.i;
        if self.ident() == Some(name) && self.eat(b'=') {
            return Ok(());
        }
        self.i = save;
        Err(self.unexpected(&format!("`{name}=`")))
    }

    /// Everything up to the next whitespace, `,`, `:`, `]` or end of line (a number or scalar).
    fn word(&mut self) -> &'t str {
        self.skip_ws();
        let start = self.i;
        let bytes = self.s.as_bytes();
        while bytes.get(self.i).is_some_and(|b| !b.is_ascii_whitespace() && !b",:]".contains(b)) {
            self.i += 1;
        }
        self.s.get(start..self.i).unwrap_or("")
    }

    /// A dim running up to the first of `stops` outside parentheses.
    fn dim(&mut self, stops: &[u8]) -> Result<Dim, String> {
        self.skip_ws();
        let start = self.i;
        let bytes = self.s.as_bytes();
        let mut depth = 0usize;
        loop {
            match bytes.get(self.i) {
                None => return Err(format!("unterminated dim `{}`", self.s.get(start..).unwrap_or(""))),
                Some(&b) if depth == 0 && stops.contains(&b) => break,
                Some(b'(') => depth += 1,
                Some(b')') => {
                    depth = depth.checked_sub(1).ok_or_else(|| format!("unbalanced `)` in `{}`", self.rest()))?
                }
                Some(_) => {}
            }
            self.i += 1;
        }
        let text = self.s.get(start..self.i).unwrap_or("").trim();
        if text.is_empty() {
            return Err(self.unexpected("a dim"));
        }
        Dim::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_round_trip_bit_for_bit() {
        let values = [0.0, -0.0, 1.0, 0.1, 1e-7, 1e300, f64::MIN_POSITIVE, 5e-324, f64::MAX, f64::INFINITY];
        let nans = [f64::NAN, -f64::NAN, f64::from_bits(0x7ff0_0000_0000_0001)];
        for x in values.iter().flat_map(|&x| [x, -x]).chain(nans) {
            let text = ScalarText(Scalar::Float(x)).to_string();
            let back = scalar(&mut Cursor::new(&text)).unwrap();
            assert_eq!(back, Scalar::Float(x), "{text}");
        }
        for s in [Scalar::Int(i64::MIN), Scalar::Int(7), Scalar::Bool(true), Scalar::Bool(false)] {
            assert_eq!(scalar(&mut Cursor::new(&s.to_string())).unwrap(), s);
        }
        for bad in ["", "1.2.3", "x", "nan(0x1)", "--1", "1e", "99999999999999999999"] {
            assert!(scalar(&mut Cursor::new(bad)).is_err(), "{bad}");
        }
    }
}

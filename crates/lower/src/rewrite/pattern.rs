//! The pattern language of rewrite rules: s-expressions over op mnemonics, parsed once when a rule
//! set is built (each head becomes an `air::OpKind`), and the matcher that runs them against a
//! graph.
//!
//! # Patterns (left-hand sides)
//!
//! ```text
//! pat  := ?name            capture any node; a name used twice must be the same node
//!       | ?name:class      capture a node whose dtype is of `class` (int, float, bool, notfloat)
//!       | ?_               match anything, capture nothing
//!       | (const)          any const leaf
//!       | (const LIT)      a const leaf holding LIT (see below)
//!       | (HEAD pat ...)   a node with op HEAD, any attributes, and inputs matching the pats
//! HEAD := an op mnemonic (neg, add, where, cast, reshape, ...) | unary | binary (any op of the class)
//! LIT  := true | false | an integer (3, -1) | a float (1.0, -0.0, inf, nan)
//! ```
//!
//! A binary op that is commutative (`BinaryOp::is_commutative`) also matches its inputs swapped,
//! so `(mul ?x (const 1))` matches `1 * x` too.
//!
//! Const literals match bit-exactly: an integer literal `k` matches an int const `k` and a float
//! const whose `f64` bits are those of `k as f64` (so `0` is `+0.0` and never `-0.0`); a float
//! literal matches only float consts with its exact bits. Attributes are never matched by the
//! pattern; a rule that cares about them has a guard or a computed replacement.
//!
//! # Templates (right-hand sides)
//!
//! ```text
//! tpl := ?name             the captured node itself
//!      | (const LIT)       a const of the root's type holding LIT converted to the root's dtype
//!      | (root tpl ...)    the matched root's op, attributes and all, on new inputs
//!      | (OP tpl ...)      a new node of an attribute-free op (unary, binary, where)
//! ```

use air::{BinaryOp, DType, Graph, NodeId, Op, OpKind, Scalar, UnaryOp};
use smallvec::SmallVec;

/// Which dtypes a typed capture accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DClass {
    /// Every dtype (an untyped `?name`).
    Any,
    /// Integer dtypes (`int`).
    Int,
    /// Float dtypes (`float`).
    Float,
    /// `bool` only (`bool`).
    Bool,
    /// Ints and bools: the dtypes where every value equals itself.
    NotFloat,
}

impl DClass {
    fn parse(text: &str) -> Option<DClass> {
        Some(match text {
            "int" => DClass::Int,
            "float" => DClass::Float,
            "bool" => DClass::Bool,
            "notfloat" => DClass::NotFloat,
            _ => return None,
        })
    }

    /// Whether a node of `dtype` may be captured by a capture of this class.
    pub fn accepts(self, dtype: DType) -> bool {
        match self {
            DClass::Any => true,
            DClass::Int => dtype.is_int(),
            DClass::Float => dtype.is_float(),
            DClass::Bool => dtype.is_bool(),
            DClass::NotFloat => !dtype.is_float(),
        }
    }
}

/// A literal of a const matcher or a const template.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lit {
    /// `true` or `false`.
    Bool(bool),
    /// An integer literal such as `3` or `-1`.
    Int(i64),
    /// A float literal such as `1.0`, `-0.0`, `inf` or `nan`.
    Float(f64),
}

impl Lit {
    fn parse(text: &str) -> Option<Lit> {
        match text {
            "true" => return Some(Lit::Bool(true)),
            "false" => return Some(Lit::Bool(false)),
            _ => {}
        }
        if let Ok(i) = text.parse::<i64>() {
            return Some(Lit::Int(i));
        }
        text.parse::<f64>().ok().map(Lit::Float)
    }

    /// Whether a const holding `value` holds exactly this literal (bit-exact, see the module docs).
    pub fn matches(self, value: Scalar) -> bool {
        match (self, value) {
            (Lit::Bool(a), Scalar::Bool(b)) => a == b,
            (Lit::Int(a), Scalar::Int(b)) => a == b,
            (Lit::Int(a), Scalar::Float(b)) => (a as f64).to_bits() == b.to_bits(),
            (Lit::Float(a), Scalar::Float(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }

    /// This literal as a scalar of the kind `dtype` holds.
    pub fn to_scalar(self, dtype: DType) -> Scalar {
        let s = match self {
            Lit::Bool(b) => Scalar::Bool(b),
            Lit::Int(i) => Scalar::Int(i),
            Lit::Float(x) => Scalar::Float(x),
        };
        s.cast(dtype)
    }
}

/// What the head of an op pattern accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// Exactly the ops of this kind.
    Op(OpKind),
    /// Any unary element-wise op.
    Unary,
    /// Any binary element-wise op.
    Binary,
}

impl Head {
    /// Whether a node with op `op` matches this head (attributes are ignored).
    pub fn accepts(self, op: &Op) -> bool {
        match self {
            Head::Op(k) => op.kind() == k,
            Head::Unary => matches!(op, Op::Unary(_)),
            Head::Binary => matches!(op, Op::Binary(_)),
        }
    }

    /// The op kinds this head accepts (the rule index files a rule under each).
    pub fn kinds(self) -> Vec<OpKind> {
        match self {
            Head::Op(k) => vec![k],
            Head::Unary => UnaryOp::ALL.iter().map(|&u| OpKind::Unary(u)).collect(),
            Head::Binary => BinaryOp::ALL.iter().map(|&b| OpKind::Binary(b)).collect(),
        }
    }
}

/// A parsed left-hand side.
#[derive(Clone, Debug, PartialEq)]
pub enum Pat {
    /// `?name[:class]`; `var` is `None` for `?_`.
    Capture {
        /// The index of the captured variable among the rule's names; `None` for `?_`.
        var: Option<usize>,
        /// The dtypes the captured node may have.
        class: DClass,
    },
    /// `(const)` or `(const LIT)`.
    Const(Option<Lit>),
    /// `(HEAD pat ...)`.
    Op {
        /// Which ops the node may have.
        head: Head,
        /// The patterns its inputs must match, in order.
        inputs: Vec<Pat>,
    },
}

impl Pat {
    /// Levels of op (or const) matchers: a pattern of depth `d` can start to match at a node when
    /// something up to `d - 1` levels below it changes.
    pub fn depth(&self) -> usize {
        match self {
            Pat::Capture { .. } => 0,
            Pat::Const(_) => 1,
            Pat::Op { inputs, .. } => 1 + inputs.iter().map(Pat::depth).max().unwrap_or(0),
        }
    }
}

/// A parsed right-hand side.
#[derive(Clone, Debug, PartialEq)]
pub enum Template {
    /// `?name`: the node captured by the variable with this index.
    Capture(usize),
    /// `(const LIT)`: a new const of the root's type holding the literal.
    Const(Lit),
    /// `(root tpl ...)`: the matched root's op, attributes included, on the given inputs.
    Root(Vec<Template>),
    /// `(OP tpl ...)`: a new node of an attribute-free op on the given inputs.
    Op(Op, Vec<Template>),
}

/// The nodes a pattern captured, by variable index; names come from the rule's pattern.
#[derive(Clone, Debug)]
pub struct Match<'r> {
    names: &'r [&'static str],
    nodes: SmallVec<[Option<NodeId>; 4]>,
}

impl<'r> Match<'r> {
    pub(crate) fn new(names: &'r [&'static str]) -> Match<'r> {
        Match { names, nodes: smallvec::smallvec![None; names.len()] }
    }

    /// The node captured as `?name` (pass the name without `?`).
    pub fn get(&self, name: &str) -> Option<NodeId> {
        let i = self.names.iter().position(|n| *n == name)?;
        self.nodes[i]
    }

    pub(crate) fn var(&self, var: usize) -> Option<NodeId> {
        self.nodes[var]
    }
}

/// Matches `pat` at `node`, extending `m`. On failure `m` may hold partial captures; the engine
/// starts each attempt with a fresh `Match`.
pub fn match_at(g: &Graph, pat: &Pat, node: NodeId, m: &mut Match<'_>) -> bool {
    match pat {
        Pat::Capture { var, class } => {
            if !class.accepts(g.ty(node).dtype) {
                return false;
            }
            match var {
                None => true,
                Some(v) => match m.nodes[*v] {
                    Some(bound) => bound == node,
                    None => {
                        m.nodes[*v] = Some(node);
                        true
                    }
                },
            }
        }
        Pat::Const(lit) => match g.op(node) {
            Op::Const(c) => lit.is_none_or(|l| l.matches(c.value)),
            _ => false,
        },
        Pat::Op { head, inputs } => {
            let op = g.op(node);
            let args = g.inputs(node);
            if !head.accepts(op) || args.len() != inputs.len() {
                return false;
            }
            let saved = m.nodes.clone();
            if inputs.iter().zip(args).all(|(p, &a)| match_at(g, p, a, m)) {
                return true;
            }
            let commutative = matches!(op, Op::Binary(b) if b.is_commutative());
            if commutative {
                m.nodes = saved;
                return match_at(g, &inputs[0], args[1], m) && match_at(g, &inputs[1], args[0], m);
            }
            false
        }
    }
}

/// An s-expression token stream over a rule's text.
struct Lexer<'a> {
    text: &'a str,
    pos: usize,
}

#[derive(Debug, PartialEq)]
enum Token<'a> {
    Open,
    Close,
    Atom(&'a str),
}

impl<'a> Lexer<'a> {
    fn next(&mut self) -> Option<Token<'a>> {
        let rest = &self.text[self.pos..];
        let trimmed = rest.trim_start();
        self.pos += rest.len() - trimmed.len();
        let c = trimmed.chars().next()?;
        if c == '(' || c == ')' {
            self.pos += 1;
            return Some(if c == '(' { Token::Open } else { Token::Close });
        }
        let len = trimmed.find(|c: char| c.is_whitespace() || c == '(' || c == ')').unwrap_or(trimmed.len());
        self.pos += len;
        Some(Token::Atom(&trimmed[..len]))
    }

    fn expect_end(&mut self) -> Result<(), String> {
        match self.next() {
            None => Ok(()),
            Some(t) => Err(format!("trailing {t:?} in `{}`", self.text)),
        }
    }
}

/// Parses a left-hand side; capture names are appended to `names` (their index is the var).
pub fn parse_pattern(text: &'static str, names: &mut Vec<&'static str>) -> Result<Pat, String> {
    let mut lx = Lexer { text, pos: 0 };
    let first = lx.next().ok_or_else(|| "empty pattern".to_string())?;
    let pat = pattern(&mut lx, first, names)?;
    lx.expect_end()?;
    Ok(pat)
}

fn pattern(lx: &mut Lexer<'static>, tok: Token<'static>, names: &mut Vec<&'static str>) -> Result<Pat, String> {
    match tok {
        Token::Atom(a) => {
            let body = a.strip_prefix('?').ok_or_else(|| format!("`{a}` is neither a capture nor a list"))?;
            let (name, class) = match body.split_once(':') {
                Some((n, c)) => (n, DClass::parse(c).ok_or_else(|| format!("unknown dtype class `{c}`"))?),
                None => (body, DClass::Any),
            };
            if name.is_empty() {
                return Err(format!("capture `{a}` has no name"));
            }
            let var = if name == "_" {
                None
            } else {
                Some(names.iter().position(|n| *n == name).unwrap_or_else(|| {
                    names.push(name);
                    names.len() - 1
                }))
            };
            Ok(Pat::Capture { var, class })
        }
        Token::Close => Err("unexpected `)`".into()),
        Token::Open => {
            let head = match lx.next() {
                Some(Token::Atom(h)) => h,
                other => return Err(format!("expected an op name after `(`, got {other:?}")),
            };
            if head == "const" {
                return match lx.next() {
                    Some(Token::Close) => Ok(Pat::Const(None)),
                    Some(Token::Atom(l)) => {
                        let lit = Lit::parse(l).ok_or_else(|| format!("bad literal `{l}`"))?;
                        match lx.next() {
                            Some(Token::Close) => Ok(Pat::Const(Some(lit))),
                            other => Err(format!("expected `)` after `(const {l}`, got {other:?}")),
                        }
                    }
                    other => Err(format!("bad const pattern at {other:?}")),
                };
            }
            let head = match head {
                "unary" => Head::Unary,
                "binary" => Head::Binary,
                h => Head::Op(OpKind::from_name(h).ok_or_else(|| format!("unknown op `{h}`"))?),
            };
            let mut inputs = Vec::new();
            loop {
                match lx.next() {
                    Some(Token::Close) => break,
                    Some(t) => inputs.push(pattern(lx, t, names)?),
                    None => return Err("unclosed `(`".into()),
                }
            }
            if let Head::Op(k) = head
                && inputs.len() != k.arity()
            {
                return Err(format!("`{k}` takes {} inputs, the pattern gives {}", k.arity(), inputs.len()));
            }
            Ok(Pat::Op { head, inputs })
        }
    }
}

/// Parses a right-hand side whose captures must all be among `names`.
pub fn parse_template(text: &'static str, names: &[&'static str]) -> Result<Template, String> {
    let mut lx = Lexer { text, pos: 0 };
    let first = lx.next().ok_or_else(|| "empty template".to_string())?;
    let t = template(&mut lx, first, names)?;
    lx.expect_end()?;
    Ok(t)
}

fn template(lx: &mut Lexer<'static>, tok: Token<'static>, names: &[&'static str]) -> Result<Template, String> {
    match tok {
        Token::Atom(a) => {
            let name = a.strip_prefix('?').ok_or_else(|| format!("`{a}` is neither a capture nor a list"))?;
            let var = names.iter().position(|n| *n == name).ok_or_else(|| format!("`{a}` is not captured"))?;
            Ok(Template::Capture(var))
        }
        Token::Close => Err("unexpected `)`".into()),
        Token::Open => {
            let head = match lx.next() {
                Some(Token::Atom(h)) => h,
                other => return Err(format!("expected an op name after `(`, got {other:?}")),
            };
            let mut args = Vec::new();
            let mut lits = Vec::new();
            loop {
                match lx.next() {
                    Some(Token::Close) => break,
                    Some(Token::Atom(a)) if head == "const" => lits.push(a),
                    Some(t) => args.push(template(lx, t, names)?),
                    None => return Err("unclosed `(`".into()),
                }
            }
            match head {
                "const" => match lits.as_slice() {
                    [l] if args.is_empty() => {
                        Ok(Template::Const(Lit::parse(l).ok_or_else(|| format!("bad literal `{l}`"))?))
                    }
                    _ => Err("a const template holds exactly one literal".into()),
                },
                "root" => Ok(Template::Root(args)),
                h => {
                    let op = match OpKind::from_name(h) {
                        Some(OpKind::Unary(u)) => Op::Unary(u),
                        Some(OpKind::Binary(b)) => Op::Binary(b),
                        Some(OpKind::Where) => Op::Where,
                        _ => return Err(format!("`{h}` cannot be built by a template (it has attributes)")),
                    };
                    if args.len() != op.arity() {
                        return Err(format!("`{h}` takes {} inputs, the template gives {}", op.arity(), args.len()));
                    }
                    Ok(Template::Op(op, args))
                }
            }
        }
    }
}

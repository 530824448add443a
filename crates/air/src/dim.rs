//! Symbolic dimensions: each dim is a constant or an integer polynomial over named symbols
//! (`seq`, `2*seq + 1`, `batch*seq`), kept in a canonical form so that equal dims compare equal.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

/// A named integer symbol (`seq`, `start_pos`). Symbols compare by name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Symbol(Arc<str>);

impl Symbol {
    /// The symbol called `name`.
    pub fn new(name: &str) -> Symbol {
        Symbol(Arc::from(name))
    }
    /// The symbol's name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A product of symbols, sorted; empty means the constant term.
type Monomial = SmallVec<[Symbol; 2]>;

/// Monomial -> non-zero coefficient.
type Terms = BTreeMap<Monomial, i64>;

/// A canonical integer polynomial: monomial -> non-zero coefficient, with the hash of its terms
/// computed once (graph keys, CSE and the schedule hash shapes all the time; a polynomial's terms
/// are a tree of symbol names).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Poly {
    terms: Terms,
    hash: u64,
}

impl Poly {
    fn new(terms: Terms) -> Poly {
        use std::hash::{Hash, Hasher};
        // Unseeded, as graph keys are (`key`): the same hash in every process.
        let mut h = rustc_hash::FxHasher::default();
        terms.hash(&mut h);
        Poly { terms, hash: h.finish() }
    }
}

impl std::hash::Hash for Poly {
    /// The terms' hash, computed once: equal terms have equal hashes.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// One dimension of a shape. Constants are stored inline; symbolic dims point to their
/// polynomial, interned ([`intern`]), so a `Dim` is `Copy` and two symbolic dims are equal
/// exactly when they point to the same polynomial.
///
/// `Dim` is 16 bytes: shapes are copied around a lot and nearly all dims are constants. Copying a
/// shape touches no reference count: with `Arc`-shared polynomials, the atomic increments and
/// decrements of cloned and dropped shapes were about a tenth of the per-layer compile time of
/// the cached Transformer forward (`perf`, `examples/compile_loop`).
#[derive(Clone, Copy, PartialOrd, Ord)]
pub enum Dim {
    /// A constant size.
    Const(i64),
    /// A polynomial that mentions at least one symbol, in canonical form. [`Dim::sym`] and dim
    /// arithmetic fold any polynomial without symbols into [`Dim::Const`].
    Sym(&'static Poly),
}

impl PartialEq for Dim {
    /// Constants by value, polynomials by address (interned: equal polynomials are one).
    fn eq(&self, other: &Dim) -> bool {
        match (self, other) {
            (Dim::Const(a), Dim::Const(b)) => a == b,
            (Dim::Sym(a), Dim::Sym(b)) => std::ptr::eq(*a, *b),
            _ => false,
        }
    }
}

impl Eq for Dim {}

impl std::hash::Hash for Dim {
    /// A constant's value, or its polynomial's hash of terms (the same in every process, as
    /// graph keys need; an address would not be).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Dim::Const(c) => {
                state.write_isize(0);
                state.write_i64(*c);
            }
            Dim::Sym(p) => {
                state.write_isize(1);
                p.hash(state);
            }
        }
    }
}

/// The process's polynomials, each stored once and kept for the life of the process (as a
/// compiler interns its types): a program mentions a few dozen (`seq`, `start + seq`,
/// `64*batch*seq`), and every graph built afterwards shares them. A process that makes new
/// symbol names without end keeps each polynomial it made (a few hundred bytes each).
mod intern {
    use std::collections::HashSet;
    use std::sync::{LazyLock, Mutex, PoisonError};

    use super::Poly;

    static POLYS: LazyLock<Mutex<HashSet<&'static Poly>>> = LazyLock::new(Default::default);

    /// The interned polynomial equal to `p`.
    pub(super) fn poly(p: Poly) -> &'static Poly {
        let mut polys = POLYS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&q) = polys.get(&p) {
            return q;
        }
        let q: &'static Poly = Box::leak(Box::new(p));
        polys.insert(q);
        q
    }
}

/// Values for the symbols of a graph, given when a program runs.
pub type Bindings = BTreeMap<Symbol, i64>;

/// Binds every derived symbol ([`Dim::floor_div`]) whose definition's symbols are bound, in the
/// order the symbols were defined (a floor of a floor comes after its inner one). One already
/// bound to another value than its definition gives (a tensor computed for another size, mixed
/// in) is returned as `Err((symbol, bound, defined))`. Free when the process defined none; what
/// runs a graph calls this after binding its inputs' symbols.
pub fn close_derived(bindings: &mut Bindings) -> Result<(), (Symbol, i64, i64)> {
    derived::close(bindings)
}

/// The floor-division symbols of the process ([`Dim::floor_div`]): each name's definition, kept
/// for the life of the process like the interned polynomials.
mod derived {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, PoisonError};

    use super::{Bindings, Dim, Symbol};

    /// `(symbol, numerator, divisor)` in definition order.
    static DEFINED: Mutex<Vec<(Symbol, Dim, i64)>> = Mutex::new(Vec::new());
    static ANY: AtomicBool = AtomicBool::new(false);

    /// The symbol for `floor(num / d)`, defined on first use.
    pub(super) fn floor(num: Dim, d: i64) -> Dim {
        let name = format!("⌊({num})/{d}⌋");
        let mut defined = DEFINED.lock().unwrap_or_else(PoisonError::into_inner);
        if !defined.iter().any(|(s, _, _)| s.name() == name) {
            defined.push((Symbol::new(&name), num, d));
            ANY.store(true, Ordering::Release);
        }
        Dim::sym(&name)
    }

    /// The numerator and divisor `s` stands for, if it is a derived symbol.
    pub(super) fn definition(s: &Symbol) -> Option<(Dim, i64)> {
        if !ANY.load(Ordering::Acquire) {
            return None;
        }
        let defined = DEFINED.lock().unwrap_or_else(PoisonError::into_inner);
        defined.iter().find(|(t, _, _)| t == s).map(|&(_, num, d)| (num, d))
    }

    pub(super) fn close(bindings: &mut Bindings) -> Result<(), (Symbol, i64, i64)> {
        if !ANY.load(Ordering::Acquire) {
            return Ok(());
        }
        let defined = DEFINED.lock().unwrap_or_else(PoisonError::into_inner);
        for (s, num, d) in defined.iter() {
            let Ok(v) = num.eval(bindings) else { continue };
            let v = v.div_euclid(*d);
            match bindings.get(s) {
                Some(&bound) if bound != v => return Err((s.clone(), bound, v)),
                Some(_) => {}
                None => {
                    bindings.insert(s.clone(), v);
                }
            }
        }
        Ok(())
    }
}

/// Why a symbolic dim could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DimError {
    /// A symbol of the dim has no value in the bindings.
    #[error("symbol `{0}` has no value bound")]
    Unbound(Symbol),
    /// Evaluating the polynomial overflowed `i64`.
    #[error("dim expression overflowed i64")]
    Overflow,
}

impl Dim {
    /// The symbol `name` as a dim.
    pub fn sym(name: &str) -> Dim {
        memo::symbol(name, || {
            let mut terms = BTreeMap::new();
            terms.insert(smallvec::smallvec![Symbol::new(name)], 1);
            Dim::from_terms(terms)
        })
    }

    fn from_terms(terms: Terms) -> Dim {
        match terms.len() {
            0 => Dim::Const(0),
            1 if terms.keys().next().is_some_and(|m| m.is_empty()) => {
                Dim::Const(terms.values().next().copied().unwrap_or(0))
            }
            _ => Dim::Sym(intern::poly(Poly::new(terms))),
        }
    }

    fn to_terms(self) -> Terms {
        match self {
            Dim::Const(c) => {
                let mut terms = BTreeMap::new();
                if c != 0 {
                    terms.insert(Monomial::new(), c);
                }
                terms
            }
            Dim::Sym(p) => p.terms.clone(),
        }
    }

    /// The value if this dim is a constant.
    pub fn as_const(&self) -> Option<i64> {
        match self {
            Dim::Const(c) => Some(*c),
            Dim::Sym(_) => None,
        }
    }

    /// Whether this dim is at least 0 whatever its symbols' values, which are sizes and
    /// positions and so never negative: a constant of at least 0, or a polynomial whose every
    /// coefficient (the constant term included) is at least 0.
    pub fn provably_nonneg(&self) -> bool {
        match self {
            Dim::Const(c) => *c >= 0,
            Dim::Sym(p) => p.terms.values().all(|&c| c >= 0),
        }
    }

    /// Whether this dim is a constant ([`Dim::Const`]).
    pub fn is_const(&self) -> bool {
        matches!(self, Dim::Const(_))
    }

    /// Calls `f` with every symbol this dim mentions (a symbol of several terms once per term).
    pub fn for_each_symbol(&self, mut f: impl FnMut(&Symbol)) {
        if let Dim::Sym(p) = self {
            p.terms.keys().flat_map(|m| m.iter()).for_each(&mut f);
        }
    }

    /// The symbol this dim is, when it is exactly one symbol (`seq`, not `2*seq` or `seq+1`).
    pub fn as_symbol(&self) -> Option<&Symbol> {
        let Dim::Sym(p) = self else { return None };
        let mut terms = p.terms.iter();
        match (terms.next(), terms.next()) {
            (Some((m, 1)), None) if m.len() == 1 => Some(&m[0]),
            _ => None,
        }
    }

    /// The terms of this dim in printed order (highest degree first, then by symbol name; the
    /// constant last): each the symbols it multiplies and its coefficient. `0` has none.
    pub fn terms(&self) -> Vec<(Vec<Symbol>, i64)> {
        let mut terms: Vec<(Vec<Symbol>, i64)> = self.to_terms().into_iter().map(|(m, c)| (m.into_vec(), c)).collect();
        terms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        terms
    }

    /// Every symbol this dim mentions, sorted and deduplicated.
    pub fn symbols(&self) -> Vec<Symbol> {
        let mut out = Vec::new();
        self.for_each_symbol(|s| out.push(s.clone()));
        out.sort();
        out.dedup();
        out
    }

    /// Evaluates this dim with the given symbol values.
    pub fn eval(&self, bindings: &Bindings) -> Result<i64, DimError> {
        match self {
            Dim::Const(c) => Ok(*c),
            Dim::Sym(p) => {
                let mut total: i64 = 0;
                for (m, c) in &p.terms {
                    let mut v = *c;
                    for s in m {
                        let x = *bindings.get(s).ok_or_else(|| DimError::Unbound(s.clone()))?;
                        v = v.checked_mul(x).ok_or(DimError::Overflow)?;
                    }
                    total = total.checked_add(v).ok_or(DimError::Overflow)?;
                }
                Ok(total)
            }
        }
    }

    /// `self / d` if the division is exact for every symbol value (every coefficient divides).
    pub fn exact_div(&self, d: i64) -> Option<Dim> {
        if d == 0 {
            return None;
        }
        let mut terms = BTreeMap::new();
        for (m, c) in self.to_terms() {
            if c.checked_rem(d)? != 0 {
                return None;
            }
            terms.insert(m, c.checked_div(d)?);
        }
        Some(Dim::from_terms(terms))
    }

    /// `self / d` if the division is exact for every symbol value, where `d` is a constant or a
    /// single term (`4*seq*seq`): every term of `self` must hold `d`'s symbols and a multiple of
    /// its coefficient (`4*batch*seq*seq / 4*seq*seq` is `batch`). `None` otherwise, and for a
    /// `d` of several terms (`start + seq`), which this does not divide.
    pub fn exact_div_dim(&self, d: &Dim) -> Option<Dim> {
        let (m, c) = match d {
            Dim::Const(c) => return self.exact_div(*c),
            Dim::Sym(p) if p.terms.len() == 1 => p.terms.iter().next()?,
            Dim::Sym(_) => return None,
        };
        let mut terms = BTreeMap::new();
        for (mut t, tc) in self.to_terms() {
            if tc.checked_rem(*c)? != 0 {
                return None;
            }
            // Remove `m`'s symbols from `t` (both sorted multisets).
            for s in m {
                let at = t.iter().position(|x| x == s)?;
                t.remove(at);
            }
            terms.insert(t, tc.checked_div(*c)?);
        }
        Some(Dim::from_terms(terms))
    }

    /// `floor(self / d)` for a positive `d`: the exact quotient where every coefficient divides
    /// (`exact_div`), a constant's quotient, or else a *derived* symbol standing for the floor,
    /// named `⌊(self)/d⌋` and defined once per process ([`close_derived`] binds it from the
    /// symbols `self` mentions). A strided window's output size, `⌊(h - 7)/2⌋ + 1`, is one:
    /// polynomials have no floor, so the floor is a symbol of its own. `None` for `d <= 0`.
    ///
    /// The numerator is first reduced so that one floor has one name whatever form it came in:
    /// each coefficient `c = q*d + r` with `0 <= r < d` puts `q` times its term outside the floor
    /// (`⌊(h - 8)/4⌋` is `⌊h/4⌋ - 2`, as torch.export writes it).
    pub fn floor_div(&self, d: i64) -> Option<Dim> {
        if d <= 0 {
            return None;
        }
        let (mut whole, mut rest) = (BTreeMap::new(), BTreeMap::new());
        for (m, c) in self.to_terms() {
            let (q, r) = (c.div_euclid(d), c.rem_euclid(d));
            if q != 0 {
                whole.insert(m.clone(), q);
            }
            if r != 0 {
                rest.insert(m, r);
            }
        }
        let (whole, rest) = (Dim::from_terms(whole), Dim::from_terms(rest));
        // A floor of a floor plus a constant is one floor: `⌊(⌊p/a⌋ + c)/d⌋ = ⌊(p + a*c)/(a*d)⌋`
        // (strided windows in a row; torch.export writes the right-hand side).
        let mut inner = None;
        let mut c = 0;
        for (symbols, coefficient) in rest.terms() {
            match (symbols.as_slice(), coefficient) {
                ([], k) => c = k,
                ([s], 1) if inner.is_none() => match derived::definition(s) {
                    Some(def) => inner = Some(def),
                    None => return Some(whole + derived::floor(rest, d)),
                },
                _ => return Some(whole + derived::floor(rest, d)),
            }
        }
        Some(match (rest, inner) {
            // `0 <= rest < d`: its floor is 0.
            (Dim::Const(_), _) => whole,
            (_, Some((p, a))) => match (a.checked_mul(c), a.checked_mul(d)) {
                (Some(ac), Some(ad)) => whole + (p + Dim::Const(ac)).floor_div(ad)?,
                _ => whole + derived::floor(rest, d),
            },
            (rest, None) => whole + derived::floor(rest, d),
        })
    }

    /// Parses the form `Display` prints: integers, symbols, `+`, `-`, `*` and parentheses.
    pub fn parse(text: &str) -> Result<Dim, String> {
        let mut p = DimParser { s: text.as_bytes(), i: 0, depth: 0 };
        let d = p.sum()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("unexpected `{}` in dim `{text}`", &text[p.i..]));
        }
        Ok(d)
    }
}

impl From<i64> for Dim {
    fn from(c: i64) -> Dim {
        Dim::Const(c)
    }
}
impl From<usize> for Dim {
    fn from(c: usize) -> Dim {
        Dim::Const(c as i64)
    }
}
impl From<i32> for Dim {
    fn from(c: i32) -> Dim {
        Dim::Const(c as i64)
    }
}
impl From<&str> for Dim {
    fn from(name: &str) -> Dim {
        Dim::sym(name)
    }
}

/// Coefficient arithmetic: checked (the parser reports overflow) or wrapping (the operators, so that
/// a huge user-supplied dim never panics a debug build; release builds wrap the same way).
#[derive(Clone, Copy)]
enum Arith {
    Checked,
    Wrapping,
}

impl Arith {
    fn add(self, a: i64, b: i64) -> Option<i64> {
        match self {
            Arith::Checked => a.checked_add(b),
            Arith::Wrapping => Some(a.wrapping_add(b)),
        }
    }
    fn mul(self, a: i64, b: i64) -> Option<i64> {
        match self {
            Arith::Checked => a.checked_mul(b),
            Arith::Wrapping => Some(a.wrapping_mul(b)),
        }
    }
}

fn add_polys(a: Terms, b: &Terms, sign: i64, arith: Arith) -> Option<Terms> {
    let mut terms = a;
    for (m, c) in b {
        let e = terms.entry(m.clone()).or_insert(0);
        *e = arith.add(*e, arith.mul(sign, *c)?)?;
        if *e == 0 {
            terms.remove(m);
        }
    }
    Some(terms)
}

fn mul_polys(a: &Terms, b: &Terms, arith: Arith) -> Option<Terms> {
    let mut terms = Terms::new();
    for (ma, ca) in a {
        for (mb, cb) in b {
            let mut m: Monomial = ma.iter().chain(mb.iter()).cloned().collect();
            m.sort();
            let e = terms.entry(m.clone()).or_insert(0);
            *e = arith.add(*e, arith.mul(*ca, *cb)?)?;
            if *e == 0 {
                terms.remove(&m);
            }
        }
    }
    Some(terms)
}

fn combine(a: &Dim, b: &Dim, op: char, arith: Arith) -> Option<Dim> {
    match (a, b) {
        (Dim::Const(x), Dim::Const(y)) => {
            return match op {
                '+' => arith.add(*x, *y),
                '-' => arith.add(*x, arith.mul(*y, -1)?),
                _ => arith.mul(*x, *y),
            }
            .map(Dim::Const);
        }
        // Adding 0 or multiplying by 1 or 0 keeps the other polynomial (shared, not rebuilt):
        // view offsets and strides do this all the time, and a rebuilt polynomial is a new tree.
        (p, Dim::Const(0)) if op != '*' => return Some(*p),
        (Dim::Const(0), p) if op == '+' => return Some(*p),
        (p, Dim::Const(1)) | (Dim::Const(1), p) if op == '*' => return Some(*p),
        (_, Dim::Const(0)) | (Dim::Const(0), _) if op == '*' => return Some(Dim::Const(0)),
        (Dim::Sym(x), Dim::Sym(y)) if op == '-' && x == y => return Some(Dim::Const(0)),
        _ => {}
    }
    memo::get_or_insert(a, b, op, arith, || {
        let terms = match op {
            '+' => add_polys(a.to_terms(), &b.to_terms(), 1, arith)?,
            '-' => add_polys(a.to_terms(), &b.to_terms(), -1, arith)?,
            _ => mul_polys(&a.to_terms(), &b.to_terms(), arith)?,
        };
        Some(Dim::from_terms(terms))
    })
}

/// A small per-thread memo of polynomial arithmetic. Building a graph and lowering it combine the
/// same symbolic dims over and over (every node's element count is `batch*seq*64`, every view's
/// offset a sum of the same strides), and each combination builds a new polynomial: a tree map
/// and its monomials, a dozen allocations, then looks it up in the interner. The memo answers a
/// repeated combination with the polynomial found the first time.
///
/// Entries are found by operand identity (a constant's value, an interned polynomial's address,
/// which no other polynomial ever takes). The memo is direct-mapped: a colliding combination
/// replaces the entry, so it never grows past [`memo::SLOTS`] entries. Results are the same with
/// or without it: the arithmetic is a pure function of the operands' values, and the interner
/// returns the one polynomial of a value either way.
mod memo {
    use std::cell::RefCell;

    use super::{Arith, Dim};

    /// Entries per thread.
    pub(super) const SLOTS: usize = 1024;

    #[derive(Clone, Copy)]
    struct Entry {
        op: u8,
        a: Dim,
        b: Dim,
        out: Option<Dim>,
    }

    thread_local! {
        static MEMO: RefCell<Vec<Option<Entry>>> = RefCell::new(vec![None; SLOTS]);
    }

    /// The operand's identity: a constant's value, or its polynomial's address.
    fn id(d: &Dim) -> u64 {
        match d {
            Dim::Const(c) => *c as u64,
            Dim::Sym(p) => *p as *const super::Poly as u64,
        }
    }

    /// Symbols remembered per thread (a decoding step names its symbols on every call).
    const SYMBOL_SLOTS: usize = 64;

    thread_local! {
        static SYMBOLS: RefCell<Vec<Option<Dim>>> = RefCell::new(vec![None; SYMBOL_SLOTS]);
    }

    /// The dim of the symbol `name`, built by `compute` the first time (direct-mapped by the
    /// name's hash, like the arithmetic).
    pub(super) fn symbol(name: &str, compute: impl FnOnce() -> Dim) -> Dim {
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        let slot = (h >> 32) as usize % SYMBOL_SLOTS;
        let hit = SYMBOLS
            .with_borrow(|m| m[slot].as_ref().filter(|d| d.as_symbol().is_some_and(|s| s.name() == name)).copied());
        if let Some(d) = hit {
            return d;
        }
        let d = compute();
        SYMBOLS.with_borrow_mut(|m| m[slot] = Some(d));
        d
    }

    /// `compute()`'s value for `a op b`, remembered.
    pub(super) fn get_or_insert(
        a: &Dim,
        b: &Dim,
        op: char,
        arith: Arith,
        compute: impl FnOnce() -> Option<Dim>,
    ) -> Option<Dim> {
        let op = (op as u8) << 1 | matches!(arith, Arith::Checked) as u8;
        let h = (id(a).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ id(b).rotate_left(29) ^ u64::from(op))
            .wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let slot = (h >> 54) as usize % SLOTS;
        let hit = MEMO.with_borrow(|m| match &m[slot] {
            Some(e) if e.op == op && e.a == *a && e.b == *b => Some(e.out),
            _ => None,
        });
        if let Some(out) = hit {
            return out;
        }
        let out = compute();
        MEMO.with_borrow_mut(|m| m[slot] = Some(Entry { op, a: *a, b: *b, out }));
        out
    }
}

impl Dim {
    /// `self + rhs`, or `None` if a coefficient overflows i64.
    pub fn checked_add(&self, rhs: &Dim) -> Option<Dim> {
        combine(self, rhs, '+', Arith::Checked)
    }
    /// `self - rhs`, or `None` if a coefficient overflows i64.
    pub fn checked_sub(&self, rhs: &Dim) -> Option<Dim> {
        combine(self, rhs, '-', Arith::Checked)
    }
    /// `self * rhs`, or `None` if a coefficient overflows i64.
    pub fn checked_mul(&self, rhs: &Dim) -> Option<Dim> {
        combine(self, rhs, '*', Arith::Checked)
    }
}

/// Wrapping arithmetic never fails, so these `unwrap_or` fallbacks are never taken.
impl std::ops::Add for &Dim {
    type Output = Dim;
    fn add(self, rhs: &Dim) -> Dim {
        combine(self, rhs, '+', Arith::Wrapping).unwrap_or(Dim::Const(0))
    }
}
impl std::ops::Sub for &Dim {
    type Output = Dim;
    fn sub(self, rhs: &Dim) -> Dim {
        combine(self, rhs, '-', Arith::Wrapping).unwrap_or(Dim::Const(0))
    }
}
impl std::ops::Mul for &Dim {
    type Output = Dim;
    fn mul(self, rhs: &Dim) -> Dim {
        combine(self, rhs, '*', Arith::Wrapping).unwrap_or(Dim::Const(0))
    }
}
macro_rules! owned_ops {
    ($($tr:ident $f:ident),*) => {$(
        impl std::ops::$tr for Dim {
            type Output = Dim;
            fn $f(self, rhs: Dim) -> Dim { std::ops::$tr::$f(&self, &rhs) }
        }
        impl std::ops::$tr<i64> for &Dim {
            type Output = Dim;
            fn $f(self, rhs: i64) -> Dim { std::ops::$tr::$f(self, &Dim::Const(rhs)) }
        }
        impl std::ops::$tr<i64> for Dim {
            type Output = Dim;
            fn $f(self, rhs: i64) -> Dim { std::ops::$tr::$f(&self, &Dim::Const(rhs)) }
        }
    )*};
}
owned_ops!(Add add, Sub sub, Mul mul);

impl fmt::Display for Dim {
    /// Terms print highest degree first, then by symbol name; the constant term comes last:
    /// `batch*seq + 2*seq - 1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Const(c) => write!(f, "{c}"),
            Dim::Sym(p) => {
                let mut terms: Vec<(&Monomial, i64)> = p.terms.iter().map(|(m, c)| (m, *c)).collect();
                terms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
                for (i, (m, c)) in terms.into_iter().enumerate() {
                    let (neg, mag) = (c < 0, c.unsigned_abs());
                    match (i, neg) {
                        (0, true) => f.write_str("-")?,
                        (0, false) => {}
                        (_, true) => f.write_str(" - ")?,
                        (_, false) => f.write_str(" + ")?,
                    }
                    if m.is_empty() {
                        write!(f, "{mag}")?;
                        continue;
                    }
                    if mag != 1 {
                        write!(f, "{mag}*")?;
                    }
                    for (j, s) in m.iter().enumerate() {
                        if j > 0 {
                            f.write_str("*")?;
                        }
                        write!(f, "{s}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn overflow(d: Option<Dim>) -> Result<Dim, String> {
    d.ok_or_else(|| "dim expression overflowed i64".to_string())
}

struct DimParser<'a> {
    s: &'a [u8],
    i: usize,
    /// Parenthesis nesting, bounded so that hostile input cannot overflow the stack.
    depth: u32,
}

impl DimParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }
    fn sum(&mut self) -> Result<Dim, String> {
        let mut acc = if self.peek() == Some(b'-') {
            self.i += 1;
            overflow(Dim::Const(0).checked_sub(&self.product()?))?
        } else {
            self.product()?
        };
        loop {
            match self.peek() {
                Some(b'+') => {
                    self.i += 1;
                    acc = overflow(acc.checked_add(&self.product()?))?;
                }
                Some(b'-') => {
                    self.i += 1;
                    acc = overflow(acc.checked_sub(&self.product()?))?;
                }
                _ => return Ok(acc),
            }
        }
    }
    fn product(&mut self) -> Result<Dim, String> {
        let mut acc = self.atom()?;
        while self.peek() == Some(b'*') {
            self.i += 1;
            acc = overflow(acc.checked_mul(&self.atom()?))?;
        }
        Ok(acc)
    }
    fn atom(&mut self) -> Result<Dim, String> {
        match self.peek() {
            Some(b'(') => {
                self.i += 1;
                self.depth += 1;
                if self.depth > 64 {
                    return Err("dim nested too deeply".into());
                }
                let d = self.sum()?;
                self.depth -= 1;
                if self.peek() != Some(b')') {
                    return Err("expected `)` in dim".into());
                }
                self.i += 1;
                Ok(d)
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                    self.i += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                t.parse::<i64>().map(Dim::Const).map_err(|e| format!("bad dim `{t}`: {e}"))
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.i;
                while self.i < self.s.len() && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_') {
                    self.i += 1;
                }
                Ok(Dim::sym(std::str::from_utf8(&self.s[start..self.i]).unwrap()))
            }
            _ => Err("expected a number, a symbol or `(` in dim".into()),
        }
    }
}

/// A shape: one `Dim` per axis. Four axes fit inline.
pub type Shape = SmallVec<[Dim; 4]>;

/// Builds a shape of constant dims.
pub fn shape_of(dims: &[usize]) -> Shape {
    dims.iter().map(|&d| Dim::Const(d as i64)).collect()
}

/// The number of elements of `shape` as a dim (the product of its dims), with wrapping
/// arithmetic: only for shapes already known to pass [`checked_numel`] (every node of a graph the
/// verifier accepted, every tensor the facade built), or for comparing two products.
pub fn numel(shape: &[Dim]) -> Dim {
    // The constants first, as in `checked_numel`.
    let c = shape.iter().fold(1i64, |c, d| if let Dim::Const(v) = d { c.wrapping_mul(*v) } else { c });
    shape.iter().filter(|d| !d.is_const()).fold(Dim::Const(c), |acc, d| &acc * d)
}

/// The number of elements of `shape`, or `None` if the product (or, for a symbolic shape, one of
/// its polynomial's coefficients) overflows `i64`.
pub fn checked_numel(shape: &[Dim]) -> Option<Dim> {
    // The constants multiplied as integers first: one polynomial product per symbolic dim, not
    // one per dim (`[10, seq, 8, 8]` is `640 * seq`; the verifier and type inference count every
    // node's elements).
    let mut c: i64 = 1;
    for d in shape {
        if let Dim::Const(v) = d {
            c = c.checked_mul(*v)?;
        }
    }
    shape.iter().filter(|d| !d.is_const()).try_fold(Dim::Const(c), |acc, d| acc.checked_mul(d))
}

/// The element count of `shape` with elements of `elem_bytes` bytes, checked: an error if the
/// count overflows, or if a constant count's bytes exceed `isize::MAX` (no allocation can be
/// that large). A symbolic count passes if its polynomial does not overflow; its value is
/// checked when the symbols are bound.
pub fn checked_size(shape: &[Dim], elem_bytes: usize) -> Result<Dim, String> {
    let n =
        checked_numel(shape).ok_or_else(|| format!("the element count of shape {} overflows", ShapeDisplay(shape)))?;
    if let Some(c) = n.as_const() {
        if c < 0 {
            return Err(format!("shape {} has a negative element count", ShapeDisplay(shape)));
        }
        let bytes = usize::try_from(c).ok().and_then(|c| c.checked_mul(elem_bytes));
        if bytes.is_none_or(|b| b > isize::MAX as usize) {
            return Err(format!(
                "shape {} has {c} elements of {elem_bytes} bytes, more than any allocation can hold",
                ShapeDisplay(shape)
            ));
        }
    }
    Ok(n)
}

/// Evaluates every dim of `shape`.
pub fn eval_shape(shape: &[Dim], bindings: &Bindings) -> Result<Vec<usize>, DimError> {
    shape.iter().map(|d| d.eval(bindings).map(|v| v.max(0) as usize)).collect()
}

/// Prints a shape as `[4, seq, 2*seq]`.
pub struct ShapeDisplay<'a>(pub &'a [Dim]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_division_is_exact_constant_or_a_derived_symbol() {
        let h = Dim::sym("h");
        assert_eq!(Dim::Const(7).floor_div(2), Some(Dim::Const(3)));
        assert_eq!(Dim::Const(-7).floor_div(2), Some(Dim::Const(-4)));
        assert_eq!((Dim::Const(4) * h).floor_div(2), Some(Dim::Const(2) * h));
        assert_eq!(h.floor_div(0), None);
        // `⌊(h - 7)/2⌋ + 1`, and a floor of that: one symbol each, the same one when asked again
        // and for every form of the same floor (`⌊(h + 1)/2⌋ - 4 + 1`).
        let out = (h - 7).floor_div(2).unwrap() + 1;
        assert_eq!(out, (h + 1).floor_div(2).unwrap() - 3);
        assert_eq!((Dim::Const(5) * h).floor_div(4).unwrap(), h + h.floor_div(4).unwrap());
        let out2 = (out - 3).floor_div(2).unwrap() + 1;
        // A floor of a floor plus a constant is one floor (`⌊(⌊(h + 3)/4⌋ + 1)/2⌋ = ⌊(h + 7)/8⌋`).
        let nested = ((h + 3).floor_div(4).unwrap() + 1).floor_div(2).unwrap();
        assert_eq!(nested, (h + 7).floor_div(8).unwrap());
        for (hv, want, want2) in [(32i64, 13i64, 6i64), (45, 20, 9), (7, 1, 0)] {
            let mut b = Bindings::new();
            b.insert(Symbol::new("h"), hv);
            close_derived(&mut b).unwrap();
            assert_eq!((out.eval(&b).unwrap(), out2.eval(&b).unwrap()), (want, want2), "h = {hv}");
        }
        // Unbound inputs leave it unbound; a value bound against its definition is an error.
        let mut b = Bindings::new();
        close_derived(&mut b).unwrap();
        assert!(out.eval(&b).is_err());
        let name = (h - 7).floor_div(2).unwrap().symbols().into_iter().find(|s| s.name() != "h").unwrap();
        assert_eq!(name.name(), "⌊(h + 1)/2⌋");
        b.insert(Symbol::new("h"), 32);
        b.insert(name.clone(), 99);
        assert_eq!(close_derived(&mut b), Err((name, 99, 16)));
    }

    #[test]
    fn exact_division_by_a_term() {
        let (b, seq, start) = (Dim::sym("batch"), Dim::sym("seq"), Dim::sym("start"));
        let total = Dim::Const(4) * b * seq * seq;
        assert_eq!(total.exact_div_dim(&(Dim::Const(4) * seq * seq)), Some(b));
        assert_eq!(total.exact_div_dim(&(Dim::Const(2) * seq)), Some(Dim::Const(2) * b * seq));
        assert_eq!(total.exact_div_dim(&Dim::Const(8)), None);
        // A symbol the dividend lacks, or a power it has too few of.
        assert_eq!(total.exact_div_dim(&start), None);
        assert_eq!(total.exact_div_dim(&(seq * seq * seq)), None);
        // Every term divides, or the division is not exact.
        let sum = Dim::Const(6) * b * (start + seq);
        assert_eq!(sum.exact_div_dim(&(Dim::Const(3) * b)), Some(Dim::Const(2) * (start + seq)));
        assert_eq!((sum + 1).exact_div_dim(&b), None);
        // Several terms are not divided.
        assert_eq!(sum.exact_div_dim(&(start + seq)), None);
    }

    #[test]
    fn dims_are_canonical() {
        let seq = Dim::sym("seq");
        let b = Dim::sym("batch");
        let a = (&seq * 2) + (b * seq);
        let c = (seq * b) + (seq + seq);
        assert_eq!(a, c);
        assert_eq!(a.to_string(), "batch*seq + 2*seq");
        assert_eq!(a - a, Dim::Const(0));
        assert_eq!(Dim::parse(&a.to_string()).unwrap(), a);
        assert_eq!(Dim::parse("-(seq - 1)*3").unwrap().to_string(), "-3*seq + 3");
        let mut bind = Bindings::new();
        bind.insert(Symbol::new("seq"), 7);
        bind.insert(Symbol::new("batch"), 3);
        assert_eq!(a.eval(&bind), Ok(35));
        assert_eq!(std::mem::size_of::<Dim>(), 16);
    }

    #[test]
    fn a_plain_symbol_is_known_and_named_once_per_thread() {
        let seq = Dim::sym("seq");
        assert_eq!(seq.as_symbol().map(Symbol::name), Some("seq"));
        for not_plain in [&seq * 2, &seq + 1, seq * Dim::sym("b"), Dim::Const(3)] {
            assert_eq!(not_plain.as_symbol(), None, "{not_plain}");
        }
        // Named again, a symbol shares the polynomial built the first time; another name (even
        // one sharing its slot) gets its own.
        assert!(matches!((&seq, &Dim::sym("seq")), (Dim::Sym(x), Dim::Sym(y)) if std::ptr::eq(*x, *y)));
        let names: Vec<String> = (0..200).map(|i| format!("s{i}")).collect();
        let dims: Vec<Dim> = names.iter().map(|n| Dim::sym(n)).collect();
        for (n, d) in names.iter().zip(&dims) {
            assert_eq!(Dim::sym(n), *d);
            assert_eq!(d.as_symbol().map(Symbol::name), Some(n.as_str()));
        }
    }

    #[test]
    fn huge_dims_never_panic() {
        assert!(Dim::parse("9223372036854775807 + 1").is_err());
        assert!(Dim::parse("-(-9223372036854775807 - 1)").is_err());
        assert!(Dim::parse("4294967296*4294967296*seq").is_err());
        assert_eq!(Dim::parse("-9223372036854775807 - 1"), Ok(Dim::Const(i64::MIN)));
        let big = Dim::Const(i64::MAX);
        assert_eq!(&big + 1, Dim::Const(i64::MIN));
        assert_eq!(big.checked_add(&Dim::Const(1)), None);
        assert_eq!(Dim::Const(i64::MIN).exact_div(-1), None);
        assert!(Dim::parse(&"(".repeat(100_000)).is_err());
    }

    #[test]
    fn sizes_are_checked() {
        let big = shape_of(&[1 << 32, 1 << 32]);
        assert_eq!(numel(&big), Dim::Const(0)); // wrapping: why callers must check first
        assert_eq!(checked_numel(&big), None);
        assert!(checked_size(&big, 4).unwrap_err().contains("[4294967296, 4294967296]"));
        // Fits in i64 but not in memory at 4 bytes an element.
        let huge = shape_of(&[1 << 31, 1 << 31]);
        assert_eq!(checked_numel(&huge), Some(Dim::Const(1 << 62)));
        assert!(checked_size(&huge, 4).unwrap_err().contains("more than any allocation"));
        assert_eq!(checked_size(&huge, 1), Ok(Dim::Const(1 << 62)));
        // A symbolic shape is checked as far as its polynomial goes.
        let seq = Dim::sym("seq");
        let sym: Shape = smallvec::smallvec![seq, Dim::Const(1 << 40), Dim::Const(1 << 40)];
        assert!(checked_size(&sym, 4).is_err());
        let fine: Shape = smallvec::smallvec![seq, Dim::Const(1 << 40)];
        assert_eq!(checked_size(&fine, 4), Ok(seq * (1i64 << 40)));
        assert_eq!(checked_size(&[], 8), Ok(Dim::Const(1)));
    }

    #[test]
    fn remembered_arithmetic_answers_by_value() {
        let seq = Dim::sym("seq");
        // A repeated combination shares the polynomial built the first time.
        let (a, b) = (&seq * 64, &seq * 64);
        assert!(matches!((&a, &b), (Dim::Sym(x), Dim::Sym(y)) if std::ptr::eq(*x, *y)));
        // Checked and wrapping arithmetic are remembered apart: the same operands overflow in one
        // and wrap in the other.
        let huge = Dim::Const(1 << 62);
        assert_eq!(seq.checked_mul(&huge).and_then(|d| d.checked_mul(&Dim::Const(6))), None);
        assert_eq!(&(seq * huge) * 6, seq * i64::MIN);
        // An operand dropped while its combinations are remembered: a new polynomial of the same
        // size, possibly at the freed address, must not be answered with the old one's result.
        for k in 1..200i64 {
            let p = seq + k;
            assert_eq!((&p * 2).to_string(), format!("2*seq + {}", 2 * k));
            assert_eq!((p - seq), Dim::Const(k));
        }
        // Many distinct combinations: entries are replaced, never wrong.
        let b = Dim::sym("batch");
        for k in 0..(4 * memo::SLOTS as i64) {
            let want = match k {
                0 => "seq".to_string(),
                1 => "batch + seq".to_string(),
                _ => format!("{k}*batch + seq"),
            };
            assert_eq!(((b * k) + seq).to_string(), want);
        }
    }

    #[test]
    fn equal_polynomials_are_one_whatever_thread_or_route_built_them() {
        let here = Dim::sym("rows") * 2 + 1;
        let parsed = Dim::parse("2*rows + 1").unwrap();
        let there = std::thread::spawn(|| Dim::sym("rows") + Dim::sym("rows") + 1).join().unwrap();
        for d in [parsed, there] {
            assert!(matches!((here, d), (Dim::Sym(x), Dim::Sym(y)) if std::ptr::eq(x, y)));
            assert_eq!(here, d);
        }
        assert_ne!(here, Dim::sym("rows") * 2);
        assert_eq!((here - 1).exact_div(2), Some(Dim::sym("rows")));
    }
}

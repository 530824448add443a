//! View tracking: how a kernel's loop indices map to element positions in a buffer, through any
//! chain of movement ops (reshape, permute, expand, pad, shrink), without ever copying.
//!
//! A `View` is a strided window (shape, strides, offset, optional validity mask) over the linear
//! positions of what lies below it. Movement ops compose into the top view of a `ViewStack` when
//! they can (permute and shrink always can; expand unless it broadcasts a dim whose mask is
//! symbolic; pad unless a valid range is not provably inside its dim; reshape when the dims it
//! merges are contiguous with each other). One that cannot pushes a new contiguous view: for a
//! reshape, the index of the view below is then recovered with div/mod, which is the only place
//! div/mod index math comes from. Dims stay symbolic (`air::Dim`) while views compose, so that merging decisions
//! compare canonical polynomials; `IndexCx` turns them into kir `IExpr`s at the end, with symbol
//! `n` of `Program::symbols` as `IExpr::Sym(n)`, and simplifies div/mod of affine expressions with
//! the known loop extents (`(i0*6 + i1) / 6` is `i0` when `i1 < 6`).

use smallvec::SmallVec;

use air::{Dim, Shape, Symbol};

use crate::error::LowerError;
use crate::kir::IExpr;

/// One movement op, with its attributes, as the view tracker applies it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Movement {
    /// `reshape` to this shape (same element count, row-major order).
    Reshape(Shape),
    /// `permute`: output axis `i` is input axis `perm[i]`.
    Permute(Vec<usize>),
    /// `expand` of size-1 axes to this shape (same rank).
    Expand(Shape),
    /// `pad` by `(before, after)` elements on each axis.
    Pad(Vec<(Dim, Dim)>),
    /// `shrink` to the `(start, end)` range of each axis.
    Shrink(Vec<(Dim, Dim)>),
}

/// A strided window: the element at multi-index `idx` is position
/// `offset + sum(idx[d] * strides[d])` of what lies below, and exists only where every
/// `mask[d] = (lo, hi)` holds `lo <= idx[d] < hi` (elsewhere it is padding).
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    /// The shape this view presents.
    pub shape: Shape,
    /// The stride of each dim, in positions of what lies below (0 for an expanded dim).
    pub strides: Shape,
    /// The position of multi-index zero.
    pub offset: Dim,
    /// Per dim, the `[lo, hi)` range of indices that exist; `None` if every index does.
    pub mask: Option<Vec<(Dim, Dim)>>,
}

fn is_one(d: &Dim) -> bool {
    d.as_const() == Some(1)
}

fn is_zero(d: &Dim) -> bool {
    d.as_const() == Some(0)
}

/// Row-major strides of `shape`.
pub fn row_major(shape: &[Dim]) -> Shape {
    let mut strides: Shape = smallvec::smallvec![Dim::Const(1); shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// A value to decide the order of symbolic sizes by; equality is always checked exactly.
fn probe(d: &Dim) -> i64 {
    let mut b = air::Bindings::new();
    for s in d.symbols() {
        b.insert(s, 7);
    }
    d.eval(&b).unwrap_or(i64::MAX)
}

impl View {
    /// The row-major, unmasked view of `shape` at offset 0.
    pub fn contiguous(shape: &[Dim]) -> View {
        View { shape: shape.into(), strides: row_major(shape), offset: Dim::Const(0), mask: None }
    }

    /// Whether the mask of dim `d` keeps every index of the dim.
    pub fn mask_trivial(&self, d: usize) -> bool {
        match &self.mask {
            None => true,
            Some(m) => range_covers(&m[d], &self.shape[d]),
        }
    }

    fn normalize_mask(&mut self) {
        if (0..self.shape.len()).all(|d| self.mask_trivial(d)) {
            self.mask = None;
        }
    }

    fn mask_or_full(&self) -> Vec<(Dim, Dim)> {
        match &self.mask {
            Some(m) => m.clone(),
            None => self.shape.iter().map(|s| (Dim::Const(0), *s)).collect(),
        }
    }

    /// Whether dims `d` and `d + 1` can become one dim of this view.
    pub fn mergeable(&self, d: usize) -> bool {
        if !self.mask_trivial(d) || !self.mask_trivial(d + 1) {
            return false;
        }
        is_one(&self.shape[d])
            || is_one(&self.shape[d + 1])
            || self.strides[d] == self.strides[d + 1] * self.shape[d + 1]
    }

    fn permute(&self, perm: &[usize]) -> View {
        View {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
            mask: self.mask.as_ref().map(|m| perm.iter().map(|&p| m[p]).collect()),
        }
    }

    /// `None` when a broadcast size-1 dim carries a mask whose truth is not a constant.
    fn expand(&self, shape: &[Dim]) -> Option<View> {
        let mut v = self.clone();
        let mut mask = self.mask_or_full();
        for d in 0..shape.len() {
            if shape[d] == self.shape[d] {
                continue;
            }
            v.strides[d] = Dim::Const(0);
            let (lo, hi) = &mask[d];
            let valid = match (lo.as_const(), hi.as_const()) {
                (Some(lo), Some(hi)) => lo <= 0 && 0 < hi,
                _ => return None,
            };
            mask[d] = (Dim::Const(0), if valid { shape[d] } else { Dim::Const(0) });
        }
        v.shape = shape.into();
        v.mask = Some(mask);
        v.normalize_mask();
        Some(v)
    }

    fn shrink(&self, ranges: &[(Dim, Dim)]) -> View {
        let mut offset = self.offset;
        for (d, (start, _)) in ranges.iter().enumerate() {
            offset = offset + (start * &self.strides[d]);
        }
        let mask =
            self.mask.as_ref().map(|m| m.iter().zip(ranges).map(|((lo, hi), (s, _))| (lo - s, hi - s)).collect());
        let mut v =
            View { shape: ranges.iter().map(|(s, e)| e - s).collect(), strides: self.strides.clone(), offset, mask };
        v.normalize_mask();
        v
    }

    /// `None` when the valid range of some dim is not known to lie within the dim (a range
    /// reaching past a shrunk dim's symbolic edge): the padding then goes on a view of its own.
    fn pad(&self, padding: &[(Dim, Dim)]) -> Option<View> {
        let mut offset = self.offset;
        for (d, (before, _)) in padding.iter().enumerate() {
            offset = offset - (before * &self.strides[d]);
        }
        // The valid range is clamped to the dim before it is shifted: past the old edges lie the
        // new padding's positions, which a range reaching beyond them (left by a shrink) must
        // not cover. A range whose clamp is not a constant cannot be expressed in the mask (a
        // range `0..m` over a dim shrunk to 0 had kept `m` rows valid).
        let mut mask = Vec::with_capacity(self.shape.len());
        for (((lo, hi), size), (b, _)) in self.mask_or_full().iter().zip(&self.shape).zip(padding) {
            let lo = match lo.as_const() {
                Some(l) => Dim::Const(l.max(0)),
                None if lo.provably_nonneg() => *lo,
                None => return None,
            };
            let hi = match (hi.as_const(), size.as_const()) {
                (Some(h), Some(s)) => Dim::Const(h.min(s)),
                _ if (size - hi).provably_nonneg() => *hi,
                _ => return None,
            };
            mask.push((&lo + b, &hi + b));
        }
        let mut v = View {
            shape: self.shape.iter().zip(padding).map(|(s, (b, a))| &(s + b) + a).collect(),
            strides: self.strides.clone(),
            offset,
            mask: Some(mask),
        };
        v.normalize_mask();
        Some(v)
    }

    /// Reshapes this view in place of pushing a new one, when every group of dims that the
    /// reshape merges or splits is contiguous and unmasked. `None` otherwise.
    pub(crate) fn reshape(&self, new: &[Dim]) -> Option<View> {
        if self.shape.as_slice() == new {
            return Some(self.clone());
        }
        // Size-1 dims carry nothing but their mask; a masked-out one (empty view) is not merged.
        let mut old: Vec<usize> = Vec::new();
        for d in 0..self.shape.len() {
            if is_one(&self.shape[d]) {
                if !self.mask_trivial(d) {
                    return None;
                }
            } else {
                old.push(d);
            }
        }
        let new_dims: Vec<usize> = (0..new.len()).filter(|&d| !is_one(&new[d])).collect();
        let mut strides: Shape = smallvec::smallvec![Dim::Const(0); new.len()];
        let mut mask: Vec<(Dim, Dim)> = new.iter().map(|s| (Dim::Const(0), *s)).collect();
        let (mut i, mut j) = (0, 0);
        while i < old.len() && j < new_dims.len() {
            let (i0, j0) = (i, j);
            let mut po = self.shape[old[i]];
            let mut pn = new[new_dims[j]];
            i += 1;
            j += 1;
            while po != pn {
                if probe(&po) < probe(&pn) {
                    if i == old.len() {
                        return None;
                    }
                    po = po * self.shape[old[i]];
                    i += 1;
                } else {
                    if j == new_dims.len() {
                        return None;
                    }
                    pn = pn * new[new_dims[j]];
                    j += 1;
                }
            }
            if i - i0 == 1 && j - j0 == 1 {
                strides[new_dims[j0]] = self.strides[old[i0]];
                if let Some(m) = &self.mask {
                    mask[new_dims[j0]] = m[old[i0]];
                }
                continue;
            }
            for a in i0..i {
                if !self.mask_trivial(old[a]) {
                    return None;
                }
                if a + 1 < i && self.strides[old[a]] != self.strides[old[a + 1]] * self.shape[old[a + 1]] {
                    return None;
                }
            }
            let mut stride = self.strides[old[i - 1]];
            for b in (j0..j).rev() {
                strides[new_dims[b]] = stride;
                stride = stride * new[new_dims[b]];
            }
        }
        if i != old.len() || j != new_dims.len() {
            return None;
        }
        let mut v = View { shape: new.into(), strides, offset: self.offset, mask: Some(mask) };
        v.normalize_mask();
        Some(v)
    }
}

/// Whether `lo <= i < hi` holds for every `i` in `0..size`.
fn range_covers((lo, hi): &(Dim, Dim), size: &Dim) -> bool {
    let lo_ok = lo.as_const().is_some_and(|l| l <= 0);
    let hi_ok = hi == size || matches!((hi.as_const(), size.as_const()), (Some(h), Some(s)) if h >= s);
    lo_ok && hi_ok
}

/// The coarsest shape that both `a` and `b` are merges of (size-1 dims dropped), e.g.
/// `[8, 676]` and `[8, 1, 26, 26]` give `[8, 26, 26]`; `None` if there is none (`[2, 3]` and
/// `[3, 2]`) or a symbolic dim would have to be split.
pub fn common_refinement(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let mut a = a.iter().filter(|d| !is_one(d)).cloned();
    let mut b = b.iter().filter(|d| !is_one(d)).cloned();
    let mut out = Vec::new();
    let (mut ra, mut rb) = (a.next(), b.next());
    loop {
        match (ra.take(), rb.take()) {
            (None, None) => return Some(out),
            (Some(x), Some(y)) if x == y => {
                out.push(x);
                (ra, rb) = (a.next(), b.next());
            }
            (Some(x), Some(y)) => {
                let (cx, cy) = (x.as_const()?, y.as_const()?);
                if cx > cy && cy > 0 && cx % cy == 0 {
                    out.push(y);
                    (ra, rb) = (Some(Dim::Const(cx / cy)), b.next());
                } else if cy > cx && cx > 0 && cy % cx == 0 {
                    out.push(x);
                    (ra, rb) = (a.next(), Some(Dim::Const(cy / cx)));
                } else {
                    return None;
                }
            }
            _ => return None,
        }
    }
}

/// A stack of views: `views[0]` addresses the buffer (or, for index-only uses like `iota`, a
/// virtual contiguous tensor of shape `base`); each later view addresses the linear positions of
/// the one below it. The last view's shape is what the consumer sees.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewStack {
    /// The shape of the contiguous tensor `views[0]` addresses.
    pub base: Shape,
    /// The views, bottom first; never empty.
    pub views: Vec<View>,
}

impl ViewStack {
    /// A single contiguous view of a buffer of shape `shape`.
    pub fn contiguous(shape: &[Dim]) -> ViewStack {
        ViewStack { base: shape.into(), views: vec![View::contiguous(shape)] }
    }

    /// The last view: the one the consumer indexes.
    pub fn top(&self) -> &View {
        self.views.last().expect("a view stack is never empty")
    }

    /// The shape the consumer sees (the top view's).
    pub fn shape(&self) -> &[Dim] {
        &self.top().shape
    }

    /// Whether the stack is one view with no mask: its index is affine in the loop variables.
    pub fn is_affine(&self) -> bool {
        self.views.len() == 1 && self.views[0].mask.is_none()
    }

    /// Whether loop dims `d` and `d + 1` of the top view can become one loop without div/mod:
    /// the top view can merge them, and, when it reads a view below it, the merged dim does not
    /// straddle a boundary between two dims of the view below (there the merged index would be
    /// split again by division when the top index is delinearized).
    pub fn mergeable(&self, d: usize) -> bool {
        let top = self.top();
        if !top.mergeable(d) {
            return false;
        }
        let [.., below, _] = self.views.as_slice() else { return true };
        if is_one(&top.shape[d]) || is_one(&top.shape[d + 1]) {
            return true;
        }
        let outer_stride = top.strides[d + 1] * top.shape[d + 1];
        let strides = row_major(&below.shape);
        let real: Vec<usize> = (0..below.shape.len()).filter(|&m| !is_one(&below.shape[m])).collect();
        real.windows(2).all(|pair| strides[pair[0]] != outer_stride)
    }

    /// The shape of the view below the top one when the top view is a plain reshape of it
    /// (contiguous, unmasked, offset 0): the finer loop shape that indexes it without div/mod.
    pub fn reshaped_from(&self) -> Option<&[Dim]> {
        let [.., below, top] = self.views.as_slice() else { return None };
        let plain = top.mask.is_none() && is_zero(&top.offset) && top.strides == row_major(&top.shape);
        plain.then_some(below.shape.as_slice())
    }

    fn push_contiguous(&mut self) {
        let shape = self.shape().to_vec();
        self.views.push(View::contiguous(&shape));
    }

    /// Composes `op` into the top view, or, where it cannot compose, applies it to a new
    /// contiguous view pushed on top (where it always composes).
    fn compose_or_push(&mut self, op: impl Fn(&View) -> Option<View>) {
        let top = self.views.len() - 1;
        if let Some(v) = op(&self.views[top]) {
            self.views[top] = v;
            return;
        }
        self.push_contiguous();
        let top = self.views.len() - 1;
        if let Some(v) = op(&self.views[top]) {
            self.views[top] = v;
        }
    }

    /// Applies one movement op on top of the stack.
    pub fn apply(&mut self, m: &Movement) {
        let top = self.views.len() - 1;
        match m {
            Movement::Reshape(shape) => match self.views[top].reshape(shape) {
                Some(v) => self.views[top] = v,
                None => self.views.push(View::contiguous(shape)),
            },
            Movement::Permute(perm) => self.views[top] = self.views[top].permute(perm),
            Movement::Expand(shape) => self.compose_or_push(|v| v.expand(shape)),
            Movement::Pad(p) => self.compose_or_push(|v| v.pad(p)),
            Movement::Shrink(r) => self.views[top] = self.views[top].shrink(r),
        }
    }

    /// The stack seen through `ops`, applied first to last.
    pub fn through<'a>(mut self, ops: impl IntoIterator<Item = &'a Movement>) -> ViewStack {
        for m in ops {
            self.apply(m);
        }
        self
    }

    /// The buffer index and validity mask of the element at `idx` (one expression per dim of
    /// the top view).
    pub fn index(&self, idx: &[IExpr], cx: &IndexCx) -> Result<(IExpr, Option<IExpr>), LowerError> {
        let mut idx = idx.to_vec();
        let mut valid: Option<IExpr> = None;
        for k in (0..self.views.len()).rev() {
            let v = &self.views[k];
            if let Some(mask) = &v.mask {
                for (d, range) in mask.iter().enumerate() {
                    if let Some(c) = cx.range_cond(&idx[d], range, &v.shape[d])? {
                        valid = Some(match valid {
                            None => c,
                            Some(p) => IExpr::and(p, c),
                        });
                    }
                }
            }
            let mut lin = IExpr::Const(0);
            for ((i, size), stride) in idx.iter().zip(&v.shape).zip(&v.strides) {
                if is_one(size) || is_zero(stride) {
                    continue;
                }
                lin = IExpr::add(lin, IExpr::mul(i.clone(), cx.dim(stride)?));
            }
            lin = cx.canon(IExpr::add(lin, cx.dim(&v.offset)?));
            if k == 0 {
                return Ok((lin, valid));
            }
            idx = cx.delinearize(&lin, &self.views[k - 1].shape)?;
        }
        unreachable!("a view stack is never empty")
    }

    /// The index along every dim of `base` of the element at `idx`, and the validity mask.
    pub fn indices(&self, idx: &[IExpr], cx: &IndexCx) -> Result<(Vec<IExpr>, Option<IExpr>), LowerError> {
        let (lin, valid) = self.index(idx, cx)?;
        Ok((cx.delinearize(&lin, &self.base)?, valid))
    }
}

/// Turns dims into index expressions and simplifies them with the loop extents.
#[derive(Clone, Debug, Default)]
pub struct IndexCx {
    /// `Program::symbols`: symbol `n` is `IExpr::Sym(n)`.
    pub symbols: Vec<Symbol>,
    /// The extent of loop variable `v`, where it is a constant.
    pub extents: Vec<Option<i64>>,
    /// The extent of loop variable `v` as an index expression (symbolic ones too); may be
    /// empty, then only the constant extents are known.
    pub extent_exprs: Vec<IExpr>,
}

/// An affine form `sum(coef * var) + constant` with constant coefficients: the terms by loop
/// variable, ascending, none with coefficient 0.
#[derive(Clone, Debug, Default, PartialEq)]
struct Affine {
    terms: SmallVec<[(u32, i64); 8]>,
    constant: i64,
}

impl Affine {
    /// The affine form of `e`, or `None` where it is not one (a div, a mod, a symbol, a product
    /// of two non-constants) or a coefficient overflows.
    fn of(e: &IExpr) -> Option<Affine> {
        let mut a = Affine::default();
        a.add(e, 1)?;
        a.terms.retain(|(_, c)| *c != 0);
        Some(a)
    }

    /// Adds `k * e`, accumulating into one table (the index of a view stack has a dozen nodes,
    /// and a form per node cost an allocation each).
    fn add(&mut self, e: &IExpr, k: i64) -> Option<()> {
        match e {
            IExpr::Const(c) => self.constant = self.constant.checked_add(c.checked_mul(k)?)?,
            IExpr::Var(v) => match self.terms.binary_search_by_key(&v.0, |&(t, _)| t) {
                Ok(i) => self.terms[i].1 = self.terms[i].1.checked_add(k)?,
                Err(i) => self.terms.insert(i, (v.0, k)),
            },
            IExpr::Add(a, b) => {
                self.add(a, k)?;
                self.add(b, k)?;
            }
            IExpr::Mul(a, b) => match (a.as_const(), b.as_const()) {
                (Some(c), _) => self.add(b, k.checked_mul(c)?)?,
                (_, Some(c)) => self.add(a, k.checked_mul(c)?)?,
                _ => return None,
            },
            _ => return None,
        }
        Some(())
    }

    /// Whether `e` is already [`Affine::expr`]'s form of `self` (terms by variable, each `v` or
    /// `v*c`, summed left to right, the constant last where it is not 0): then canonicalising
    /// it need not build and drop a copy (most of a kernel's indices come out of the view stack
    /// canonical, and their boxes were a tenth of MobileNet's kernel emission).
    fn is_expr(&self, e: &IExpr) -> bool {
        let term = |t: &IExpr, (v, c): (u32, i64)| match t {
            IExpr::Var(x) => c == 1 && x.0 == v,
            IExpr::Mul(a, b) => c != 1 && matches!(**a, IExpr::Var(x) if x.0 == v) && b.as_const() == Some(c),
            _ => false,
        };
        let mut e = e;
        if self.constant != 0 && !self.terms.is_empty() {
            match e {
                IExpr::Add(a, b) if b.as_const() == Some(self.constant) => e = a,
                _ => return false,
            }
        }
        let Some((&first, rest)) = self.terms.split_first() else { return e.as_const() == Some(self.constant) };
        for &t in rest.iter().rev() {
            match e {
                IExpr::Add(a, b) if term(b, t) => e = a,
                _ => return false,
            }
        }
        term(e, first)
    }

    fn expr(&self) -> IExpr {
        let mut e = IExpr::Const(0);
        for &(v, c) in &self.terms {
            e = IExpr::add(e, IExpr::mul(IExpr::Var(crate::kir::Var(v)), IExpr::Const(c)));
        }
        IExpr::add(e, IExpr::Const(self.constant))
    }
}

/// A sum `sum(coef * part) + constant` where each part is a loop variable or any other
/// subexpression taken whole (an *atom*: a `div`, a `mod`, a symbol product), for splitting
/// `div`/`mod` by a constant where the affine form alone cannot ([`IndexCx::split`]).
#[derive(Clone, Debug, Default)]
struct Sum {
    parts: Vec<(IExpr, i64)>,
    constant: i64,
}

impl Sum {
    fn of(e: &IExpr) -> Option<Sum> {
        let mut s = Sum::default();
        s.add(e, 1)?;
        Some(s)
    }

    fn add(&mut self, e: &IExpr, k: i64) -> Option<()> {
        match e {
            IExpr::Const(c) => self.constant = self.constant.checked_add(c.checked_mul(k)?)?,
            IExpr::Add(a, b) => {
                self.add(a, k)?;
                self.add(b, k)?;
            }
            IExpr::Mul(a, b) if b.as_const().is_some() => self.add(a, k.checked_mul(b.as_const()?)?)?,
            IExpr::Mul(a, b) if a.as_const().is_some() => self.add(b, k.checked_mul(a.as_const()?)?)?,
            part => match self.parts.iter_mut().find(|(p, _)| p == part) {
                Some((_, c)) => *c = c.checked_add(k)?,
                None => self.parts.push((part.clone(), k)),
            },
        }
        Some(())
    }

    fn expr(&self) -> IExpr {
        let mut e = IExpr::Const(0);
        for (p, c) in &self.parts {
            if *c != 0 {
                e = IExpr::add(e, IExpr::mul(p.clone(), IExpr::Const(*c)));
            }
        }
        IExpr::add(e, IExpr::Const(self.constant))
    }
}

impl IndexCx {
    /// A context where symbol `symbols[n]` becomes `IExpr::Sym(n)`, with no loop extents known yet.
    pub fn new(symbols: Vec<Symbol>) -> IndexCx {
        IndexCx { symbols, extents: Vec::new(), extent_exprs: Vec::new() }
    }

    /// Whether one of the loops `levels` has constant extent 0 (its body never runs, and the
    /// index folding over its empty range may have made loads inside it look invariant).
    pub fn empty_loop(&self, levels: std::ops::Range<usize>) -> bool {
        levels.into_iter().any(|l| self.extents.get(l) == Some(&Some(0)))
    }

    /// A dim as an index expression: its polynomial over `IExpr::Sym`s.
    pub fn dim(&self, d: &Dim) -> Result<IExpr, LowerError> {
        if let Some(c) = d.as_const() {
            return Ok(IExpr::Const(c));
        }
        // Term by term, each built as `sign * magnitude * symbols...` in printed order.
        let mut out = IExpr::Const(0);
        for (symbols, c) in d.terms() {
            let mut term = IExpr::Const(c.signum());
            if c.unsigned_abs() != 1 {
                term = IExpr::mul(IExpr::Const(c.unsigned_abs() as i64), term);
            }
            for s in &symbols {
                let n = self.symbols.iter().position(|x| x == s).ok_or_else(|| {
                    LowerError::InvalidGraph(format!("dim `{d}` names the symbol `{s}`, which the program lacks"))
                })?;
                term = IExpr::mul(IExpr::Sym(n as u32), term);
            }
            out = IExpr::add(out, term);
        }
        Ok(out)
    }

    /// An affine expression in canonical order (`i0*64 + i1 + 3`); others unchanged.
    pub fn canon(&self, e: IExpr) -> IExpr {
        match Affine::of(&e) {
            Some(a) if !a.is_expr(&e) => a.expr(),
            _ => e,
        }
    }

    /// The smallest and largest value of `e` by interval arithmetic over the known loop extents
    /// (`None` where a symbol or an unknown extent leaves it open).
    fn range(&self, e: &IExpr) -> Option<(i64, i64)> {
        Some(match e {
            IExpr::Const(c) => (*c, *c),
            IExpr::Var(v) => (0, (*self.extents.get(v.0 as usize)?)?.max(1) - 1),
            IExpr::Add(a, b) => {
                let ((a0, a1), (b0, b1)) = (self.range(a)?, self.range(b)?);
                (a0.checked_add(b0)?, a1.checked_add(b1)?)
            }
            IExpr::Mul(a, b) => {
                let ((a0, a1), (b0, b1)) = (self.range(a)?, self.range(b)?);
                let ends = [a0.checked_mul(b0)?, a0.checked_mul(b1)?, a1.checked_mul(b0)?, a1.checked_mul(b1)?];
                (*ends.iter().min()?, *ends.iter().max()?)
            }
            IExpr::Div(a, b) => {
                let ((a0, a1), d) = (self.range(a)?, b.as_const().filter(|d| *d > 0)?);
                (a0.div_euclid(d), a1.div_euclid(d))
            }
            IExpr::Mod(a, b) => {
                let ((a0, a1), d) = (self.range(a)?, b.as_const().filter(|d| *d > 0)?);
                if a0 >= 0 && a1 < d { (a0, a1) } else { (0, d - 1) }
            }
            IExpr::Lt(..) | IExpr::And(..) => (0, 1),
            IExpr::Sym(_) => return None,
        })
    }

    /// `e = d * q + r` for a constant `d > 0`, with `q` the parts of `e` whose coefficients `d`
    /// divides (and the constant's quotient) and `r` the rest, known non-negative: then
    /// `e / d = q + r / d` and `e % d = r % d` exactly. Returns `(q, r, r < d)`.
    fn split(&self, e: &IExpr, d: i64) -> Option<(IExpr, IExpr, bool)> {
        if d <= 0 {
            return None;
        }
        let s = Sum::of(e)?;
        let mut q = Sum { parts: Vec::new(), constant: s.constant.div_euclid(d) };
        let mut r = Sum { parts: Vec::new(), constant: s.constant.rem_euclid(d) };
        for (p, c) in &s.parts {
            if c % d == 0 {
                q.parts.push((p.clone(), c / d));
            } else {
                r.parts.push((p.clone(), *c));
            }
        }
        let r_expr = r.expr();
        let (lo, hi) = self.range(&r_expr)?;
        (lo >= 0).then(|| (q.expr(), r_expr, hi < d))
    }

    /// `e / d` (floor division of a non-negative index), simplified when `d` is a constant: the
    /// parts of `e` that are multiples of `d` leave the division (`(i0*36 + i1) / 36` is
    /// `i0 + i1 / 36`, and `i0` when `i1 < 36`); or when `d` is a constant times a symbol and the
    /// division is exact in the same way ([`Self::split_symbolic`]).
    ///
    /// # Errors
    /// `LowerError::InvalidGraph` if `d` cannot be written as an index expression.
    pub fn div(&self, e: IExpr, d: &Dim) -> Result<IExpr, LowerError> {
        if let Some(c) = d.as_const()
            && let Some((q, r, small)) = self.split(&e, c)
        {
            return Ok(if small { q } else { IExpr::add(q, IExpr::div(r, IExpr::Const(c))) });
        }
        let divisor = self.dim(d)?;
        if let Some((q, _)) = self.split_symbolic(&e, &divisor) {
            return Ok(q);
        }
        Ok(IExpr::div(e, divisor))
    }

    /// `(q, r)` with `e = d * q + r` and `0 <= r < d` proven, for `d = c * s` (a constant
    /// `c > 0` times a symbol `s`): `q` comes from the parts `k * s` and `k * s * x` of `e` with
    /// `c | k`, and the rest `r` must be loop variables with non-negative coefficients plus a
    /// non-negative constant, whose largest value (each variable at its extent minus one) is `d`
    /// minus a positive constant, with every symbol cancelled. A stacked piece's window
    /// (`(i0*32 + i1 + s*288) / (s*32)` with `i0 < s`, `i1 < 32`) is `9`; a row of a symbolic
    /// length read by its position (`(i0*s + i1) % s` with `i1 < s`) is `i1`.
    fn split_symbolic(&self, e: &IExpr, d: &IExpr) -> Option<(IExpr, IExpr)> {
        let ds = Sum::of(d)?;
        let [(IExpr::Sym(sym), c)] = ds.parts.as_slice() else { return None };
        let es = Sum::of(e)?;
        if ds.constant != 0 || *c <= 0 || es.constant < 0 {
            return None;
        }
        let mut q = Sum::default();
        let mut r = Sum { parts: Vec::new(), constant: es.constant };
        // `max(r) - d`, built up as a sum over the symbols.
        let mut over = Sum { parts: Vec::new(), constant: es.constant };
        let is_sym = |x: &IExpr| matches!(x, IExpr::Sym(n) if n == sym);
        for (part, k) in &es.parts {
            // The part as `s * x`.
            let x = match part {
                IExpr::Sym(n) if n == sym => Some(IExpr::Const(1)),
                IExpr::Mul(a, b) if is_sym(b) => Some((**a).clone()),
                IExpr::Mul(a, b) if is_sym(a) => Some((**b).clone()),
                _ => None,
            };
            match (x, part) {
                (Some(x), _) if k % c == 0 => q.add(&x, k / c)?,
                (_, IExpr::Var(v)) if *k >= 0 => {
                    // k * (extent - 1)
                    over.add(self.extent_exprs.get(v.0 as usize)?, *k)?;
                    over.constant = over.constant.checked_sub(*k)?;
                    r.add(part, *k)?;
                }
                _ => return None,
            }
        }
        over.add(d, -1)?;
        (over.parts.iter().all(|(_, k)| *k == 0) && over.constant < 0).then(|| (q.expr(), r.expr()))
    }

    /// `e % d`, simplified to `e` when its known bounds lie in `[0, d)`, or, for a constant `d`,
    /// to the remainder of the parts of `e` that are not multiples of `d`; for a symbolic `d`
    /// as [`Self::split_symbolic`] allows.
    ///
    /// # Errors
    /// `LowerError::InvalidGraph` if `d` cannot be written as an index expression.
    pub fn rem(&self, e: IExpr, d: &Dim) -> Result<IExpr, LowerError> {
        if let Some(c) = d.as_const() {
            if let Some((lo, hi)) = self.range(&e)
                && lo >= 0
                && hi < c
            {
                return Ok(e);
            }
            if let Some((_, r, small)) = self.split(&e, c) {
                return Ok(if small { r } else { IExpr::rem(r, IExpr::Const(c)) });
            }
            return Ok(IExpr::rem(e, IExpr::Const(c)));
        }
        let divisor = self.dim(d)?;
        if let Some((_, r)) = self.split_symbolic(&e, &divisor) {
            return Ok(r);
        }
        Ok(IExpr::rem(e, divisor))
    }

    /// The row-major multi-index of linear position `lin` in `shape`. The first dim needs no
    /// remainder: positions of valid elements are below the element count.
    pub fn delinearize(&self, lin: &IExpr, shape: &[Dim]) -> Result<Vec<IExpr>, LowerError> {
        let strides = row_major(shape);
        let mut out = Vec::with_capacity(shape.len());
        for d in 0..shape.len() {
            if is_one(&shape[d]) {
                out.push(IExpr::Const(0));
                continue;
            }
            let q = self.div(lin.clone(), &strides[d])?;
            let first_real = (0..d).all(|e| is_one(&shape[e]));
            out.push(if first_real { q } else { self.rem(q, &shape[d])? });
        }
        Ok(out)
    }

    /// The condition `lo <= e < hi`, or `None` where it always holds for `e` in `0..size`.
    pub fn range_cond(&self, e: &IExpr, range: &(Dim, Dim), size: &Dim) -> Result<Option<IExpr>, LowerError> {
        let (lo, hi) = range;
        let bounds = self.range(e);
        let mut cond: Option<IExpr> = None;
        let lo_needed = match lo.as_const() {
            Some(l) => l > 0 && bounds.is_none_or(|(min, _)| min < l),
            None => true,
        };
        if lo_needed {
            cond = Some(IExpr::lt(self.dim(&(lo - 1))?, e.clone()));
        }
        let hi_needed = !range_covers(&(Dim::Const(0), *hi), size)
            && match hi.as_const() {
                Some(h) => bounds.is_none_or(|(_, max)| max >= h),
                None => true,
            };
        if hi_needed {
            let c = IExpr::lt(e.clone(), self.dim(hi)?);
            cond = Some(match cond {
                None => c,
                Some(p) => IExpr::and(p, c),
            });
        }
        Ok(cond)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kir::Var;

    fn dims(v: &[i64]) -> Shape {
        v.iter().map(|&c| Dim::Const(c)).collect()
    }

    fn cx(extents: &[i64]) -> IndexCx {
        IndexCx {
            symbols: vec![Symbol::new("seq")],
            extents: extents.iter().map(|&e| Some(e)).collect(),
            extent_exprs: Vec::new(),
        }
    }

    fn vars(n: u32) -> Vec<IExpr> {
        (0..n).map(|v| IExpr::Var(Var(v))).collect()
    }

    #[test]
    fn an_index_already_in_canonical_form_is_recognised_as_such_and_no_other() {
        let v = vars(3);
        let (add, mul, k) = (IExpr::add, IExpr::mul, IExpr::Const);
        let cases = [
            k(0),
            k(7),
            v[1].clone(),
            mul(v[1].clone(), k(4)),
            add(mul(v[0].clone(), k(64)), v[2].clone()),
            add(add(mul(v[0].clone(), k(64)), v[2].clone()), k(-3)),
            add(v[2].clone(), mul(v[0].clone(), k(64))),
            add(add(v[0].clone(), v[0].clone()), k(1)),
            add(add(v[0].clone(), k(1)), v[1].clone()),
            mul(k(4), v[1].clone()),
            add(add(mul(v[0].clone(), k(2)), mul(v[1].clone(), k(0))), v[2].clone()),
        ];
        for e in cases {
            let a = Affine::of(&e).expect("affine");
            assert_eq!(a.is_expr(&e), a.expr() == e, "{e:?}");
            assert_eq!(cx(&[]).canon(e.clone()), a.expr(), "{e:?}");
        }
        // The canonical forms above are recognised, the others rebuilt.
        let canonical = add(add(mul(v[0].clone(), k(64)), v[2].clone()), k(-3));
        assert!(Affine::of(&canonical).unwrap().is_expr(&canonical));
        let swapped = add(v[2].clone(), mul(v[0].clone(), k(64)));
        assert!(!Affine::of(&swapped).unwrap().is_expr(&swapped));
    }

    #[test]
    fn division_by_a_symbolic_size_folds_where_the_remainder_is_below_it() {
        // Loops i0 < seq, i1 < 32: (i0*32 + i1 + seq*288) / (seq*32) is 9.
        let seq = Dim::sym("seq");
        let mut c = cx(&[]);
        c.extents = vec![None, Some(32)];
        c.extent_exprs = vec![IExpr::Sym(0), IExpr::Const(32)];
        let v = vars(2);
        let lin = |k: i64| {
            IExpr::add(
                IExpr::add(IExpr::mul(v[0].clone(), IExpr::Const(32)), v[1].clone()),
                IExpr::mul(IExpr::Sym(0), IExpr::Const(k)),
            )
        };
        let d = seq * Dim::Const(32);
        assert_eq!(c.div(lin(288), &d).unwrap(), IExpr::Const(9));
        assert_eq!(c.div(lin(0), &d).unwrap(), IExpr::Const(0));
        // Not a multiple of the divisor's constant, or a remainder that can reach it: unchanged.
        assert!(matches!(c.div(lin(100), &d).unwrap(), IExpr::Div(..)));
        c.extent_exprs[1] = IExpr::Const(33);
        assert!(matches!(c.div(lin(288), &d).unwrap(), IExpr::Div(..)));
        c.extent_exprs = vec![IExpr::add(IExpr::Sym(0), IExpr::Const(1)), IExpr::Const(32)];
        assert!(matches!(c.div(lin(288), &d).unwrap(), IExpr::Div(..)));
    }

    #[test]
    fn transpose_then_flatten_needs_div_mod() {
        let s = ViewStack::contiguous(&dims(&[2, 3]))
            .through(&[Movement::Permute(vec![1, 0]), Movement::Reshape(dims(&[6]))]);
        assert_eq!(s.views.len(), 2);
        let (i, m) = s.index(&vars(1), &cx(&[6])).unwrap();
        assert_eq!(i.to_string(), "((i0 / 2) + (i0 % 2)*3)");
        assert!(m.is_none());
    }

    #[test]
    fn common_refinements() {
        let r = |a: &[i64], b: &[i64]| {
            common_refinement(&dims(a), &dims(b)).map(|v| v.iter().map(|d| d.as_const().unwrap()).collect::<Vec<_>>())
        };
        assert_eq!(r(&[8, 676], &[8, 1, 26, 26]), Some(vec![8, 26, 26]));
        assert_eq!(r(&[6, 4], &[2, 12]), Some(vec![2, 3, 4]));
        assert_eq!(r(&[2, 3], &[3, 2]), None);
        assert_eq!(r(&[1, 5], &[5, 1]), Some(vec![5]));
        let n = Dim::sym("n");
        let sym = common_refinement(&[n, Dim::Const(6)], &[n, Dim::Const(2), Dim::Const(3)]);
        assert_eq!(sym, Some(vec![n, Dim::Const(2), Dim::Const(3)]));
        assert_eq!(common_refinement(&[n * Dim::Const(2)], &[n, Dim::Const(2)]), None);
    }

    #[test]
    fn loops_split_at_a_strided_view_need_no_div() {
        // A shrunk [8, 1, 26, 26] window of a [8, 1, 28, 28] input, flattened to [8, 676]: the
        // flat loop needs div/mod, the loops [8, 26, 26] (split at the view below) do not.
        let window = ViewStack::contiguous(&dims(&[8, 1, 28, 28])).through(&[Movement::Shrink(vec![
            (Dim::Const(0), Dim::Const(8)),
            (Dim::Const(0), Dim::Const(1)),
            (Dim::Const(1), Dim::Const(27)),
            (Dim::Const(2), Dim::Const(28)),
        ])]);
        let flat = window.clone().through(&[Movement::Reshape(dims(&[8, 676]))]);
        assert_eq!(flat.views.len(), 2);
        let (i, _) = flat.index(&vars(2), &cx(&[8, 676])).unwrap();
        assert!(i.to_string().contains('/'), "{i}");
        let loops = common_refinement(flat.shape(), flat.reshaped_from().unwrap()).unwrap();
        let split = flat.through(&[Movement::Reshape(loops.into())]);
        assert!(!split.mergeable(1), "merging 26 x 26 would straddle the strided rows");
        assert!(!split.mergeable(0), "merging 8 x 26 would straddle the strided images");
        let contiguous = ViewStack::contiguous(&dims(&[8, 1, 26, 26]))
            .through(&[Movement::Permute(vec![1, 0, 2, 3]), Movement::Reshape(dims(&[8 * 676]))]);
        let loops = contiguous.clone().through(&[Movement::Reshape(dims(&[8, 26, 26]))]);
        assert!(loops.mergeable(0) && loops.mergeable(1), "a contiguous view below merges");
        let (i, m) = split.index(&vars(3), &cx(&[8, 26, 26])).unwrap();
        assert_eq!(i.to_string(), "(((i0*784 + i1*28) + i2) + 30)");
        assert!(m.is_none());
    }

    #[test]
    fn contiguous_reshapes_merge() {
        let s = ViewStack::contiguous(&dims(&[4, 6]))
            .through(&[Movement::Reshape(dims(&[2, 2, 3, 2])), Movement::Reshape(dims(&[24]))]);
        assert_eq!(s.views.len(), 1);
        let (i, _) = s.index(&vars(1), &cx(&[24])).unwrap();
        assert_eq!(i.to_string(), "i0");
    }

    #[test]
    fn symbolic_dims_become_syms() {
        let seq = Dim::sym("seq");
        let s = ViewStack::contiguous(&[seq, Dim::Const(4)]).through(&[Movement::Permute(vec![1, 0])]);
        let (i, _) = s.index(&vars(2), &cx(&[4])).unwrap();
        assert_eq!(i.to_string(), "(i0 + i1*4)");
        let t = ViewStack::contiguous(&[Dim::Const(4), seq]);
        let (j, _) = t.index(&vars(2), &IndexCx::new(vec![Symbol::new("seq")])).unwrap();
        assert_eq!(j.to_string(), "(i0*s0 + i1)");
        let c = IndexCx::new(vec![Symbol::new("seq")]);
        assert_eq!(c.dim(&(&(&seq * 2) - 3)).unwrap().to_string(), "(s0*2 + -3)");
    }

    #[test]
    fn pad_masks_and_shrink_offsets() {
        let s = ViewStack::contiguous(&dims(&[3])).through(&[Movement::Pad(vec![(Dim::Const(1), Dim::Const(2))])]);
        let (i, m) = s.index(&vars(1), &cx(&[6])).unwrap();
        assert_eq!(i.to_string(), "(i0 + -1)");
        assert_eq!(m.unwrap().to_string(), "((0 < i0) && (i0 < 4))");
        let t = ViewStack::contiguous(&dims(&[5, 4]))
            .through(&[Movement::Shrink(vec![(Dim::Const(1), Dim::Const(3)), (Dim::Const(0), Dim::Const(4))])]);
        let (j, _) = t.index(&vars(2), &cx(&[2, 4])).unwrap();
        assert_eq!(j.to_string(), "((i0*4 + i1) + 4)");
    }

    #[test]
    fn div_and_mod_keep_only_the_parts_they_need() {
        let x = cx(&[4, 16, 16]);
        let v = vars(3);
        let c = |k: i64| IExpr::Const(k);
        let sum = |parts: &[(usize, i64)], k: i64| {
            parts.iter().fold(c(k), |e, &(i, m)| IExpr::add(e, IExpr::mul(v[i].clone(), c(m))))
        };
        let lin = sum(&[(0, 5184), (1, 18), (2, 1)], 19);
        let q = x.div(lin.clone(), &Dim::Const(36)).unwrap();
        assert_eq!(q.to_string(), "(i0*144 + (((i1*18 + i2) + 19) / 36))");
        // The quotient's remainder by 9: the multiple of 9 leaves, the rest is below 9.
        let r = x.rem(q.clone(), &Dim::Const(9)).unwrap();
        assert_eq!(r.to_string(), "(((i1*18 + i2) + 19) / 36)");
        let m = x.rem(lin.clone(), &Dim::Const(36)).unwrap();
        assert_eq!(m.to_string(), "(((i1*18 + i2) + 19) % 36)");
        for (a, b, d) in (0..4).flat_map(|a| (0..16).flat_map(move |b| (0..16).map(move |d| (a, b, d)))) {
            let at = [a, b, d];
            let want = lin.eval(&at, &[]);
            assert_eq!(q.eval(&at, &[]), want.div_euclid(36));
            assert_eq!(r.eval(&at, &[]), want.div_euclid(36).rem_euclid(9));
            assert_eq!(m.eval(&at, &[]), want.rem_euclid(36));
        }
    }

    #[test]
    fn padding_an_emptied_dim_is_all_padding() {
        // Row 1 of a padded [2, 1] is padding; shrinking the columns to none and padding one back
        // leaves only padding, although the row mask's column range (0..1) outlives the shrink.
        let r = |a: i64, b: i64| (Dim::Const(a), Dim::Const(b));
        let s = ViewStack::contiguous(&dims(&[2, 1])).through(&[
            Movement::Shrink(vec![r(0, 1), r(0, 1)]),
            Movement::Pad(vec![r(0, 1), r(0, 0)]),
            Movement::Shrink(vec![r(0, 2), r(0, 0)]),
            Movement::Pad(vec![r(0, 0), r(0, 1)]),
        ]);
        let (_, m) = s.index(&vars(2), &cx(&[2, 1])).unwrap();
        let m = m.expect("a mask");
        assert!((0..2).all(|row| m.eval(&[row, 0], &[]) == 0), "{m}");
    }
}

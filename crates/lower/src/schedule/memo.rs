//! Kernels of the same structure built once per program: a Transformer's layers launch the
//! same kernels over different buffers, and building one (its expression tree, views, index
//! arithmetic, CSE, placement) costs far more than reading the graph that decides it.
//!
//! [`Key`] walks exactly the nodes that `kernel::loop_kernel`'s tree builder reads for a root,
//! in its order: each node's op (with its typed attributes) and type, down to the nodes that
//! have buffers, which it records by buffer position (the first buffer met is 0, the kernel's
//! target is always 0) with the type they are read at. The builder decides everything from
//! exactly those facts (views from the ops and shapes, pad folding from which nodes below a pad
//! have buffers, parameters in the order buffers are met), so two roots with equal keys get the
//! same kernel, its parameters bound to the buffers at the same positions. A kernel that added a
//! data check is not remembered (its check number is the program's next).
//!
//! Matmul kernels likewise ([`MatmulKey`]): the contraction's space and axes, its output type,
//! and each operand's buffer position, base type and movement chain are all it is built from.

use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap as HashMap, FxHasher};
use smallvec::SmallVec;

use air::{Dim, Graph, NodeId, Op, TensorType};

use super::{Buffers, MatmulOperand};
use crate::kir::Kernel;
use crate::program::BufId;
use crate::view::Movement;

/// What a root's kernel is built from, read off the graph (see the module docs).
#[derive(Clone)]
pub(super) struct Key<'g> {
    items: Vec<Item<'g>>,
    /// The window of a concatenation's piece (its slice of the output).
    window: Option<Vec<(Dim, Dim)>>,
    /// Whether the root itself is expanded (built from its inputs though it has a buffer).
    expand: bool,
    /// The hash of all of the above, fed item by item as the walk pushes them: a key is hashed
    /// once, not again by each lookup, insertion and resize of the table (their ops and types
    /// hashed deeply were a third of the memo's time in an unrolled GRU's lowering).
    hash: u64,
}

impl PartialEq for Key<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && self.expand == other.expand
            && self.window == other.window
            && self.items == other.items
    }
}

impl Eq for Key<'_> {}

impl Hash for Key<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Item<'g> {
    /// A node the builder expands: its op and type, then its inputs' items.
    Node(&'g Op, &'g TensorType),
    /// A `Shrink` of a node read from its buffer, by its type alone: where it starts is the
    /// read's offset (the next item's).
    Shrunk(&'g TensorType),
    /// A concatenation's piece that pads a node (the next items: its buffer's read, or its
    /// expression) to exactly its window of the output, of this type: where the window starts
    /// is the target's offset.
    Piece(&'g TensorType),
    /// A node read from its buffer: the buffer's position among those met, its type, and the
    /// read's offset (in elements) from the first read of that position.
    Buf(u8, &'g TensorType, Dim),
}

/// A key and the buffers at its positions, and the hasher its items are fed to.
pub(super) struct Walk<'g> {
    key: Key<'g>,
    bufs: SmallVec<[BufId; 8]>,
    /// The offset of the first read of each position (`Dim::Const(0)` where it starts the
    /// buffer, or none is read): a kernel of an equal key built before reads each position at
    /// its own bases, the same distance from these everywhere (see [`Memo::get`]).
    bases: SmallVec<[Option<Dim>; 8]>,
    hasher: FxHasher,
}

impl<'g> Walk<'g> {
    /// The walk of the kernel of `root` writing `target`, or `None` where the builder would not
    /// build one from these facts alone (a scatter, a node without its buffer: the builder
    /// reports those) or more than 255 buffers are read.
    pub(super) fn new(
        g: &'g Graph,
        bufs: &Buffers,
        root: NodeId,
        expand: bool,
        target: BufId,
        window: Option<&[(Dim, Dim)]>,
    ) -> Option<Walk<'g>> {
        let mut w = Walk {
            key: Key { items: Vec::new(), window: window.map(<[_]>::to_vec), expand, hash: 0 },
            bufs: SmallVec::from_elem(target, 1),
            bases: SmallVec::from_elem(None, 1),
            hasher: FxHasher::default(),
        };
        let piece = window.and_then(|w| window_pad(g, bufs, root, w, target));
        if let (Some(window), Some(_)) = (window, piece) {
            // Keyed by the window's size: where it starts is where the kernel writes.
            let sizes = window.iter().map(|(lo, hi)| Some((Dim::Const(0), hi.checked_sub(lo)?)));
            w.key.window = Some(sizes.collect::<Option<_>>()?);
            w.bases[0] = Some(offset(window, &g.ty(root).shape)?);
        }
        w.key.window.hash(&mut w.hasher);
        expand.hash(&mut w.hasher);
        match piece {
            // The pad's own amounts are the window's start (keyed by the target's offset) and
            // what follows it: the piece is what it pads, wherever the window lies.
            Some(x) => {
                w.push(Item::Piece(g.ty(root)));
                w.walk(g, bufs, x, false)?;
            }
            None => w.walk(g, bufs, root, expand)?,
        }
        w.key.hash = w.hasher.finish();
        Some(w)
    }

    fn push(&mut self, item: Item<'g>) {
        item.hash(&mut self.hasher);
        self.key.items.push(item);
    }

    /// A read of buffer `b` (of type `ty`) starting `offset` elements into it.
    fn buf(&mut self, b: BufId, ty: &'g TensorType, offset: Dim) -> Option<()> {
        let at = match self.bufs.iter().position(|&x| x == b) {
            Some(at) => at,
            None => {
                self.bufs.push(b);
                self.bases.push(None);
                self.bufs.len() - 1
            }
        };
        let base = *self.bases[at].get_or_insert(offset);
        self.push(Item::Buf(u8::try_from(at).ok()?, ty, offset.checked_sub(&base)?));
        Some(())
    }

    /// Mirrors `TreeBuilder::build`: the same nodes, stops and order.
    fn walk(&mut self, g: &'g Graph, bufs: &Buffers, n: NodeId, expand: bool) -> Option<()> {
        air::work::tick();
        let node = g.node(n);
        if !expand && let Some(&b) = bufs.get(n) {
            return self.buf(b, &node.ty, Dim::Const(0));
        }
        match &node.op {
            Op::Input(_) => self.buf(*bufs.get(n)?, &node.ty, Dim::Const(0)),
            Op::ScatterAdd(_) => None,
            Op::Gather(_) => {
                self.push(Item::Node(&node.op, &node.ty));
                let src = node.inputs[0];
                self.buf(*bufs.get(src)?, g.ty(src), Dim::Const(0))?;
                self.walk(g, bufs, node.inputs[1], false)
            }
            // A slice read straight from a buffer (not the target's, which the kernel also
            // writes) is that buffer read from an offset: an unrolled RNN's steps read the
            // step's slice of one projection, in kernels otherwise the same.
            Op::Shrink(s) if bufs.get(node.inputs[0]).is_some_and(|&b| b != self.bufs[0]) => {
                let x = node.inputs[0];
                let ty = g.ty(x);
                self.push(Item::Shrunk(&node.ty));
                self.buf(*bufs.get(x)?, ty, offset(&s.ranges, &ty.shape)?)
            }
            op => {
                self.push(Item::Node(op, &node.ty));
                node.inputs.iter().try_for_each(|&i| self.walk(g, bufs, i, false))
            }
        }
    }
}

/// The node the concatenation's piece `root` pads to exactly `window` of the target (a node with
/// its own buffer, not the target's, or an expression): the builder computes it at the
/// window's positions (the pad folds into each of its loads, the window cancelling it) and
/// writes the window's part of the target, wherever the window starts. An unrolled RNN's
/// output stacks each step's state, computed in its piece: one kernel for every step.
fn window_pad(g: &Graph, bufs: &Buffers, root: NodeId, window: &[(Dim, Dim)], target: BufId) -> Option<NodeId> {
    let (Op::Pad(p), [x]) = (g.op(root), g.inputs(root)) else { return None };
    let shape = &g.ty(root).shape;
    let exact = p.padding.len() == window.len()
        && p.padding.iter().zip(window).zip(shape.iter()).all(|(((before, after), (lo, hi)), size)| {
            before == lo && size.checked_sub(after).is_some_and(|end| end == *hi)
        });
    (exact && bufs.get(*x).is_none_or(|&b| b != target)).then_some(*x)
}

/// The offset in elements of the window starting at `ranges`' starts of a row-major `shape`;
/// `None` where it overflows.
fn offset(ranges: &[(Dim, Dim)], shape: &[Dim]) -> Option<Dim> {
    let (mut at, mut stride) = (Dim::Const(0), Dim::Const(1));
    for ((start, _), size) in ranges.iter().zip(shape).rev() {
        at = at.checked_add(&start.checked_mul(&stride)?)?;
        stride = stride.checked_mul(size)?;
    }
    Some(at)
}

/// What a matmul kernel is built from (see the module docs), and the buffers at its positions.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct MatmulKey<'g> {
    reduce: &'g Op,
    input: &'g TensorType,
    output: &'g TensorType,
    operands: [(u8, &'g TensorType, &'g [Movement]); 2],
    accumulate: bool,
}

impl<'g> MatmulKey<'g> {
    /// The key of the matmul kernel of `reduce` on `operands` writing `target`, and the buffers at
    /// its positions (target first); `None` where an operand has no buffer (the builder reports
    /// it).
    pub(super) fn new(
        g: &'g Graph,
        bufs: &Buffers,
        reduce: NodeId,
        operands: [&'g MatmulOperand; 2],
        target: BufId,
        accumulate: bool,
    ) -> Option<(MatmulKey<'g>, SmallVec<[BufId; 3]>)> {
        let mut at: SmallVec<[BufId; 3]> = SmallVec::from_elem(target, 1);
        let mut operand = |o: &'g MatmulOperand| -> Option<(u8, &'g TensorType, &'g [Movement])> {
            let b = *bufs.get(o.base)?;
            let p = at.iter().position(|&x| x == b).unwrap_or_else(|| {
                at.push(b);
                at.len() - 1
            });
            Some((p as u8, g.ty(o.base), o.chain.as_slice()))
        };
        let operands = [operand(operands[0])?, operand(operands[1])?];
        let key = MatmulKey {
            reduce: g.op(reduce),
            input: g.ty(*g.inputs(reduce).first()?),
            output: g.ty(reduce),
            operands,
            accumulate,
        };
        Some((key, at))
    }
}

/// Kernels built so far, by key: the kernel, which key position each of its parameters is
/// bound to, and its index among the program's kernels once launched alone.
#[derive(Default)]
pub(super) struct Memo<'g> {
    built: HashMap<Key<'g>, Entry>,
    /// Matmul kernels: their index among the program's kernels and their parameters' positions.
    matmuls: HashMap<MatmulKey<'g>, (u32, SmallVec<[u8; 3]>)>,
}

/// A kernel built before: launched alone (its index among the program's kernels: a hit reuses
/// the launch), or a concatenation's piece (the kernel itself: pieces merge before they launch).
pub(super) enum Built {
    Launched(u32),
    Piece(Box<Kernel>),
}

/// A [`Built`], which key position each of its parameters is bound to, and the walk's
/// [`Walk::bases`] it was built for.
pub(super) struct Entry {
    pub(super) built: Built,
    params: SmallVec<[u8; 8]>,
    bases: SmallVec<[Dim; 8]>,
}

/// A kernel built before for a walk's key: its arguments for this walk (the buffers at the
/// positions its parameters were bound to), and, where this walk reads some of them from
/// further in (an RNN's later step), how far further, per parameter in elements.
pub(super) struct Hit<'m> {
    pub(super) built: &'m Built,
    pub(super) args: Vec<BufId>,
    pub(super) shifts: Option<Vec<Dim>>,
}

impl<'g> Memo<'g> {
    /// The kernel built for `walk`'s key (see [`Hit`]).
    pub(super) fn get(&self, walk: &Walk<'g>) -> Option<Hit<'_>> {
        let entry = self.built.get(&walk.key)?;
        let args = entry.params.iter().map(|&p| walk.bufs[p as usize]).collect();
        // Equal keys read each position at the same distances from its first read, so the
        // first reads' distance is every read's.
        let shift = |p: u8| walk.bases[p as usize].unwrap_or(Dim::Const(0)).checked_sub(&entry.bases[p as usize]);
        let shifts: Vec<Dim> = entry.params.iter().map(|&p| shift(p)).collect::<Option<_>>()?;
        let shifts = shifts.iter().any(|d| *d != Dim::Const(0)).then_some(shifts);
        Some(Hit { built: &entry.built, args, shifts })
    }

    /// Remembers `built`, made for `walk` with arguments `args`, unless an argument is not one
    /// of the walk's buffers (the status buffer of a kernel that checks data).
    pub(super) fn insert(&mut self, walk: Walk<'g>, built: Built, args: &[BufId]) {
        if let Some(params) = positions(&walk.bufs, args) {
            let bases = walk.bases.iter().map(|b| b.unwrap_or(Dim::Const(0))).collect();
            self.built.insert(walk.key, Entry { built, params, bases });
        }
    }

    /// The matmul kernel launched for `key` and its arguments (the buffers `at` its positions).
    pub(super) fn matmul(&self, key: &MatmulKey<'g>, at: &[BufId]) -> Option<(u32, Vec<BufId>)> {
        let (id, params) = self.matmuls.get(key)?;
        Some((*id, params.iter().map(|&p| at[p as usize]).collect()))
    }

    /// Remembers the matmul kernel `id` launched for `key` on `args` (buffers among `at`).
    pub(super) fn insert_matmul(&mut self, key: MatmulKey<'g>, at: &[BufId], id: u32, args: &[BufId]) {
        if let Some(params) = positions(at, args) {
            self.matmuls.insert(key, (id, params));
        }
    }
}

/// The position of each of `args` among `at`; `None` when one is not there (or past 255).
fn positions<const N: usize>(at: &[BufId], args: &[BufId]) -> Option<SmallVec<[u8; N]>>
where
    [u8; N]: smallvec::Array<Item = u8>,
{
    args.iter().map(|a| at.iter().position(|b| b == a).and_then(|p| u8::try_from(p).ok())).collect()
}

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
    /// A node read from its buffer: the buffer's position among those met, and its type.
    Buf(u8, &'g TensorType),
}

/// A key and the buffers at its positions, and the hasher its items are fed to.
pub(super) struct Walk<'g> {
    key: Key<'g>,
    bufs: SmallVec<[BufId; 8]>,
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
            hasher: FxHasher::default(),
        };
        w.key.window.hash(&mut w.hasher);
        expand.hash(&mut w.hasher);
        w.walk(g, bufs, root, expand)?;
        w.key.hash = w.hasher.finish();
        Some(w)
    }

    fn push(&mut self, item: Item<'g>) {
        item.hash(&mut self.hasher);
        self.key.items.push(item);
    }

    fn buf(&mut self, b: BufId, ty: &'g TensorType) -> Option<()> {
        let at = match self.bufs.iter().position(|&x| x == b) {
            Some(at) => at,
            None => {
                self.bufs.push(b);
                self.bufs.len() - 1
            }
        };
        self.push(Item::Buf(u8::try_from(at).ok()?, ty));
        Some(())
    }

    /// Mirrors `TreeBuilder::build`: the same nodes, stops and order.
    fn walk(&mut self, g: &'g Graph, bufs: &Buffers, n: NodeId, expand: bool) -> Option<()> {
        air::work::tick();
        let node = g.node(n);
        if !expand && let Some(&b) = bufs.get(n) {
            return self.buf(b, &node.ty);
        }
        match &node.op {
            Op::Input(_) => self.buf(*bufs.get(n)?, &node.ty),
            Op::ScatterAdd(_) => None,
            Op::Gather(_) => {
                self.push(Item::Node(&node.op, &node.ty));
                let src = node.inputs[0];
                self.buf(*bufs.get(src)?, g.ty(src))?;
                self.walk(g, bufs, node.inputs[1], false)
            }
            op => {
                self.push(Item::Node(op, &node.ty));
                node.inputs.iter().try_for_each(|&i| self.walk(g, bufs, i, false))
            }
        }
    }
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

/// A [`Built`] and which key position each of its parameters is bound to.
pub(super) struct Entry {
    pub(super) built: Built,
    params: SmallVec<[u8; 8]>,
}

impl<'g> Memo<'g> {
    /// The kernel built for `walk`'s key and its arguments (the buffers at the positions its
    /// parameters were bound to).
    pub(super) fn get(&self, walk: &Walk<'g>) -> Option<(&Built, Vec<BufId>)> {
        let entry = self.built.get(&walk.key)?;
        Some((&entry.built, entry.params.iter().map(|&p| walk.bufs[p as usize]).collect()))
    }

    /// Remembers `built`, made for `walk` with arguments `args`, unless an argument is not one
    /// of the walk's buffers (the status buffer of a kernel that checks data).
    pub(super) fn insert(&mut self, walk: Walk<'g>, built: Built, args: &[BufId]) {
        if let Some(params) = positions(&walk.bufs, args) {
            self.built.insert(walk.key, Entry { built, params });
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

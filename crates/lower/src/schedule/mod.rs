//! Scheduling: decides which nodes of a graph get a buffer (kernel boundaries), then emits one
//! kernel per such node, in topological order, over planned buffers.
//!
//! # Fusion heuristics (`decide`)
//!
//! A node is *materialized* (computed by its own kernel into a buffer) when
//! - it is a graph output (outputs are always contiguous `Output` buffers; an output that is an
//!   input, or a view of one, gets a copy kernel);
//! - it is a reduce, unless its only consumer is an element-wise node reading it directly (then the
//!   reduce loop runs inside that consumer's kernel and the consumer's other element-wise work
//!   becomes the reduce's epilogue: `sum(x) * (1/n)` is one kernel);
//! - it is a recognised contraction, which becomes a `Kernel::Matmul`: a `reduce sum` of
//!   `mul(x, y)` with `x` and `y` affine views (broadcast, permuted, reshaped) of buffers, whose
//!   product-space axes split into batch (kept, both operands vary or neither), M (kept, only `x`
//!   varies), N (kept, only `y` varies) and K (reduced, both vary) groups that each collapse into
//!   one strided dim (see `contraction`). This covers the front end's matmul, its gradients (a sum
//!   over the first or a middle axis) and einsum-style contractions. The result is written in the
//!   reduce's own row-major layout; its operands' base nodes are materialized too. An `add`
//!   consuming the matmul (through reshapes only) takes the matmul over: the other addend is
//!   written into the result buffer first and the matmul accumulates onto it, unless one loop
//!   kernel reads the sum anyway (its one reader, through reshapes and permutes, is element-wise
//!   other than `mul`, or a reduce: a ReLU, a pooling), which then adds the addend as it loads
//!   the product;
//! - it is element-wise with several consumers and its fused expression costs more than
//!   `RECOMPUTE_MAX` ops (else every consumer recomputes it: cheaper than a round trip through
//!   memory), or it is read through a broadcasting `expand` and costs more than `BROADCAST_MAX`
//!   (recomputing it per broadcast element would multiply the work);
//! - it is element-wise with several consumers, one of them a reduce reading it directly over rows
//!   of a known length of at least `TILE_ROWS_MIN`, and its fused expression evaluates a
//!   transcendental (`exp2`, `log2`, `sin`, `erf`): softmax's exponentials, read by their sum and
//!   by the normalization, are one element-wise kernel that codegen runs at full vector width
//!   (tile routines) instead of an `exp2` in each reader;
//! - it is element-wise and carries a fused reduce but has several consumers or is read through a
//!   view (a reduce result cannot be recomputed or re-indexed inside another loop), unless it is
//!   a *row reduce*: a reduce over trailing axes of a symbolic length, read only broadcast back
//!   over them by at most `ROW_READERS` kernels whose loops take its rows outermost; each of
//!   those computes it per row in loops of its own (`decide`'s `fuse_rows`, `kernel`'s
//!   `KExpr::Row`);
//! - it is a `pad` read by `STENCIL_READS` or more consumers (the windows of a convolution or a
//!   pooling): one kernel writes the padded tensor, and the windows read it without masks;
//! - its fused expression tree would be deeper than `MAX_DEPTH` (bounds kernel size and the
//!   recursion that builds it).
//!
//! Movement ops are never materialized (except as outputs, shared pads, or to give a matmul an
//! affine operand that fits a GEMM): they become index arithmetic (`view::ViewStack`) in the kernels that read
//! them. `const` and `iota` leaves are never buffers: they become `Inst::Const`/`Inst::Index`. With
//! `fuse = false` every element-wise and reduce node is its own kernel (movement ops still fuse as
//! views), which gives the memory planner the most buffers to place.
//!
//! # Kernel emission (`KernelBuilder`)
//!
//! The root's expression tree is built down to materialized nodes (loads through views), leaves
//! and at most one fused reduce. The loop space is the root's shape (for a reduce kernel: the kept
//! dims, then the reduced dims); an element-wise kernel drops its size-1 dims and splits its dims
//! further where a read is a reshape of a differently strided view (a flattened window), so that
//! read indexes without div/mod. Adjacent loop dims are then merged whenever every view of the
//! kernel is contiguous across them and no view below a reshape has a dim boundary inside the
//! merged dim, so element-wise kernels over contiguous data loop once over numel.
//!
//! A concatenation (the front end's `cat`: an `add`/`or` chain of zero-padded pieces whose ranges
//! tile one axis, see `kernel::cat_pieces`) is not one kernel evaluating every piece's masked load
//! per element: each piece gets its own kernel over its own shape, writing its slice of the
//! output buffer (steps that write one buffer stay in order: `batch` orders write-after-write);
//! pieces whose kernels are the same loop nest around element-wise statements are one kernel
//! with a store per piece (`merge`: im2col's nine shifted windows of a 3x3 convolution are one
//! launch).
//! Instructions are hash-consed (CSE) and placed at the outermost loop level their operands allow
//! (loop-invariant loads of a reduce kernel sit outside the reduce loop). The outermost loop over
//! independent output elements is marked `parallel`. Identical kernels are stored once.
//!
//! # Data-dependent indexing and checks
//!
//! A `gather` is always materialized, with its `src` a buffer: its kernel computes the index
//! expression (fused) and reads `src` with an `Inst::Gather` (row-major `src`, the gathered axis's
//! stride times the index). A `scatter_add` is its own kernel over buffers (`scatter_kernel`):
//! the top-level parallel loop runs over the output positions off the axis, which no two index
//! positions can share, and for each zeroes the output line along the axis, then accumulates the
//! index positions of that line in order. Integer `div`/`mod` get an `Stmt::Check` of their
//! divisor. Every check is numbered in `Program::checks`; kernels that check take the program's
//! one `BufferKind::Status` buffer as a parameter.
//!
//! # Layout
//!
//! This file is the entry: the shared limits, [`decide`]'s result handed to [`emit`], which
//! assigns buffers and launches kernels. `decide.rs` makes the fusion decisions, `kernel.rs`
//! builds loop and scatter kernels, `contraction.rs` recognises contractions and builds their
//! matmul kernels. Tables keyed by node are `slotmap::SecondaryMap`s over the graph's ids.

mod contraction;
mod decide;
mod kernel;
mod memo;
mod merge;

use rustc_hash::FxHashMap as HashMap;

use air::{DType, Dim, Graph, NodeId, Op, OpClass, Symbol};
use slotmap::SecondaryMap;
use smallvec::SmallVec;

use crate::error::LowerError;
use crate::kir::{IExpr, Kernel};
use crate::program::{BufId, BufferInfo, BufferKind, Program, Step};
use crate::view::{IndexCx, Movement};

use contraction::matmul_kernel;
pub use decide::{Decisions, FuseOptions, MatmulOperand, Plan, decide};
use kernel::{cat_pieces, loop_kernel, scatter_kernel};
use memo::{Built, Hit, MatmulKey, Memo, Walk};

/// Element-wise nodes with several consumers are recomputed by each while their fused expression
/// has at most this many ops.
pub const RECOMPUTE_MAX: u32 = 8;
/// Element-wise nodes read through a broadcasting expand are recomputed while they cost at most
/// this many ops.
pub const BROADCAST_MAX: u32 = 4;

/// A `pad` read by at least this many consumers (a convolution's or a pooling's windows, each a
/// shifted view of one padded input) is written once into a buffer of its own: each window then
/// reads it without border masks (a masked load per tap kept the stencil scalar and recomputed
/// the padded producer in every tap).
pub const STENCIL_READS: u32 = 3;

/// The shortest rows (elements reduced per output, a known constant) over which a transcendental
/// read by a reduce and by something else gets a kernel of its own (see `decide`): rows of 8 are
/// the shortest codegen runs as whole-row tiles.
pub const TILE_ROWS_MIN: i64 = 8;

/// The most kernels that may each compute a row reduce for themselves (`decide`'s row fusion)
/// rather than read it from a kernel of its own.
pub const ROW_READERS: u32 = 2;

/// The placeholder of the status buffer while kernels are emitted (replaced at the end of `emit`).
const STATUS_BUF: BufId = BufId(u32::MAX);

/// Expression trees deeper than this are cut by a buffer, which bounds the recursion of kernel
/// building (and the size of one kernel) for very long element-wise chains.
pub const MAX_DEPTH: u32 = 64;

/// The buffer of every node that has one while kernels are emitted.
type Buffers = SecondaryMap<NodeId, BufId>;

/// Whether `op` is a view (reshape, permute, expand, pad, shrink).
fn is_movement(op: &Op) -> bool {
    op.class() == OpClass::Movement
}

/// The movement op of a node, if it is one.
pub fn movement(op: &Op) -> Option<Movement> {
    Some(match op {
        Op::Reshape(r) => Movement::Reshape(r.shape.clone()),
        Op::Permute(p) => Movement::Permute(p.perm.to_vec()),
        Op::Expand(e) => Movement::Expand(e.shape.clone()),
        Op::Pad(p) => Movement::Pad(p.padding.clone()),
        Op::Shrink(s) => Movement::Shrink(s.ranges.clone()),
        _ => return None,
    })
}

/// Every symbol the graph's live nodes mention, sorted by name: `Program::symbols`.
pub fn graph_symbols(g: &Graph, order: &[NodeId]) -> Vec<Symbol> {
    // A program mentions a handful of symbols: a list scanned per symbol beats sorting copies.
    let mut syms: Vec<Symbol> = Vec::new();
    let mut add = |d: &Dim| {
        d.for_each_symbol(|s| {
            if !syms.contains(s) {
                syms.push(s.clone());
            }
        })
    };
    for &n in order {
        let node = g.node(n);
        node.ty.shape.iter().for_each(&mut add);
        match &node.op {
            Op::Reshape(r) => r.shape.iter().for_each(&mut add),
            Op::Expand(e) => e.shape.iter().for_each(&mut add),
            Op::Pad(p) => p.padding.iter().for_each(|(a, b)| {
                add(a);
                add(b)
            }),
            Op::Shrink(s) => s.ranges.iter().for_each(|(a, b)| {
                add(a);
                add(b)
            }),
            _ => {}
        }
    }
    syms.sort();
    syms
}

/// Emits the program for decided boundaries.
pub fn emit<'g>(g: &'g Graph, dec: &'g Decisions) -> Result<Program, LowerError> {
    emit_with(g, dec, &mut |_, _| {})
}

/// Where a kernel handed over during emission is an earlier one with its accesses moved: that
/// kernel's index among the program's kernels, and the moves, per parameter, in elements (see
/// [`crate::PassObserver::shifted_kernel`]).
pub type Shifted<'a> = Option<(usize, &'a [IExpr])>;

/// [`emit`], handing each kernel of the program to `made` as soon as it is made, in the order of
/// `Program::kernels`, with where it is an earlier one moved ([`Shifted`]).
pub fn emit_with<'g>(
    g: &'g Graph,
    dec: &'g Decisions,
    made: &mut dyn FnMut(&Kernel, Shifted),
) -> Result<Program, LowerError> {
    let symbols = graph_symbols(g, &dec.order);
    let mut buffers: Vec<BufferInfo> = Vec::new();
    let mut bufs: Buffers = SecondaryMap::new();
    let new_buf = |buffers: &mut Vec<BufferInfo>, n: NodeId, kind: BufferKind| {
        let t = g.ty(n);
        buffers.push(BufferInfo { dtype: t.dtype, numel: t.numel(), kind });
        BufId(buffers.len() as u32 - 1)
    };
    let mut inputs: Vec<(u32, NodeId)> = dec
        .order
        .iter()
        .filter_map(|&n| match g.op(n) {
            Op::Input(i) => Some((i.slot, n)),
            _ => None,
        })
        .collect();
    inputs.sort();
    for (slot, n) in inputs {
        let b = new_buf(&mut buffers, n, BufferKind::Input(slot));
        bufs.insert(n, b);
    }
    let mut outputs = Vec::new();
    let mut out_bufs: Buffers = SecondaryMap::new();
    let mut copies = Vec::new();
    for (i, &o) in g.outputs().iter().enumerate() {
        let b = match out_bufs.get(o) {
            Some(&b) => b,
            None => {
                let b = new_buf(&mut buffers, o, BufferKind::Output(i as u32));
                out_bufs.insert(o, b);
                if matches!(g.op(o), Op::Input(_)) {
                    copies.push((o, b));
                } else {
                    bufs.insert(o, b);
                }
                b
            }
        };
        outputs.push((b, g.ty(o).clone()));
    }
    for &n in &dec.order {
        air::work::tick();
        if dec.plans.contains_key(n) && !bufs.contains_key(n) {
            if let Some(o) = dec.aliases.get(n) {
                bufs.insert(n, out_bufs[*o]);
                continue;
            }
            let b = new_buf(&mut buffers, n, BufferKind::Temp);
            bufs.insert(n, b);
        }
    }

    let mut out = Launches::default();
    let mut memo = Memo::default();
    let mut checks = Vec::new();
    let mut inits = Vec::new();
    // A loop kernel of a structure met before is not built again (`memo`); one met at other
    // offsets is moved there, its moves made index expressions in `shift_cx`.
    let shift_cx = IndexCx::new(symbols.clone());
    let loops = |out: &mut Launches,
                 memo: &mut Memo<'g>,
                 checks: &mut Vec<_>,
                 root: NodeId,
                 expand: bool,
                 target: BufId,
                 window: Option<&[(Dim, Dim)]>,
                 piece: bool|
     -> Result<Option<(Kernel, Vec<BufId>)>, LowerError> {
        let walk = Walk::new(g, &bufs, root, expand, target, window);
        if let Some(Hit { built, args, shifts }) = walk.as_ref().and_then(|w| memo.get(w)) {
            // The moves as index expressions, one per parameter (none: all zero).
            let by: Vec<IExpr> = match &shifts {
                Some(shifts) => shifts.iter().map(|d| shift_cx.dim(d)).collect::<Result<_, _>>()?,
                None => Vec::new(),
            };
            return Ok(match (built, piece) {
                (Built::Launched(id), false) if by.is_empty() => {
                    out.known(*id, args);
                    None
                }
                (Built::Launched(id), false) => {
                    let kernel = shifted(&out.kernels[*id as usize], &by);
                    out.launch_shifted(kernel, args, (*id, by));
                    None
                }
                (Built::Launched(id), true) => Some((shifted(&out.kernels[*id as usize], &by), args)),
                (Built::Piece(kernel), true) => Some((shifted(kernel, &by), args)),
                // Not met (a piece's key holds its window, a launched kernel's none), but were
                // it, the kernel is launched all the same.
                (Built::Piece(kernel), false) => {
                    out.launch(shifted(kernel, &by), args);
                    None
                }
            });
        }
        let (kernel, args) = loop_kernel(g, &bufs, &symbols, root, expand, target, window, &dec.rows, checks)?;
        if piece {
            if let Some(w) = walk {
                memo.insert(w, Built::Piece(Box::new(kernel.clone())), &args);
            }
            return Ok(Some((kernel, args)));
        }
        // Remembered by its launch's index: the kernel itself is not copied.
        let id = out.launch(kernel, args);
        if let (Some(w), Some(step)) = (walk, out.steps.last()) {
            memo.insert(w, Built::Launched(id), &step.args);
        }
        Ok(None)
    };
    // Kernels are final once made: each goes to `made` before the next node is emitted.
    let mut reported = 0;
    let mut report = |out: &Launches| {
        for (k, shifted) in out.kernels[reported..].iter().zip(&out.shifted[reported..]) {
            made(k, shifted.as_ref().map(|(from, by)| (*from as usize, by.as_slice())));
        }
        reported = out.kernels.len();
    };
    for (o, b) in copies {
        loops(&mut out, &mut memo, &mut checks, o, true, b, None, false)?;
    }
    for &n in &dec.order {
        air::work::tick();
        report(&out);
        let Some(plan) = dec.plans.get(n) else { continue };
        let target = bufs[n];
        match plan {
            Plan::Loops if matches!(g.op(n), Op::ScatterAdd(_)) => {
                let (k, args) = scatter_kernel(g, &bufs, &symbols, n, target, &mut checks)?;
                out.launch(k, args);
            }
            Plan::Loops => match cat_pieces(g, &bufs, n) {
                // A concatenation: each piece is computed into its slice of the output.
                Some((axis, pieces)) => {
                    let shape = &g.ty(n).shape;
                    // Written in place over an input nobody else reads: the pieces that copy it
                    // into its own positions are not launched (`Program::inits`).
                    let base = match buffers[target.0 as usize].kind {
                        BufferKind::Output(_) => in_place_base(g, dec, n, axis, &pieces),
                        _ => None,
                    };
                    if let Some(x) = base {
                        inits.push((target, bufs[x]));
                    }
                    // Pieces over the same loop nest share one kernel (`merge`).
                    let mut kernels = Vec::new();
                    for (leaf, lo, hi) in pieces {
                        if base.is_some() && copied_input(g, leaf, axis) == base {
                            continue;
                        }
                        let window: Vec<(Dim, Dim)> = (0..shape.len())
                            .map(|d| if d == axis { (lo, hi) } else { (Dim::Const(0), shape[d]) })
                            .collect();
                        if let Some(piece) =
                            loops(&mut out, &mut memo, &mut checks, leaf, true, target, Some(&window), true)?
                        {
                            merge::push_piece(&mut kernels, piece);
                        }
                    }
                    for (k, args) in kernels {
                        out.launch(k, args);
                    }
                }
                None => {
                    loops(&mut out, &mut memo, &mut checks, n, true, target, None, false)?;
                }
            },
            Plan::Matmul { reduce, a, b, bias } => {
                if let Some(bias) = bias {
                    loops(&mut out, &mut memo, &mut checks, *bias, false, target, None, false)?;
                }
                // A matmul of a structure met before is not built again (`memo`).
                let key = MatmulKey::new(g, &bufs, *reduce, [a, b], target, bias.is_some());
                if let Some((id, args)) = key.as_ref().and_then(|(key, at)| memo.matmul(key, at)) {
                    out.known(id, args);
                    continue;
                }
                let (k, args) = matmul_kernel(g, &bufs, &symbols, *reduce, [a, b], target, bias.is_some())?;
                let launched = args.clone();
                let id = out.launch(k, args);
                if let Some((key, at)) = key {
                    memo.insert_matmul(key, &at, id, &launched);
                }
            }
        }
    }
    report(&out);
    let Launches { kernels, mut steps, .. } = out;
    // The status buffer exists only when some kernel checks something.
    if !checks.is_empty() {
        let status = BufId(buffers.len() as u32);
        buffers.push(BufferInfo {
            dtype: DType::I32,
            numel: Dim::Const(crate::kir::STATUS_WORDS as i64),
            kind: BufferKind::Status,
        });
        for arg in steps.iter_mut().flat_map(|s| s.args.iter_mut()).filter(|a| **a == STATUS_BUF) {
            *arg = status;
        }
    }
    Ok(Program { symbols, kernels, steps, buffers, outputs, inits, checks: Vec::new(), data_checks: checks })
}

/// `kernel` (a loop kernel the memo holds) with each parameter `p`'s accesses moved `by[p]`
/// elements further into its buffer (none where `by` is empty).
fn shifted(kernel: &Kernel, by: &[IExpr]) -> Kernel {
    match kernel {
        Kernel::Loops(k) if !by.is_empty() => {
            let mut k = crate::offsets::shift_accesses(k, by);
            k.n_syms = by.iter().filter_map(kernel::max_sym_expr).map(|m| m + 1).fold(k.n_syms, u32::max);
            Kernel::Loops(k)
        }
        _ => kernel.clone(),
    }
}

/// The kernels of a program and its steps, each kernel stored once.
#[derive(Default)]
struct Launches {
    kernels: Vec<Kernel>,
    /// Per kernel, the earlier kernel it was made from by moving its accesses, and the moves
    /// ([`crate::PassObserver::shifted_kernel`]).
    shifted: Vec<Option<(u32, Vec<IExpr>)>>,
    /// Kernels by structural hash: a launch of a kernel seen before is found without storing it
    /// again (a depth-8 Transformer launches 32 kernels 230 times).
    ids: HashMap<u64, SmallVec<[u32; 1]>>,
    steps: Vec<Step>,
}

impl Launches {
    /// Launches `kernel` on `args`; returns its index among the kernels.
    fn launch(&mut self, kernel: Kernel, args: Vec<BufId>) -> u32 {
        self.launch_made(kernel, args, None)
    }

    /// Launches `kernel`, kernel `from.0` with its accesses moved by `from.1`, on `args`.
    fn launch_shifted(&mut self, kernel: Kernel, args: Vec<BufId>, from: (u32, Vec<IExpr>)) -> u32 {
        self.launch_made(kernel, args, Some(from))
    }

    fn launch_made(&mut self, kernel: Kernel, args: Vec<BufId>, from: Option<(u32, Vec<IExpr>)>) -> u32 {
        let same = self.ids.entry(kernel.structural_hash()).or_default();
        let id = match same.iter().find(|&&id| self.kernels[id as usize] == kernel) {
            Some(&id) => id,
            None => {
                self.kernels.push(kernel);
                self.shifted.push(from);
                same.push(self.kernels.len() as u32 - 1);
                self.kernels.len() as u32 - 1
            }
        };
        self.known(id, args);
        id
    }

    /// Launches the kernel `id` again, on `args`.
    fn known(&mut self, id: u32, args: Vec<BufId>) {
        air::work::add(1 + args.len() as u64);
        self.steps.push(Step { kernel: id, args });
    }
}

/// The input `x` that the cat piece `leaf` copies into its own positions (`pad(shrink(x))` with
/// the same range along `axis` and whole elsewhere), if it is one.
fn copied_input(g: &Graph, leaf: NodeId, axis: usize) -> Option<NodeId> {
    let (Op::Pad(pad), [shrink]) = (g.op(leaf), g.inputs(leaf)) else { return None };
    let (Op::Shrink(s), [x]) = (g.op(*shrink), g.inputs(*shrink)) else { return None };
    if !matches!(g.op(*x), Op::Input(_)) || g.ty(*x).shape != g.ty(leaf).shape {
        return None;
    }
    let shape = &g.ty(leaf).shape;
    let same = (0..shape.len()).all(|d| {
        let (lo, hi) = &s.ranges[d];
        if d == axis {
            *lo == pad.padding[d].0 && *hi == shape[d] - pad.padding[d].1
        } else {
            *lo == Dim::Const(0) && *hi == shape[d] && pad.padding[d] == (Dim::Const(0), Dim::Const(0))
        }
    });
    same.then_some(*x)
}

/// The input a concatenation `n` may be written over in place: the input `x` some pieces copy
/// into their own positions, when nothing else reads `x` (its only users are those pieces'
/// shrinks, each used once, by a pad used once, inside `n`'s add chain of single-use nodes) and
/// it is not an output. The caller gives the output buffer `x`'s contents before the run and
/// launches only the other pieces, so the unchanged part is never copied (a KV cache update).
fn in_place_base(g: &Graph, dec: &Decisions, n: NodeId, axis: usize, pieces: &[kernel::CatPiece]) -> Option<NodeId> {
    let x = pieces.iter().find_map(|(leaf, _, _)| copied_input(g, *leaf, axis))?;
    if g.outputs().contains(&x) {
        return None;
    }
    let single_use = |m: NodeId| g.users(m).len() == 1 && !dec.plans.contains_key(m);
    let mut from_x = 0;
    for (leaf, _, _) in pieces {
        if copied_input(g, *leaf, axis) == Some(x) {
            if !single_use(*leaf) || !single_use(g.inputs(*leaf)[0]) {
                return None;
            }
            from_x += 1;
        }
    }
    // Every user of `x` is one of those shrinks.
    if g.users(x).len() != from_x {
        return None;
    }
    // The add chain between the pieces and `n`: no node of it is read elsewhere.
    let mut stack: Vec<NodeId> = g.inputs(n).to_vec();
    while let Some(m) = stack.pop() {
        air::work::tick();
        if matches!(g.op(m), Op::Binary(_)) {
            if !single_use(m) {
                return None;
            }
            stack.extend(g.inputs(m).iter().copied());
        }
    }
    Some(x)
}

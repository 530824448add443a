//! Saturation per repeated block: a graph is cut into regions at its narrowest points between
//! matmuls, each region is listed as a small graph of its own and compared by structure, and
//! each distinct region is saturated once, its result reused for every identical region.
//!
//! # Cutting
//!
//! Walk the live nodes in topological order. After each position, the *frontier* is the number
//! of non-leaf values computed so far that something later (or the graph's outputs) still reads;
//! leaves (inputs, consts, iotas) are free to read anywhere and do not count, and neither do
//! values computed from consts and iotas alone (a causal mask: a constant of the program). A cut
//! may fall after a position with a matmul before it and a matmul after it, and no matmul result
//! (or view of one) and no part of a matmul's pattern live across it (so no matmul chain is
//! split, and no matmul is cut from its operands); cuts fall at the candidates whose frontier is
//! the least over all candidates, skipping any that would leave a region without a matmul. In a Transformer the narrowest points are the residual stream between the
//! attention and MLP halves of each layer, so the regions are those halves, and every layer after
//! the first (which also computes the mask that the others read) repeats them.
//!
//! # Structure and reuse
//!
//! A region's graph reads its boundary values (values of earlier regions, and the graph's inputs:
//! a layer's weights) as inputs numbered by first use, copies the consts and iotas it reads, and
//! outputs the values read after it, in order. Identical layers therefore list equal graphs
//! (what `air::GraphKey` would say of them), compared by a structural hash and then in full, so
//! a hash collision never merges two regions. The graph is built only for the first region of
//! each structure, which is saturated once; a changed result is instantiated in place of every
//! region with that structure, its inputs bound to that region's boundary values.
//!
//! Regions are used only when some structure repeats: without repetition there is nothing to reuse,
//! and saturating the whole graph keeps the rewrites that span a cut (a matmul chain cut in two
//! could not reassociate).

use std::hash::{Hash, Hasher};

use air::graph::Inputs;
use air::op::Input;
use air::{Graph, Node, NodeId, Op};
use rustc_hash::FxHashMap as HashMap;
use rustc_hash::FxHasher;
use slotmap::SecondaryMap;
use smallvec::SmallVec;

use super::lang::is_matmul;

/// A region of the graph, listed as the graph of its own it stands for (see the module docs);
/// the graph itself is built only for the first region of each structure ([`Block::graph`]).
pub struct Block {
    /// The region's nodes in the order its graph adds them.
    items: Vec<Item>,
    /// Positions in `items` of the graph's outputs.
    output_items: Vec<u32>,
    /// Structural hash of `items` and `output_items`.
    hash: u64,
    /// The value of the original graph each input slot of the block's graph stands for.
    pub boundary: Vec<NodeId>,
    /// The original nodes the block graph's outputs stand for, in order.
    pub outputs: Vec<NodeId>,
}

/// A node of a block's graph: the original node, and what it becomes.
struct Item {
    id: NodeId,
    kind: ItemKind,
}

#[derive(PartialEq)]
enum ItemKind {
    /// A value of an earlier region (or a graph input): an input of the block's graph.
    Boundary { slot: u32 },
    /// A const or iota: copied.
    Leaf,
    /// A node of the region, its inputs by position in `items`.
    Node { inputs: SmallVec<[u32; 3]> },
}

impl Block {
    /// Whether `self` and `other` stand for equal graphs (what their `GraphKey`s would say).
    fn same_as(&self, other: &Block, g: &Graph) -> bool {
        self.hash == other.hash
            && self.output_items == other.output_items
            && self.items.len() == other.items.len()
            && self.items.iter().zip(&other.items).all(|(a, b)| {
                let (x, y) = (g.node(a.id), g.node(b.id));
                a.kind == b.kind && x.ty == y.ty && (matches!(a.kind, ItemKind::Boundary { .. }) || x.op == y.op)
            })
    }

    /// The block's graph: inputs by slot, outputs in order.
    pub fn graph(&self, g: &Graph) -> Graph {
        let mut graph = Graph::with_capacity(self.items.len());
        let mut made: Vec<NodeId> = Vec::with_capacity(self.items.len());
        for item in &self.items {
            let node = g.node(item.id);
            let new = match &item.kind {
                ItemKind::Boundary { slot } => {
                    Node { op: Op::Input(Input { slot: *slot }), inputs: Inputs::new(), ty: node.ty.clone() }
                }
                ItemKind::Leaf => Node { op: node.op.clone(), inputs: Inputs::new(), ty: node.ty.clone() },
                ItemKind::Node { inputs } => Node {
                    op: node.op.clone(),
                    inputs: inputs.iter().map(|&p| made[p as usize]).collect(),
                    ty: node.ty.clone(),
                },
            };
            made.push(graph.add_unchecked(new));
        }
        graph.set_outputs(self.output_items.iter().map(|&p| made[p as usize]).collect());
        graph
    }
}

/// The live non-leaf nodes of `g` in topological order, cut into regions (see the module docs);
/// one region when there is no cut (fewer than two matmuls).
pub fn regions(g: &Graph) -> Vec<Vec<NodeId>> {
    let order = g.live_order();
    let n = order.len();
    let mut pos: SecondaryMap<NodeId, usize> = SecondaryMap::with_capacity(n);
    for (i, &id) in order.iter().enumerate() {
        pos.insert(id, i);
    }
    let mut is_output: SecondaryMap<NodeId, ()> = SecondaryMap::new();
    for &o in g.outputs() {
        is_output.insert(o, ());
    }
    // delta[i]: change of the frontier after position i (a value is live from its position up
    // to, not including, its last reader's).
    let mut delta = vec![0i64; n + 1];
    // The same for values that are matmul results (or views of one): a cut there would split a
    // matmul chain that reassociation may need whole.
    let mut products = vec![0i64; n + 1];
    let mut product: SecondaryMap<NodeId, ()> = SecondaryMap::new();
    // A matmul's own pattern (its product and the operand views that feed it) is never cut
    // either: a region holding half of it would hold no matmul.
    let matmuls: SecondaryMap<NodeId, ()> = order.iter().filter(|&&id| is_matmul(g, id)).map(|&id| (id, ())).collect();
    for id in matmuls.keys() {
        let prod = g.inputs(id)[0];
        product.insert(prod, ());
        for &v in g.inputs(prod) {
            product.insert(v, ());
        }
    }
    let mut matmuls_upto = Vec::with_capacity(n);
    let mut seen = 0usize;
    // Values computed from leaves other than inputs alone (a causal mask from iotas): constants
    // of the program, read by every layer, that do not narrow anything.
    let mut constant: SecondaryMap<NodeId, ()> = SecondaryMap::new();
    for (i, &id) in order.iter().enumerate() {
        air::work::add(1 + g.users(id).len() as u64);
        if matmuls.contains_key(id) {
            seen += 1;
        }
        matmuls_upto.push(seen);
        let inputs = g.inputs(id);
        if (inputs.is_empty() && !matches!(g.op(id), Op::Input(_)))
            || (!inputs.is_empty() && inputs.iter().all(|&k| constant.contains_key(k)))
        {
            constant.insert(id, ());
        }
        let view = matches!(g.op(id), Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) | Op::Shrink(_));
        if matmuls.contains_key(id) || (view && product.contains_key(inputs[0])) {
            product.insert(id, ());
        }
        if inputs.is_empty() || constant.contains_key(id) {
            continue;
        }
        let last = if is_output.contains_key(id) {
            n
        } else {
            g.users(id).iter().filter_map(|&u| pos.get(u).copied()).max().unwrap_or(i)
        };
        if last > i {
            delta[i] += 1;
            delta[last] -= 1;
        }
        if last > i && product.contains_key(id) {
            products[i] += 1;
            products[last] -= 1;
        }
    }
    let mut frontier = Vec::with_capacity(n);
    let mut products_live = Vec::with_capacity(n);
    let (mut live, mut live_products) = (0i64, 0i64);
    for (d, p) in delta[..n].iter().zip(&products[..n]) {
        live += d;
        live_products += p;
        frontier.push(live);
        products_live.push(live_products);
    }
    let candidate = |i: usize| matmuls_upto[i] >= 1 && matmuls_upto[i] < seen && products_live[i] == 0;
    let narrowest = (0..n).filter(|&i| candidate(i)).map(|i| frontier[i]).min();
    let mut cuts = Vec::new();
    if let Some(narrowest) = narrowest {
        let mut matmuls_at_cut = 0;
        for i in 0..n {
            if candidate(i) && frontier[i] == narrowest && matmuls_upto[i] > matmuls_at_cut {
                cuts.push(i);
                matmuls_at_cut = matmuls_upto[i];
            }
        }
    }
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut current = Vec::new();
    let mut next_cut = cuts.iter().peekable();
    for (i, &id) in order.iter().enumerate() {
        if !g.inputs(id).is_empty() {
            current.push(id);
        }
        if next_cut.peek() == Some(&&i) {
            next_cut.next();
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() || out.is_empty() {
        out.push(current);
    }
    out
}

/// The graphs of `regions` (see the module docs).
pub fn blocks(g: &Graph, regions: &[Vec<NodeId>]) -> Vec<Block> {
    let mut region_of: SecondaryMap<NodeId, usize> = SecondaryMap::new();
    for (r, nodes) in regions.iter().enumerate() {
        for &id in nodes {
            region_of.insert(id, r);
        }
    }
    let mut is_output: SecondaryMap<NodeId, ()> = SecondaryMap::new();
    for &o in g.outputs() {
        is_output.insert(o, ());
    }
    regions
        .iter()
        .enumerate()
        .map(|(r, nodes)| {
            let outputs: Vec<NodeId> = nodes
                .iter()
                .copied()
                .filter(|&id| {
                    is_output.contains_key(id)
                        || g.users(id).iter().any(|&u| region_of.get(u).is_some_and(|&ru| ru != r))
                })
                .collect();
            // Nodes are listed in post-order of a depth-first walk from the outputs, inputs in
            // operand order: an order that depends on the structure alone, not on the slots the
            // rewriter happened to give nodes, so identical layers list identical graphs.
            let mut items: Vec<Item> = Vec::with_capacity(nodes.len());
            let mut position: HashMap<NodeId, u32> = HashMap::with_capacity_and_hasher(nodes.len(), Default::default());
            let mut boundary = Vec::new();
            let mut h = FxHasher::default();
            let mut stack: Vec<(NodeId, usize)> = outputs.iter().rev().map(|&o| (o, 0)).collect();
            while let Some((id, next)) = stack.pop() {
                if position.contains_key(&id) {
                    continue;
                }
                let node = g.node(id);
                let kind = if region_of.get(id) != Some(&r) {
                    match g.op(id) {
                        // Consts and iotas are part of the structure: copied.
                        Op::Const(_) | Op::Iota(_) => ItemKind::Leaf,
                        _ => {
                            let slot = u32::try_from(boundary.len()).expect("fewer than 2^32 inputs");
                            boundary.push(id);
                            ItemKind::Boundary { slot }
                        }
                    }
                } else if let Some(&input) = node.inputs.get(next) {
                    stack.push((id, next + 1));
                    if !position.contains_key(&input) {
                        stack.push((input, 0));
                    }
                    continue;
                } else {
                    ItemKind::Node { inputs: node.inputs.iter().map(|i| position[i]).collect() }
                };
                node.ty.hash(&mut h);
                match &kind {
                    ItemKind::Boundary { slot } => h.write_u32(*slot),
                    ItemKind::Leaf => node.op.hash(&mut h),
                    ItemKind::Node { inputs } => {
                        node.op.hash(&mut h);
                        inputs.iter().for_each(|&i| h.write_u32(i));
                    }
                }
                position.insert(id, u32::try_from(items.len()).expect("fewer than 2^32 nodes"));
                items.push(Item { id, kind });
            }
            let output_items: Vec<u32> = outputs.iter().map(|o| position[o]).collect();
            output_items.iter().for_each(|&p| h.write_u32(p));
            Block { items, output_items, hash: h.finish(), boundary, outputs }
        })
        .collect()
}

/// For each of `blocks`, the index of the first block with the same structure (itself when it is
/// the first), and whether any structure repeats. Blocks are compared by structural hash, then
/// in full (so a collision never merges two different blocks).
pub fn representatives(g: &Graph, blocks: &[Block]) -> (Vec<usize>, bool) {
    let mut firsts: HashMap<u64, Vec<usize>> = HashMap::default();
    let mut repeats = false;
    let reps = blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let seen = firsts.entry(b.hash).or_default();
            match seen.iter().find(|&&f| blocks[f].same_as(b, g)) {
                Some(&first) => {
                    repeats = true;
                    first
                }
                None => {
                    seen.push(i);
                    i
                }
            }
        })
        .collect();
    (reps, repeats)
}

/// Adds `result` (a saturated block graph) to `g`, its input slots bound to `boundary`; returns
/// the nodes standing for its outputs.
pub fn instantiate(g: &mut Graph, result: &Graph, boundary: &[NodeId]) -> Vec<NodeId> {
    let mut map: HashMap<NodeId, NodeId> = HashMap::with_capacity_and_hasher(result.len(), Default::default());
    for id in result.live_order() {
        let node = result.node(id);
        let new = match &node.op {
            Op::Input(Input { slot }) => boundary[*slot as usize],
            op => {
                let inputs = node.inputs.iter().map(|i| map[i]).collect();
                g.add_unchecked(Node { op: op.clone(), inputs, ty: node.ty.clone() })
            }
        };
        map.insert(id, new);
    }
    result.outputs().iter().map(|o| map[o]).collect()
}

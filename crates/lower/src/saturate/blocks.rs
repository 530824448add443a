//! Saturation per repeated block: a graph is cut into regions at its narrowest points between
//! matmuls, each region becomes a small graph of its own keyed by structure (`air::GraphKey`),
//! and each distinct region is saturated once, its result reused for every identical region.
//!
//! # Cutting
//!
//! Walk the live nodes in topological order. After each position, the *frontier* is the number
//! of non-leaf values computed so far that something later (or the graph's outputs) still reads;
//! leaves (inputs, consts, iotas) are free to read anywhere and do not count, and neither do
//! values computed from consts and iotas alone (a causal mask: a constant of the program). A cut may fall
//! after a position with a matmul before it and a matmul after it, and no matmul result (or view
//! of one) live across it (so no matmul chain is split); cuts fall at the candidates
//! whose frontier is the least over all candidates, skipping any that would leave a region
//! without a matmul. In a Transformer the narrowest points are the residual stream between the
//! attention and MLP halves of each layer, so the regions are those halves, and every layer after
//! the first (which also computes the mask that the others read) repeats them.
//!
//! # Keys and reuse
//!
//! A region's graph reads its boundary values (values of earlier regions, and the graph's inputs:
//! a layer's weights) as inputs numbered by first use, copies the consts and iotas it reads, and
//! outputs the values read after it, in order. Identical layers therefore give equal graphs and
//! equal `GraphKey`s (a key compares in full, so equal keys are equal graphs, not a hash
//! collision). Each distinct key is saturated once; a changed result is instantiated in place of
//! every region with that key, its inputs bound to that region's boundary values.
//!
//! Regions are used only when some key repeats: without repetition there is nothing to reuse,
//! and saturating the whole graph keeps the rewrites that span a cut (a matmul chain cut in two
//! could not reassociate).

use std::collections::HashMap;

use air::graph::Inputs;
use air::op::Input;
use air::{Graph, GraphKey, Node, NodeId, Op};
use slotmap::SecondaryMap;

use super::lang::is_matmul;

/// A region of the graph as a graph of its own.
pub struct Block {
    /// The region's graph: inputs by slot, outputs in order.
    pub graph: Graph,
    /// The value of the original graph each input slot of `graph` stands for.
    pub boundary: Vec<NodeId>,
    /// The original nodes `graph`'s outputs stand for, in order.
    pub outputs: Vec<NodeId>,
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
    let mut matmuls_upto = Vec::with_capacity(n);
    let mut seen = 0usize;
    // Values computed from leaves other than inputs alone (a causal mask from iotas): constants
    // of the program, read by every layer, that do not narrow anything.
    let mut constant: SecondaryMap<NodeId, ()> = SecondaryMap::new();
    for (i, &id) in order.iter().enumerate() {
        air::work::add(1 + g.users(id).len() as u64);
        if is_matmul(g, id) {
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
        if is_matmul(g, id) || (view && product.contains_key(inputs[0])) {
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
            // Nodes are added in post-order of a depth-first walk from the outputs, inputs in
            // operand order: an order that depends on the structure alone, not on the slots the
            // rewriter happened to give nodes, so identical layers give identical graphs.
            let mut graph = Graph::with_capacity(nodes.len());
            let mut map: HashMap<NodeId, NodeId> = HashMap::with_capacity(nodes.len());
            let mut boundary = Vec::new();
            let mut stack: Vec<(NodeId, usize)> = outputs.iter().rev().map(|&o| (o, 0)).collect();
            while let Some((id, next)) = stack.pop() {
                if map.contains_key(&id) {
                    continue;
                }
                let node = g.node(id);
                if region_of.get(id) != Some(&r) {
                    let m = match g.op(id) {
                        // Consts and iotas are part of the structure: copied.
                        op @ (Op::Const(_) | Op::Iota(_)) => {
                            graph.add_unchecked(Node { op: op.clone(), inputs: Inputs::new(), ty: node.ty.clone() })
                        }
                        _ => {
                            let slot = u32::try_from(boundary.len()).expect("fewer than 2^32 inputs");
                            boundary.push(id);
                            let op = Op::Input(Input { slot });
                            graph.add_unchecked(Node { op, inputs: Inputs::new(), ty: node.ty.clone() })
                        }
                    };
                    map.insert(id, m);
                    continue;
                }
                if let Some(&input) = node.inputs.get(next) {
                    stack.push((id, next + 1));
                    if !map.contains_key(&input) {
                        stack.push((input, 0));
                    }
                    continue;
                }
                let inputs = node.inputs.iter().map(|i| map[i]).collect();
                let m = graph.add_unchecked(Node { op: node.op.clone(), inputs, ty: node.ty.clone() });
                map.insert(id, m);
            }
            graph.set_outputs(outputs.iter().map(|o| map[o]).collect());
            Block { graph, boundary, outputs }
        })
        .collect()
}

/// Whether two of `blocks` have the same structure, and the key of each.
pub fn keys(blocks: &[Block]) -> (Vec<GraphKey>, bool) {
    let keys: Vec<GraphKey> = blocks.iter().map(|b| GraphKey::of(&b.graph)).collect();
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    let repeats = keys.iter().any(|k| !seen.insert(k));
    (keys, repeats)
}

/// Adds `result` (a saturated block graph) to `g`, its input slots bound to `boundary`; returns
/// the nodes standing for its outputs.
pub fn instantiate(g: &mut Graph, result: &Graph, boundary: &[NodeId]) -> Vec<NodeId> {
    let mut map: HashMap<NodeId, NodeId> = HashMap::with_capacity(result.len());
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

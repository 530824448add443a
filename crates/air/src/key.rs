//! The structural key of a graph: what the program cache is keyed by.
//!
//! Two graphs get equal keys when they hold the same ops (with attributes and types) wired the same
//! way, whatever the slot numbers of their `NodeId`s. Nodes are listed in the graph's topological
//! order and refer to their inputs by position in that list, so a graph built twice by the same
//! code has one key. Symbol *values* are not part of the key: one program serves every binding.
//!
//! Hashing uses `rustc-hash`'s `FxHasher`, a fast non-cryptographic hash: a cache compares keys
//! in full on a hash match, so only speed and spread matter, not resistance to crafted
//! collisions (SipHash made hashing a third of a cache hit).

use std::hash::{Hash, Hasher};

use rustc_hash::FxHasher;
use smallvec::SmallVec;

use crate::graph::{Graph, NodeId};
use crate::op::{Op, TensorType};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct KeyNode {
    op: Op,
    ty: TensorType,
    /// Positions of the inputs in the key's node list (always earlier entries).
    inputs: SmallVec<[u32; 3]>,
}

/// A graph's structure without its ids, for caches keyed by structure (a device's program cache,
/// a trainer counting distinct step graphs); hashing it reads only the precomputed hash.
#[derive(Clone, Debug)]
pub struct GraphKey {
    nodes: Vec<KeyNode>,
    outputs: Vec<u32>,
    hash: u64,
}

/// The position of every node of `order` in it, indexed by `NodeId::index` (`u32::MAX`: absent).
pub fn positions(order: &[NodeId]) -> Vec<u32> {
    let len = order.iter().map(|id| id.index() as usize + 1).max().unwrap_or(0);
    let mut position = vec![u32::MAX; len];
    for (i, id) in order.iter().enumerate() {
        position[id.index() as usize] = i as u32;
    }
    position
}

/// Feeds one node (op, type, input positions) to the hasher; `of` and `structural_hash` agree.
fn hash_node(h: &mut FxHasher, op: &Op, ty: &TensorType, inputs: impl ExactSizeIterator<Item = u32>) {
    op.hash(h);
    ty.hash(h);
    h.write_usize(inputs.len());
    for i in inputs {
        h.write_u32(i);
    }
}

impl GraphKey {
    /// The key of `graph`: O(N) over every node of the graph (dead nodes included, so that the
    /// input slots a program expects are the graph's input nodes).
    pub fn of(graph: &Graph) -> GraphKey {
        GraphKey::with_hash(graph, GraphKey::structural_hash(graph))
    }

    /// [`GraphKey::of`] for a graph whose [`GraphKey::structural_hash`] is `hash` (a cache that
    /// looked the graph up has it already): the nodes are copied, not hashed again. A `hash`
    /// of another graph makes a key no lookup of this graph finds.
    pub fn with_hash(graph: &Graph, hash: u64) -> GraphKey {
        let order = graph.topo_order();
        let position = positions(order);
        let mut nodes = Vec::with_capacity(order.len());
        for &id in order {
            let node = graph.node(id);
            crate::work::add(1 + node.inputs.len() as u64);
            let inputs: SmallVec<[u32; 3]> = node.inputs.iter().map(|input| position[input.index() as usize]).collect();
            nodes.push(KeyNode { op: node.op.clone(), ty: node.ty.clone(), inputs });
        }
        let outputs: Vec<u32> = graph.outputs().iter().map(|o| position[o.index() as usize]).collect();
        debug_assert_eq!(hash, GraphKey::structural_hash(graph), "the hash is the graph's");
        GraphKey { nodes, outputs, hash }
    }

    /// `GraphKey::of(graph).hash_value()` without building the key (no clone of any op or type):
    /// what a cache lookup needs before [`GraphKey::matches`].
    pub fn structural_hash(graph: &Graph) -> u64 {
        let order = graph.topo_order();
        let position = positions(order);
        let mut h = FxHasher::default();
        h.write_usize(order.len());
        for &id in order {
            let node = graph.node(id);
            crate::work::add(1 + node.inputs.len() as u64);
            hash_node(&mut h, &node.op, &node.ty, node.inputs.iter().map(|input| position[input.index() as usize]));
        }
        h.write_usize(graph.outputs().len());
        graph.outputs().iter().for_each(|o| h.write_u32(position[o.index() as usize]));
        h.finish()
    }

    /// Whether `graph` has this key (`GraphKey::of(graph) == *self`), without building its key.
    pub fn matches(&self, graph: &Graph) -> bool {
        let order = graph.topo_order();
        if order.len() != self.nodes.len() || graph.outputs().len() != self.outputs.len() {
            return false;
        }
        let position = positions(order);
        let same_nodes = order.iter().zip(&self.nodes).all(|(&id, key)| {
            let node = graph.node(id);
            node.inputs.len() == key.inputs.len()
                && node.inputs.iter().zip(&key.inputs).all(|(i, &k)| position[i.index() as usize] == k)
                && node.op == key.op
                && node.ty == key.ty
        });
        same_nodes && graph.outputs().iter().zip(&self.outputs).all(|(o, &k)| position[o.index() as usize] == k)
    }

    /// The precomputed structural hash.
    pub fn hash_value(&self) -> u64 {
        self.hash
    }

    /// Number of nodes the key covers.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the key covers no node (the key of an empty graph).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The op and type of the node at `position` of the topological order the key lists (that of
    /// every graph with this key), if there is one: a key kept instead of its graph still
    /// answers what each node is.
    pub fn node(&self, position: usize) -> Option<(&Op, &TensorType)> {
        self.nodes.get(position).map(|n| (&n.op, &n.ty))
    }

    /// The type of each input slot (`None` for a slot no input node has), in slot order.
    pub fn input_types(&self) -> Vec<Option<TensorType>> {
        let mut slots: Vec<Option<TensorType>> = Vec::new();
        for n in &self.nodes {
            if let Op::Input(input) = &n.op {
                let slot = input.slot as usize;
                if slots.len() <= slot {
                    slots.resize(slot + 1, None);
                }
                slots[slot] = Some(n.ty.clone());
            }
        }
        slots
    }

    /// The type of each graph output, in output order.
    pub fn output_types(&self) -> Vec<TensorType> {
        self.outputs.iter().map(|&o| self.nodes[o as usize].ty.clone()).collect()
    }
}

impl PartialEq for GraphKey {
    fn eq(&self, other: &GraphKey) -> bool {
        self.hash == other.hash && self.outputs == other.outputs && self.nodes == other.nodes
    }
}

impl Eq for GraphKey {}

impl Hash for GraphKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;
    use crate::dim::shape_of;
    use crate::op::{BinaryOp, Input, UnaryOp};

    fn build(extra_dead: bool) -> Graph {
        let mut g = Graph::new();
        let t = TensorType::new(DType::F32, shape_of(&[4]));
        if extra_dead {
            // A node removed again shifts the slot numbers of everything after it.
            let d0 = g.add_leaf(Op::Input(Input { slot: 0 }), t.clone()).unwrap();
            let d1 = g.add_leaf(Op::Input(Input { slot: 1 }), t.clone()).unwrap();
            g.remove(d0).unwrap();
            g.remove(d1).unwrap();
        }
        let a = g.add_leaf(Op::Input(Input { slot: 0 }), t.clone()).unwrap();
        let b = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
        let c = g.add(Op::Binary(BinaryOp::Mul), &[b, a]).unwrap();
        g.add_output(c);
        g
    }

    #[test]
    fn key_ignores_slot_numbers() {
        let (g1, g2) = (build(false), build(true));
        assert_eq!(GraphKey::of(&g1), GraphKey::of(&g2));
        assert_eq!(GraphKey::of(&g1).hash_value(), GraphKey::of(&g2).hash_value());
    }

    #[test]
    fn hash_and_match_agree_with_the_key() {
        let (g1, g2) = (build(false), build(true));
        let key = GraphKey::of(&g1);
        assert_eq!(GraphKey::structural_hash(&g1), key.hash_value());
        assert_eq!(GraphKey::structural_hash(&g2), key.hash_value());
        assert!(key.matches(&g1) && key.matches(&g2));
        let mut g3 = build(false);
        let out = g3.outputs()[0];
        let extra = g3.add(Op::Unary(UnaryOp::Neg), &[out]).unwrap();
        g3.add_output(extra);
        assert!(!key.matches(&g3));
        assert_ne!(GraphKey::structural_hash(&g3), key.hash_value());
    }

    #[test]
    fn key_sees_ops_and_wiring() {
        let g1 = build(false);
        let mut g2 = Graph::new();
        let t = TensorType::new(DType::F32, shape_of(&[4]));
        let a = g2.add_leaf(Op::Input(Input { slot: 0 }), t).unwrap();
        let b = g2.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
        let c = g2.add(Op::Binary(BinaryOp::Mul), &[a, b]).unwrap();
        g2.add_output(c);
        assert_ne!(GraphKey::of(&g1), GraphKey::of(&g2));
    }
}

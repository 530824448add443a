//! The structural key of a graph: what the program cache is keyed by.
//!
//! Two graphs get equal keys when they hold the same ops (with attributes and types) wired the same
//! way, whatever the slot numbers of their `NodeId`s. Nodes are listed in the graph's topological
//! order and refer to their inputs by position in that list, so a graph built twice by the same
//! code has one key. Symbol *values* are not part of the key: one program serves every binding.

use std::hash::{DefaultHasher, Hash, Hasher};

use air::{Graph, NodeId, Op, TensorType};
use smallvec::SmallVec;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct KeyNode {
    op: Op,
    ty: TensorType,
    /// Positions of the inputs in the key's node list (always earlier entries).
    inputs: SmallVec<[u32; 3]>,
}

/// A graph's structure without its ids; hashing it reads only the precomputed hash.
#[derive(Clone, Debug)]
pub struct GraphKey {
    nodes: Vec<KeyNode>,
    outputs: Vec<u32>,
    hash: u64,
}

impl GraphKey {
    /// The key of `graph`: O(N) over every node of the graph (dead nodes included, so that the
    /// input slots a program expects are the graph's input nodes).
    pub fn of(graph: &Graph) -> GraphKey {
        let order = graph.topo_order();
        let mut position: std::collections::HashMap<NodeId, u32> =
            std::collections::HashMap::with_capacity(order.len());
        let mut nodes = Vec::with_capacity(order.len());
        for (i, &id) in order.iter().enumerate() {
            position.insert(id, i as u32);
            let node = graph.node(id);
            let inputs = node.inputs.iter().map(|input| position[input]).collect();
            nodes.push(KeyNode { op: node.op.clone(), ty: node.ty.clone(), inputs });
        }
        let outputs: Vec<u32> = graph.outputs().iter().map(|o| position[o]).collect();
        let mut hasher = DefaultHasher::new();
        nodes.hash(&mut hasher);
        outputs.hash(&mut hasher);
        GraphKey { nodes, outputs, hash: hasher.finish() }
    }

    /// The precomputed structural hash.
    pub fn hash_value(&self) -> u64 {
        self.hash
    }

    /// Number of nodes the key covers.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
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
    use air::dim::shape_of;
    use air::op::Input;
    use air::{BinaryOp, DType, UnaryOp};

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

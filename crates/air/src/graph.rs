//! The graph: nodes in a slotmap keyed by `NodeId`, a users side table kept in step with every
//! edit, the program's outputs, and a topological order computed once and cached until an edit.
//!
//! Every node lookup (`node`, `get`, `op`, `ty`, `inputs`, `users`) and every node an iteration
//! yields adds one unit to [`crate::work`], so the graph traffic of any pass is counted, an
//! accidental scan of the graph per node included.

use std::cell::OnceCell;
use std::fmt;

use slotmap::{SecondaryMap, SlotMap};
use smallvec::SmallVec;

use crate::error::{AirError, Result};
use crate::op::{Op, TensorType};

/// A set of a few nodes (a graph's outputs), hashed cheaply.
type NodeSet = std::collections::HashSet<NodeId, std::hash::BuildHasherDefault<rustc_hash::FxHasher>>;

slotmap::new_key_type! {
    /// A node of a `Graph`. Prints as `n12` (its slot index), like the text form.
    pub struct NodeId;
}

impl NodeId {
    /// The slot index, which the text form prints (`n12`). Unique among live nodes. Counts from 0:
    /// slotmap keeps slot 0 as a sentinel, so the first node of a fresh graph is `n0`, the name the
    /// text form's sequential numbering gives it too.
    pub fn index(self) -> u32 {
        use slotmap::Key;
        ((self.data().as_ffi() & 0xffff_ffff) as u32).wrapping_sub(1)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.index())
    }
}

/// Inputs of a node; three fit inline (the largest arity, `where`, is three).
pub type Inputs = SmallVec<[NodeId; 3]>;

/// One node: an op with typed attributes, its inputs, and the type of its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The op and its typed attributes.
    pub op: Op,
    /// The nodes this node reads, in operand order.
    pub inputs: Inputs,
    /// The type of the node's value.
    pub ty: TensorType,
}

/// A tensor program: a DAG of nodes plus the list of outputs it computes.
///
/// Invariants, kept by every method: `users[n]` holds one entry per input edge that reads `n`
/// (so a node reading `n` twice appears twice); every input of a live node is live; the cached
/// topological order is dropped by every edit.
#[derive(Clone, Default)]
pub struct Graph {
    nodes: SlotMap<NodeId, Node>,
    users: SecondaryMap<NodeId, SmallVec<[NodeId; 4]>>,
    outputs: Vec<NodeId>,
    topo: OnceCell<Topo>,
    /// Set by the first edit that may break what the verifier checks (see
    /// [`Graph::is_verified`]); never cleared.
    unverified: bool,
}

/// The cached topological order, and a node on a cycle if the graph has one.
#[derive(Clone, Default)]
struct Topo {
    order: Vec<NodeId>,
    cycle: Option<NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// An empty graph with room for `n` nodes before it reallocates.
    pub fn with_capacity(n: usize) -> Graph {
        Graph { nodes: SlotMap::with_capacity_and_key(n), users: SecondaryMap::with_capacity(n), ..Graph::default() }
    }

    /// An empty graph with room for `n` nodes and for those that the compiler's rewrites add
    /// ([`Graph::rewrite_room`]): a graph traced to be compiled. Filled to exactly its capacity,
    /// the rewriter's first new node would copy every node to a storage twice the size (a
    /// fifth of the rewrite pass of a depth-8 Transformer's forward).
    pub fn for_compile(n: usize) -> Graph {
        Graph::with_capacity(n + Graph::rewrite_room(n))
    }

    /// The room for new nodes that [`Graph::for_compile`] keeps beyond `n` nodes.
    pub fn rewrite_room(n: usize) -> usize {
        n / 16 + 16
    }

    /// Makes room for at least `additional` more nodes before the graph reallocates.
    pub fn reserve(&mut self, additional: usize) {
        self.nodes.reserve(additional);
        // Keys index the users map by slot; a new node's slot is at most the nodes' capacity.
        self.users.set_capacity(self.nodes.capacity() + 1);
    }

    /// Number of live nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no live nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether `id` is a live node of this graph.
    pub fn contains(&self, id: NodeId) -> bool {
        self.nodes.contains_key(id)
    }

    /// The node `id`. Panics if `id` was removed: holding a dead id is an internal bug.
    pub fn node(&self, id: NodeId) -> &Node {
        crate::work::tick();
        &self.nodes[id]
    }

    /// The node `id`, or `None` if it is not in the graph.
    pub fn get(&self, id: NodeId) -> Option<&Node> {
        crate::work::tick();
        self.nodes.get(id)
    }

    /// The op of node `id`. Panics if `id` was removed, like [`Graph::node`].
    pub fn op(&self, id: NodeId) -> &Op {
        crate::work::tick();
        &self.nodes[id].op
    }

    /// The type of node `id`'s value. Panics if `id` was removed, like [`Graph::node`].
    pub fn ty(&self, id: NodeId) -> &TensorType {
        crate::work::tick();
        &self.nodes[id].ty
    }

    /// The inputs of node `id`, in operand order. Panics if `id` was removed, like [`Graph::node`].
    pub fn inputs(&self, id: NodeId) -> &[NodeId] {
        crate::work::tick();
        &self.nodes[id].inputs
    }

    /// The nodes that read `id`, one entry per input edge, in no particular order.
    pub fn users(&self, id: NodeId) -> &[NodeId] {
        crate::work::tick();
        self.users.get(id).map_or(&[], |u| u.as_slice())
    }

    /// Every live node id, in slot order (not a topological order).
    pub fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.keys().inspect(|_| crate::work::tick())
    }

    /// Every live node with its id, in slot order (not a topological order).
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, &Node)> + '_ {
        self.nodes.iter().inspect(|_| crate::work::tick())
    }

    /// The program's outputs, in order (an id may repeat).
    pub fn outputs(&self) -> &[NodeId] {
        &self.outputs
    }

    /// Marks `id` as an output of the program (outputs may repeat).
    pub fn add_output(&mut self, id: NodeId) {
        assert!(self.contains(id), "add_output of a dead node {id}");
        self.outputs.push(id);
    }

    /// Replaces the program's outputs. Panics if any of them is not a live node.
    pub fn set_outputs(&mut self, outputs: Vec<NodeId>) {
        assert!(outputs.iter().all(|&o| self.contains(o)), "set_outputs with a dead node");
        self.outputs = outputs;
    }

    fn edited(&mut self) {
        self.topo.take();
    }

    /// An edit that may break what the verifier checks (a type, an arity, a cycle).
    fn edited_unchecked(&mut self) {
        self.edited();
        self.unverified = true;
    }

    /// Whether [`crate::verify`] is known to pass without running it: every node came in through
    /// [`Graph::add`] or [`Graph::add_leaf`] (which check a node as the verifier does: its type
    /// rule or leaf attributes and its size) or [`Graph::add_inferred`] (whose caller checked
    /// it), and no edit since could have broken a type, an arity or acyclicity (`set_op`,
    /// `set_inputs`, `replace_all_uses` and the `_unchecked` edits could). `lower::compile`
    /// runs the verifier only on a graph for which this is false (and on every graph in a
    /// debug build): a traced graph, built node by node from the facade's checked ops, skips it.
    pub fn is_verified(&self) -> bool {
        !self.unverified
    }

    /// The verifier's check of a node's size ([`TensorType::checked_numel`]), as an error of `op`.
    fn check_size(op: &Op, ty: &TensorType) -> Result<()> {
        ty.checked_numel().map(drop).map_err(|msg| AirError::Op(format!("{}: {msg}", op.mnemonic())))
    }

    /// Adds a leaf (`input`, `const`, `iota`) of the given type.
    pub fn add_leaf(&mut self, op: Op, ty: TensorType) -> Result<NodeId> {
        op.check_leaf(&ty).map_err(AirError::Op)?;
        Graph::check_size(&op, &ty)?;
        Ok(self.insert(Node { op, inputs: Inputs::new(), ty }))
    }

    /// Adds a node, inferring its type from its inputs; a type error names the op and the types.
    pub fn add(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId> {
        for &i in inputs {
            if !self.contains(i) {
                return Err(AirError::DeadNode(format!("{}: input {i} is not in the graph", op.mnemonic())));
            }
        }
        let ty = {
            let tys: SmallVec<[&TensorType; 3]> = inputs.iter().map(|&i| &self.nodes[i].ty).collect();
            op.infer(&tys)?
        };
        Graph::check_size(&op, &ty)?;
        Ok(self.insert(Node { op, inputs: inputs.into(), ty }))
    }

    /// Adds a node as given, without type inference (the parser and the verifier's tests use this
    /// to build graphs that may be wrong). Inputs must be live. The graph is no longer
    /// [verified](Graph::is_verified).
    #[inline]
    pub fn add_unchecked(&mut self, node: Node) -> NodeId {
        assert!(node.inputs.iter().all(|&i| self.contains(i)), "add_unchecked with a dead input");
        self.unverified = true;
        self.insert(node)
    }

    /// Adds a node whose type its caller inferred, without inferring it again: what a tracer
    /// calls for nodes it checked when they were recorded. The graph stays
    /// [verified](Graph::is_verified). Inputs must be live. A debug build checks the contract.
    ///
    /// # Safety
    /// The node must pass the verifier's checks of a node: a leaf has no inputs and its
    /// attributes fit its type (`Op::check_leaf`); any other node has the arity of its op and
    /// exactly the type `Op::infer` gives for its inputs' types; and its size is checked
    /// (`TensorType::checked_numel` is `Ok`). Compilation trusts a verified graph's types for
    /// the sizes of the buffers its kernels index: a wrong type here can make compiled code
    /// read or write outside a buffer.
    #[inline]
    pub unsafe fn add_inferred(&mut self, node: Node) -> NodeId {
        assert!(node.inputs.iter().all(|&i| self.contains(i)), "add_inferred with a dead input");
        #[cfg(debug_assertions)]
        {
            let tys: SmallVec<[&TensorType; 3]> = node.inputs.iter().map(|&i| &self.nodes[i].ty).collect();
            let checked = if node.op.is_leaf() {
                node.op.check_leaf(&node.ty).is_ok() && tys.is_empty()
            } else {
                node.op.infer(&tys).is_ok_and(|ty| ty == node.ty)
            };
            debug_assert!(
                checked && node.ty.checked_numel().is_ok(),
                "add_inferred: {} breaks its contract",
                node.op.mnemonic()
            );
        }
        self.insert(node)
    }

    #[inline]
    fn insert(&mut self, node: Node) -> NodeId {
        self.edited();
        let id = self.nodes.insert(node);
        self.users.insert(id, SmallVec::new());
        for k in 0..self.nodes[id].inputs.len() {
            let i = self.nodes[id].inputs[k];
            self.users[i].push(id);
        }
        id
    }

    /// Removes a node that nobody reads and that is not an output. O(sum of its inputs' degrees).
    pub fn remove(&mut self, id: NodeId) -> Result<Node> {
        if !self.users(id).is_empty() || self.outputs.contains(&id) {
            return Err(AirError::InUse(format!("{id} still has users or is an output")));
        }
        self.edited();
        let node = self.nodes.remove(id).ok_or_else(|| AirError::DeadNode(format!("{id} is not in the graph")))?;
        self.users.remove(id);
        for &i in &node.inputs {
            unlink(&mut self.users[i], id);
        }
        Ok(node)
    }

    /// Makes every reader of `old` (and every output slot holding it) read `new` instead. `old`
    /// stays in the graph, now without users. An error, changing nothing, if a node is dead or if
    /// `new` depends on `old` (its readers would then depend on themselves). The dependency test
    /// walks the nodes `new` depends on: O(those nodes) on top of O(degree of `old`); a hot
    /// rewrite loop uses [`Graph::replace_all_uses_unchecked`] and checks once afterwards.
    pub fn replace_all_uses(&mut self, old: NodeId, new: NodeId) -> Result<()> {
        if !self.contains(old) || !self.contains(new) {
            return Err(AirError::DeadNode(format!("replace_all_uses({old}, {new}): a node is not in the graph")));
        }
        if old != new && self.depends_on(&[new], old) {
            return Err(AirError::Cycle(format!("replace_all_uses({old}, {new}): {new} depends on {old}")));
        }
        self.replace_all_uses_unchecked(old, new);
        Ok(())
    }

    /// [`Graph::replace_all_uses`] without the dependency test: O(degree of `old`). The caller
    /// guarantees that `new` does not depend on `old`; if it does, the graph gets a cycle, which
    /// [`Graph::check_acyclic`] (O(1) once the topological order is computed) and the verifier
    /// report. `lower`'s rewriter uses this and checks the graph once after rewriting.
    pub fn replace_all_uses_unchecked(&mut self, old: NodeId, new: NodeId) {
        assert!(self.contains(old) && self.contains(new), "replace_all_uses with a dead node");
        if old == new {
            return;
        }
        self.edited_unchecked();
        let users = std::mem::take(&mut self.users[old]);
        for &u in &users {
            for inp in self.nodes[u].inputs.iter_mut() {
                if *inp == old {
                    *inp = new;
                    // Each edge is recorded once in `users`, so rewrite one edge per entry.
                    break;
                }
            }
        }
        self.users[new].extend(users);
        for o in self.outputs.iter_mut() {
            if *o == old {
                *o = new;
            }
        }
    }

    /// Replaces the inputs of `id`, keeping the users table in step. The node's type is kept;
    /// a pass that changes types runs the verifier afterwards. An error, changing nothing, if a
    /// node is dead or if an input depends on `id` (or is `id`): that would make a cycle. The test
    /// walks the nodes the new inputs depend on.
    pub fn set_inputs(&mut self, id: NodeId, inputs: &[NodeId]) -> Result<()> {
        if !self.contains(id) || !inputs.iter().all(|&i| self.contains(i)) {
            return Err(AirError::DeadNode(format!("set_inputs({id}): a node is not in the graph")));
        }
        if self.depends_on(inputs, id) {
            return Err(AirError::Cycle(format!("set_inputs({id}): an input depends on {id}")));
        }
        self.set_inputs_unchecked(id, inputs);
        Ok(())
    }

    /// [`Graph::set_inputs`] without the cycle test (the verifier's tests use it to build cyclic
    /// graphs). Inputs must be live. A cycle it makes is reported by [`Graph::check_acyclic`] and
    /// the verifier; [`Graph::topo_order`] never panics on one.
    pub fn set_inputs_unchecked(&mut self, id: NodeId, inputs: &[NodeId]) {
        assert!(inputs.iter().all(|&i| self.contains(i)), "set_inputs with a dead input");
        self.edited_unchecked();
        let old = std::mem::replace(&mut self.nodes[id].inputs, inputs.into());
        for i in old {
            unlink(&mut self.users[i], id);
        }
        for &i in inputs {
            self.users[i].push(id);
        }
    }

    /// Replaces the op (and type) of `id`, keeping its inputs and users.
    pub fn set_op(&mut self, id: NodeId, op: Op, ty: TensorType) {
        self.edited_unchecked();
        let n = &mut self.nodes[id];
        n.op = op;
        n.ty = ty;
    }

    /// Whether one of `from` is `target` or depends on it: a depth-first walk over inputs that
    /// visits each node once. O(the nodes `from` depend on).
    fn depends_on(&self, from: &[NodeId], target: NodeId) -> bool {
        let mut seen: SecondaryMap<NodeId, ()> = SecondaryMap::new();
        let mut stack: Vec<NodeId> = from.to_vec();
        while let Some(id) = stack.pop() {
            if id == target {
                return true;
            }
            if seen.insert(id, ()).is_none() {
                stack.extend(self.nodes[id].inputs.iter().copied());
            }
        }
        false
    }

    /// `Err(AirError::Cycle)` naming a node on a cycle, if the graph has one (only the
    /// `_unchecked` edits can make one). O(1) once the topological order is computed, which it
    /// computes otherwise (O(N + E)).
    pub fn check_acyclic(&self) -> Result<()> {
        match self.topo().cycle {
            Some(id) => Err(AirError::Cycle(format!("the graph has a cycle through {id}"))),
            None => Ok(()),
        }
    }

    /// A topological order of every live node (inputs before users), computed once per edit
    /// generation in O(N + E) by an iterative depth-first post-order over inputs, starting from the
    /// nodes in slot order. Ties keep slot order: when slot order is already topological (a graph
    /// built front to back, or one the text parser read), the topological order *is* slot order,
    /// so printing, parsing and printing again gives the same text. Never panics: on a graph with
    /// a cycle (which only the `_unchecked` edits can make) it is the same post-order with the
    /// edges that close cycles left out, so not a topological order; [`Graph::check_acyclic`] and
    /// the verifier report the cycle, and every consumer that relies on the order checks first.
    pub fn topo_order(&self) -> &[NodeId] {
        &self.topo().order
    }

    fn topo(&self) -> &Topo {
        self.topo.get_or_init(|| {
            // A graph built front to back (a trace) lists every node after its inputs: then slot
            // order is the order the walk below would find, read off in one pass.
            crate::work::add(self.nodes.len() as u64);
            if self.nodes.iter().all(|(id, n)| n.inputs.iter().all(|i| i.index() < id.index())) {
                return Topo { order: self.nodes.keys().collect(), cycle: None };
            }
            const ON_STACK: bool = false;
            const DONE: bool = true;
            let mut state: SecondaryMap<NodeId, bool> = SecondaryMap::with_capacity(self.nodes.len());
            let mut order = Vec::with_capacity(self.nodes.len());
            // (node, how many of its inputs have been visited)
            let mut stack: Vec<(NodeId, usize)> = Vec::new();
            let mut cycle = None;
            for root in self.nodes.keys() {
                if state.contains_key(root) {
                    continue;
                }
                state.insert(root, ON_STACK);
                stack.push((root, 0));
                while let Some((id, next)) = stack.last_mut() {
                    crate::work::tick();
                    let inputs = &self.nodes[*id].inputs;
                    if let Some(&input) = inputs.get(*next) {
                        *next += 1;
                        match state.get(input) {
                            None => {
                                state.insert(input, ON_STACK);
                                stack.push((input, 0));
                            }
                            Some(&ON_STACK) => {
                                cycle.get_or_insert(input);
                            }
                            Some(_) => {}
                        }
                    } else {
                        state.insert(*id, DONE);
                        order.push(*id);
                        stack.pop();
                    }
                }
            }
            Topo { order, cycle }
        })
    }

    /// The nodes the outputs depend on, in topological order. O(N); a graph whose every node
    /// is read or is an output (all of it live, the usual case after `remove_dead`) skips the
    /// walk from the outputs.
    pub fn live_order(&self) -> Vec<NodeId> {
        let outputs = self.output_set();
        crate::work::add(self.nodes.len() as u64);
        if !self.nodes.keys().any(|id| self.unread(id, &outputs)) {
            return self.topo_order().to_vec();
        }
        let live = self.live_set();
        self.topo_order().iter().copied().filter(|id| live.contains_key(*id)).collect()
    }

    /// The nodes the outputs depend on, as a dense side table. O(live nodes + their edges).
    fn live_set(&self) -> SecondaryMap<NodeId, ()> {
        let mut live: SecondaryMap<NodeId, ()> = SecondaryMap::with_capacity(self.nodes.len());
        let mut stack: Vec<NodeId> = self.outputs.clone();
        while let Some(id) = stack.pop() {
            crate::work::tick();
            if live.insert(id, ()).is_none() {
                stack.extend(self.nodes[id].inputs.iter().copied());
            }
        }
        live
    }

    /// Removes every node the outputs do not depend on. O(N) to find the nodes without users,
    /// then O(removed nodes and their edges): a node goes when its last reader went. (A cycle,
    /// which only the `_unchecked` edits can make and the verifier reports, keeps its nodes.)
    /// Returns how many were removed.
    pub fn remove_dead(&mut self) -> usize {
        crate::work::add(self.nodes.len() as u64);
        let outputs = self.output_set();
        let mut dead: Vec<NodeId> = self.nodes.keys().filter(|&id| self.unread(id, &outputs)).collect();
        if dead.is_empty() {
            return 0;
        }
        self.edited();
        let mut removed = 0;
        while let Some(id) = dead.pop() {
            crate::work::tick();
            let node = self.nodes.remove(id).expect("a dead node is found once");
            self.users.remove(id);
            removed += 1;
            for &i in &node.inputs {
                let users = &mut self.users[i];
                // In order: the readers' order is the order passes meet them.
                if let Some(pos) = users.iter().position(|&u| u == id) {
                    users.remove(pos);
                }
                if self.unread(i, &outputs) {
                    dead.push(i);
                }
            }
        }
        removed
    }

    /// The outputs as a set.
    fn output_set(&self) -> NodeSet {
        self.outputs.iter().copied().collect()
    }

    /// Whether no node reads `id` and it is not an output (one of `outputs`).
    fn unread(&self, id: NodeId, outputs: &NodeSet) -> bool {
        self.users.get(id).is_none_or(|u| u.is_empty()) && !outputs.contains(&id)
    }

    /// The input nodes by slot.
    pub fn input_nodes(&self) -> Vec<(u32, NodeId)> {
        let mut v: Vec<(u32, NodeId)> = self
            .nodes
            .iter()
            .filter_map(|(id, n)| match &n.op {
                Op::Input(i) => Some((i.slot, id)),
                _ => None,
            })
            .collect();
        v.sort_by_key(|(s, _)| *s);
        v
    }
}

fn unlink(users: &mut SmallVec<[NodeId; 4]>, id: NodeId) {
    if let Some(pos) = users.iter().position(|&u| u == id) {
        users.swap_remove(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dim::shape_of;
    use crate::dtype::DType;
    use crate::op::{BinaryOp, Input, UnaryOp};

    #[test]
    fn users_follow_edits() {
        let mut g = Graph::new();
        let t = TensorType::new(DType::F32, shape_of(&[4]));
        let a = g.add_leaf(Op::Input(Input { slot: 0 }), t.clone()).unwrap();
        let b = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
        let c = g.add(Op::Binary(BinaryOp::Add), &[b, b]).unwrap();
        g.add_output(c);
        assert_eq!(g.users(b), &[c, c]);
        assert_eq!(g.topo_order(), &[a, b, c]);
        assert_eq!(a.to_string(), "n0");
        g.replace_all_uses(b, a).unwrap();
        assert_eq!(g.inputs(c), &[a, a]);
        assert!(g.users(b).is_empty());
        assert_eq!(g.users(a).len(), 3);
        g.remove(b).unwrap();
        assert_eq!(g.users(a), &[c, c]);
        assert_eq!(g.topo_order(), &[a, c]);
        assert!(g.remove(c).is_err());
        assert!(g.add(Op::Binary(BinaryOp::Add), &[a]).is_err());
    }

    #[test]
    fn checked_additions_keep_a_graph_verified_and_edits_that_may_break_it_do_not() {
        let t = TensorType::new(DType::F32, shape_of(&[4]));
        let build = || {
            let mut g = Graph::new();
            let a = g.add_leaf(Op::Input(Input { slot: 0 }), t.clone()).unwrap();
            let b = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
            let c = g.add(Op::Binary(BinaryOp::Add), &[b, b]).unwrap();
            g.add_output(c);
            (g, [a, b, c])
        };
        let (mut g, [a, _, c]) = build();
        assert!(g.is_verified() && crate::verify(&g).is_ok());
        // Removing a node keeps every check true.
        let spare = g.add(Op::Unary(UnaryOp::Neg), &[c]).unwrap();
        g.remove(spare).unwrap();
        let unread = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
        assert_eq!(g.remove_dead(), 1, "{unread} goes");
        assert!(g.is_verified());
        type Edit = fn(&mut Graph, [NodeId; 3]);
        let edits: [(&str, Edit); 5] = [
            ("replace_all_uses", |g, [a, b, _]| g.replace_all_uses(b, a).unwrap()),
            ("set_inputs", |g, [a, _, c]| g.set_inputs(c, &[a, a]).unwrap()),
            ("set_op", |g, [_, b, _]| g.set_op(b, Op::Unary(UnaryOp::Sin), g.ty(b).clone())),
            ("set_inputs_unchecked", |g, [a, _, c]| g.set_inputs_unchecked(c, &[a])),
            ("add_unchecked", |g, [a, _, _]| {
                g.add_unchecked(Node {
                    op: Op::Unary(UnaryOp::Neg),
                    inputs: [a].into_iter().collect(),
                    ty: g.ty(a).clone(),
                });
            }),
        ];
        for (name, edit) in edits {
            let (mut g, ids) = build();
            edit(&mut g, ids);
            assert!(!g.is_verified(), "{name} may break a type, an arity or acyclicity");
        }
        // A size the verifier refuses is refused by the checked additions too.
        let huge = TensorType::new(DType::F32, shape_of(&[1 << 40, 1 << 40]));
        let mut g = Graph::new();
        assert!(g.add_leaf(Op::Input(Input { slot: 0 }), huge).is_err());
        let x = g.add_leaf(Op::Input(Input { slot: 0 }), TensorType::new(DType::F32, shape_of(&[1]))).unwrap();
        let big = crate::op::Expand { shape: shape_of(&[1 << 40, 1 << 40]) };
        assert!(g.add(Op::Expand(big), &[x]).is_err());
        assert!(g.is_verified());
    }

    #[test]
    fn topo_order_keeps_slot_order_for_fan_out() {
        let mut g = Graph::new();
        let t = TensorType::new(DType::F32, shape_of(&[4]));
        let a = g.add_leaf(Op::Input(Input { slot: 0 }), t.clone()).unwrap();
        let v = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
        let u = g.add(Op::Unary(UnaryOp::Exp2), &[a]).unwrap();
        let w = g.add(Op::Binary(BinaryOp::Add), &[u, v]).unwrap();
        assert_eq!(g.topo_order(), &[a, v, u, w]);
        // An edit that breaks slot order still gives a topological order.
        let x = g.add_leaf(Op::Input(Input { slot: 1 }), t).unwrap();
        let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
        g.replace_all_uses(v, y).unwrap();
        assert_eq!(g.topo_order(), &[a, v, u, x, y, w]);
    }

    #[test]
    fn edits_that_would_make_a_cycle_are_errors() {
        let mut g = Graph::new();
        let t = TensorType::new(DType::F32, shape_of(&[4]));
        let a = g.add_leaf(Op::Input(Input { slot: 0 }), t).unwrap();
        let b = g.add(Op::Unary(UnaryOp::Neg), &[a]).unwrap();
        let c = g.add(Op::Unary(UnaryOp::Neg), &[b]).unwrap();
        let d = g.add(Op::Binary(BinaryOp::Add), &[c, b]).unwrap();
        g.add_output(d);
        let before = crate::text::print(&g);
        assert!(matches!(g.set_inputs(b, &[c]), Err(AirError::Cycle(_))));
        assert!(matches!(g.set_inputs(b, &[b]), Err(AirError::Cycle(_))));
        assert!(matches!(g.replace_all_uses(b, c), Err(AirError::Cycle(_))));
        assert!(matches!(g.replace_all_uses(b, d), Err(AirError::Cycle(_))));
        assert_eq!(crate::text::print(&g), before, "a rejected edit changes nothing");
        assert!(g.check_acyclic().is_ok());
        // Edits that keep the graph acyclic still work.
        g.set_inputs(c, &[a]).unwrap();
        g.replace_all_uses(c, b).unwrap();
        assert_eq!(g.inputs(d), &[b, b]);
        // The unchecked edit makes the cycle; the order then never panics and the check reports it.
        g.set_inputs_unchecked(b, &[d]);
        assert_eq!(g.topo_order().len(), g.len());
        assert!(matches!(g.check_acyclic(), Err(AirError::Cycle(_))));
        assert!(crate::interp::eval(&g, &[], &Default::default()).is_err());
    }

    #[test]
    fn node_size_is_pinned() {
        assert_eq!(std::mem::size_of::<NodeId>(), 8);
        assert!(std::mem::size_of::<Node>() <= 192, "Node grew to {}", std::mem::size_of::<Node>());
    }
}

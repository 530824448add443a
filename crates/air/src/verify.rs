//! The verifier: checks every invariant of a graph and reports every problem it finds, not just the
//! first, each message naming the node (`n7: add: operands must have equal types, got f32[4], f32[5]`).
//!
//! Run it after a pass or on a hand-written graph. It re-infers the type of every non-leaf node from
//! its inputs' stored types (so each message points at the node whose type rule fails, not at its
//! users), checks leaves' attributes, arities, that every node's element count and byte size fit
//! (`TensorType::checked_numel`), that inputs and outputs are live, that the users
//! table mirrors the input edges, and that the graph has no cycle. It never panics, whatever the
//! graph, and does not rely on `Graph::topo_order` (which is no topological order on a cycle).

use slotmap::SecondaryMap;
use smallvec::SmallVec;

use crate::error::{AirError, Result};
use crate::graph::{Graph, NodeId};
use crate::op::TensorType;

impl Graph {
    /// Runs the verifier (see [`verify`]).
    pub fn verify(&self) -> Result<()> {
        verify(self)
    }
}

/// Checks `graph`; on failure, `AirError::Verify` lists every problem in slot order, then the
/// outputs, then cycles.
pub fn verify(graph: &Graph) -> Result<()> {
    let mut errors = Vec::new();
    for (id, node) in graph.iter() {
        crate::work::add(1 + node.inputs.len() as u64);
        let name = node.op.mnemonic();
        if let Err(msg) = node.ty.checked_numel() {
            errors.push(format!("{id}: {name}: {msg}"));
        }
        let dead: Vec<NodeId> = node.inputs.iter().copied().filter(|&i| !graph.contains(i)).collect();
        for input in &dead {
            errors.push(format!("{id}: {name}: input {input} is not in the graph"));
        }
        if node.op.is_leaf() {
            if !node.inputs.is_empty() {
                errors.push(format!("{id}: {name}: a leaf takes no inputs, got {}", node.inputs.len()));
            }
            if let Err(msg) = node.op.check_leaf(&node.ty) {
                errors.push(format!("{id}: {msg}"));
            }
            continue;
        }
        if !dead.is_empty() {
            continue;
        }
        let types: SmallVec<[&TensorType; 3]> = node.inputs.iter().map(|&i| graph.ty(i)).collect();
        match node.op.infer(&types) {
            Err(msg) => errors.push(format!("{id}: {msg}")),
            Ok(ty) if ty != node.ty => {
                errors.push(format!("{id}: {name}: stored type {} but its inputs give {ty}", node.ty))
            }
            Ok(_) => {}
        }
    }
    for (i, &out) in graph.outputs().iter().enumerate() {
        if !graph.contains(out) {
            errors.push(format!("output {i}: {out} is not in the graph"));
        }
    }
    // The users table is the graph's own, kept by every method that edits it (nothing outside
    // `Graph` can write it): checking it is a debug build's assertion. It was a quarter of this
    // function's time (two sorts of every edge) on a Transformer.
    let users_ok = !cfg!(debug_assertions) || check_users(graph, &mut errors);
    check_acyclic(graph, users_ok, &mut errors);
    if errors.is_empty() { Ok(()) } else { Err(AirError::Verify(errors)) }
}

/// The users table must hold exactly one entry per input edge (the invariant every `Graph`
/// method keeps; checked in debug builds). Compared as two sorted edge lists (two allocations
/// whatever the graph's size); only a mismatch builds the per-node lists that name it.
/// Returns whether the table matched.
fn check_users(graph: &Graph, errors: &mut Vec<String>) -> bool {
    let mut read: Vec<(NodeId, NodeId)> = Vec::with_capacity(graph.len() * 2);
    let mut listed: Vec<(NodeId, NodeId)> = Vec::with_capacity(graph.len() * 2);
    for (id, node) in graph.iter() {
        crate::work::add(1 + node.inputs.len() as u64);
        read.extend(node.inputs.iter().filter(|&&i| graph.contains(i)).map(|&i| (i, id)));
        listed.extend(graph.users(id).iter().map(|&u| (id, u)));
    }
    read.sort_unstable();
    listed.sort_unstable();
    if read == listed {
        return true;
    }
    name_user_mismatches(graph, errors);
    false
}

/// The nodes whose users table differs from their readers, each with both lists.
fn name_user_mismatches(graph: &Graph, errors: &mut Vec<String>) {
    let mut expected: SecondaryMap<NodeId, Vec<NodeId>> = SecondaryMap::with_capacity(graph.len());
    for id in graph.ids() {
        expected.insert(id, Vec::new());
    }
    for (id, node) in graph.iter() {
        for &input in &node.inputs {
            if let Some(users) = expected.get_mut(input) {
                users.push(id);
            }
        }
    }
    for (id, want) in expected.iter_mut() {
        let mut have = graph.users(id).to_vec();
        have.sort();
        want.sort();
        if have != *want {
            errors.push(format!("{id}: users table lists {} but its readers are {}", list(&have), list(want)));
        }
    }
}

/// Kahn's algorithm over input edges; whatever it cannot order is on or behind a cycle. The
/// readers of a node are its users table when `users_ok` (the table was just checked against
/// the input edges), else lists built here.
fn check_acyclic(graph: &Graph, users_ok: bool, errors: &mut Vec<String>) {
    let mut pending: SecondaryMap<NodeId, usize> = SecondaryMap::with_capacity(graph.len());
    let mut built: SecondaryMap<NodeId, Vec<NodeId>> = SecondaryMap::new();
    let mut ready = Vec::new();
    for (id, node) in graph.iter() {
        let live = node.inputs.iter().filter(|&&i| graph.contains(i)).count();
        pending.insert(id, live);
        if live == 0 {
            ready.push(id);
        }
        if !users_ok {
            for &input in node.inputs.iter().filter(|&&i| graph.contains(i)) {
                built.entry(input).expect("a live node").or_default().push(id);
            }
        }
    }
    let readers = |id: NodeId| -> &[NodeId] {
        if users_ok { graph.users(id) } else { built.get(id).map_or(&[][..], |r| r.as_slice()) }
    };
    let mut ordered = 0;
    while let Some(id) = ready.pop() {
        ordered += 1;
        crate::work::tick();
        for &reader in readers(id) {
            crate::work::tick();
            if let Some(p) = pending.get_mut(reader) {
                *p -= 1;
                if *p == 0 {
                    ready.push(reader);
                }
            }
        }
    }
    if ordered < graph.len() {
        let stuck: Vec<NodeId> = pending.iter().filter(|(_, p)| **p > 0).map(|(id, _)| id).collect();
        errors.push(format!("cycle: nodes {} are on or behind a cycle", list(&stuck)));
    }
}

/// `[n1, n2]`, at most 16 names.
fn list(ids: &[NodeId]) -> String {
    let mut names: Vec<String> = ids.iter().take(16).map(|id| id.to_string()).collect();
    if ids.len() > 16 {
        names.push(format!("... ({} more)", ids.len() - 16));
    }
    format!("[{}]", names.join(", "))
}

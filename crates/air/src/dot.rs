//! Graphviz export: `to_dot(&graph)` renders a graph as a DOT digraph for `dot -Tsvg`.
//!
//! One box per node labelled like its text-form line (name, op with attributes, type), an edge from
//! each input to its user (numbered when the user has several inputs), and the outputs drawn bold
//! and filled, each pointing at a `return i` marker. Nodes are emitted in slot order, so a graph
//! with a cycle still renders (it is what one wants to look at when the verifier reports one).

use std::fmt::Write as _;

use crate::graph::Graph;
use crate::text::OpHead;

impl Graph {
    /// The Graphviz DOT form (see [`to_dot`]).
    pub fn to_dot(&self) -> String {
        to_dot(self)
    }
}

/// Renders `graph` as a Graphviz digraph.
pub fn to_dot(graph: &Graph) -> String {
    let mut out = String::from("digraph air {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n");
    for (id, node) in graph.iter() {
        let label = format!("{id} = {}\\n{}", escape(&OpHead(&node.op).to_string()), escape(&node.ty.to_string()));
        let style =
            if graph.outputs().contains(&id) { ", style=\"bold,filled\", fillcolor=\"lightyellow\"" } else { "" };
        let _ = writeln!(out, "  {id} [label=\"{label}\"{style}];");
    }
    for (id, node) in graph.iter() {
        for (i, input) in node.inputs.iter().enumerate() {
            if node.inputs.len() > 1 {
                let _ = writeln!(out, "  {input} -> {id} [label=\"{i}\"];");
            } else {
                let _ = writeln!(out, "  {input} -> {id};");
            }
        }
    }
    for (i, out_id) in graph.outputs().iter().enumerate() {
        let _ = writeln!(out, "  return{i} [label=\"return {i}\", shape=plaintext];");
        let _ = writeln!(out, "  {out_id} -> return{i} [style=bold];");
    }
    out.push_str("}\n");
    out
}

/// Escapes a label for a double-quoted DOT string.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

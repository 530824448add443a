//! Benchmark: air graph operations (build, users, replace, topo sort) at 1k..1M nodes.
fn main() {}

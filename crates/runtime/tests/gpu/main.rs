//! `kiln-runtime`'s integration tests that compare the wgpu backend with the interpreter
//! throughout (their CPU halves run too), one module per area, linked into one test binary built
//! with the `wgpu` feature.

#[path = "../common/mod.rs"]
mod common;

mod cache_bound;
mod random_graphs;
mod wgpu_ops;

//! `kiln-codegen`'s integration tests, one module per area, linked into one test binary.

#[path = "../common/mod.rs"]
mod common;

mod approx;
mod checks;
mod clif;
mod compile_many;
mod loops;
mod map;
mod ops;
mod prop;
mod stencil;
mod tiers;
mod tile;
mod unroll;
mod wgsl_gen;

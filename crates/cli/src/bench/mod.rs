//! The benchmark suites of `kiln bench`.

pub mod check;
pub mod decode;
pub mod dist;
pub mod embedding;
pub mod matmul;
pub mod memory;
pub mod models;
pub mod transformer;
pub mod tree;
pub mod unary;

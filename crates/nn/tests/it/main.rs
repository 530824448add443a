//! `kiln-nn`'s integration tests, one module per area, linked into one test binary.
//! `compile_once` and `kv_cache` stay separate: they count the shared CPU device's compiles, which
//! other tests in the same process would add to.

#[path = "../common/mod.rs"]
mod common;

mod autograd;
mod conv_paths;
mod derive;
mod error_sites;
mod functional;
mod fuzz_safetensors;
mod generate;
mod gpt2;
mod half;
mod kernels;
mod layers;
mod lookup;
mod serialize;
mod training;
mod transformer;
mod tree;
mod zoo;

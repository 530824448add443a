//! `kiln-runtime`'s integration tests that run without the wgpu backend's feature, one module
//! per area, linked into one test binary (`tests/gpu` holds those that need it).

#[path = "../common/mod.rs"]
mod common;

mod end_to_end;
mod error_kinds;
mod gather;
mod parallel;
mod rows;
mod third_backend;
mod vm;

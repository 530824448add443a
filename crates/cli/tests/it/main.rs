//! The `kiln` command's integration tests, one module per area, linked into one test binary;
//! `compile_work` stays separate (it installs a counting global allocator).

mod check;
mod clif_determinism;
mod generate;
mod memory;
mod onnx_cmd;
mod pipeline;
mod smoke;

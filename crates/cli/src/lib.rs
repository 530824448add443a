//! The library behind the `kiln` command: the profiled CPU compile pipeline, the benchmark
//! suites, and their outputs (tables, CSV, JSON, SVG plots).
//!
//! - `kiln profile transformer`: [`profile_cmd`] over [`pipeline`] (each compile step in a
//!   `kiln::profile` span) and [`model`] (`nn::Transformer` in the anchor configuration).
//! - `kiln bench <suite>`: [`bench`], run through a [`runner::Runner`], written by [`output`] and
//!   plotted by [`svg`]. The suites' workloads are [`workloads`], which the criterion benches of
//!   this package (`crates/cli/benches/`) share.
//! - `kiln onnx info`, `kiln onnx run`, `kiln profile onnx`, `kiln bench onnx`: [`onnx_cmd`],
//!   models imported with `kiln-onnx`; [`tensor_file`] reads and writes their inputs and outputs
//!   (`.npy`, `.pb`).
//! - `kiln generate`: [`generate_cmd`], GPT-2 checkpoints decoded with a KV cache and
//!   [`tokenizer`], GPT-2's byte-level BPE (embedded, offline).

pub mod bench;
pub mod dump;
pub mod generate_cmd;
pub mod model;
pub mod onnx_cmd;
pub mod output;
pub mod pipeline;
pub mod profile_cmd;
pub mod runner;
pub mod svg;
pub mod tensor_file;
pub mod timing;
pub mod tokenizer;
pub mod workloads;

/// The `kiln` command's global allocator: mimalloc under the profiler's counting. The compiler
/// allocates many small, short-lived objects on two threads (lowering and Cranelift), where
/// glibc's `malloc` spent 18% of an imported MobileNet's first call (BENCHMARKS.md, s55b). The
/// examples that time compiles declare it too, so that they measure what the command runs.
pub type Allocator = kiln::profile::CountingAlloc<mimalloc::MiMalloc>;

/// The one [`Allocator`]: `#[global_allocator] static ALLOC: Allocator = ALLOCATOR;`.
pub const ALLOCATOR: Allocator = kiln::profile::CountingAlloc::over(mimalloc::MiMalloc);

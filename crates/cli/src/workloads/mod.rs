//! The benchmark workloads, each defined once: its shapes, its input data and the lazy graph it
//! records. `kiln bench <suite>` ([`crate::bench`]) and the criterion benches of this package
//! (`crates/cli/benches/`, `cargo bench -p kiln-cli --bench <name>`) both build their tensors here,
//! so the two measure the same work; only how they time it differs (the suites: median of their
//! runs on any device, after a check against the interpreter; criterion: its own estimate, on the
//! CPU device). The model workloads are `nn::zoo`, shared the same way by `kiln bench models` and
//! `cargo bench -p kiln-nn --bench models`.
//!
//! Inputs are plain host tensors: a caller moves them to its device (`Runner::place`, or
//! `Tensor::to_device`).

pub mod matmul;
pub mod tree;
pub mod unary;

//! `kiln-onnx`'s integration tests, one module per area, linked into one test binary.

mod exported;
mod import;
mod node;

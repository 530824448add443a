//! `kiln-dist`'s integration tests, one module per area, linked into one test binary.

#[path = "../scenario/mod.rs"]
mod scenario;

mod ddp;
mod ddp_buffers;
mod thread;

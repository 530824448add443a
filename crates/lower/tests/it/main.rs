//! `kiln-lower`'s integration tests, one module per area, linked into one test binary.

#[path = "../common/mod.rs"]
mod common;

mod autodiff;
mod batch;
mod contraction;
mod memplan;
mod observe;
mod rewrite;
mod saturate;
mod schedule;

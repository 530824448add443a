//! `kiln-air`'s integration tests, one module per area, linked into one test binary.

mod fuzz_text;
mod interp;
mod prop;
mod text;
mod verify;

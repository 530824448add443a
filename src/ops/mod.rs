//! The tensor ops, grouped like the air op classes: constructors, element-wise, reductions,
//! movement, matmul, joining and indexing, plus the `std::ops` operators.

pub(crate) mod create;
pub(crate) mod elementwise;
pub(crate) mod index;
pub(crate) mod matmul;
pub(crate) mod movement;
pub(crate) mod operators;
pub(crate) mod reduce;

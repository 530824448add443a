//! Kiln: lazy tensors that compile to fast kernels. The user-facing facade over the air IR.

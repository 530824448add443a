//! codegen: the kernel IR emitted as native CPU code (Cranelift) and as WGSL compute shaders.

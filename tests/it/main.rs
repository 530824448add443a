//! The facade's integration tests, one module per area, linked into one test binary (one link of
//! every dependency instead of one per file). Three stay separate because they read or change the
//! whole process: `bad_kiln_device` sets the environment, `profile` installs a counting global
//! allocator, `native` counts the shared CPU device's compiles (other tests would add to them).

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

mod device_select;
mod error_kinds;
mod fuzz_ops;
mod index_checks;
mod jit;
mod realize_cache;
mod recorder;
mod sizes;
mod slice_scatter;
mod softmax;
mod symbolic_bounds;
mod tanh;
mod tensor_devices;
mod tensor_errors;
mod tensor_lazy;
mod tensor_ops;
mod torch_edges;
mod torch_names;
mod torch_ops;
mod tree;
mod wgpu_loop_nests;

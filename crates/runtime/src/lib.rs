//! runtime: devices, buffers, and the VM that runs a compiled program.

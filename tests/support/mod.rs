//! Helpers shared by the facade's device tests: the devices to run on and where a tensor's data
//! lives.

use kiln::{Device, Tensor};

/// The CPU and the interpreter, and wgpu where an adapter exists.
pub fn devices() -> Vec<Device> {
    let mut d = vec![Device::Cpu, Device::Interp];
    if Device::probe(Device::Wgpu).is_ok() {
        d.push(Device::Wgpu);
    }
    d
}

/// The address of a realized tensor's host array (equal for two tensors sharing storage).
pub fn data_ptr(t: &Tensor) -> *const u8 {
    t.to_host().unwrap().data.as_bytes().as_ptr()
}

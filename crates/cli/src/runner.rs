//! Where the benchmark suites run their tensors: a facade device, through `kiln::realize` (the
//! device traces, caches programs by graph structure and runs them; nothing here re-implements
//! that).

use kiln::{Device, Tensor};

/// Runs lazy tensors on one facade device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runner {
    /// The device every source tensor is moved to and every realize runs on.
    pub device: Device,
}

impl Runner {
    /// The runner on `device`.
    pub fn on(device: Device) -> Runner {
        Runner { device }
    }

    /// The runner for a `--device` name (`cpu`, `wgpu`, `interp`).
    pub fn for_device(name: &str) -> anyhow::Result<Runner> {
        Ok(Runner::on(Device::parse(name)?))
    }

    /// A short description for the output's header.
    pub fn describe(&self) -> String {
        format!("{} (kiln::realize)", self.device)
    }

    /// A source tensor where this runner computes.
    pub fn place(&self, t: Tensor) -> anyhow::Result<Tensor> {
        Ok(t.to_device(self.device)?)
    }

    /// Moves every parameter and buffer of `model` where this runner computes (trainable ones
    /// keep requiring gradients; all-or-nothing, see `nn::Module::to_device`).
    pub fn place_module(&self, model: &mut dyn nn::Module) -> anyhow::Result<()> {
        Ok(model.to_device(self.device)?)
    }

    /// Computes `tensors` with one program; returns the same handles, now realized.
    pub fn realize(&self, tensors: &[&Tensor]) -> anyhow::Result<Vec<Tensor>> {
        kiln::realize(tensors)?;
        Ok(tensors.iter().map(|t| (*t).clone()).collect())
    }
}

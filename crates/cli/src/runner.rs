//! Where the facade-level benchmarks run their tensors: through `kiln::realize` on a facade
//! device, or, while the facade has no CPU device, through the runtime's `CpuDevice` directly
//! (trace, program cache keyed by graph structure, run), which is what the facade's CPU device
//! will do.

use anyhow::bail;
use kiln::{Device, Tensor};
use runtime::CpuDevice;

use crate::pipeline;

/// Runs lazy tensors.
pub enum Runner {
    /// `kiln::realize` on a facade device; source tensors are moved there first.
    Facade(Device),
    /// The runtime's CPU pipeline called directly, with a program cache.
    Direct(DirectCpu),
}

/// The runtime's CPU device without the facade (it caches programs by graph structure).
pub struct DirectCpu {
    device: CpuDevice,
}

impl Runner {
    /// The runner for a `--device` name: the facade's device when the facade has it; for `cpu`
    /// the runtime directly otherwise.
    pub fn for_device(name: &str) -> anyhow::Result<Runner> {
        match Device::parse(name) {
            Ok(device) => Ok(Runner::Facade(device)),
            Err(_) if name.eq_ignore_ascii_case("cpu") => Ok(Runner::Direct(DirectCpu { device: CpuDevice::new()? })),
            Err(e) => bail!("{e}"),
        }
    }

    /// A short description for the output's header.
    pub fn describe(&self) -> String {
        match self {
            Runner::Facade(d) => format!("{d} (kiln::realize)"),
            Runner::Direct(_) => "cpu (runtime::CpuDevice called directly: the facade has no cpu device yet)".into(),
        }
    }

    /// A source tensor where this runner computes.
    pub fn place(&self, t: Tensor) -> anyhow::Result<Tensor> {
        match self {
            Runner::Facade(d) => Ok(t.to_device(*d)?),
            Runner::Direct(_) => Ok(t),
        }
    }

    /// Moves every parameter and buffer of `model` where this runner computes (trainable ones
    /// keep requiring gradients).
    pub fn place_module(&self, model: &mut dyn nn::Module) -> anyhow::Result<()> {
        let Runner::Facade(device) = self else { return Ok(()) };
        let mut failure = None;
        model.visit_mut(&mut |_, t, kind| match t.to_device(*device) {
            Ok(moved) => *t = if kind == nn::ParamKind::Weight { moved.requires_grad_() } else { moved },
            Err(e) => failure = Some(e),
        });
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Computes `tensors` with one program; returns realized tensors holding the results (the same
    /// handles on a facade device).
    pub fn realize(&self, tensors: &[&Tensor]) -> anyhow::Result<Vec<Tensor>> {
        match self {
            Runner::Facade(_) => {
                kiln::realize(tensors)?;
                Ok(tensors.iter().map(|t| (*t).clone()).collect())
            }
            Runner::Direct(cpu) => cpu.realize(tensors),
        }
    }

    /// Number of programs compiled so far (direct runner only).
    pub fn programs_compiled(&self) -> Option<u64> {
        match self {
            Runner::Facade(_) => None,
            Runner::Direct(cpu) => Some(cpu.device.stats().programs_compiled),
        }
    }
}

impl DirectCpu {
    fn realize(&self, tensors: &[&Tensor]) -> anyhow::Result<Vec<Tensor>> {
        let traced = pipeline::Traced::of(tensors)?;
        let outputs = self.device.run(&traced.graph, &traced.inputs, &traced.bindings)?;
        // `trace` deduplicates the requested tensors; map each back to its output.
        let mut index = Vec::with_capacity(tensors.len());
        let mut distinct: Vec<&Tensor> = Vec::new();
        for t in tensors {
            match distinct.iter().position(|d| Tensor::ptr_eq(d, t)) {
                Some(i) => index.push(i),
                None => {
                    index.push(distinct.len());
                    distinct.push(t);
                }
            }
        }
        if outputs.len() != distinct.len() {
            bail!("{} outputs for {} requested tensors", outputs.len(), distinct.len());
        }
        let realized: Vec<Tensor> = outputs.into_iter().map(Tensor::from_host).collect();
        Ok(index.into_iter().map(|i| realized[i].clone()).collect())
    }
}

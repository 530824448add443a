//! Random tensors, generated on the host: `rand` (uniform in `[0, 1)`) and `randn` (standard
//! normal), from the calling thread's generator that `manual_seed` resets, or from an explicit
//! seed.
//!
//! Every thread's generator starts from the same fixed seed, so a program is reproducible by
//! default, threads included: one thread's draws never move another's sequence. (PyTorch's
//! default generator is one per process, so there concurrent draws depend on scheduling.)

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, StandardNormal};

use crate::device::Device;
use crate::shape::{IntoShape, concrete, show};
use crate::tensor::{Site, Tensor};

const DEFAULT_SEED: u64 = 0x4b69_6c6e; // "Kiln"

thread_local! {
    static GENERATOR: RefCell<StdRng> = RefCell::new(StdRng::seed_from_u64(DEFAULT_SEED));
}

/// Resets the calling thread's generator, the one `Tensor::rand` and `Tensor::randn` draw from.
pub fn manual_seed(seed: u64) {
    GENERATOR.with(|g| *g.borrow_mut() = StdRng::seed_from_u64(seed));
}

/// `n` samples from the calling thread's generator.
fn draw(n: usize, kind: Kind) -> Result<Vec<f32>, String> {
    GENERATOR.with(|g| fill(&mut g.borrow_mut(), n, kind))
}

#[derive(Clone, Copy)]
enum Kind {
    Uniform,
    Normal,
}

/// `n` samples, in a vector reserved fallibly: a size the allocator refuses is an error message,
/// not an abort.
fn fill(rng: &mut StdRng, n: usize, kind: Kind) -> Result<Vec<f32>, String> {
    let mut v: Vec<f32> = Vec::new();
    v.try_reserve_exact(n).map_err(|_| crate::error::out_of_memory(n, "f32", "random samples"))?;
    match kind {
        Kind::Uniform => v.extend((0..n).map(|_| rng.random::<f32>())),
        Kind::Normal => v.extend((0..n).map(|_| -> f32 { StandardNormal.sample(rng) })),
    }
    Ok(v)
}

fn random(site: Site, shape: Vec<air::Dim>, kind: Kind, seed: Option<u64>, device: Option<Device>) -> Tensor {
    let Some(dims) = concrete(&shape) else {
        return site.fail(format!("shape {} must be concrete and non-negative", show(&shape)));
    };
    if let Err(message) = air::dim::checked_size(&shape, std::mem::size_of::<f32>()) {
        return site.fail(message);
    }
    let n: usize = dims.iter().product();
    if seed.is_none() {
        crate::record::impure();
    }
    if seed.is_none() && crate::jit::is_tracing() {
        // Inside a `kiln::jit` trace: an input drawn again from the caller's generator on every call.
        let device = match crate::ops::create::place(device) {
            Ok(d) => d,
            Err(e) => return e,
        };
        let ty = air::TensorType::new(air::DType::F32, shape.clone());
        let draw_dims = dims.clone();
        let draw: crate::jit::Draw = Box::new(move || air::HostTensor::from_vec(draw(n, kind)?, draw_dims.clone()));
        if let Some(t) = crate::jit::random_input(ty, device, draw) {
            return t;
        }
    }
    let data = match seed {
        Some(seed) => fill(&mut StdRng::seed_from_u64(seed), n, kind),
        None => draw(n, kind),
    };
    match data.and_then(|data| air::HostTensor::from_vec(data, dims)) {
        Ok(host) => Tensor::from_host_in(host, device),
        Err(m) => site.fail(m),
    }
}

impl Tensor {
    /// `f32` samples uniform in `[0, 1)` from the thread's generator.
    #[track_caller]
    pub fn rand(shape: impl IntoShape) -> Tensor {
        random(Site::here("rand"), shape.into_dims(), Kind::Uniform, None, None)
    }

    /// [`Tensor::rand`] on `device` (generated on the host, from the thread's generator).
    #[track_caller]
    pub fn rand_on(shape: impl IntoShape, device: Device) -> Tensor {
        random(Site::here("rand"), shape.into_dims(), Kind::Uniform, None, Some(device))
    }

    /// `f32` samples from the standard normal distribution, from the thread's generator.
    #[track_caller]
    pub fn randn(shape: impl IntoShape) -> Tensor {
        random(Site::here("randn"), shape.into_dims(), Kind::Normal, None, None)
    }

    /// [`Tensor::randn`] on `device` (generated on the host, from the thread's generator).
    #[track_caller]
    pub fn randn_on(shape: impl IntoShape, device: Device) -> Tensor {
        random(Site::here("randn"), shape.into_dims(), Kind::Normal, None, Some(device))
    }

    /// `f32` samples uniform in `[0, 1)` from a generator seeded with `seed`.
    #[track_caller]
    pub fn rand_seeded(shape: impl IntoShape, seed: u64) -> Tensor {
        random(Site::here("rand"), shape.into_dims(), Kind::Uniform, Some(seed), None)
    }

    /// Standard normal `f32` samples from a generator seeded with `seed`.
    #[track_caller]
    pub fn randn_seeded(shape: impl IntoShape, seed: u64) -> Tensor {
        random(Site::here("randn"), shape.into_dims(), Kind::Normal, Some(seed), None)
    }
}

//! The backend seam: what a device implements (kernels and buffers) and the one runner that
//! drives every device through it.
//!
//! A [`Runner`] owns a [`Prepared`] program (validation, sizes per binding set and their cache,
//! `Program::checks`, input checks, the memory plan; see [`crate::prepared`]) and a [`Backend`]:
//! the program's kernels compiled for one device, which only says how big its buffers are,
//! derives its launches for a binding set, allocates its buffers, launches a step and hands the
//! outputs out. The CPU VM ([`crate::vm::CpuCode`]) and wgpu ([`crate::wgpu::GpuCode`]) are the two
//! backends; a third one writes those few methods and nothing else (see
//! `tests/it/third_backend.rs`).
//!
//! A run: the binding set's [`BindingSet`] (cached: sizes, memory plan, launches), the inputs
//! checked, then [`Backend::bind`], [`Backend::launch_all`] (by default [`Backend::launch`] for
//! every step, in order) and [`Backend::finish`]. The runner is generic over the backend, so the
//! CPU's hot path has no dynamic dispatch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use air::{Bindings, HostData, HostTensor, TensorType};
use lower::{MemoryPlan, MemoryStats, Program};

use crate::error::Result;
use crate::prepared::{Prepared, Preset, SizedCache, Sizes};

/// One program's kernels on one device, and the buffers its runs use.
///
/// The runner calls, per binding set, [`buffer_bytes`](Backend::buffer_bytes),
/// [`size`](Backend::size) and [`time_slots`](Backend::time_slots) (once, cached), and per run
/// [`bind`](Backend::bind), [`launch_all`](Backend::launch_all) and [`finish`](Backend::finish)
/// on the same buffers, in that order.
pub trait Backend: Send + Sync + Sized {
    /// The device's name, as errors name it (`cpu`, `wgpu`).
    const NAME: &'static str;
    /// Whether two runs of one program may run at the same time, each with buffers of its own
    /// (`true`), or wait for each other (`false`: the buffers are costly, as device memory is).
    const CONCURRENT_RUNS: bool;
    /// What the backend derives from one binding set's sizes: launch ranges, dispatch counts.
    type Launches: Send + Sync;
    /// The buffers (arena, outputs, staging, pointer tables) of a run, reused by later runs.
    type Buffers: Default + Send;

    /// Bytes buffer `buf` takes on the device when it holds `numel` elements (for a temp: its
    /// slot in the arena, padded as the device needs).
    fn buffer_bytes(&self, program: &Program, buf: usize, numel: usize) -> Result<usize>;

    /// The launches of every step for one binding set.
    fn size(&self, prepared: &Prepared, sizes: &Sizes) -> Result<Self::Launches>;

    /// The steps that run at the same time for this binding set, as the memory plan's time slots
    /// (`None`: one step after another, in program order).
    fn time_slots(launches: &Self::Launches) -> Option<&[Vec<usize>]> {
        let _ = launches;
        None
    }

    /// Storage the caller no longer needs, offered for the next run's outputs (PyTorch's `out=`):
    /// a backend whose outputs live in host arrays may write an output into an array of the same
    /// dtype and length instead of allocating one (no allocation, no fresh pages to fault in).
    /// What the run does not take is dropped after [`bind`](Backend::bind). By default nothing
    /// is taken.
    fn recycle(&self, buffers: &mut Self::Buffers, spare: Vec<HostData>) {
        let _ = (buffers, spare);
    }

    /// The initial contents of outputs that a run writes in place (`Program::inits`), as
    /// (output buffer, data), for the next [`bind`](Backend::bind): the output must start the
    /// run holding exactly that data. A backend whose outputs live in host arrays takes the
    /// array when nobody else holds it (no copy), else copies it. By default a program with
    /// such outputs is refused.
    fn preset(&self, buffers: &mut Self::Buffers, inits: Vec<Preset>) -> Result<()> {
        let _ = buffers;
        if inits.is_empty() {
            return Ok(());
        }
        Err(crate::error::RuntimeError::InvalidProgram(format!(
            "the {} backend cannot run a program that writes an input's storage in place",
            Self::NAME
        )))
    }

    /// Makes `buffers` ready for a run on `inputs`: the arena holds `sized.plan`, the outputs
    /// and the status words are allocated (the status words zeroed), the inputs bound or
    /// uploaded.
    fn bind(
        &self,
        buffers: &mut Self::Buffers,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        inputs: &[HostTensor],
    ) -> Result<()>;

    /// Launches step `step` of the program.
    ///
    /// # Safety
    /// `bind` prepared `buffers` for `sized` and `inputs` (which live until `finish`), and every
    /// step before `step` was launched after it.
    unsafe fn launch(
        &self,
        buffers: &mut Self::Buffers,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        step: usize,
    ) -> Result<()>;

    /// Launches every step: by default one after another, in program order.
    ///
    /// # Safety
    /// `bind` prepared `buffers` for `sized` and the run's inputs, which live until `finish`.
    unsafe fn launch_all(
        &self,
        buffers: &mut Self::Buffers,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
    ) -> Result<()> {
        for step in 0..prepared.program().steps.len() {
            // SAFETY: the caller bound the buffers; the steps before `step` ran.
            unsafe { self.launch(buffers, prepared, sized, step)? };
        }
        Ok(())
    }

    /// After the launches: turns a failure recorded in the status words into the run's error
    /// ([`Prepared::check_status`]), else hands out one host tensor per graph output.
    ///
    /// # Safety
    /// `launch_all` ran on `buffers` after `bind` with these `inputs`.
    unsafe fn finish(
        &self,
        buffers: &mut Self::Buffers,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        inputs: &[HostTensor],
    ) -> Result<Vec<HostTensor>>;
}

/// Everything for one binding set: the device-independent sizes, the memory plan, and the
/// backend's launches.
///
/// Binding sets that differ only in symbols kernels read as index offsets (a KV cache's write
/// position, `Prepared::structure_key`) share their plan and launches, calibration included.
pub struct BindingSet<B: Backend> {
    pub sizes: Sizes,
    pub plan: Arc<MemoryPlan>,
    pub launches: Arc<B::Launches>,
}

/// A program on one backend, ready to run for any symbol values.
pub struct Runner<B: Backend> {
    pub(crate) prepared: Prepared,
    pub(crate) backend: B,
    sized: SizedCache<BindingSet<B>>,
    /// Binding sets by structure key (only for programs with offset symbols): where a new binding
    /// set finds its plan and launches.
    structures: SizedCache<BindingSet<B>>,
    /// Binding sets sized and planned from scratch (see [`Runner::binding_sets_planned`]).
    planned: AtomicU64,
    pub(crate) buffers: Mutex<B::Buffers>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B: Backend> Runner<B> {
    /// `prepared` on `backend` (the program's kernels, compiled for the device).
    pub fn with_backend(prepared: Prepared, backend: B) -> Runner<B> {
        Runner {
            prepared,
            backend,
            sized: SizedCache::default(),
            structures: SizedCache::default(),
            planned: AtomicU64::new(0),
            buffers: Mutex::new(B::Buffers::default()),
        }
    }

    /// The lowered program.
    pub fn program(&self) -> &Program {
        self.prepared.program()
    }

    /// The device-independent part of the program.
    pub fn prepared(&self) -> &Prepared {
        &self.prepared
    }

    /// The backend: the program's kernels on its device.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The graph's input slots and their types (`None` for a slot no input node uses).
    pub fn input_types(&self) -> &[Option<TensorType>] {
        self.prepared.input_types()
    }

    /// Number of kernel launches per run (at most: a backend may skip empty ones).
    pub fn launches(&self) -> usize {
        self.program().steps.len()
    }

    /// Memory sizes for one binding set (from the memory planner).
    pub fn memory(&self, bindings: &Bindings) -> Result<MemoryStats> {
        Ok(self.sized(bindings)?.plan.stats)
    }

    /// How many binding sets were sized, planned and given launches from scratch. Binding sets
    /// that differ only in offset symbols (`Program::structure_symbols`: a KV cache's write
    /// position) share one, so a decoding loop plans once per structure, not once per token.
    pub fn binding_sets_planned(&self) -> u64 {
        self.planned.load(Ordering::Relaxed)
    }

    /// The cached sizes, plan and launches for `bindings`, computed on first use.
    pub fn sized(&self, bindings: &Bindings) -> Result<Arc<BindingSet<B>>> {
        let key = self.prepared.key(bindings)?;
        self.sized.get_or_insert(key, |key| {
            if self.prepared.has_offset_symbols() {
                let structure = self.prepared.structure_key(bindings)?;
                let like = self.structures.get_or_insert(structure, |_| self.make_sized(key.clone(), bindings))?;
                let sizes = self.prepared.resized(&like.sizes, key, bindings)?;
                return Ok(BindingSet { sizes, plan: like.plan.clone(), launches: like.launches.clone() });
            }
            self.make_sized(key, bindings)
        })
    }

    /// Sizes, plan and launches for `bindings`, computed from scratch.
    fn make_sized(&self, key: crate::prepared::SizeKey, bindings: &Bindings) -> Result<BindingSet<B>> {
        self.planned.fetch_add(1, Ordering::Relaxed);
        {
            let sizes = self.prepared.sizes(key, bindings)?;
            let launches = self.backend.size(&self.prepared, &sizes)?;
            let program = self.prepared.program();
            // One unit per buffer sized, as `lower::memplan::buffer_sizes` counts: a device's plan
            // costs what `memplan::plan` does.
            air::work::add(sizes.buf_numel.len() as u64);
            let bytes = sizes
                .buf_numel
                .iter()
                .enumerate()
                .map(|(b, &n)| self.backend.buffer_bytes(program, b, n))
                .collect::<Result<Vec<usize>>>()?;
            let plan = self.prepared.plan(bytes, B::time_slots(&launches))?;
            Ok(BindingSet { sizes, plan: Arc::new(plan), launches: Arc::new(launches) })
        }
    }

    /// Forgets every binding set (after a change to how the backend launches).
    pub(crate) fn clear_sized(&self) {
        self.sized.clear();
        self.structures.clear();
    }

    /// Runs the program on `inputs` (one per input slot) with the symbol values in `bindings`,
    /// returning the graph's outputs in order.
    pub fn run(&self, inputs: &[HostTensor], bindings: &Bindings) -> Result<Vec<HostTensor>> {
        self.run_recycling(inputs, bindings, Vec::new())
    }

    /// [`Runner::run`], offering `spare` (arrays the caller no longer needs) as storage for the
    /// outputs: see [`Backend::recycle`]. An output written into a spare array is the same value
    /// as a fresh one; only the allocation is saved.
    pub fn run_recycling(
        &self,
        inputs: &[HostTensor],
        bindings: &Bindings,
        spare: Vec<HostData>,
    ) -> Result<Vec<HostTensor>> {
        if !self.program().inits.is_empty() {
            return self.run_owned(inputs.to_vec(), bindings, spare);
        }
        let sized = self.sized(bindings)?;
        self.prepared.check_inputs(inputs, &sized.sizes)?;
        self.run_checked(inputs, &sized, spare, Vec::new())
    }

    /// [`Runner::run_recycling`] on inputs the caller gives up: an output the program writes in
    /// place over an input (`Program::inits`, a KV cache update) takes that input's storage
    /// when nothing else holds it, so only the new part is written. Inputs still shared
    /// elsewhere are copied into the output first; either way the result is the same.
    pub fn run_owned(
        &self,
        mut inputs: Vec<HostTensor>,
        bindings: &Bindings,
        spare: Vec<HostData>,
    ) -> Result<Vec<HostTensor>> {
        self.run_taking(&mut inputs, bindings, spare)
    }

    /// [`Runner::run_owned`] on inputs the caller keeps in place (a compiled function's bound
    /// arguments, most of them the same weights call after call): the arrays of inputs written
    /// in place are taken out of `inputs` (left as empty arrays), the others stay.
    pub fn run_taking(
        &self,
        inputs: &mut [HostTensor],
        bindings: &Bindings,
        spare: Vec<HostData>,
    ) -> Result<Vec<HostTensor>> {
        let sized = self.sized(bindings)?;
        self.prepared.check_inputs(inputs, &sized.sizes)?;
        let inits = self.prepared.take_inits(inputs);
        self.run_checked(inputs, &sized, spare, inits)
    }

    /// One run on checked `inputs`, on the shared buffers, or, while another run holds them, on a
    /// set of its own (or the shared ones after a wait, when the backend says so): `spare` offered
    /// for the outputs, `inits` given to the outputs written in place.
    fn run_checked(
        &self,
        inputs: &[HostTensor],
        sized: &BindingSet<B>,
        spare: Vec<HostData>,
        inits: Vec<Preset>,
    ) -> Result<Vec<HostTensor>> {
        // Concurrent runs: the first takes the shared buffers; the others make their own for the
        // run, or wait when the backend says so.
        let mut own;
        let mut guard;
        let buffers: &mut B::Buffers = match self.buffers.try_lock() {
            Ok(g) => {
                guard = g;
                &mut guard
            }
            Err(TryLockError::Poisoned(p)) => {
                guard = p.into_inner();
                &mut guard
            }
            Err(TryLockError::WouldBlock) if B::CONCURRENT_RUNS => {
                own = B::Buffers::default();
                &mut own
            }
            Err(TryLockError::WouldBlock) => {
                guard = lock(&self.buffers);
                &mut guard
            }
        };
        self.backend.recycle(buffers, spare);
        self.backend.preset(buffers, inits)?;
        self.run_with(buffers, inputs, sized)
    }

    /// One run on `buffers`.
    pub(crate) fn run_with(
        &self,
        buffers: &mut B::Buffers,
        inputs: &[HostTensor],
        sized: &BindingSet<B>,
    ) -> Result<Vec<HostTensor>> {
        let (backend, prepared) = (&self.backend, &self.prepared);
        backend.bind(buffers, prepared, sized, inputs)?;
        // SAFETY: bound just now for `sized` and `inputs`, which outlive the calls.
        unsafe {
            backend.launch_all(buffers, prepared, sized)?;
            backend.finish(buffers, prepared, sized, inputs)
        }
    }
}

//! The VM as a [`Backend`]: per binding set its launches and level schedule; per run the arena,
//! the fresh outputs and the pointer table, the launch walk (calibration and concurrent levels
//! included) and the outputs handed back without a copy.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use air::{HostData, HostTensor};
use lower::{BufferKind, Program};
use smallvec::SmallVec;

use super::launch::{self, Code, Launch};
use super::{CALIBRATE_AGAIN, CALIBRATION_RUNS, CpuCode, CpuLaunches, OutputSource, RunState, SPLIT_MIN_NS};
use crate::backend::{Backend, BindingSet};
use crate::error::{Result, RuntimeError};
use crate::levels::{self, Phase};
use crate::matmul::PackedWeight;
use crate::memory;
use crate::parallel::{self, SendPtr};
use crate::prepared::{Prepared, Preset, Sizes};

impl Backend for CpuCode {
    const NAME: &'static str = "cpu";
    const CONCURRENT_RUNS: bool = true;
    type Launches = CpuLaunches;
    type Buffers = RunState;

    fn buffer_bytes(&self, program: &Program, buf: usize, numel: usize) -> Result<usize> {
        // `Prepared::sizes` checked that this fits in `isize::MAX`.
        Ok(numel * program.buffers[buf].dtype.size_bytes())
    }

    fn size(&self, prepared: &Prepared, sizes: &Sizes) -> Result<CpuLaunches> {
        let p = prepared.program();
        let threads = parallel::threads();
        let launches = launch::launches(p, &self.steps, sizes, threads, self.table_bufs.len())?;
        let unwritten_ok = self
            .output_bufs
            .iter()
            .zip(&self.output_writer)
            .map(|(&b, writer)| match writer.map(|s| &launches[s as usize]) {
                // A loop kernel's loop space is the shape of the node it materializes, and an
                // output buffer holds exactly that node (`lower::schedule`): it stores every element.
                Some(Launch::Loop { .. }) => true,
                Some(Launch::Matmul { mm, .. }) => mm.writes_all_of_c(sizes.buf_numel[b as usize]),
                None => false,
            })
            .collect();
        let schedule = match &self.concurrency {
            Some(c) => {
                let costs = launch::launch_costs(p, &launches, &sizes.syms);
                levels::schedule(&c.levels, &costs, threads, c.min_work)
            }
            None => None,
        };
        let copy_steps = (0..launches.len() as u32)
            .filter(|&s| matches!(launches[s as usize], Launch::Matmul { copied: Some(_), .. }))
            .collect();
        // Launches calibrated before in another binding set take that decision; when all of them
        // do, the first calibration window is skipped.
        let costs = launch::launch_costs(p, &launches, &sizes.syms);
        let runs = if self.decisions.apply(&launches, &costs) { 2 * CALIBRATION_RUNS + 1 } else { 0 };
        Ok(CpuLaunches {
            unwritten_ok,
            launches,
            copy_steps,
            schedule,
            runs: AtomicU32::new(runs),
            code_seen: AtomicU64::new(codegen::cpu::tier_ups_so_far()),
            code_swapped: AtomicUsize::new(self.swapped_steps()),
        })
    }

    fn time_slots(launches: &CpuLaunches) -> Option<&[Vec<usize>]> {
        launches.schedule.as_ref().map(|s| s.slots.as_slice())
    }

    fn recycle(&self, state: &mut RunState, spare: Vec<HostData>) {
        state.spare = spare;
    }

    fn preset(&self, state: &mut RunState, inits: Vec<Preset>) -> Result<()> {
        state.presets = inits;
        Ok(())
    }

    /// Makes the arena big enough, allocates the fresh outputs (or takes spare arrays of the
    /// same dtype and length) and fills the pointer table.
    fn bind(
        &self,
        state: &mut RunState,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        inputs: &[HostTensor],
    ) -> Result<()> {
        let program = prepared.program();
        state.arena.ensure(sized.plan.stats.arena_bytes)?;
        let base = state.arena.base();

        state.fresh.clear();
        state.fresh_shapes.clear();
        for (j, &b) in self.output_bufs.iter().enumerate() {
            let b = b as usize;
            let (dtype, n) = (program.buffers[b].dtype, sized.sizes.buf_numel[b]);
            if let Some(k) = state.presets.iter().position(|p| p.out == b) {
                // Written in place: the given array itself (its very `Arc`, so that the caller
                // can tell it comes back) when nobody else holds it, else a copy.
                let Preset { mut data, shape, .. } = state.presets.swap_remove(k);
                Arc::make_mut(&mut data);
                if data.dtype() != dtype || data.len() != n {
                    state.presets.clear();
                    return Err(RuntimeError::InvalidProgram(format!(
                        "buf{b} starts from {} {} elements, not {n} {dtype}",
                        data.len(),
                        data.dtype()
                    )));
                }
                state.fresh.push(data);
                state.fresh_shapes.push(Some(shape));
                continue;
            }
            state.fresh_shapes.push(None);
            let spare = state.spare.iter().position(|d| d.dtype() == dtype && d.len() == n);
            state.fresh.push(Arc::new(match spare {
                Some(i) => {
                    let mut data = state.spare.swap_remove(i);
                    if !sized.launches.unwritten_ok[j] {
                        memory::zero(&mut data);
                    }
                    data
                }
                None if sized.launches.unwritten_ok[j] => memory::unwritten_host_data(dtype, n)?,
                None => memory::zeroed_host_data(dtype, n)?,
            }));
        }
        state.spare.clear();

        state.status.clear();
        state.status.resize(lower::kir::STATUS_WORDS, 0);
        state.buf_ptrs.clear();
        let mut next_fresh = 0;
        for (i, b) in program.buffers.iter().enumerate() {
            let ptr = match b.kind {
                BufferKind::Input(slot) => {
                    let data = &inputs[slot as usize].data;
                    memory::note_input(data);
                    memory::data_ptr(data)
                }
                BufferKind::Output(_) => {
                    next_fresh += 1;
                    let data = Arc::get_mut(&mut state.fresh[next_fresh - 1]).expect("a fresh output is not shared");
                    memory::data_ptr_mut(data)
                }
                // SAFETY: the offset lies inside the arena (checked against the plan in
                // `Prepared::plan`, and the arena holds `arena_bytes`).
                BufferKind::Temp => unsafe { base.add(sized.plan.offsets[i].unwrap_or(0)) },
                BufferKind::Status => state.status.as_mut_ptr() as *mut u8,
            };
            state.buf_ptrs.push(ptr);
        }
        state.table.clear();
        state.table.extend(self.table_bufs.iter().map(|&b| state.buf_ptrs[b as usize]));
        // The weights' copies in rows, set below.
        state.table.resize(self.table_bufs.len() + sized.launches.copy_steps.len(), std::ptr::null_mut());
        // Per run, not per binding set: an offset may read a symbol that binding sets sharing
        // their launches differ in (a KV cache's write position).
        for (at, e, size) in &self.table_offsets {
            let elements = e.eval(&[], &sized.sizes.syms);
            let Some(bytes) = elements.checked_mul(*size as i64).and_then(|b| isize::try_from(b).ok()) else {
                return Err(RuntimeError::BadSize(format!("argument offset {e} = {elements} elements overflows")));
            };
            // The kernel adds the rest of each index back: it touches the elements the
            // program's kernel addresses (`lower::offsets`), inside the buffer.
            let entry = &mut state.table[*at as usize];
            *entry = entry.wrapping_offset(bytes);
        }
        // Weights read from their copies in rows (made on a step's second run, again when the
        // weight changed).
        let launches = &sized.launches.launches;
        state.weight_copies.resize_with(launches.len(), || None);
        for &step in &sized.launches.copy_steps {
            let step = step as usize;
            let Launch::Matmul { arg_start, mm, copied: Some(copied), copy_at, .. } = &launches[step] else { continue };
            let at = *arg_start as usize + mm.b.param;
            let BufferKind::Input(slot) = program.buffers[self.table_bufs[at] as usize].kind else {
                return Err(RuntimeError::InvalidProgram(format!("step {step} copies a weight that is not an input")));
            };
            let b = state.table[at].wrapping_offset(mm.b.offset * mm.dtype.size_bytes() as isize);
            // SAFETY: `b` is the matmul's `b` inside the input's array (its strides were checked
            // against the buffer's size in `MatmulLaunch::new`, the input's size in
            // `check_inputs`); `copied` came from `mm.with_packed_b()`.
            let copy = unsafe {
                PackedWeight::refresh(
                    &mut state.weight_copies[step],
                    (mm, copied),
                    &inputs[slot as usize].data,
                    b,
                    true,
                )
            };
            state.table[*copy_at as usize] = copy;
        }
        Ok(())
    }

    unsafe fn launch(&self, state: &mut RunState, _: &Prepared, sized: &BindingSet<Self>, step: usize) -> Result<()> {
        // SAFETY: `bind` filled the table for this binding set (the caller's contract).
        let split = unsafe {
            launch::run_launch(&sized.launches.launches[step], state.table.as_ptr(), sized.sizes.syms.as_ptr(), false)
        };
        if split {
            self.split_launches.fetch_add(1, Ordering::Relaxed);
        }
        self.launched.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    unsafe fn launch_all(&self, state: &mut RunState, prepared: &Prepared, sized: &BindingSet<Self>) -> Result<()> {
        let table = state.table.as_ptr();
        let syms = sized.sizes.syms.as_ptr();
        let l = &sized.launches;
        let mut run = l.runs.load(Ordering::Relaxed);
        let seen = codegen::cpu::tier_ups_so_far();
        if l.code_seen.load(Ordering::Relaxed) != seen {
            l.code_seen.store(seen, Ordering::Relaxed);
            let swapped = self.swapped_steps();
            if l.code_swapped.swap(swapped, Ordering::Relaxed) != swapped && run > 0 {
                // The JIT swapped faster code in under decisions timed on the quick tier's (a
                // split that paid for slow code may not for fast): calibrate again, from one
                // thread, as the first window does.
                l.launches.iter().for_each(launch::restart_calibration);
                l.runs.store(1, Ordering::Relaxed);
                run = 1;
            }
        }
        if run < u32::MAX {
            l.runs.fetch_add(1, Ordering::Relaxed);
        }
        if run == 1 {
            // The program runs again: the JIT's optimised tier pays now (a no-op per kernel
            // after the first request, and for kernels that are not tiered).
            for s in &self.steps {
                if let Code::Loop { entry, .. } = &s.code {
                    entry.request_tier_up();
                }
            }
        }
        let pos = calibration_position(run);
        let calibrating = pos > 0;
        // A first run's launches, timed where a profile asked (`time_first_runs`; each slot
        // written by the one thread that runs its launch).
        let timed: Vec<AtomicU64> = if run == 0 && super::TIME_FIRST_RUNS.load(Ordering::Relaxed) {
            l.launches.iter().map(|_| AtomicU64::new(0)).collect()
        } else {
            Vec::new()
        };
        if pos == 1 && run > 1 {
            // A later calibration window: the candidates start again from one thread.
            l.launches.iter().for_each(launch::restart_calibration);
        }
        // SAFETY (both closures): the table holds every step's buffers (see `run_launch`).
        let in_order = |s: usize| {
            let launch = &l.launches[s];
            let split = unsafe {
                if calibrating {
                    // The first split run wakes the pool's threads (up to 77 us, `parallel`):
                    // a warm-up, not timed.
                    launch::run_calibrating(launch, table, syms, pos != CALIBRATION_RUNS + 1)
                } else {
                    launch::run_launch(launch, table, syms, false)
                }
            };
            if split {
                self.split_launches.fetch_add(1, Ordering::Relaxed);
            }
        };
        let in_order = |s: usize| clocked(timed.get(s), || in_order(s));
        match &l.schedule {
            None => (0..l.launches.len()).for_each(in_order),
            Some(schedule) => {
                for phase in &schedule.phases {
                    match phase {
                        Phase::Step(s) => in_order(*s as usize),
                        Phase::Concurrent { bins } => {
                            let (table, syms) = (SendPtr(table as *mut u8), SendPtr(syms as *mut u8));
                            parallel::for_chunks(bins.len(), bins.len(), &|lo, hi| {
                                for bin in &bins[lo..hi] {
                                    for &s in bin {
                                        // SAFETY: as above; the steps of one level touch no
                                        // common bytes where one of them writes (`lower::batch`
                                        // levels, planned with the level as one time slot), so
                                        // they may run at the same time, each on one thread.
                                        clocked(timed.get(s as usize), || unsafe {
                                            launch::run_launch(
                                                &l.launches[s as usize],
                                                table.get() as *const *mut u8,
                                                syms.get() as *const i64,
                                                true,
                                            );
                                        });
                                    }
                                }
                            });
                        }
                    }
                }
            }
        }
        if calibrating && (pos == CALIBRATION_RUNS || pos == 2 * CALIBRATION_RUNS) {
            for launch in &l.launches {
                if let Launch::Matmul { calibrate: true, threads, calib_ns, split_ns, .. } = launch {
                    // As for loops below: threaded for the second half of the calibration runs
                    // when one thread took long enough, kept only where that was 15% faster.
                    let one = calib_ns.load(Ordering::Relaxed);
                    let decided = if pos == CALIBRATION_RUNS {
                        one >= SPLIT_MIN_NS
                    } else {
                        split_ns.load(Ordering::Relaxed) < one / 20 * 17
                    };
                    threads.store(decided, Ordering::Relaxed);
                }
                if let Launch::Loop { chunks, split, calib_ns, split_ns, .. } = launch
                    && *split > 1
                {
                    let one = calib_ns.load(Ordering::Relaxed);
                    let decided = if pos == CALIBRATION_RUNS {
                        if one >= SPLIT_MIN_NS { *split } else { 1 }
                    } else if split_ns.load(Ordering::Relaxed) < one / 20 * 17 {
                        *split
                    } else {
                        1
                    };
                    chunks.store(decided, Ordering::Relaxed);
                }
            }
            if pos == 2 * CALIBRATION_RUNS {
                let costs = launch::launch_costs(prepared.program(), &l.launches, &sized.sizes.syms);
                self.decisions.remember(&l.launches, &costs);
            }
        }
        if !timed.is_empty() {
            let mut first = super::lock(&self.first_run_ns);
            if first.is_empty() {
                *first = timed.iter().map(|t| t.load(Ordering::Relaxed)).collect();
            }
        }
        self.launched.fetch_add(l.launches.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Hands the fresh outputs out as the graph's outputs.
    ///
    /// # Safety
    /// Every launch of `sized` ran on the pointers `bind` set up, so every fresh output whose
    /// `unwritten_ok` flag is set has had every element written.
    unsafe fn finish(
        &self,
        state: &mut RunState,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        inputs: &[HostTensor],
    ) -> Result<Vec<HostTensor>> {
        // One check per run: a data-dependent failure recorded by any kernel becomes the error.
        if let Err(e) = prepared.check_status(&state.status) {
            state.fresh.clear();
            return Err(e);
        }
        let buf_numel = &sized.sizes.buf_numel;
        let mut fresh: SmallVec<[Arc<HostData>; 4]> = SmallVec::with_capacity(state.fresh.len());
        for (&b, mut data) in self.output_bufs.iter().zip(state.fresh.drain(..)) {
            // SAFETY: the buffer's first writer stored every element (`unwritten_ok`), or it was
            // zeroed; it has room for exactly `buf_numel` elements.
            unsafe {
                memory::mark_written(
                    Arc::get_mut(&mut data).expect("a fresh output is not shared"),
                    buf_numel[b as usize],
                )
            };
            fresh.push(data);
        }
        let mut results = Vec::with_capacity(self.outputs.len());
        for (i, source) in self.outputs.iter().enumerate() {
            // An output written in place takes its input's shape allocation (same dims).
            let mut shape = match *source {
                OutputSource::Fresh(j) => state.fresh_shapes.get_mut(j).and_then(Option::take).unwrap_or_default(),
                _ => Vec::new(),
            };
            shape.clone_from(&sized.sizes.output_shapes[i]);
            let data = match *source {
                OutputSource::Fresh(j) => fresh[j].clone(),
                OutputSource::Input(slot) => inputs[slot as usize].data.clone(),
                OutputSource::Temp(b) => {
                    let info = &prepared.program().buffers[b as usize];
                    let n = buf_numel[b as usize];
                    let mut data = memory::unwritten_host_data(info.dtype, n)?;
                    // SAFETY: the temporary holds `n` elements of its dtype inside the arena, and
                    // `data` is a fresh array of the same dtype with room for `n`: both ranges are
                    // in bounds and do not overlap. Kernels store only valid values (bools as 0/1),
                    // so after the copy all `n` elements are initialized.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            state.buf_ptrs[b as usize],
                            memory::data_ptr_mut(&mut data),
                            n * info.dtype.size_bytes(),
                        );
                        memory::mark_written(&mut data, n);
                    }
                    Arc::new(data)
                }
            };
            results.push(HostTensor { data, shape });
        }
        Ok(results)
    }
}

impl CpuCode {
    /// How many loop steps run code the JIT has swapped (to its optimised tier).
    fn swapped_steps(&self) -> usize {
        self.steps.iter().filter(|s| matches!(&s.code, Code::Loop { entry, .. } if entry.is_swapped())).count()
    }
}

/// Runs `f`, its wall time stored into `slot` when there is one (a first run's timed launch).
#[inline(always)]
fn clocked(slot: Option<&AtomicU64>, f: impl FnOnce()) {
    match slot {
        Some(slot) => {
            let t0 = std::time::Instant::now();
            f();
            slot.store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        None => f(),
    }
}

/// Where run number `run` (0 for the first) falls in the calibration windows of a binding set:
/// `1..=2 * CALIBRATION_RUNS` inside one, 0 outside. The first window follows the first run; the
/// later ones start after runs [`CALIBRATE_AGAIN`], so that a decision taken while other work
/// held the cores (a split that looked slower) is taken again.
fn calibration_position(run: u32) -> u32 {
    let start = CALIBRATE_AGAIN.iter().rev().copied().find(|&s| run > s).unwrap_or(0);
    let pos = run - start;
    if (1..=2 * CALIBRATION_RUNS).contains(&pos) { pos } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_windows_follow_the_first_run_and_come_back() {
        let window = |start: u32| (start + 1..=start + 2 * CALIBRATION_RUNS).collect::<Vec<u32>>();
        let mut want = window(0);
        for s in CALIBRATE_AGAIN {
            want.extend(window(s));
        }
        let got: Vec<u32> = (0..20_000).filter(|&r| calibration_position(r) > 0).collect();
        assert_eq!(got, want);
        for (i, &r) in want.iter().enumerate() {
            assert_eq!(calibration_position(r), i as u32 % (2 * CALIBRATION_RUNS) + 1, "run {r}");
        }
        assert_eq!(calibration_position(u32::MAX), 0);
    }
}

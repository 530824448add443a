//! Independent work in a program: the dependencies between steps, dependency levels, and the
//! horizontal batching of equal matmuls into grouped GEMM launches.
//!
//! # Dependencies and levels
//!
//! Step `t` depends on an earlier step `s` when they touch a common buffer and one of them writes
//! it (read-after-write, write-after-write, write-after-read, by `BufId`). A matmul that
//! accumulates into `c` declares `c` as written, so it depends on the step that wrote the bias
//! (write-after-write). The *level* of a step is one more than the highest level it depends on;
//! a step that depends on nothing is at level 0 if it is a matmul or nothing depends on it, else
//! one below its first dependent (what it writes then lives from just before its first use, not
//! from the start of the run). Steps of one level never depend on each other: a runtime may
//! run them in any order or at the same time, as long as level `l` finishes before level `l + 1`
//! starts. Running by levels changes which buffers are alive together, so the memory plan for it
//! is [`crate::memplan::plan_with_groups`] with the levels (or finer groups) as time slots.
//!
//! # Grouped matmuls
//!
//! Identical kernels appear once in `Program::kernels`, so steps of one level that launch the same
//! `Kernel::Matmul` have identical shapes, strides and dtypes and differ only in their buffers: N
//! independent products (a tree of matmuls) become one [`Launch::Grouped`], a "grouped GEMM" of
//! N problems that a backend runs as one launch (the CPU splits the problems over its cores, each
//! GEMM on one thread). The kir is not changed for it: a group is a set of steps of one kernel,
//! so every backend that runs the steps one by one stays correct.
//!
//! Everything here is computed once per program, in O(steps + arguments) plus a sort per level.

use rustc_hash::FxHashMap as HashMap;

use crate::error::LowerError;
use crate::kir::{Access, Kernel};
use crate::program::{BufferKind, Program};

/// The dependencies of every step and its level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dependencies {
    /// `preds[t]`: the earlier steps step `t` depends on directly, sorted, without repeats.
    pub preds: Vec<Vec<u32>>,
    /// `level[t]`: 1 + the highest level of its preds; for a step with none, 0, or for a loop
    /// step that others depend on, 1 below the lowest level among them (see the module docs).
    pub level: Vec<u32>,
}

impl Dependencies {
    /// The steps of each level, in program order within a level.
    pub fn levels(&self) -> Vec<Vec<usize>> {
        let n = self.level.iter().map(|&l| l as usize + 1).max().unwrap_or(0);
        let mut out = vec![Vec::new(); n];
        for (s, &l) in self.level.iter().enumerate() {
            out[l as usize].push(s);
        }
        out
    }
}

/// Computes the dependencies of every step of `program`.
pub fn dependencies(program: &Program) -> Result<Dependencies, LowerError> {
    let n_bufs = program.buffers.len();
    let mut last_writer: Vec<Option<u32>> = vec![None; n_bufs];
    // Readers of each buffer since its last write.
    let mut readers: Vec<Vec<u32>> = vec![Vec::new(); n_bufs];
    let mut preds = Vec::with_capacity(program.steps.len());
    let mut level = Vec::with_capacity(program.steps.len());
    // Per step, the lowest level among the steps that depend on it (`u32::MAX`: none).
    let mut first_use = vec![u32::MAX; program.steps.len()];
    for (s, step) in program.steps.iter().enumerate() {
        let kernel = program.step_kernel(s)?;
        air::work::add(1 + 2 * step.args.len() as u64);
        let mut p: Vec<u32> = Vec::new();
        for (param, &b) in kernel.params().iter().zip(&step.args) {
            let b = b.0 as usize;
            if b >= n_bufs {
                return Err(LowerError::Malformed(format!("step {s} uses a missing buffer buf{b}")));
            }
            // Kernels only ever set the status buffer atomically from 0: no order between them.
            if program.buffers[b].kind == BufferKind::Status {
                continue;
            }
            p.extend(last_writer[b]);
            if param.access == Access::Write {
                p.extend(readers[b].iter().copied());
            }
        }
        air::work::add(p.len() as u64);
        p.sort_unstable();
        p.dedup();
        let s32 = s as u32;
        p.retain(|&q| q != s32);
        for (param, &b) in kernel.params().iter().zip(&step.args) {
            let b = b.0 as usize;
            if program.buffers[b].kind == BufferKind::Status {
                continue;
            }
            match param.access {
                Access::Read => readers[b].push(s32),
                Access::Write => {
                    last_writer[b] = Some(s32);
                    readers[b].clear();
                }
            }
        }
        let l = p.iter().map(|&q| level[q as usize] + 1).max().unwrap_or(0);
        for &q in &p {
            first_use[q as usize] = first_use[q as usize].min(l);
        }
        level.push(l);
        preds.push(p);
    }
    sink_sources(program, &preds, &first_use, &mut level);
    Ok(Dependencies { preds, level })
}

/// Moves each loop step that depends on nothing (it reads only the program's inputs and
/// constants) from level 0 to just below its first dependent, so that what it writes lives from
/// the level before its first use rather than from the start: a `Linear`'s bias broadcast into
/// the product's output (`schedule::decide`) is such a step, one per layer, and at level 0 all of
/// them were alive together until their layers came. A step that nothing depends on stays at 0.
/// Matmul steps stay too: equal ones of one level become one grouped launch (an RNN's input
/// projections of every time step).
fn sink_sources(program: &Program, preds: &[Vec<u32>], first_use: &[u32], level: &mut [u32]) {
    air::work::add(level.len() as u64);
    for (s, step) in program.steps.iter().enumerate() {
        let matmul = matches!(program.kernels.get(step.kernel as usize), Some(Kernel::Matmul(_)));
        if preds[s].is_empty() && first_use[s] != u32::MAX && !matmul {
            // Every dependent is above level 0 (it depends on this step), so this stays below it.
            level[s] = first_use[s] - 1;
        }
    }
}

/// The steps of each dependency level of `program` (see the module docs).
pub fn levels(program: &Program) -> Result<Vec<Vec<usize>>, LowerError> {
    Ok(dependencies(program)?.levels())
}

/// One launch of a batched program: a single step, or N steps of one matmul kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Launch {
    /// `program.steps[s]`.
    Step(usize),
    /// The steps (at least two, independent of each other, in program order) all launch matmul
    /// kernel `kernel`: one grouped GEMM of `steps.len()` problems.
    Grouped {
        /// The index of the shared matmul kernel in `program.kernels`.
        kernel: u32,
        /// The grouped steps, in program order.
        steps: Vec<usize>,
    },
}

impl Launch {
    /// The steps this launch runs.
    pub fn steps(&self) -> &[usize] {
        match self {
            Launch::Step(s) => std::slice::from_ref(s),
            Launch::Grouped { steps, .. } => steps,
        }
    }
}

/// Splits one level's steps into launches: the steps of each matmul kernel that occurs at least
/// twice become one [`Launch::Grouped`] (placed where its first step was); every other step is a
/// launch of its own. `steps` must be independent of each other (one level).
pub fn group_level(program: &Program, steps: &[usize]) -> Vec<Launch> {
    let mut by_kernel: HashMap<u32, Vec<usize>> = HashMap::default();
    for &s in steps {
        let k = program.steps[s].kernel;
        if matches!(program.kernels.get(k as usize), Some(Kernel::Matmul(_))) {
            by_kernel.entry(k).or_default().push(s);
        }
    }
    by_kernel.retain(|_, group| group.len() >= 2);
    let mut out = Vec::with_capacity(steps.len());
    for &s in steps {
        let k = program.steps[s].kernel;
        match by_kernel.get_mut(&k) {
            // The group goes where its first step was; its other steps are skipped.
            Some(group) if group.first() == Some(&s) => {
                out.push(Launch::Grouped { kernel: k, steps: std::mem::take(group) })
            }
            Some(_) => {}
            None => out.push(Launch::Step(s)),
        }
    }
    out
}

/// The whole program as levels of launches, equal matmuls of a level grouped.
pub fn batched_levels(program: &Program) -> Result<Vec<Vec<Launch>>, LowerError> {
    Ok(levels(program)?.iter().map(|level| group_level(program, level)).collect())
}

/// A readable dump: one line per level, `[s3 s4 {k1: s5 s6 s7}]` (braces: a grouped matmul).
pub fn describe(program: &Program) -> Result<String, LowerError> {
    let mut out = String::new();
    for (l, launches) in batched_levels(program)?.iter().enumerate() {
        let parts: Vec<String> = launches
            .iter()
            .map(|launch| match launch {
                Launch::Step(s) => format!("s{s}"),
                Launch::Grouped { kernel, steps } => {
                    let steps: Vec<String> = steps.iter().map(|s| format!("s{s}")).collect();
                    format!("{{k{kernel}: {}}}", steps.join(" "))
                }
            })
            .collect();
        out.push_str(&format!("level {l}: {}\n", parts.join(" ")));
    }
    Ok(out)
}

impl Program {
    /// The dependencies between steps (see [`crate::batch`]).
    pub fn deps(&self) -> Result<Dependencies, LowerError> {
        dependencies(self)
    }

    /// The steps of each dependency level: steps of one level may run concurrently.
    pub fn levels(&self) -> Result<Vec<Vec<usize>>, LowerError> {
        levels(self)
    }
}

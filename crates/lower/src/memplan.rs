//! The memory planner: places every `Temp` buffer of a program in one arena, by offsets, so that
//! buffers whose lifetimes overlap never share bytes.
//!
//! # Why one arena
//!
//! The runtime allocates the arena once per distinct set of symbol bindings and reuses it for
//! every run with those bindings; the offsets are computed once per binding set and cached next to
//! it. A run then allocates nothing for its intermediates: a temp is `arena + offset`. The
//! alternative, a pool of buffers keyed by size, allocates lazily and needs no planning, but pays
//! a lookup (and often an allocation, since sizes rarely repeat exactly) per temp per run, keeps
//! freed buffers of sizes that never come back, and cannot pack a small buffer into the tail of a
//! bigger dead one. Planning is cheap (O(T^2) in the number of temps, done once), and the arena's
//! size is known before the run starts, so a device allocation cannot fail halfway.
//!
//! # Lifetimes
//!
//! Steps are grouped into *time slots*: by default each step is its own slot, in program order.
//! Steps that may run at the same time (a parallel runtime) are passed as one group to
//! [`plan_with_groups`]: every step of a group gets the group's slot, so the lifetimes of the
//! buffers they touch all overlap. A temp lives from the slot of its first write to the slot of
//! its last read, inclusive (a kernel never reads and writes a temp it could share memory with).
//!
//! # Placement
//!
//! Greedy by size: temps sorted by size (largest first), each placed at the lowest 64-byte-aligned
//! offset that does not overlap any already placed temp whose lifetime intersects its own.

use air::Bindings;

use crate::error::LowerError;
use crate::kir::Access;
use crate::program::{BufferKind, Program};

/// Offsets of temps inside the arena are multiples of this many bytes.
pub const ALIGN: usize = 64;

/// Where each temp buffer lives, for one set of symbol bindings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Per `BufId`: the byte offset in the arena for temps, `None` for inputs and outputs.
    pub offsets: Vec<Option<usize>>,
    /// Per `BufId`: its size in bytes.
    pub sizes: Vec<usize>,
    /// Per `BufId`: the inclusive range of time slots a temp lives in (`None` for non-temps).
    pub intervals: Vec<Option<(usize, usize)>>,
    /// Bytes the arena needs.
    pub arena_bytes: usize,
    /// Bytes every temp would take with a buffer of its own (each rounded up to `ALIGN`, as in
    /// the arena, so that `arena_bytes <= naive_bytes` always holds).
    pub naive_bytes: usize,
    /// The most bytes of temps alive in one time slot: no placement can beat it.
    pub peak_live_bytes: usize,
}

fn align_up(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// Plans with every step in its own time slot, in program order.
pub fn plan(program: &Program, bindings: &Bindings) -> Result<MemoryPlan, LowerError> {
    let groups: Vec<Vec<usize>> = (0..program.steps.len()).map(|s| vec![s]).collect();
    plan_with_groups(program, bindings, &groups)
}

/// Plans with `groups[t]` the steps of time slot `t`; every step must be in exactly one group.
pub fn plan_with_groups(
    program: &Program,
    bindings: &Bindings,
    groups: &[Vec<usize>],
) -> Result<MemoryPlan, LowerError> {
    let sizes = buffer_sizes(program, bindings)?;
    let intervals = lifetimes(program, groups)?;
    let (offsets, arena_bytes) = place(&sizes, &intervals);
    let naive_bytes = intervals.iter().zip(&sizes).filter(|(i, _)| i.is_some()).map(|(_, &s)| align_up(s)).sum();
    Ok(MemoryPlan {
        peak_live_bytes: peak_live(&sizes, &intervals),
        offsets,
        sizes,
        intervals,
        arena_bytes,
        naive_bytes,
    })
}

/// The size in bytes of every buffer under `bindings`.
pub fn buffer_sizes(program: &Program, bindings: &Bindings) -> Result<Vec<usize>, LowerError> {
    program
        .buffers
        .iter()
        .map(|b| {
            let n = b.numel.eval(bindings)?;
            usize::try_from(n)
                .ok()
                .and_then(|n| n.checked_mul(b.dtype.size_bytes()))
                .ok_or_else(|| LowerError::BadInputs(format!("buffer of {} elements", b.numel)))
        })
        .collect()
}

/// The inclusive time-slot interval of every temp (`None` for inputs and outputs). A temp no
/// step touches lives in slot 0.
pub fn lifetimes(program: &Program, groups: &[Vec<usize>]) -> Result<Vec<Option<(usize, usize)>>, LowerError> {
    let mut slot = vec![usize::MAX; program.steps.len()];
    for (t, group) in groups.iter().enumerate() {
        for &s in group {
            match slot.get_mut(s) {
                Some(x) if *x == usize::MAX => *x = t,
                _ => return Err(LowerError::Malformed(format!("step {s} is in no group or in several"))),
            }
        }
    }
    if let Some(s) = slot.iter().position(|&t| t == usize::MAX) {
        return Err(LowerError::Malformed(format!("step {s} is in no group")));
    }
    let mut out: Vec<Option<(usize, usize)>> = vec![None; program.buffers.len()];
    for (s, step) in program.steps.iter().enumerate() {
        let kernel = program
            .kernels
            .get(step.kernel as usize)
            .ok_or_else(|| LowerError::Malformed(format!("step {s} launches a missing kernel")))?;
        if kernel.params().len() != step.args.len() {
            return Err(LowerError::Malformed(format!("step {s}: argument count differs from the kernel's")));
        }
        for (p, &b) in kernel.params().iter().zip(&step.args) {
            let info = program
                .buffers
                .get(b.0 as usize)
                .ok_or_else(|| LowerError::Malformed(format!("step {s} uses a missing buffer {b}")))?;
            if info.kind != BufferKind::Temp {
                continue;
            }
            let t = slot[s];
            let e = &mut out[b.0 as usize];
            *e = Some(match *e {
                None => {
                    if p.access == Access::Read {
                        return Err(LowerError::Malformed(format!("step {s} reads {b} before any step writes it")));
                    }
                    (t, t)
                }
                Some((lo, hi)) => (lo.min(t), hi.max(t)),
            });
        }
    }
    for (i, b) in program.buffers.iter().enumerate() {
        if b.kind == BufferKind::Temp && out[i].is_none() {
            out[i] = Some((0, 0));
        }
    }
    Ok(out)
}

/// Places every buffer with an interval; returns the offsets and the arena size.
pub fn place(sizes: &[usize], intervals: &[Option<(usize, usize)>]) -> (Vec<Option<usize>>, usize) {
    let mut order: Vec<usize> = (0..sizes.len()).filter(|&i| intervals[i].is_some()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), intervals[i].map(|(lo, _)| lo), i));
    let mut offsets: Vec<Option<usize>> = vec![None; sizes.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut arena = 0;
    for i in order {
        let (lo, hi) = intervals[i].expect("filtered");
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| {
                let (a, b) = intervals[j].expect("placed buffers have intervals");
                a <= hi && lo <= b && sizes[j] > 0
            })
            .map(|&j| (offsets[j].expect("placed"), sizes[j]))
            .collect();
        busy.sort();
        let mut at = 0;
        for (off, size) in busy {
            if at + sizes[i] <= off {
                break;
            }
            at = at.max(align_up(off + size));
        }
        offsets[i] = Some(at);
        arena = arena.max(at + sizes[i]);
        placed.push(i);
    }
    (offsets, align_up(arena))
}

/// The most bytes alive in one time slot.
pub fn peak_live(sizes: &[usize], intervals: &[Option<(usize, usize)>]) -> usize {
    let end = intervals.iter().flatten().map(|&(_, hi)| hi + 1).max().unwrap_or(0);
    let mut delta = vec![0i128; end + 1];
    for (i, iv) in intervals.iter().enumerate() {
        if let Some((lo, hi)) = iv {
            delta[*lo] += sizes[i] as i128;
            delta[hi + 1] -= sizes[i] as i128;
        }
    }
    let (mut live, mut peak) = (0i128, 0i128);
    for d in delta {
        live += d;
        peak = peak.max(live);
    }
    peak as usize
}

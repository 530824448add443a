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
//! bigger dead one. Planning is cheap (done once; placement is O(T log T) in the number of temps
//! when each overlaps few others, see [`place`]), and the arena's size is known before the run
//! starts, so a device allocation cannot fail halfway.
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
//! offset that does not overlap any already placed temp whose lifetime intersects its own. The
//! placed temps whose lifetimes intersect are found through an interval index (a segment tree over
//! time slots), not by scanning every placed temp.

use air::Bindings;

use crate::error::LowerError;
use crate::kir::Access;
use crate::program::{BufferKind, Program};

/// Offsets of temps inside the arena are multiples of this many bytes.
pub const ALIGN: usize = 64;

/// The memory a plan needs, for one set of symbol bindings: the one `{arena, naive, peak}` type
/// every device, the facade's profiler and the cli report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemoryStats {
    /// Bytes the arena needs (after the planner's reuse).
    pub arena_bytes: usize,
    /// Bytes every temp would take with a buffer of its own (each rounded up to `ALIGN`, as in
    /// the arena, so that `arena_bytes <= naive_bytes` always holds).
    pub naive_bytes: usize,
    /// The most bytes of temps alive in one time slot: no placement can beat it.
    pub peak_live_bytes: usize,
}

/// Where each temp buffer lives, for one set of symbol bindings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Per `BufId`: the byte offset in the arena for temps, `None` for inputs and outputs.
    pub offsets: Vec<Option<usize>>,
    /// Per `BufId`: its size in bytes.
    pub sizes: Vec<usize>,
    /// Per `BufId`: the inclusive range of time slots a temp lives in (`None` for non-temps).
    pub intervals: Vec<Option<(usize, usize)>>,
    /// The arena, naive and peak-live bytes.
    pub stats: MemoryStats,
}

fn align_up(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// Plans with every step in its own time slot, in program order.
pub fn plan(program: &Program, bindings: &Bindings) -> Result<MemoryPlan, LowerError> {
    plan_with_groups(program, bindings, &in_order(program))
}

/// Plans with `groups[t]` the steps of time slot `t`; every step must be in exactly one group.
pub fn plan_with_groups(
    program: &Program,
    bindings: &Bindings,
    groups: &[Vec<usize>],
) -> Result<MemoryPlan, LowerError> {
    plan_sizes(program, buffer_sizes(program, bindings)?, groups)
}

/// Plans with `sizes[b]` the bytes buffer `b` takes (what a device needs: its element sizes and
/// its padding of temps, see [`buffer_sizes`] for the host's) and `groups` as in
/// [`plan_with_groups`]. Every device plans through here.
pub fn plan_sizes(program: &Program, sizes: Vec<usize>, groups: &[Vec<usize>]) -> Result<MemoryPlan, LowerError> {
    if sizes.len() != program.buffers.len() {
        return Err(LowerError::Malformed(format!(
            "{} buffer sizes for {} buffers",
            sizes.len(),
            program.buffers.len()
        )));
    }
    let intervals = lifetimes(program, groups)?;
    let naive_bytes = naive_temp_bytes(&sizes, &intervals)?;
    let (offsets, arena_bytes) = place(&sizes, &intervals);
    let stats = MemoryStats { arena_bytes, naive_bytes, peak_live_bytes: peak_live(&sizes, &intervals) };
    Ok(MemoryPlan { offsets, sizes, intervals, stats })
}

/// Every step in its own time slot, in program order: the groups of [`plan`].
pub fn in_order(program: &Program) -> Vec<Vec<usize>> {
    (0..program.steps.len()).map(|s| vec![s]).collect()
}

/// The size in bytes of every buffer under `bindings`: an error if an element count is negative
/// or overflows, or if a buffer would take more than `isize::MAX` bytes (no allocation can).
pub fn buffer_sizes(program: &Program, bindings: &Bindings) -> Result<Vec<usize>, LowerError> {
    air::work::add(program.buffers.len() as u64);
    program
        .buffers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let n = b.numel.eval(bindings)?;
            usize::try_from(n)
                .ok()
                .and_then(|n| n.checked_mul(b.dtype.size_bytes()))
                .filter(|&bytes| bytes <= isize::MAX as usize)
                .ok_or_else(|| {
                    LowerError::BadInputs(format!(
                        "buf{i}: {n} elements of {} (numel {}) do not fit in memory",
                        b.dtype, b.numel
                    ))
                })
        })
        .collect()
}

/// Bytes every temp would take with a buffer of its own (each aligned), or an error when that
/// total exceeds `isize::MAX`: the arena never needs more than this total, so checking it once
/// keeps every offset computed while placing from overflowing.
fn naive_temp_bytes(sizes: &[usize], intervals: &[Option<(usize, usize)>]) -> Result<usize, LowerError> {
    intervals
        .iter()
        .zip(sizes)
        .filter(|(i, _)| i.is_some())
        .try_fold(0usize, |total, (_, &s)| total.checked_add(align_up(s)))
        .filter(|&total| total <= isize::MAX as usize)
        .ok_or_else(|| LowerError::BadInputs("the temporaries' bytes together overflow the address space".into()))
}

/// The inclusive time-slot interval of every temp (`None` for inputs and outputs). A temp no
/// step touches lives in slot 0. The temps a skippable copy reads live until its product's slot
/// ([`Program::skippable_copies`]: a runtime may read them there instead of the copy's output).
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
        let kernel = program.step_kernel(s)?;
        air::work::add(1 + step.args.len() as u64);
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
    // A copy a runtime may skip, its product reading the copy's source in place: what the copy
    // reads lives until the product (`Program::skippable_copies`).
    for (i, j) in program.skippable_copies() {
        let kernel = program.step_kernel(i)?;
        for (p, &b) in kernel.params().iter().zip(&program.steps[i].args) {
            if p.access == Access::Read
                && let Some(Some((_, hi))) = out.get_mut(b.0 as usize)
            {
                *hi = (*hi).max(slot[j]);
            }
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
///
/// `sizes[i]` is buffer `i`'s size in bytes and `intervals[i]` its inclusive lifetime in time
/// slots (`None`: not placed, its offset is `None`). Buffers are taken largest first (ties: earlier
/// start slot first, then lower index), each at the lowest `ALIGN`-aligned offset whose bytes do
/// not overlap a placed, non-empty buffer whose lifetime intersects its own. The arena size is the
/// highest end offset, rounded up to `ALIGN`.
///
/// The placed buffers that intersect a lifetime are found through a segment tree over the
/// distinct slot endpoints, so a placement costs O((k + 1) log S) for k intersecting buffers and
/// S distinct endpoints, plus sorting those k: O(T log T) overall when each buffer overlaps few
/// others.
pub fn place(sizes: &[usize], intervals: &[Option<(usize, usize)>]) -> (Vec<Option<usize>>, usize) {
    let mut work = sizes.len();
    let placed = place_counted(sizes, intervals, &mut work);
    air::work::add(work as u64);
    placed
}

/// `place`, adding to `work` one unit per tree node visited and per candidate buffer examined.
fn place_counted(
    sizes: &[usize],
    intervals: &[Option<(usize, usize)>],
    work: &mut usize,
) -> (Vec<Option<usize>>, usize) {
    let mut order: Vec<usize> = (0..sizes.len()).filter(|&i| intervals[i].is_some()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), intervals[i].map(|(lo, _)| lo), i));
    let mut offsets: Vec<Option<usize>> = vec![None; sizes.len()];
    let mut index = IntervalIndex::new(intervals);
    let mut busy: Vec<(usize, usize)> = Vec::new();
    let mut found: Vec<usize> = Vec::new();
    let mut arena = 0;
    for i in order {
        let (lo, hi) = intervals[i].expect("filtered");
        let (lo, hi) = (index.coord(lo), index.coord(hi));
        found.clear();
        index.query(lo, hi, &mut found, work);
        busy.clear();
        busy.extend(found.iter().map(|&j| (offsets[j].expect("placed"), sizes[j])));
        busy.sort_unstable();
        let mut at = 0;
        for &(off, size) in &busy {
            if at + sizes[i] <= off {
                break;
            }
            at = at.max(align_up(off + size));
        }
        offsets[i] = Some(at);
        arena = arena.max(at + sizes[i]);
        // Empty buffers occupy no bytes, so they never constrain a later placement.
        if sizes[i] > 0 {
            index.insert(i, lo, hi);
        }
    }
    (offsets, align_up(arena))
}

/// The placed buffers, by lifetime: a segment tree over the distinct interval endpoints (time
/// slots, compressed to `0..n`). A buffer is stored in the O(log n) nodes that exactly cover its
/// compressed interval; `count` per node is how many are stored in its subtree, so that a query
/// skips empty subtrees.
struct IntervalIndex {
    /// The distinct endpoints of all intervals, sorted: compressed coordinate `c` is `coords[c]`.
    coords: Vec<usize>,
    /// Per node (heap order, root 1): the buffers stored exactly at this node.
    stored: Vec<Vec<usize>>,
    /// Per node: how many buffers are stored in its subtree, itself included.
    count: Vec<usize>,
    /// Per buffer: the query that last reported it (deduplicates across nodes).
    seen: Vec<usize>,
    /// The number of the current query, starting at 1.
    query_id: usize,
}

impl IntervalIndex {
    fn new(intervals: &[Option<(usize, usize)>]) -> Self {
        let mut coords: Vec<usize> = intervals.iter().flatten().flat_map(|&(lo, hi)| [lo, hi]).collect();
        coords.sort_unstable();
        coords.dedup();
        let nodes = 4 * coords.len().max(1);
        IntervalIndex {
            coords,
            stored: vec![Vec::new(); nodes],
            count: vec![0; nodes],
            seen: vec![0; intervals.len()],
            query_id: 0,
        }
    }

    /// The compressed coordinate of an interval endpoint. Since every endpoint is a coordinate,
    /// two intervals intersect exactly when their compressed intervals do.
    fn coord(&self, slot: usize) -> usize {
        self.coords.binary_search(&slot).expect("every endpoint is a coordinate")
    }

    /// Stores buffer `id` with the compressed interval `[lo, hi]`.
    fn insert(&mut self, id: usize, lo: usize, hi: usize) {
        self.insert_at(1, 0, self.coords.len() - 1, id, lo, hi);
    }

    fn insert_at(&mut self, node: usize, nl: usize, nr: usize, id: usize, lo: usize, hi: usize) {
        if hi < nl || nr < lo {
            return;
        }
        self.count[node] += 1;
        if lo <= nl && nr <= hi {
            self.stored[node].push(id);
            return;
        }
        let mid = nl + (nr - nl) / 2;
        self.insert_at(2 * node, nl, mid, id, lo, hi);
        self.insert_at(2 * node + 1, mid + 1, nr, id, lo, hi);
    }

    /// Appends to `out`, once each, the stored buffers whose interval intersects `[lo, hi]`.
    fn query(&mut self, lo: usize, hi: usize, out: &mut Vec<usize>, work: &mut usize) {
        self.query_id += 1;
        self.query_at(1, 0, self.coords.len() - 1, lo, hi, out, work);
    }

    /// A buffer stored at a node covers the node's whole range, so it intersects `[lo, hi]`
    /// whenever the node's range does; every buffer that intersects `[lo, hi]` covers some slot
    /// `t` in it, and is stored at an ancestor of `t`'s leaf, whose range contains `t`.
    #[allow(clippy::too_many_arguments)]
    fn query_at(
        &mut self,
        node: usize,
        nl: usize,
        nr: usize,
        lo: usize,
        hi: usize,
        out: &mut Vec<usize>,
        work: &mut usize,
    ) {
        if self.count[node] == 0 || hi < nl || nr < lo {
            return;
        }
        *work += 1;
        for &id in &self.stored[node] {
            *work += 1;
            if self.seen[id] != self.query_id {
                self.seen[id] = self.query_id;
                out.push(id);
            }
        }
        if nl < nr {
            let mid = nl + (nr - nl) / 2;
            self.query_at(2 * node, nl, mid, lo, hi, out, work);
            self.query_at(2 * node + 1, mid + 1, nr, lo, hi, out, work);
        }
    }
}

/// The most bytes alive in one time slot.
pub fn peak_live(sizes: &[usize], intervals: &[Option<(usize, usize)>]) -> usize {
    let end = intervals.iter().flatten().map(|&(_, hi)| hi + 1).max().unwrap_or(0);
    air::work::add((intervals.len() + end) as u64);
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Buffer sizes and lifetimes, as `place` takes them.
    type Buffers = (Vec<usize>, Vec<Option<(usize, usize)>>);

    #[test]
    fn what_a_skippable_copy_reads_lives_until_its_product() {
        use crate::kir::{IExpr, Kernel, LoopKernel, MatOperand, MatmulKernel, Param};
        use crate::program::{BufId, BufferInfo, Step};
        use air::{DType, Dim};
        let param = |access| Param { dtype: DType::F32, access };
        // Loop kernels with no body: only their parameters matter here.
        let loops = |n_params: usize| {
            let mut params = vec![param(Access::Write)];
            params.extend((1..n_params).map(|_| param(Access::Read)));
            Kernel::Loops(LoopKernel { params, n_syms: 0, body: Vec::new() })
        };
        let operand = |buf| MatOperand {
            buf,
            offset: IExpr::Const(0),
            batch_stride: IExpr::Const(0),
            row_stride: IExpr::Const(4),
            col_stride: IExpr::Const(1),
        };
        let product = Kernel::Matmul(MatmulKernel {
            params: vec![param(Access::Write), param(Access::Read), param(Access::Read)],
            n_syms: 0,
            dtype: DType::F32,
            batch: IExpr::Const(1),
            m: IExpr::Const(4),
            n: IExpr::Const(4),
            k: IExpr::Const(4),
            a: operand(1),
            b: operand(2),
            c: operand(0),
            accumulate: false,
        });
        let buffer = |kind| BufferInfo { dtype: DType::F32, numel: Dim::Const(16), kind };
        let step = |kernel, args: &[u32]| Step { kernel, args: args.iter().map(|&b| BufId(b)).collect() };
        // buf0 input; pad: buf1 = f(buf0); copy: buf2 = g(buf1); product: buf3 = buf0 @ buf2;
        // then buf4 = h(buf3), and the output buf5 = h(buf4).
        let mut program = Program {
            symbols: Vec::new(),
            kernels: vec![loops(2), product],
            steps: vec![step(0, &[1, 0]), step(0, &[2, 1]), step(1, &[3, 0, 2]), step(0, &[4, 3]), step(0, &[5, 4])],
            buffers: vec![
                buffer(BufferKind::Input(0)),
                buffer(BufferKind::Temp),
                buffer(BufferKind::Temp),
                buffer(BufferKind::Temp),
                buffer(BufferKind::Temp),
                buffer(BufferKind::Output(0)),
            ],
            outputs: Vec::new(),
            inits: Vec::new(),
            checks: Vec::new(),
            data_checks: Vec::new(),
        };
        let groups: Vec<Vec<usize>> = (0..5).map(|s| vec![s]).collect();
        assert_eq!(program.skippable_copies(), [(1, 2)]);
        let lives = lifetimes(&program, &groups).unwrap();
        // The pad's output, read by the copy at step 1, lives until the product at step 2.
        assert_eq!(lives[1..5], [Some((0, 2)), Some((1, 2)), Some((2, 3)), Some((3, 4))]);
        // A second reader of the copy's output: no skipping, and the pad's output dies at 1.
        program.steps[3] = step(0, &[4, 2]);
        assert!(program.skippable_copies().is_empty());
        assert_eq!(lifetimes(&program, &groups).unwrap()[1], Some((0, 1)));
        // The copy's output as the product's `a` instead: not a window's.
        program.steps[3] = step(0, &[4, 3]);
        program.steps[2] = step(1, &[3, 2, 0]);
        assert!(program.skippable_copies().is_empty());
    }

    /// The original O(T^2) placement, kept as the reference `place` must match exactly.
    fn place_reference(sizes: &[usize], intervals: &[Option<(usize, usize)>]) -> (Vec<Option<usize>>, usize) {
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

    /// A size drawn mostly from a few values (ties, zero, exact multiples of `ALIGN`), sometimes
    /// from a wide range.
    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![
            3 => prop::sample::select(vec![0usize, 1, 63, 64, 65, 128, 200, 256]),
            1 => 0usize..5000,
        ]
    }

    /// A lifetime, or `None` (an input or output), over a short or long span of slots.
    fn interval(slots: usize) -> impl Strategy<Value = Option<(usize, usize)>> {
        prop_oneof![
            1 => Just(None),
            6 => (0..slots, 0..slots).prop_map(|(a, b)| Some((a.min(b), a.max(b)))),
            3 => (0..slots, 0usize..3).prop_map(|(a, len)| Some((a, a + len))),
        ]
    }

    fn buffers() -> impl Strategy<Value = Buffers> {
        prop_oneof![Just(4usize), Just(16), Just(200), Just(1_000_000)]
            .prop_flat_map(|slots| prop::collection::vec((size(), interval(slots)), 0..120))
            .prop_map(|bufs| bufs.into_iter().unzip())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn place_matches_reference((sizes, intervals) in buffers()) {
            prop_assert_eq!(place(&sizes, &intervals), place_reference(&sizes, &intervals));
        }
    }

    #[test]
    fn place_matches_reference_on_edge_cases() {
        let cases: Vec<Buffers> = vec![
            (vec![], vec![]),
            (vec![10], vec![None]),
            (vec![0, 0, 0], vec![Some((0, 0)); 3]),
            (vec![64, 64, 64, 64], vec![Some((0, 5)); 4]),
            (vec![100, 0, 100, 50], vec![Some((0, 1)), Some((1, 1)), Some((1, 2)), Some((usize::MAX - 1, usize::MAX))]),
            (vec![7; 6], vec![Some((3, 3)), Some((0, 9)), None, Some((9, 9)), Some((0, 0)), Some((4, 8))]),
        ];
        for (sizes, intervals) in cases {
            assert_eq!(place(&sizes, &intervals), place_reference(&sizes, &intervals), "{sizes:?} {intervals:?}");
        }
    }

    /// `t` temps in a chain: temp `i` lives in slots `i..=i + 1`, overlapping only its neighbours.
    fn chained(t: usize) -> Buffers {
        let sizes = (0..t).map(|i| 64 + (i * 37) % 300).collect();
        let intervals = (0..t).map(|i| Some((i, i + 1))).collect();
        (sizes, intervals)
    }

    #[test]
    fn placement_work_is_near_linear_on_chains() {
        let work = |t: usize| {
            let (sizes, intervals) = chained(t);
            let mut work = 0;
            let got = place_counted(&sizes, &intervals, &mut work);
            assert_eq!(got, place_reference(&sizes, &intervals));
            work
        };
        let (small, big) = (work(1000), work(10_000));
        // Quadratic work would grow 100x; O(T log T) grows about 13x.
        assert!(big < 20 * small, "work grew from {small} (T = 1000) to {big} (T = 10000)");
    }
}

//! Running independent steps at the same time: which dependency levels of a program the VM runs
//! concurrently, and how their steps are spread over the threads.
//!
//! `lower::batch` gives the levels (steps of one level never depend on each other) and groups equal
//! matmuls of a level into one grouped GEMM. Per binding set the VM estimates each step's *work*
//! (loop kernels: elements visited; matmuls: multiply-adds / [`MACS_PER_WORK`], since a GEMM
//! does a multiply-add far faster than a loop kernel visits an element) and whether the step
//! splits itself over the threads. A level runs concurrently, each step on one thread, when
//!
//! - it has at least two steps and the machine more than one thread,
//! - its total work reaches [`LEVEL_PARALLEL_MIN_WORK`] (below that, waking the pool costs more
//!   than the level; small programs keep their exact old path), and
//! - the estimated time of the concurrent run (the fullest thread after a longest-first greedy
//!   split, plus one fork-join) is at most that of running the steps one after another, each
//!   split over the threads when it can be (its share plus one fork-join per split step).
//!
//! So N equal matmuls with N >= threads become one launch whose problems are split over the cores,
//! each GEMM single-threaded; two big matmuls on 16 cores stay one after another, each using every
//! core; one huge step next to a tiny one is not run concurrently (the huge one would lose its
//! threads).
//!
//! When a binding set has a concurrent level, the whole program runs level by level, and its
//! memory plan is `lower::memplan::plan_with_groups` with one time slot per concurrent level and
//! one per step elsewhere: buffers touched by steps that run together never share bytes.

/// Below this much work in a level (in loop elements, see the module docs), its steps run one
/// after another. Equal to the VM's threshold for splitting one loop kernel: both pay one wake-up
/// of the pool, a few microseconds (about what one core needs for 32k simple f32 elements).
pub const LEVEL_PARALLEL_MIN_WORK: u128 = crate::vm::PARALLEL_MIN_WORK;

/// Multiply-adds of a GEMM per unit of work: `gemm` sustains about 100 GFLOP/s (50 G multiply-adds
/// per second) on one core of the development machine, a compiled element-wise loop a few
/// elements per nanosecond; 16 is a round, conservative ratio.
pub const MACS_PER_WORK: u128 = 16;

/// The cost of one fork-join over the pool, in work units (a wake-up of the pool).
const FORK_JOIN_WORK: u128 = crate::vm::PARALLEL_MIN_WORK;

/// What the VM knows of one step for one binding set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepCost {
    /// Estimated work (see the module docs).
    pub work: u128,
    /// Whether the step, run alone, splits itself over the threads.
    pub splits: bool,
}

/// One part of a level-by-level run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Step `s`, alone, as in an in-order run.
    Step(u32),
    /// Steps that run at the same time: `bins[t]` runs on thread `t`, in order, each step on one
    /// thread.
    Concurrent { bins: Vec<Vec<u32>> },
}

/// How a program runs for one binding set when some level is concurrent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelSchedule {
    pub phases: Vec<Phase>,
    /// The time slots for the memory planner, in run order.
    pub slots: Vec<Vec<usize>>,
    /// How many levels run concurrently.
    pub concurrent_levels: usize,
}

/// Splits `steps` over `threads` bins, longest first, each to the least loaded bin (ties: the
/// lowest bin, so the split is deterministic). Returns the bins and the fullest bin's work.
pub fn split(steps: &[usize], costs: &[StepCost], threads: usize) -> (Vec<Vec<u32>>, u128) {
    let mut order: Vec<usize> = steps.to_vec();
    order.sort_by_key(|&s| (std::cmp::Reverse(costs[s].work), s));
    let bins_n = threads.clamp(1, steps.len().max(1));
    let mut bins: Vec<Vec<u32>> = vec![Vec::new(); bins_n];
    let mut load = vec![0u128; bins_n];
    for s in order {
        let t = (0..bins_n).min_by_key(|&t| (load[t], t)).unwrap_or(0);
        bins[t].push(s as u32);
        load[t] += costs[s].work;
    }
    (bins, load.into_iter().max().unwrap_or(0))
}

/// Whether a level of `steps` runs concurrently (see the module docs), and its bins if so.
pub fn decide_level(steps: &[usize], costs: &[StepCost], threads: usize, min_work: u128) -> Option<Vec<Vec<u32>>> {
    if steps.len() < 2 || threads < 2 {
        return None;
    }
    let total: u128 = steps.iter().map(|&s| costs[s].work).sum();
    if total < min_work {
        return None;
    }
    let t = threads as u128;
    let one_by_one: u128 =
        steps.iter().map(|&s| if costs[s].splits { costs[s].work / t + FORK_JOIN_WORK } else { costs[s].work }).sum();
    let (bins, fullest) = split(steps, costs, threads);
    (fullest + FORK_JOIN_WORK <= one_by_one).then_some(bins)
}

/// The level-by-level schedule of a program, or `None` when no level is worth running
/// concurrently (the VM then runs the steps in program order, exactly as without levels).
pub fn schedule(levels: &[Vec<usize>], costs: &[StepCost], threads: usize, min_work: u128) -> Option<LevelSchedule> {
    let mut phases = Vec::new();
    let mut slots = Vec::new();
    let mut concurrent_levels = 0;
    for level in levels {
        match decide_level(level, costs, threads, min_work) {
            Some(bins) => {
                concurrent_levels += 1;
                slots.push(level.clone());
                phases.push(Phase::Concurrent { bins });
            }
            None => {
                for &s in level {
                    slots.push(vec![s]);
                    phases.push(Phase::Step(s as u32));
                }
            }
        }
    }
    (concurrent_levels > 0).then_some(LevelSchedule { phases, slots, concurrent_levels })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(works: &[(u128, bool)]) -> Vec<StepCost> {
        works.iter().map(|&(work, splits)| StepCost { work, splits }).collect()
    }

    #[test]
    fn equal_big_steps_split_evenly() {
        let c = costs(&[(1 << 20, true); 32]);
        let steps: Vec<usize> = (0..32).collect();
        let bins = decide_level(&steps, &c, 2, LEVEL_PARALLEL_MIN_WORK).unwrap();
        assert_eq!(bins.len(), 2);
        assert_eq!(bins[0].len(), 16);
        assert_eq!(bins[1].len(), 16);
    }

    #[test]
    fn small_levels_and_lopsided_levels_stay_in_order() {
        let steps: Vec<usize> = (0..8).collect();
        assert_eq!(decide_level(&steps, &costs(&[(100, false); 8]), 2, LEVEL_PARALLEL_MIN_WORK), None);
        let lopsided = costs(&[(1 << 30, true), (10, false)]);
        assert_eq!(decide_level(&[0, 1], &lopsided, 2, LEVEL_PARALLEL_MIN_WORK), None);
        // Two big steps on 16 threads: each keeps all the threads.
        let two = costs(&[(1 << 30, true), (1 << 30, true)]);
        assert_eq!(decide_level(&[0, 1], &two, 16, LEVEL_PARALLEL_MIN_WORK), None);
        // Steps that cannot split themselves gain from running together.
        let serial = costs(&[(1 << 20, false), (1 << 20, false)]);
        assert!(decide_level(&[0, 1], &serial, 2, LEVEL_PARALLEL_MIN_WORK).is_some());
        assert_eq!(decide_level(&[0, 1], &serial, 1, LEVEL_PARALLEL_MIN_WORK), None);
    }

    #[test]
    fn schedule_slots_cover_every_step_once() {
        let c = costs(&[(1 << 20, false), (1 << 20, false), (5, false), (1 << 20, false)]);
        let levels = vec![vec![0, 1], vec![2], vec![3]];
        let s = schedule(&levels, &c, 2, LEVEL_PARALLEL_MIN_WORK).unwrap();
        assert_eq!(s.concurrent_levels, 1);
        assert_eq!(s.slots, vec![vec![0, 1], vec![2], vec![3]]);
        assert_eq!(s.phases[0], Phase::Concurrent { bins: vec![vec![0], vec![1]] });
        assert_eq!(s.phases[1..], [Phase::Step(2), Phase::Step(3)]);
        assert_eq!(schedule(&levels[1..], &c, 2, LEVEL_PARALLEL_MIN_WORK), None);
    }
}

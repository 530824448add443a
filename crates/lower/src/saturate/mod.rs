//! Equality saturation with `egg`: the rewrites a greedy rewriter cannot find (those that make the
//! graph bigger first, that need a choice among alternatives by cost, or that span several
//! roots), within a compile budget.
//!
//! [`saturate`] converts a graph into an e-graph ([`lang`]: air's ops plus a composite `MatMul`
//! recognised from the canonical expand-multiply-sum pattern), runs the rewrites of [`rules`]
//! (the greedy table translated, plus matmul reassociation, scales and transposes through
//! matmuls, and the multi-root merge of matmuls sharing an input) under egg's
//! `BackoffScheduler` with node, iteration and time limits, extracts the cheapest program by the
//! cost model of [`cost`], and replaces the graph with it only when it is cheaper than the graph
//! as given. A graph without a matmul is left alone without building an e-graph.
//!
//! A graph whose regions repeat (the layers of a Transformer) is cut into regions at its
//! narrowest points between matmuls, and each distinct region is saturated once, its result
//! reused for every identical region ([`blocks`]), so the cost is flat in depth.
//!
//! Inputs (unused ones included) keep their slots and types, outputs their order and types.
//! `KILN_SATURATE_DEBUG=1` prints each egg iteration (e-nodes, search/apply/rebuild times, rules
//! applied) and each distinct region's result to stderr.

pub mod blocks;
pub mod cost;
pub mod lang;
pub mod rules;

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use air::{Graph, NodeId};
use egg::{BackoffScheduler, Rewrite, Runner, StopReason};
use rustc_hash::FxHashMap as HashMap;

use lang::{ANode, Types};

/// The budget and rule set of a saturation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SaturateOptions {
    /// Also the rules that change float rounding (matmul reassociation and scaling of floats, and
    /// the table's inexact rules).
    pub fast_math: bool,
    /// Stop when the e-graph has this many e-nodes.
    pub node_limit: usize,
    /// Stop after this many iterations.
    pub iter_limit: usize,
    /// Stop after this long.
    pub time_limit: Duration,
}

impl Default for SaturateOptions {
    fn default() -> SaturateOptions {
        SaturateOptions { fast_math: false, node_limit: 20_000, iter_limit: 8, time_limit: Duration::from_millis(50) }
    }
}

/// What a saturation did (the profiler's `saturate` row).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SaturateStats {
    /// Matmuls recognised in the graph.
    pub matmuls: usize,
    /// Iterations egg ran.
    pub iterations: usize,
    /// E-nodes at the end.
    pub enodes: usize,
    /// E-classes at the end.
    pub eclasses: usize,
    /// Why it stopped: `saturated`, `iter-limit`, `node-limit`, `time-limit`, or `no-matmul`
    /// when there was nothing to saturate.
    pub stop: String,
    /// Modelled cost (ns) of the graph as given, and of the extracted program.
    pub cost_before: f64,
    /// Modelled cost (ns) of the program kept.
    pub cost_after: f64,
    /// Whether the graph was replaced.
    pub changed: bool,
    /// Regions saturated separately (1: the whole graph; see [`blocks`]).
    pub regions: usize,
    /// Distinct regions among them, each saturated once.
    pub distinct: usize,
}

impl SaturateStats {
    /// Adds the counters of one saturation of a distinct region.
    fn absorb(&mut self, s: &SaturateStats) {
        self.iterations += s.iterations;
        self.enodes += s.enodes;
        self.eclasses += s.eclasses;
        self.distinct += 1;
        // A limit outranks `saturated`, which outranks `no-matmul`.
        let rank = |stop: &str| match stop {
            "no-matmul" => 0,
            "saturated" => 1,
            _ => 2,
        };
        if rank(&s.stop) > rank(&self.stop) {
            self.stop = s.stop.clone();
        }
    }
}

impl fmt::Display for SaturateStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "regions {} ({} distinct) iterations {} e-nodes {} e-classes {} stop {} matmuls {} cost {:.0} -> {:.0} ns{}",
            self.regions,
            self.distinct,
            self.iterations,
            self.enodes,
            self.eclasses,
            self.stop,
            self.matmuls,
            self.cost_before,
            self.cost_after,
            if self.changed { "" } else { " (unchanged)" }
        )
    }
}

fn rewrites(fast_math: bool) -> &'static [Rewrite<ANode, Types>] {
    static EXACT: OnceLock<Vec<Rewrite<ANode, Types>>> = OnceLock::new();
    static FAST: OnceLock<Vec<Rewrite<ANode, Types>>> = OnceLock::new();
    let cell = if fast_math { &FAST } else { &EXACT };
    cell.get_or_init(|| rules::rewrites(fast_math))
}

/// Saturates `graph` and replaces it with the cheapest equivalent program found, if that is
/// cheaper by the cost model (see the module docs). A graph whose regions repeat (the layers of
/// a Transformer) is saturated per distinct region, each once ([`blocks`]); any other as a whole.
///
/// `graph` is expected at the greedy rewriter's fixpoint, as `compile` gives it
/// (`rewrite::optimize` first): the table rules only search where the e-graph changed
/// ([`lang::ClassData::fresh`]), so a table rewrite the greedy pass left undone on the graph as
/// given is left undone here too (the greedy pass after saturation still makes it).
pub fn saturate(graph: &mut Graph, options: &SaturateOptions) -> SaturateStats {
    let regions = blocks::regions(graph);
    if regions.len() < 2 {
        return saturate_whole(graph, options);
    }
    let blocks = blocks::blocks(graph, &regions);
    let (reps, repeats) = blocks::representatives(graph, &blocks);
    if !repeats {
        return saturate_whole(graph, options);
    }
    let debug = std::env::var_os("KILN_SATURATE_DEBUG").is_some();
    let mut stats = SaturateStats { stop: "no-matmul".into(), regions: blocks.len(), ..SaturateStats::default() };
    // Per block that is the first of its structure: the saturated graph if it changed, and the
    // counters of its saturation.
    let mut done: Vec<Option<(Option<Graph>, SaturateStats)>> = vec![None; blocks.len()];
    let mut replaced: HashMap<NodeId, NodeId> = HashMap::default();
    for (i, block) in blocks.into_iter().enumerate() {
        let rep = reps[i];
        if rep == i {
            let mut g = block.graph(graph);
            let nodes = g.len();
            let s = saturate_whole(&mut g, options);
            if debug {
                eprintln!("saturate: region of {nodes} nodes: {s}");
            }
            stats.absorb(&s);
            done[i] = Some((s.changed.then_some(g), s));
        }
        let (result, s) = done[rep].as_ref().expect("a block's first of its structure comes before it");
        stats.matmuls += s.matmuls;
        stats.cost_before += s.cost_before;
        stats.cost_after += s.cost_after;
        if let Some(result) = result {
            let boundary: Vec<NodeId> = block.boundary.iter().map(|b| *replaced.get(b).unwrap_or(b)).collect();
            let outputs = blocks::instantiate(graph, result, &boundary);
            for (&old, &new) in block.outputs.iter().zip(&outputs) {
                graph.replace_all_uses_unchecked(old, new);
                replaced.insert(old, new);
            }
            stats.changed = true;
        }
    }
    if stats.changed {
        graph.remove_dead();
    }
    stats
}

/// Saturates `graph` as one region.
fn saturate_whole(graph: &mut Graph, options: &SaturateOptions) -> SaturateStats {
    let mut stats = SaturateStats { stop: "no-matmul".into(), regions: 1, distinct: 1, ..SaturateStats::default() };
    let Some((egraph, conv)) = lang::to_egraph(graph) else { return stats };
    stats.matmuls = conv.matmuls;
    if conv.matmuls == 0 {
        return stats;
    }
    let Some(before) = cost::baseline(&egraph, &conv.roots) else { return stats };
    stats.cost_before = before;
    stats.cost_after = before;
    let runner: Runner<ANode, Types> = Runner::new(Types::default())
        .with_egraph(egraph)
        .with_node_limit(options.node_limit)
        .with_iter_limit(options.iter_limit)
        .with_time_limit(options.time_limit)
        .with_scheduler(BackoffScheduler::default())
        .with_hook(|runner| {
            lang::index_fresh(&mut runner.egraph);
            Ok(())
        })
        .run(rewrites(options.fast_math));
    let eg = &runner.egraph;
    air::work::add(eg.total_number_of_nodes() as u64);
    stats.iterations = runner.iterations.len();
    stats.enodes = eg.total_number_of_nodes();
    stats.eclasses = eg.number_of_classes();
    stats.stop = match &runner.stop_reason {
        Some(StopReason::Saturated) => "saturated".into(),
        Some(StopReason::IterationLimit(_)) => "iter-limit".into(),
        Some(StopReason::NodeLimit(_)) => "node-limit".into(),
        Some(StopReason::TimeLimit(_)) => "time-limit".into(),
        Some(StopReason::Other(s)) => s.clone(),
        None => "none".into(),
    };
    if std::env::var_os("KILN_SATURATE_DEBUG").is_some() {
        for it in &runner.iterations {
            eprintln!(
                "saturate: nodes {} search {:.2} ms apply {:.2} ms rebuild {:.2} ms applied {:?}",
                it.egraph_nodes,
                it.search_time * 1e3,
                it.apply_time * 1e3,
                it.rebuild_time * 1e3,
                it.applied
            );
        }
    }
    if let Some((after, choice)) = cost::extract(eg, &conv.roots, before)
        && let Some(g) = lang::to_graph(eg, &choice, &conv)
    {
        *graph = g;
        stats.cost_after = after;
        stats.changed = true;
    }
    stats
}

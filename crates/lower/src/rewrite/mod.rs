//! Graph rewriting: rules as data, applied to a fixpoint by a worklist, plus common-subexpression
//! elimination and dead-node elimination. [`optimize`] runs all three.
//!
//! A rule is a row of a table ([`rules::RULES`]): a kebab-case name, a pattern in a small
//! s-expression language, a replacement (a template, or a named Rust function for the few rules
//! that compute attributes or values), an optional named guard, and whether it is exact:
//!
//! ```text
//! exact("mul-one", "(mul ?x (const 1))", "?x")
//! exact("reshape-reshape", "(reshape (reshape ?x))", "(root ?x)")
//! computed("permute-permute", "(permute (permute ?x))", COMPOSE_PERMUTE)
//! ```
//!
//! Why a worklist: every live node is visited once in topological order; a rewrite then queues
//! only what it may have enabled (new nodes and the readers of the replaced node). Rules are
//! indexed by the op at their root. So a sweep costs O(N) node visits, and never a scan of the
//! graph per rewrite; [`RewriteStats`] counts visits and attempts so that tests and the profiler
//! can check that.
//!
//! Invariant kept by every pass here: a node is only ever replaced by one of exactly its type, so
//! the graph's outputs keep their types, and the graph stays acyclic (replacements are built from
//! the matched node's inputs, which precede it).

mod engine;
pub mod pattern;
pub mod rules;

use std::collections::BTreeMap;
use std::fmt;

use air::Graph;

pub(crate) use engine::instantiate;
pub use engine::{Cse, RuleSet, apply_rules};
pub use pattern::Match;
pub use rules::{Builder, Compute, Guard, RULES, Rhs, Rule};

/// Rounds of CSE plus rules that `optimize` runs at most (it stops at the first round whose rules
/// rewrite nothing; real graphs settle in one to three).
pub const MAX_ROUNDS: u32 = 8;

/// Counts of the work the rewriter did. Counts, not times: tests assert on them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RewriteStats {
    /// Nodes taken off the worklist and tried against rules.
    pub visits: u64,
    /// Pattern matches attempted (one per rule tried at a visited node).
    pub attempts: u64,
    /// Rewrites made.
    pub rewrites: u64,
    /// Pattern matches attempted by each rule that was tried at least once.
    pub attempts_by_rule: BTreeMap<&'static str, u64>,
    /// Rewrites made by each rule that fired at least once.
    pub rewrites_by_rule: BTreeMap<&'static str, u64>,
    /// Nodes merged into an equal earlier node by CSE.
    pub cse_merged: u64,
    /// Nodes removed because no output needs them.
    pub dead_removed: u64,
    /// Rounds of CSE plus rules that `optimize` ran.
    pub rounds: u32,
    /// Replacements refused because their type differed from the node's (a bug in a rule).
    pub rejected: u64,
    /// Whether a rule pass stopped at its rewrite budget before reaching a fixpoint.
    pub budget_exhausted: bool,
}

impl fmt::Display for RewriteStats {
    /// One line of totals, then one line per rule that fired: `mul-one 3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rounds {} visits {} attempts {} rewrites {} cse {} dead {}",
            self.rounds, self.visits, self.attempts, self.rewrites, self.cse_merged, self.dead_removed
        )?;
        for (name, n) in &self.rewrites_by_rule {
            writeln!(f, "{name} {n}")?;
        }
        Ok(())
    }
}

/// Optimizes `graph` in place with the exact rules: dead-node elimination, then rounds of CSE and
/// rules to a fixpoint (at most [`MAX_ROUNDS`]), removing dead nodes after each. Values, outputs
/// and output types are unchanged.
pub fn optimize(graph: &mut Graph) -> RewriteStats {
    optimize_with(graph, RuleSet::exact())
}

/// [`optimize`] with a chosen rule set (for example [`RuleSet::fast_math`], or one rule alone).
pub fn optimize_with(graph: &mut Graph, rules: &RuleSet) -> RewriteStats {
    let mut stats = RewriteStats { dead_removed: graph.remove_dead() as u64, ..RewriteStats::default() };
    // The first round looks at every live node; each later one only at what the round before
    // changed: the CSE table is kept, rules start from the readers of the nodes CSE merged, and
    // CSE from the nodes the rules created or rewired. Rules leave no match behind them (their
    // worklist revisits whatever a rewrite may enable), so a round whose rules rewrite nothing
    // ends the fixpoint.
    let mut rule_start = graph.live_order();
    let mut cse_from = rule_start.clone();
    let (mut cse, mut merged_readers) = (Cse::default(), Vec::new());
    while stats.rounds < MAX_ROUNDS {
        stats.rounds += 1;
        let merged = cse.run(graph, cse_from.drain(..), &mut merged_readers);
        stats.cse_merged += merged;
        if stats.rounds > 1 {
            for readers in merged_readers.drain(..) {
                rules.revisit(graph, readers, |r| rule_start.push(r));
            }
        }
        merged_readers.clear();
        let rewrites = apply_rules(graph, rules, rule_start.drain(..), &mut stats, &mut cse_from);
        stats.dead_removed += graph.remove_dead() as u64;
        if rewrites == 0 || stats.budget_exhausted {
            break;
        }
    }
    stats
}

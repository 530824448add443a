//! The engine: a compiled rule set indexed by root op, the worklist that applies it to a fixpoint,
//! and common-subexpression elimination.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use rustc_hash::FxHashMap as HashMap;

use air::graph::Inputs;
use air::op::Const;
use air::{Graph, NodeId, Op, OpKind, TensorType};
use slotmap::SecondaryMap;
use smallvec::SmallVec;

use super::RewriteStats;
use super::pattern::{Match, Pat, Template, match_at, parse_pattern, parse_template};
use super::rules::{Builder, Compute, RULES, Rhs, Rule};

/// A rule with its pattern and template parsed.
struct Compiled {
    rule: &'static Rule,
    names: Vec<&'static str>,
    lhs: Pat,
    rhs: CompiledRhs,
}

enum CompiledRhs {
    Template(Template),
    Compute(Compute),
}

/// A set of rules ready to run: parsed, and indexed by the kind of the op at their root, so
/// that a node is only tried against the rules that can match it.
pub struct RuleSet {
    rules: Vec<Compiled>,
    by_head: HashMap<OpKind, Vec<usize>>,
    /// The deepest pattern, in op levels (see `Pat::depth`).
    depth: usize,
}

impl RuleSet {
    /// Parses and indexes `rules`; an error names the rule whose text is wrong.
    pub fn new(rules: impl IntoIterator<Item = &'static Rule>) -> Result<RuleSet, String> {
        let mut set = RuleSet { rules: Vec::new(), by_head: HashMap::default(), depth: 1 };
        for rule in rules {
            set.push(rule)?;
        }
        Ok(set)
    }

    fn push(&mut self, rule: &'static Rule) -> Result<(), String> {
        let fail = |e: String| format!("rule `{}`: {e}", rule.name);
        if self.rules.iter().any(|c| c.rule.name == rule.name) {
            return Err(fail("duplicate name".into()));
        }
        let mut names = Vec::new();
        let lhs = parse_pattern(rule.lhs, &mut names).map_err(fail)?;
        let Pat::Op { head, .. } = &lhs else {
            return Err(fail("the pattern's root must be an op".into()));
        };
        let rhs = match rule.rhs {
            Rhs::Template(t) => CompiledRhs::Template(parse_template(t, &names).map_err(fail)?),
            Rhs::Compute(c) => CompiledRhs::Compute(c),
        };
        let index = self.rules.len();
        for k in head.kinds() {
            self.by_head.entry(k).or_default().push(index);
        }
        self.depth = self.depth.max(lhs.depth());
        self.rules.push(Compiled { rule, names, lhs, rhs });
        Ok(())
    }

    /// The exact rules (every rule with `exact: true`), which `optimize` uses.
    pub fn exact() -> &'static RuleSet {
        static SET: OnceLock<RuleSet> = OnceLock::new();
        SET.get_or_init(|| RuleSet::new(RULES.iter().filter(|r| r.exact)).expect("the rule table parses"))
    }

    /// Every rule, including those that change results by rounding or on special values.
    pub fn fast_math() -> &'static RuleSet {
        static SET: OnceLock<RuleSet> = OnceLock::new();
        SET.get_or_init(|| RuleSet::new(RULES.iter()).expect("the rule table parses"))
    }

    /// The rules with these names (for tests that exercise one rule alone).
    pub fn only(names: &[&str]) -> Result<RuleSet, String> {
        for n in names {
            if !RULES.iter().any(|r| r.name == *n) {
                return Err(format!("no rule named `{n}`"));
            }
        }
        RuleSet::new(RULES.iter().filter(|r| names.contains(&r.name)))
    }

    /// The rules of this set, in the order they are tried.
    pub fn rules(&self) -> impl Iterator<Item = &'static Rule> + '_ {
        self.rules.iter().map(|c| c.rule)
    }
}

/// Builds a template's nodes; `None` if a node does not type-check.
pub(crate) fn instantiate(b: &mut Builder<'_>, t: &Template, root: NodeId, m: &Match<'_>) -> Option<NodeId> {
    match t {
        Template::Capture(v) => m.var(*v),
        Template::Const(lit) => {
            let ty: TensorType = b.graph().ty(root).clone();
            b.add_leaf(Op::Const(Const { value: lit.to_scalar(ty.dtype) }), ty)
        }
        Template::Root(args) => {
            let ids = args.iter().map(|a| instantiate(b, a, root, m)).collect::<Option<SmallVec<[NodeId; 3]>>>()?;
            let op = b.graph().op(root).clone();
            b.add(op, &ids)
        }
        Template::Op(op, args) => {
            let ids = args.iter().map(|a| instantiate(b, a, root, m)).collect::<Option<SmallVec<[NodeId; 3]>>>()?;
            b.add(op.clone(), &ids)
        }
    }
}

/// FIFO of nodes to visit, each at most once in the queue.
struct Worklist {
    queue: VecDeque<NodeId>,
    queued: SecondaryMap<NodeId, ()>,
}

impl Worklist {
    fn push(&mut self, id: NodeId) {
        if self.queued.insert(id, ()).is_none() {
            self.queue.push_back(id);
        }
    }

    fn pop(&mut self) -> Option<NodeId> {
        let id = self.queue.pop_front()?;
        self.queued.remove(id);
        Some(id)
    }
}

/// Applies `rules` until none matches, visiting each live node once in topological order and then
/// only what a rewrite may have enabled: the nodes it created and the readers of the node it
/// replaced (and their readers, as deep as the deepest pattern needs). Each visit tries only the
/// rules filed under the node's op, so a sweep is O(N). Returns how many rewrites were made; the
/// replaced nodes stay in the graph without users until `Graph::remove_dead`.
///
/// Every replacement must have the type of the node it replaces; one that does not is refused and
/// counted in `stats.rejected` (a bug in a rule). The total number of rewrites is bounded by
/// `8 * N + 64`; reaching it sets `stats.budget_exhausted`.
pub fn apply_rules(g: &mut Graph, rules: &RuleSet, stats: &mut RewriteStats) -> u64 {
    let order = g.live_order();
    let budget = 8 * order.len() as u64 + 64;
    let mut work = Worklist { queue: VecDeque::with_capacity(order.len()), queued: SecondaryMap::new() };
    for id in order {
        work.push(id);
    }
    let mut output_slots: SecondaryMap<NodeId, usize> = SecondaryMap::new();
    for &o in g.outputs() {
        *output_slots.entry(o).expect("outputs are live").or_insert(0) += 1;
    }
    let mut attempts = vec![0u64; rules.rules.len()];
    let mut fired = vec![0u64; rules.rules.len()];
    let mut total = 0u64;

    while let Some(id) = work.pop() {
        air::work::tick();
        if !g.contains(id) || (g.users(id).is_empty() && !output_slots.contains_key(id)) {
            continue;
        }
        stats.visits += 1;
        let Some(candidates) = rules.by_head.get(&g.op(id).kind()) else { continue };
        for &ri in candidates {
            air::work::tick();
            attempts[ri] += 1;
            let c = &rules.rules[ri];
            let mut m = Match::new(&c.names);
            if !match_at(g, &c.lhs, id, &mut m) || c.rule.guard.is_some_and(|guard| !(guard.f)(g, id, &m)) {
                continue;
            }
            let mut b = Builder::new(g);
            let replacement = match &c.rhs {
                CompiledRhs::Template(t) => instantiate(&mut b, t, id, &m),
                CompiledRhs::Compute(f) => (f.f)(&mut b, id, &m),
            };
            let created = std::mem::take(&mut b.created);
            let Some(new) = replacement else { continue };
            if new == id {
                continue;
            }
            if g.ty(new) != g.ty(id) {
                stats.rejected += 1;
                continue;
            }
            let readers: SmallVec<[NodeId; 8]> = g.users(id).into();
            g.replace_all_uses_unchecked(id, new);
            if let Some(slots) = output_slots.remove(id) {
                *output_slots.entry(new).expect("replacement is live").or_insert(0) += slots;
            }
            fired[ri] += 1;
            total += 1;
            for n in created {
                work.push(n);
            }
            // A pattern of depth d sees d - 1 levels below its root: revisit that many levels of
            // readers above the replaced node.
            let mut frontier = readers;
            for level in 1..rules.depth {
                air::work::add(frontier.len() as u64);
                for &r in &frontier {
                    work.push(r);
                }
                if level + 1 < rules.depth {
                    frontier = frontier.iter().flat_map(|&r| g.users(r).iter().copied()).collect();
                }
            }
            break;
        }
        if total >= budget {
            stats.budget_exhausted = true;
            break;
        }
    }

    for (ri, c) in rules.rules.iter().enumerate() {
        if attempts[ri] > 0 {
            stats.attempts += attempts[ri];
            *stats.attempts_by_rule.entry(c.rule.name).or_insert(0) += attempts[ri];
        }
        if fired[ri] > 0 {
            *stats.rewrites_by_rule.entry(c.rule.name).or_insert(0) += fired[ri];
        }
    }
    stats.rewrites += total;
    total
}

/// Common-subexpression elimination by hash-consing: one pass in topological order over the live
/// nodes, keyed by (op, inputs, type) with the inputs of commutative ops sorted, so O(N). Each
/// node equal to an earlier one has its readers (and output slots) moved to the earlier one.
/// Returns how many nodes were merged; they stay in the graph without users until
/// `Graph::remove_dead`. The table holds each key's hash and the nodes with it, compared in the
/// graph on a hit: no op or type is cloned.
pub fn cse(g: &mut Graph) -> u64 {
    let order = g.live_order();
    let mut table: HashMap<u64, SmallVec<[NodeId; 1]>> =
        HashMap::with_capacity_and_hasher(order.len(), Default::default());
    let mut merged = 0;
    for id in order {
        air::work::tick();
        let node = g.node(id);
        let inputs = cse_inputs(&node.op, &node.inputs);
        let hash = {
            let mut h = rustc_hash::FxHasher::default();
            (&node.op, &inputs, &node.ty).hash(&mut h);
            h.finish()
        };
        let same = table.entry(hash).or_default();
        let earlier = same.iter().copied().find(|&e| {
            let other = g.node(e);
            other.op == node.op && other.ty == node.ty && cse_inputs(&other.op, &other.inputs) == inputs
        });
        match earlier {
            Some(e) => {
                g.replace_all_uses_unchecked(id, e);
                merged += 1;
            }
            None => same.push(id),
        }
    }
    merged
}

/// A node's inputs as CSE compares them: a commutative op's two sorted.
fn cse_inputs(op: &Op, inputs: &Inputs) -> Inputs {
    let mut inputs = inputs.clone();
    if let Op::Binary(b) = op
        && b.is_commutative()
        && inputs[1] < inputs[0]
    {
        inputs.swap(0, 1);
    }
    inputs
}

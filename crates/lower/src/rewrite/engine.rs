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
    /// An empty worklist with room for every node of `g`.
    fn for_graph(g: &Graph) -> Worklist {
        Worklist { queue: VecDeque::with_capacity(g.len()), queued: SecondaryMap::with_capacity(g.len()) }
    }

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

/// Applies `rules` until none matches, starting from the nodes of `start` (in order; the first
/// round passes every live node in topological order) and then visiting only what a rewrite may
/// have enabled: the nodes it created and the readers of the node it replaced (and their readers,
/// as deep as the deepest pattern needs, [`RuleSet::revisit`]). Each visit tries only the rules
/// filed under the node's op, so a sweep is O(N). Returns how many rewrites were made, and
/// pushes onto `changed` the nodes whose key CSE must look at again (the nodes created, and the
/// readers of the nodes replaced, whose inputs changed); the replaced nodes stay in the graph
/// without users until `Graph::remove_dead`.
///
/// Every replacement must have the type of the node it replaces; one that does not is refused and
/// counted in `stats.rejected` (a bug in a rule). The total number of rewrites is bounded by
/// `8 * N + 64`; reaching it sets `stats.budget_exhausted`.
pub fn apply_rules(
    g: &mut Graph,
    rules: &RuleSet,
    start: impl IntoIterator<Item = NodeId>,
    stats: &mut RewriteStats,
    changed: &mut Vec<NodeId>,
) -> u64 {
    let budget = 8 * g.len() as u64 + 64;
    let mut work = Worklist::for_graph(g);
    for id in start {
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
            changed.extend(created.iter().copied());
            changed.extend(readers.iter().copied());
            for n in created {
                work.push(n);
            }
            rules.revisit(g, readers, |r| work.push(r));
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

impl RuleSet {
    /// Calls `push` with the nodes a pattern may now match at, after the nodes that `readers` read
    /// were replaced: a pattern of depth d sees d - 1 levels below its root, so that many levels
    /// of readers.
    pub(crate) fn revisit(&self, g: &Graph, readers: SmallVec<[NodeId; 8]>, mut push: impl FnMut(NodeId)) {
        let mut frontier = readers;
        for level in 1..self.depth {
            air::work::add(frontier.len() as u64);
            for &r in &frontier {
                push(r);
            }
            if level + 1 < self.depth {
                frontier = frontier.iter().flat_map(|&r| g.users(r).iter().copied()).collect();
            }
        }
    }
}

/// Common-subexpression elimination by hash-consing, keyed by (op, inputs, type) with the inputs
/// of commutative ops sorted. The table lives across the rounds of `optimize`: the first round
/// passes every live node in topological order (O(N)); later rounds pass only the nodes whose key
/// the rules changed, and look them up among all the others. The table holds each key's hash and
/// the nodes with it, compared in the graph on a hit: no op or type is cloned, and an entry whose
/// node has changed since (or is gone) simply fails the comparison.
#[derive(Default)]
pub struct Cse {
    table: HashMap<u64, SmallVec<[NodeId; 1]>>,
    /// Nodes merged into another: never a merge target again.
    merged: SecondaryMap<NodeId, ()>,
}

impl Cse {
    /// Merges each node of `nodes` (in order) into an equal node seen before, and the readers
    /// of a merged node in turn (their inputs changed). A merged node's readers and output slots
    /// move to the node it equals; it stays in the graph without users until
    /// `Graph::remove_dead`. Returns how many nodes were merged, and pushes the readers of each
    /// onto `readers` (where rules may now match).
    pub fn run(
        &mut self,
        g: &mut Graph,
        nodes: impl IntoIterator<Item = NodeId>,
        readers: &mut Vec<SmallVec<[NodeId; 8]>>,
    ) -> u64 {
        let mut work = Worklist::for_graph(g);
        for id in nodes {
            work.push(id);
        }
        self.table.reserve(work.queue.len());
        let mut merged = 0;
        while let Some(id) = work.pop() {
            air::work::tick();
            if !g.contains(id) || self.merged.contains_key(id) {
                continue;
            }
            let node = g.node(id);
            let inputs = cse_inputs(&node.op, &node.inputs);
            // An op and its inputs fix the type (inference is a function of them), so only a
            // leaf hashes its type; a hit compares it either way.
            let hash = {
                let mut h = rustc_hash::FxHasher::default();
                (&node.op, &inputs).hash(&mut h);
                if inputs.is_empty() {
                    node.ty.hash(&mut h);
                }
                h.finish()
            };
            let same = self.table.entry(hash).or_default();
            let earlier = same.iter().copied().find(|&e| {
                e != id && g.contains(e) && !self.merged.contains_key(e) && {
                    let other = g.node(e);
                    other.op == node.op && other.ty == node.ty && cse_inputs(&other.op, &other.inputs) == inputs
                }
            });
            match earlier {
                Some(e) => {
                    let users: SmallVec<[NodeId; 8]> = g.users(id).into();
                    g.replace_all_uses_unchecked(id, e);
                    self.merged.insert(id, ());
                    merged += 1;
                    for &u in &users {
                        work.push(u);
                    }
                    readers.push(users);
                }
                None if !same.contains(&id) => same.push(id),
                None => {}
            }
        }
        merged
    }
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

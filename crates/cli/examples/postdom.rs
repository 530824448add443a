//! Experiment for issue #15 (kept in history, removed in the next commit): would post-dominator
//! fusion (TVM-style: a multi-user element-wise node fused with every path into its immediate
//! post-dominator, computed once) save buffers on the Transformer and the model suite? Uses
//! `petgraph::algo::dominators::simple_fast` on the reversed graph; prints the candidates and the
//! cost of the analysis next to `decide`'s own.
use std::time::Instant;

use air::{Graph, NodeId, OpClass};
use kiln_cli::model::{Gpt, GptConfig};
use lower::schedule::{FuseOptions, Plan, decide};
use nn::Module;
use petgraph::algo::dominators::simple_fast;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::Reversed;
use std::collections::HashMap;

fn analyse(name: &str, g: &Graph) {
    let t = Instant::now();
    let d = decide(g, FuseOptions { fuse: true, matmul: true });
    let t_decide = t.elapsed();
    let t = Instant::now();
    let mut pg: DiGraph<NodeId, ()> = DiGraph::with_capacity(d.order.len() + 1, 0);
    let mut idx: HashMap<NodeId, NodeIndex> = HashMap::new();
    for &n in &d.order {
        idx.insert(n, pg.add_node(n));
    }
    for &n in &d.order {
        for &i in g.inputs(n) {
            pg.add_edge(idx[&i], idx[&n], ());
        }
    }
    let sink = pg.add_node(NodeId::default());
    for o in g.outputs() {
        pg.add_edge(idx[o], sink, ());
    }
    let dom = simple_fast(Reversed(&pg), sink);
    let t_dom = t.elapsed();
    let (mut multi, mut candidates, mut bytes) = (0, 0, 0i64);
    for (n, plan) in d.plans.iter() {
        if !matches!(plan, Plan::Loops) || g.op(n).class() != OpClass::Elementwise || g.users(n).len() < 2 {
            continue;
        }
        multi += 1;
        let Some(p) = dom.immediate_dominator(idx[&n]) else { continue };
        if p == sink {
            continue;
        }
        let target = pg[p];
        // Every node strictly between n and its post-dominator must be element-wise or movement
        // and not materialized: then one kernel could compute n once and feed all paths.
        let mut stack: Vec<NodeId> = g.users(n).to_vec();
        let mut seen = std::collections::HashSet::new();
        let mut ok = true;
        while let Some(u) = stack.pop() {
            if u == target || !seen.insert(u) {
                continue;
            }
            let c = g.op(u).class();
            if d.plans.contains_key(u) || !(c == OpClass::Elementwise || c == OpClass::Movement) {
                ok = false;
                break;
            }
            stack.extend(g.users(u).iter().copied());
        }
        if ok && matches!(g.op(target).class(), OpClass::Elementwise | OpClass::Movement | OpClass::Reduce) {
            candidates += 1;
            bytes += g.ty(n).shape.iter().map(|d| d.as_const().unwrap_or(64)).product::<i64>() * 4;
        }
    }
    println!(
        "{name}: {} live nodes, {} materialized; element-wise materialized with >=2 users: {multi}; \
         of them fusable into their post-dominator: {candidates} ({bytes} bytes); decide {:?}, petgraph build+dominators {:?}",
        d.order.len(),
        d.plans.len(),
        t_decide,
        t_dom
    );
}

fn main() -> anyhow::Result<()> {
    for layers in [2, 8] {
        let model = Gpt::new(GptConfig { layers, ..GptConfig::default() }, 0)?;
        let (outputs, _) = model.outputs(&model.tokens(1))?;
        let mut g = kiln::trace(&outputs.iter().collect::<Vec<_>>())?.graph;
        lower::rewrite::optimize(&mut g);
        analyse(&format!("transformer forward, {layers} layers"), &g);
    }
    for name in nn::zoo::NAMES {
        for fit in [false, true] {
            let mut case = nn::zoo::build(name)?;
            let outs = if fit {
                let loss = case.loss.compute(&case.model.forward(&case.x), &case.y);
                let params = case.model.parameters();
                let refs: Vec<&kiln::Tensor> = params.iter().collect();
                let mut out = vec![loss.clone()];
                out.extend(kiln::grad(&loss, &refs)?);
                out
            } else {
                vec![kiln::no_grad(|| case.model.forward(&case.x))]
            };
            let mut g = kiln::trace(&outs.iter().collect::<Vec<_>>())?.graph;
            lower::rewrite::optimize(&mut g);
            analyse(&format!("{name} {}", if fit { "fit" } else { "predict" }), &g);
        }
    }
    Ok(())
}

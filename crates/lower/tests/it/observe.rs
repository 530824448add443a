//! The pass observer of `lower::compile_observed`: typed passes bracketed in order, and what each
//! pass produced lent to the observer (the graph the real compile rewrote, the program it
//! emitted), so that a tool needs no replay of any pass.

use air::Graph;
use kiln_lower::kir::Kernel;
use kiln_lower::rewrite::RewriteStats;
use std::borrow::Cow;

use kiln_lower::{CompileOptions, Pass, PassObserver, PassOutput, compile, compile_observed, compile_taking};

fn graph() -> Graph {
    let text = "graph {\n  n0 = input 0 : f32[4]\n  n1 = const 1.0 : f32[4]\n  n2 = mul n0, n1 : f32[4]\n  \
                n3 = neg n2 : f32[4]\n  n4 = neg n3 : f32[4]\n  n5 = exp2 n4 : f32[4]\n  return n5\n}\n";
    air::text::parse(text).expect("the test graph parses")
}

#[derive(Default)]
struct Recorder {
    events: Vec<String>,
    optimized: Option<(String, RewriteStats)>,
    program: Option<String>,
    kernels: Vec<Kernel>,
}

impl PassObserver for Recorder {
    fn begin(&mut self, pass: Pass, graph_nodes: usize) {
        self.events.push(format!("begin {pass} {graph_nodes}"));
    }

    fn end(&mut self, pass: Pass, graph_nodes: usize) {
        self.events.push(format!("end {pass} {graph_nodes}"));
    }

    fn output(&mut self, pass: Pass, output: PassOutput<'_>) {
        match output {
            PassOutput::Graph(g) => self.events.push(format!("graph {pass} {}", g.len())),
            PassOutput::Optimized(g, stats) => {
                self.events.push(format!("optimized {pass} {}", g.len()));
                self.optimized = Some((air::text::print(g), stats.clone()));
            }
            PassOutput::Saturated(g, stats) => {
                self.events.push(format!("saturated {pass} {} {}", g.len(), stats.changed));
            }
            PassOutput::Program(p) => {
                self.events.push(format!("program {pass}"));
                self.program = Some(p.to_string());
            }
        }
    }

    fn kernel(&mut self, kernel: &Kernel) {
        self.events.push("kernel".into());
        self.kernels.push(kernel.clone());
    }
}

#[test]
fn emission_hands_over_each_kernel_of_the_program_once_in_order() {
    // Two inputs' rows reduced alike into outputs (one kernel, launched twice), then a
    // reduction of another shape with an element-wise tail: kernels of several structures.
    let text = "graph {\n  n0 = input 0 : f32[4, 8]\n  n1 = input 1 : f32[4, 8]\n  \
                n2 = reduce sum axes=[1] n0 : f32[4, 1]\n  n3 = reduce sum axes=[1] n1 : f32[4, 1]\n  \
                n4 = add n2, n3 : f32[4, 1]\n  n5 = reduce max axes=[0] n4 : f32[1, 1]\n  \
                n6 = exp2 n5 : f32[1, 1]\n  return n6, n2, n3\n}\n";
    let g = air::text::parse(text).expect("the test graph parses");
    let mut rec = Recorder::default();
    let program = compile_observed(&g, &CompileOptions::default(), &mut rec).expect("compiles");
    assert!(program.kernels.len() >= 2 && program.steps.len() > program.kernels.len(), "{program}");
    assert_eq!(rec.kernels, program.kernels, "every kernel once, in the program's order");
    // All of them during emission, none after it.
    let events = rec.events.join("; ");
    let kernels = vec!["kernel"; program.kernels.len()].join("; ");
    assert!(events.contains(&format!("begin emit-kernels 7; {kernels}; end emit-kernels 7")), "{events}");
}

#[test]
fn observer_hears_every_pass_in_order_and_sees_its_result() {
    let g = graph();
    let mut rec = Recorder::default();
    let program = compile_observed(&g, &CompileOptions::default(), &mut rec).expect("compiles");
    // mul-one and neg-neg leave input and exp2.
    let events = rec.events.join("; ");
    assert_eq!(
        events,
        "begin verify 6; end verify 6; graph verify 6; begin optimize 6; end optimize 2; optimized optimize 2; \
         begin decide-fusion 2; end decide-fusion 2; graph decide-fusion 2; begin emit-kernels 2; \
         kernel; end emit-kernels 2; program emit-kernels"
    );
    let (text, stats) = rec.optimized.expect("optimize lends its graph");
    let mut replayed = g.clone();
    let replay_stats = kiln_lower::rewrite::optimize(&mut replayed);
    assert_eq!(text, air::text::print(&replayed), "the graph the compile optimized");
    assert_eq!(stats, replay_stats);
    assert!(stats.rewrites >= 2, "{stats}");
    assert_eq!(rec.program.as_deref(), Some(program.to_string().as_str()));
    assert_eq!(program.to_string(), compile(&g, &CompileOptions::default()).expect("compiles").to_string());
}

/// A graph given (rewritten in place) and the same graph lent (copied in `verify`) go through the
/// same passes to the same program.
#[test]
fn a_given_graph_compiles_as_a_lent_one() {
    let g = graph();
    let (mut lent, mut given) = (Recorder::default(), Recorder::default());
    let a = compile_observed(&g, &CompileOptions::default(), &mut lent).expect("compiles");
    let b = compile_taking(Cow::Owned(graph()), &CompileOptions::default(), &mut given).expect("compiles");
    assert_eq!(a.to_string(), b.to_string());
    assert_eq!(lent.events, given.events);
    assert_eq!(lent.optimized, given.optimized);
    assert_eq!(air::text::print(&g), air::text::print(&graph()), "a lent graph is left as it was");
}

#[test]
fn a_failed_pass_ends_without_output() {
    // `neg` of bool is not typed: verify fails, is still bracketed, and lends nothing.
    let text = "graph {\n  n0 = input 0 : bool[2]\n  n1 = neg n0 : bool[2]\n  return n1\n}\n";
    let g = air::text::parse(text).expect("parses without type checks");
    let mut rec = Recorder::default();
    assert!(compile_observed(&g, &CompileOptions::default(), &mut rec).is_err());
    assert_eq!(rec.events, ["begin verify 2", "end verify 2"]);
    let names: Vec<&str> = Pass::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(names, ["verify", "optimize", "saturate", "decide-fusion", "emit-kernels"]);
}

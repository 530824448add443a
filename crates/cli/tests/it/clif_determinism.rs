//! The CPU code generator emits the same CLIF for a kernel every time: the order of its hash
//! tables must not reach the code (with SipHash's per-table random keys, two emissions of the
//! zoo LSTM's kernels came out in different orders).

use kiln_cli::profile_cmd::profile_model;
use lower::CompileOptions;
use lower::kir::Kernel;

#[test]
fn every_loop_kernel_of_the_zoo_emits_the_same_clif_twice() {
    let options = CompileOptions::default();
    let mut kernels = 0;
    for (name, fit) in [("lstm", false), ("gru", true), ("mobilenet", false), ("attention", true)] {
        let p = profile_model(name, fit, &options, false, true).unwrap();
        for k in &p.compiled.exe.program().kernels {
            if let Kernel::Loops(k) = k {
                let first = codegen::clif_text(k).unwrap();
                for _ in 0..3 {
                    assert_eq!(codegen::clif_text(k).unwrap(), first, "{name} (fit {fit})");
                }
                kernels += 1;
            }
        }
    }
    assert!(kernels > 50, "only {kernels} loop kernels");
}

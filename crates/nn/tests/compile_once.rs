//! Training the GPT-style decoder on the CPU device compiles its step program once: step 1
//! compiles native code (and never runs the interpreter), steps 2 and 3 hit the runtime's program
//! cache. Alone in its test binary, because the compile counter belongs to the process-wide CPU
//! device that concurrently running tests would also bump.

mod common;

use common::{assert_close, transformer_and_fixture};
use kiln::Tensor;
use kiln_nn::*;

/// The same training on the CPU device (the runtime's program cache): step 1 compiles the step
/// graph, steps 2 and 3 compile nothing.
#[test]
fn training_on_the_cpu_device_compiles_once() {
    let (mut model, f) = transformer_and_fixture();
    model.to_device(kiln::Device::Cpu).unwrap();
    let x = f.get("x").to_device(kiln::Device::Cpu).unwrap();
    let y = f.get("targets").to_device(kiln::Device::Cpu).unwrap();
    let cpu = kiln::backend::cpu_device().unwrap();
    let mut trainer = Trainer::new(model, Adam::new(1e-3), Loss::CrossEntropy);
    let mut losses = Vec::new();
    let mut compiled = Vec::new();
    let mut launched = Vec::new();
    let (interp, kernels) = (kiln::stats::interp_runs(), cpu.stats().kernels_compiled);
    for _ in 0..3 {
        let (before, launches, runs) =
            (cpu.stats().programs_compiled, kiln::stats::cpu_launches(), kiln::stats::cpu_runs());
        losses.push(trainer.step(&x, &y).unwrap());
        compiled.push(cpu.stats().programs_compiled - before);
        assert!(kiln::stats::cpu_runs() > runs, "a step ran no native program");
        launched.push(kiln::stats::cpu_launches() - launches);
    }
    eprintln!("cpu: losses {losses:?}, programs compiled per step {compiled:?}, kernel launches {launched:?}");
    assert!(compiled[0] >= 1, "step 1 compiled its program");
    assert!(cpu.stats().kernels_compiled > kernels, "step 1 generated native kernels");
    assert_eq!(&compiled[1..], &[0, 0], "steps 2 and 3 reuse step 1's program");
    assert!(launched.iter().all(|&n| n > 0 && n == launched[0]), "every step launches the same kernels: {launched:?}");
    assert_eq!(kiln::stats::interp_runs(), interp, "nothing ran on the interpreter");
    assert_close("cpu losses", &Tensor::from_vec(losses, &[3]), &f.get("losses"), 1e-4);
    let mut worst = 0f64;
    for (name, p) in trainer.model.named_parameters() {
        worst = worst.max(assert_close(&format!("cpu step3.{name}"), &p, &f.get(&format!("step3.{name}")), 5e-5));
    }
    eprintln!("cpu: max parameter error after 3 Adam steps {worst:.2e}");
}

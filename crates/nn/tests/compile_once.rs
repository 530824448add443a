//! Training the GPT-style decoder on the CPU device compiles its step program once: steps 2 and 3
//! hit the runtime's program cache. Alone in its test binary, because the compile counter belongs
//! to the process-wide CPU device that concurrently running tests would also bump.

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
    for _ in 0..3 {
        let before = cpu.stats().programs_compiled;
        losses.push(trainer.step(&x, &y).unwrap());
        compiled.push(cpu.stats().programs_compiled - before);
    }
    eprintln!("cpu: losses {losses:?}, programs compiled per step {compiled:?}");
    assert_eq!(&compiled[1..], &[0, 0], "steps 2 and 3 reuse step 1's program");
    assert_close("cpu losses", &Tensor::from_vec(losses, &[3]), &f.get("losses"), 1e-4);
    let mut worst = 0f64;
    for (name, p) in trainer.model.named_parameters() {
        worst = worst.max(assert_close(&format!("cpu step3.{name}"), &p, &f.get(&format!("step3.{name}")), 5e-5));
    }
    eprintln!("cpu: max parameter error after 3 Adam steps {worst:.2e}");
}

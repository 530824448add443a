//! Training on the CPU device compiles its step program once: step 1 compiles native code (and
//! never runs the interpreter), later steps hit the runtime's program cache. The compile counter
//! belongs to the process-wide CPU device, so the tests of this binary take turns through
//! [`SERIAL`] and no other test binary shares the counter.

mod common;

use std::sync::Mutex;

use common::{assert_close, transformer_and_fixture};
use kiln::Tensor;
use kiln_nn::*;

/// Held by each test while it counts compiles.
static SERIAL: Mutex<()> = Mutex::new(());

/// The same training on the CPU device (the runtime's program cache): step 1 compiles the step
/// graph, steps 2 and 3 compile nothing.
#[test]
fn training_on_the_cpu_device_compiles_once() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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

/// 60 optimizer steps (SGD with momentum, then Adam) compile one program, and every step's graph
/// has the same number of nodes: the optimizer realizes its state with the parameters, so no
/// step's graph chains onto the previous one's. A closure serves as the loss.
#[test]
fn sixty_optimizer_steps_compile_once_with_a_constant_graph() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = kiln::backend::cpu_device().unwrap();
    let x = Tensor::randn_seeded(&[8, 4], 7).to_device(kiln::Device::Cpu).unwrap();
    let y = Tensor::randn_seeded(&[8, 3], 8).to_device(kiln::Device::Cpu).unwrap();
    let huber = |p: &Tensor, t: &Tensor| {
        let d = p.sub(t).abs();
        d.lt(1.0).where_cond(d.mul(&d).mul(0.5), d.sub(0.5)).mean_all()
    };
    fn run<O: Optimizer>(trainer: &mut Trainer<Linear, O>, x: &Tensor, y: &Tensor, compiled_so_far: &dyn Fn() -> u64) {
        let before = compiled_so_far();
        let mut nodes = Vec::new();
        let mut compiled = Vec::new();
        let mut losses = Vec::new();
        for _ in 0..60 {
            let start = compiled_so_far();
            losses.push(trainer.step(x, y).unwrap());
            compiled.push(compiled_so_far() - start);
            nodes.push(trainer.last_step_nodes());
        }
        assert_eq!(trainer.distinct_step_graphs(), 1, "one step structure");
        assert!(nodes.iter().all(|&n| n == nodes[0] && n > 0), "graph sizes per step: {nodes:?}");
        assert!(compiled[1..].iter().all(|&c| c == 0), "programs compiled per step: {compiled:?}");
        assert!(compiled_so_far() - before <= 1);
        assert!(losses[59] < losses[0], "training makes progress: {losses:?}");
    }
    let mut model = Linear::new(4, 3, true);
    model.to_device(kiln::Device::Cpu).unwrap();
    let mut sgd = Trainer::new(model, Sgd::new(0.05, 0.9), huber);
    run(&mut sgd, &x, &y, &|| cpu.stats().programs_compiled);
    let mut model = Linear::new(4, 3, true);
    model.to_device(kiln::Device::Cpu).unwrap();
    let mut adam = Trainer::new(model, Adam::new(0.01), huber);
    run(&mut adam, &x, &y, &|| cpu.stats().programs_compiled);
    assert_eq!(adam.optimizer.steps(), 60);
    assert_eq!(adam.optimizer.state().len(), 4, "m and v of weight and bias");
    assert!(adam.optimizer.state().iter().all(Tensor::is_realized), "the state is realized every step");
}

/// In the steady state a training step writes its new parameters into the arrays of the
/// parameters two steps back (the compiled step's output reuse, PyTorch's `out=`): after the
/// first two steps nothing is allocated for them, and the values stay those of plain steps.
#[test]
fn training_steps_reuse_the_parameter_arrays_of_two_steps_back() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let x = Tensor::randn_seeded(&[16, 8], 3).to_device(kiln::Device::Cpu).unwrap();
    let y = Tensor::randn_seeded(&[16, 4], 4).to_device(kiln::Device::Cpu).unwrap();
    let build = || {
        let mut model = Linear::new(8, 4, true);
        model.to_device(kiln::Device::Cpu).unwrap();
        model
    };
    kiln::manual_seed(11);
    let mut trainer = Trainer::new(build(), Sgd::new(0.1, 0.9), Loss::Mse);
    kiln::manual_seed(11);
    let mut plain_model = build();
    let mut plain = Sgd::new(0.1, 0.9);
    let ptr = |t: &Tensor| t.to_host().unwrap().data.as_bytes().as_ptr() as usize;
    let mut weight_ptrs = Vec::new();
    for step in 0..6 {
        trainer.step(&x, &y).unwrap();
        weight_ptrs.push(ptr(&trainer.model.parameters()[0]));
        // The same step without the compiled function: the optimizer's own `step`.
        let params = plain_model.parameters();
        let loss = Loss::Mse.compute(&plain_model.forward(&x), &y);
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = kiln::grad(&loss, &refs).unwrap();
        let done = plain.step(&params, &grads, &[&loss]).unwrap();
        let mut next = done.params.into_iter();
        plain_model.visit_mut(&mut |_, t, kind| {
            if kind == ParamKind::Weight {
                *t = next.next().unwrap();
            }
        });
        for (a, b) in trainer.model.parameters().iter().zip(plain_model.parameters()) {
            assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "step {step}");
        }
    }
    for i in 2..weight_ptrs.len() {
        assert_eq!(weight_ptrs[i], weight_ptrs[i - 2], "step {i} writes into the array of step {}", i - 2);
        assert_ne!(weight_ptrs[i], weight_ptrs[i - 1]);
    }
}

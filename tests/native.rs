//! A realize on the default device reaches the compiler and runs native kernels: the CPU device
//! compiles a program and its loop kernels, the executable counts its launches, and the reference
//! interpreter never runs. Alone in its test binary, so that the process-wide CPU device's
//! program counter moves only for this test.

use kiln::{Device, Tensor};

#[test]
fn default_device_realize_compiles_and_launches_native_kernels() {
    assert_eq!(
        Device::default_device().unwrap(),
        Device::Cpu,
        "this test checks the default device; run it without KILN_DEVICE"
    );
    // A graph no other realize in this binary builds: its program cannot come from the cache.
    let x = Tensor::from_vec((0..7 * 13).map(|i| i as f32 * 0.25 - 3.0).collect::<Vec<_>>(), &[7, 13]);
    let y = x.sin().mul(3.0).add(x.exp().sum_keepdim(1)).softmax(0);
    assert_eq!(y.device(), Device::Cpu);
    let program = kiln::trace(&[&y]).unwrap();
    let cpu = kiln::backend::cpu_device().unwrap();
    let before = cpu.stats();
    let (interp, runs, launches) = (kiln::stats::interp_runs(), kiln::stats::cpu_runs(), kiln::stats::cpu_launches());

    let got: Vec<f32> = y.to_vec().unwrap();

    let after = cpu.stats();
    assert!(after.programs_compiled > before.programs_compiled, "the realize compiled no program: {after:?}");
    assert!(after.kernels_compiled > before.kernels_compiled, "the realize generated no native kernel: {after:?}");
    assert_eq!(kiln::stats::interp_runs(), interp, "the realize ran the interpreter");
    assert_eq!(kiln::stats::cpu_runs(), runs + 1, "one native run");
    // The executable the realize ran: found in the program cache, it counted its own launches.
    let exe = cpu.compile(&program.graph).unwrap();
    assert_eq!(cpu.stats().cache_hits, after.cache_hits + 1, "the realized program is in the cache");
    assert!(exe.launches() > 0);
    assert_eq!(exe.launches_run(), exe.launches() as u64, "the realize launched every kernel once");
    assert_eq!(kiln::stats::cpu_launches() - launches, exe.launches() as u64);
    // And the native result is the interpreter's.
    let want: Vec<f32> = {
        let x = x.to_device(Device::Interp).unwrap();
        x.sin().mul(3.0).add(x.exp().sum_keepdim(1)).softmax(0).to_vec().unwrap()
    };
    assert_eq!(kiln::stats::interp_runs(), interp + 1, "the reference ran on the interpreter");
    air::testing::assert_close("cpu vs interp", &got, &want, air::testing::Tol::both(1e-5));
}

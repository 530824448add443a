//! Graphs built by hand, run on the CPU device and compared with the reference interpreter; plus
//! the device's caches, zero-copy and memory behaviour.

use crate::common;

use std::sync::Arc;

use air::dim::shape_of;
use air::op::{Cast, Pad, Shrink};
use air::{BinaryOp, Bindings, DType, Dim, Graph, HostData, HostTensor, Op, ReduceOp, Scalar, Symbol, UnaryOp};
use common::*;
use kiln_runtime::{Backend, CpuDevice, NoCompileObserver, Runner, RuntimeError};

#[test]
fn elementwise_chain() {
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[4, 5]);
    let y = input_f32(&mut g, 1, &[4, 5]);
    let a = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    let b = g.add(Op::Unary(UnaryOp::Exp2), &[a]).unwrap();
    let c = g.add(Op::Binary(BinaryOp::Mul), &[b, y]).unwrap();
    let one = constant(&mut g, 1.5, c);
    let d = g.add(Op::Binary(BinaryOp::Add), &[c, one]).unwrap();
    let e = g.add(Op::Binary(BinaryOp::Max), &[d, x]).unwrap();
    let lt = g.add(Op::Binary(BinaryOp::CmpLt), &[x, y]).unwrap();
    let w = g.add(Op::Where, &[lt, e, y]).unwrap();
    g.add_output(w);
    g.add_output(lt);
    check(&g, &[tensor(&[4, 5], 1), tensor(&[4, 5], 2)]);
}

#[test]
fn reductions() {
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[6, 7, 8]);
    let s = reduce(&mut g, ReduceOp::Sum, x, &[1]);
    let m = reduce(&mut g, ReduceOp::Max, x, &[0, 2]);
    let all = reduce(&mut g, ReduceOp::Sum, x, &[0, 1, 2]);
    g.add_output(s);
    g.add_output(m);
    g.add_output(all);
    check(&g, &[tensor(&[6, 7, 8], 3)]);
}

/// A softmax over rows of `x: f32[5, 33]` (with `exp2`): reductions and element-wise kernels.
fn softmax_graph() -> Graph {
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[5, 33]);
    let m = reduce(&mut g, ReduceOp::Max, x, &[1]);
    let m = expand(&mut g, m, &[5, 33]);
    let d = g.add(Op::Binary(BinaryOp::Sub), &[x, m]).unwrap();
    let e = g.add(Op::Unary(UnaryOp::Exp2), &[d]).unwrap();
    let s = reduce(&mut g, ReduceOp::Sum, e, &[1]);
    let s = expand(&mut g, s, &[5, 33]);
    let r = g.add(Op::Unary(UnaryOp::Recip), &[s]).unwrap();
    let y = g.add(Op::Binary(BinaryOp::Mul), &[e, r]).unwrap();
    g.add_output(y);
    g
}

#[test]
fn softmax_like() {
    check(&softmax_graph(), &[tensor(&[5, 33], 4)]);
}

#[test]
fn views() {
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[3, 4, 5]);
    let p = permute(&mut g, x, &[2, 0, 1]);
    let n = g.add(Op::Unary(UnaryOp::Neg), &[p]).unwrap();
    let r = reshape(&mut g, n, &[5, 12]);
    let sh = g
        .add(Op::Shrink(Shrink { ranges: vec![(Dim::Const(1), Dim::Const(4)), (Dim::Const(2), Dim::Const(11))] }), &[r])
        .unwrap();
    let pad = g
        .add(
            Op::Pad(Pad {
                padding: vec![(Dim::Const(2), Dim::Const(1)), (Dim::Const(0), Dim::Const(3))],
                value: Scalar::Float(0.5),
            }),
            &[sh],
        )
        .unwrap();
    let col = input_f32(&mut g, 1, &[1, 12]);
    let col = expand(&mut g, col, &[6, 12]);
    let out = g.add(Op::Binary(BinaryOp::Add), &[pad, col]).unwrap();
    let i = g.add(Op::Cast(Cast { to: DType::I32 }), &[out]).unwrap();
    g.add_output(out);
    g.add_output(i);
    g.add_output(p);
    check(&g, &[tensor(&[3, 4, 5], 5), tensor(&[1, 12], 6)]);
}

#[test]
fn matmul_plain_batched_and_transposed() {
    // Plain.
    let mut g = Graph::new();
    let a = input_f32(&mut g, 0, &[33, 20]);
    let b = input_f32(&mut g, 1, &[20, 17]);
    let c = matmul(&mut g, a, b, &[], 33, 20, 17);
    g.add_output(c);
    check_rtol(&g, &[tensor(&[33, 20], 7), tensor(&[20, 17], 8)]);
    assert_eq!(matmul_kernels(&g), 1, "the lowering recognised the matmul");

    // Batched.
    let mut g = Graph::new();
    let a = input_f32(&mut g, 0, &[3, 9, 16]);
    let b = input_f32(&mut g, 1, &[3, 16, 5]);
    let c = matmul(&mut g, a, b, &[3], 9, 16, 5);
    g.add_output(c);
    check_rtol(&g, &[tensor(&[3, 9, 16], 9), tensor(&[3, 16, 5], 10)]);
    assert_eq!(matmul_kernels(&g), 1);

    // Transposed operand: a @ b^T with b stored [n, k].
    let mut g = Graph::new();
    let a = input_f32(&mut g, 0, &[12, 24]);
    let bt = input_f32(&mut g, 1, &[10, 24]);
    let b = permute(&mut g, bt, &[1, 0]);
    let c = matmul(&mut g, a, b, &[], 12, 24, 10);
    g.add_output(c);
    check_rtol(&g, &[tensor(&[12, 24], 11), tensor(&[10, 24], 12)]);
    assert_eq!(matmul_kernels(&g), 1);

    // Big enough for the threaded GEMM, with a bias epilogue.
    let mut g = Graph::new();
    let a = input_f32(&mut g, 0, &[96, 128]);
    let b = input_f32(&mut g, 1, &[128, 80]);
    let c = matmul(&mut g, a, b, &[], 96, 128, 80);
    let bias = input_f32(&mut g, 2, &[1, 80]);
    let bias = expand(&mut g, bias, &[96, 80]);
    let y = g.add(Op::Binary(BinaryOp::Add), &[c, bias]).unwrap();
    g.add_output(y);
    check_rtol(&g, &[tensor(&[96, 128], 13), tensor(&[128, 80], 14), tensor(&[1, 80], 15)]);
}

#[test]
fn a_weight_read_from_a_copy_in_rows_follows_the_array_given() {
    // `x @ w^T` with `w` a `[n, k]` input (a `Linear`'s weight, read column-major): the VM keeps
    // `w` copied in rows across runs while the same array is given (`matmul::RowCopy`), and
    // copies again for another array, also one at the address of a dropped one.
    let (m, k, n) = (40, 64, 48);
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[m, k]);
    let wt = input_f32(&mut g, 1, &[n, k]);
    let w = permute(&mut g, wt, &[1, 0]);
    let y = matmul(&mut g, x, w, &[], m, k, n);
    g.add_output(y);
    let dev = CpuDevice::new().unwrap();
    let x = tensor(&[m, k], 1);
    for seed in 2..7 {
        let w = tensor(&[n, k], seed);
        check_with(&dev, &g, &[x.clone(), w.clone()], &Bindings::new(), 1e-4);
        check_with(&dev, &g, &[x.clone(), w], &Bindings::new(), 1e-4);
    }
    assert_eq!(dev.stats().programs_compiled, 1);
}

fn matmul_kernels(g: &Graph) -> usize {
    let exe = CpuDevice::new().unwrap().compile(g).unwrap();
    exe.program().kernels.iter().filter(|k| matches!(k, lower::kir::Kernel::Matmul(_))).count()
}

/// GEMM sums in a different order than the interpreter's f64 sum.
fn check_rtol(g: &Graph, inputs: &[HostTensor]) {
    check_with(&CpuDevice::new().unwrap(), g, inputs, &Bindings::new(), 1e-4);
}

#[test]
fn f64_matmul() {
    let mut g = Graph::new();
    let a =
        g.add_leaf(Op::Input(air::op::Input { slot: 0 }), air::TensorType::new(DType::F64, shape_of(&[7, 9]))).unwrap();
    let b =
        g.add_leaf(Op::Input(air::op::Input { slot: 1 }), air::TensorType::new(DType::F64, shape_of(&[9, 4]))).unwrap();
    let c = matmul(&mut g, a, b, &[], 7, 9, 4);
    g.add_output(c);
    check_with(
        &CpuDevice::new().unwrap(),
        &g,
        &[f64_tensor(&[7, 9], 1), f64_tensor(&[9, 4], 2)],
        &Bindings::new(),
        1e-12,
    );
}

fn seq_graph() -> Graph {
    let seq = Dim::sym("seq");
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, &[seq, Dim::Const(4)]);
    let w = input_f32(&mut g, 1, &[1, 4]);
    let w = expand_dims(&mut g, w, &[seq, Dim::Const(4)]);
    let y = g.add(Op::Binary(BinaryOp::Mul), &[x, w]).unwrap();
    let s = reduce(&mut g, ReduceOp::Sum, y, &[1]);
    let s = g.add(Op::Unary(UnaryOp::Neg), &[s]).unwrap();
    g.add_output(s);
    g
}

#[test]
fn symbolic_dims_compile_once() {
    let dev = CpuDevice::new().unwrap();
    let g = seq_graph();
    for seq in [3usize, 7, 3, 1000] {
        let b: Bindings = [(Symbol::new("seq"), seq as i64)].into_iter().collect();
        let inputs = [tensor(&[seq, 4], seq as u64), tensor(&[1, 4], 99)];
        let before = dev.stats();
        check_with(&dev, &g, &inputs, &b, 1e-5);
        let after = dev.stats();
        if seq == 3 && before.programs_compiled == 0 {
            assert_eq!(after.programs_compiled, 1);
            assert!(after.kernels_compiled + after.kernels_native >= 1);
        } else {
            assert_eq!(after.programs_compiled, before.programs_compiled, "seq={seq} recompiled");
            assert_eq!(after.kernels_compiled, before.kernels_compiled, "seq={seq} compiled kernels");
            assert_eq!(after.kernels_native, before.kernels_native, "seq={seq} native kernels");
            assert_eq!(after.cache_hits, before.cache_hits + 1);
        }
    }
    // A missing binding is an error naming the symbol.
    let e = dev.run(&g, &[tensor(&[3, 4], 1), tensor(&[1, 4], 2)], &Bindings::new()).unwrap_err();
    assert!(matches!(&e, RuntimeError::Unbound(s) if s.name() == "seq"), "{e}");
}

/// Four steps of an unrolled loop, each reading two slices of one input (its step's halves, at
/// the symbolic offsets `t * seq * 8` and `t * seq * 8 + 4`) and writing its own output: the
/// kernels differ only in those offsets, which the VM adds to the argument's pointer
/// (`lower::offsets`), so one kernel is compiled for all four. The lowering builds the first
/// step's kernel and moves its reads for the others (`schedule::memo`), and the CPU device takes
/// their offsets from the first's (`PassObserver::shifted_kernel`).
#[test]
fn kernels_differing_in_base_offsets_compile_once() {
    let seq = Dim::sym("seq");
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, &[Dim::Const(4), seq, Dim::Const(8)]);
    for t in 0..4 {
        let half = |g: &mut Graph, lo: i64| {
            let ranges =
                vec![(Dim::Const(t), Dim::Const(t + 1)), (Dim::Const(0), seq), (Dim::Const(lo), Dim::Const(lo + 4))];
            g.add(Op::Shrink(Shrink { ranges }), &[x]).unwrap()
        };
        let (p, q) = (half(&mut g, 0), half(&mut g, 4));
        let a = g.add(Op::Unary(UnaryOp::Neg), &[p]).unwrap();
        let a = g.add(Op::Binary(BinaryOp::Add), &[a, q]).unwrap();
        let b = g.add(Op::Unary(UnaryOp::Exp2), &[a]).unwrap();
        g.add_output(b);
    }
    let dev = CpuDevice::new().unwrap();
    for n in [3usize, 5] {
        let b: Bindings = [(Symbol::new("seq"), n as i64)].into_iter().collect();
        check_with(&dev, &g, &[tensor(&[4, n, 8], n as u64)], &b, 1e-6);
    }
    // One kernel made for the four launches: compiled, or (a tiled exp2) run natively.
    let stats = dev.stats();
    assert_eq!((stats.programs_compiled, stats.kernels_compiled + stats.kernels_native), (1, 1), "{stats:?}");
}

#[test]
fn same_graph_built_twice_compiles_once() {
    let dev = CpuDevice::new().unwrap();
    let (g1, g2) = (seq_graph(), seq_graph());
    let e1 = dev.compile(&g1).unwrap();
    let e2 = dev.compile(&g2).unwrap();
    assert!(Arc::ptr_eq(&e1, &e2));
    let s = dev.stats();
    assert_eq!((s.programs_compiled, s.cache_hits), (1, 1));
    assert_eq!(dev.cached_programs(), 1);
    // A different graph is a different program, but reuses the kernel cache.
    let mut g3 = seq_graph();
    let out = g3.outputs()[0];
    let n = g3.add(Op::Unary(UnaryOp::Neg), &[out]).unwrap();
    g3.set_outputs(vec![n]);
    dev.compile(&g3).unwrap();
    assert_eq!(dev.stats().programs_compiled, 2);
    // The device is a cheap shared handle, usable from other threads.
    let dev2 = dev.clone();
    std::thread::spawn(move || dev2.compile(&seq_graph()).unwrap()).join().unwrap();
    assert_eq!(dev.stats().programs_compiled, 2);
}

/// A graph given to the device is lowered in place, and the key that comes back answers what its
/// nodes were, by topological position; a structurally equal graph, lent or given, gets the
/// cached program and that program's key.
#[test]
fn a_given_graph_comes_back_as_its_key() {
    let dev = CpuDevice::new().unwrap();
    let g = seq_graph();
    let (exe, key) = dev.compile_taking(std::borrow::Cow::Owned(seq_graph()), &mut NoCompileObserver).unwrap();
    assert_eq!(key.len(), g.len());
    for (position, &id) in g.topo_order().iter().enumerate() {
        let node = g.node(id);
        assert_eq!(key.node(position), Some((&node.op, &node.ty)), "node at {position}");
    }
    assert_eq!(key.node(g.len()), None);
    let (again, same_key) = dev.compile_taking(std::borrow::Cow::Owned(seq_graph()), &mut NoCompileObserver).unwrap();
    assert!(Arc::ptr_eq(&exe, &again) && Arc::ptr_eq(&key, &same_key));
    assert!(Arc::ptr_eq(&exe, &dev.compile(&g).unwrap()));
    assert_eq!((dev.stats().programs_compiled, dev.stats().cache_hits), (1, 2));
    // The program run from the given graph is the lent graph's program.
    let bindings = [(Symbol::new("seq"), 3)].into_iter().collect();
    check_with(&dev, &g, &[tensor(&[3, 4], 7), tensor(&[1, 4], 8)], &bindings, 1e-6);
    assert_eq!(dev.stats().programs_compiled, 1);
}

#[test]
fn a_first_run_times_each_launch_once_asked() {
    let dev = CpuDevice::new().unwrap();
    let g = seq_graph();
    let exe = dev.compile(&g).unwrap();
    let bindings: Bindings = [(Symbol::new("seq"), 3)].into_iter().collect();
    let inputs = [tensor(&[3, 4], 7), tensor(&[1, 4], 8)];
    // (Other tests' executables may time their first runs too: a clock read per launch.)
    kiln_runtime::time_first_runs(true);
    exe.run(&inputs, &bindings).unwrap();
    let first = exe.first_run_times();
    let steady = exe.launch_times(&inputs, &bindings, 3).unwrap();
    assert_eq!(first.len(), steady.len(), "one time per launch of the program");
    assert!(first.iter().all(|&ns| ns > 0), "{first:?}");
    // Later runs leave the first run's times as they were.
    exe.run(&inputs, &bindings).unwrap();
    assert_eq!(exe.first_run_times(), first);
    // A program not run yet has no first run to show.
    let untimed = dev
        .compile(&{
            let mut g = Graph::new();
            let x = input_f32(&mut g, 0, &[8]);
            let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
            g.add_output(y);
            g
        })
        .unwrap();
    assert!(untimed.first_run_times().is_empty());
}

#[test]
fn inputs_zero_copy_outputs_owned_and_released() {
    let dev = CpuDevice::new().unwrap();
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[1000]);
    let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    g.add_output(y);
    let exe = dev.compile(&g).unwrap();
    let xs = tensor(&[1000], 1);
    let x_ptr = xs.as_slice::<f32>().unwrap().as_ptr() as usize;
    let out = exe.run(std::slice::from_ref(&xs), &Bindings::new()).unwrap();
    let addrs = exe.last_buffer_addresses();
    let program = exe.program();
    let in_buf = program.buffers.iter().position(|b| b.kind == lower::BufferKind::Input(0)).unwrap();
    let out_buf = program.outputs[0].0.0 as usize;
    assert_eq!(addrs[in_buf], x_ptr, "the kernel read the caller's Vec in place");
    let out_ptr = out[0].as_slice::<f32>().unwrap().as_ptr() as usize;
    assert_ne!(out_ptr, x_ptr);
    assert_eq!(addrs[out_buf], out_ptr, "the returned Vec is what the kernel wrote");
    assert_eq!(Arc::strong_count(&xs.data), 1, "the run kept no reference to the input");
    assert_eq!(Arc::strong_count(&out[0].data), 1);
    let v = out.into_iter().next().unwrap().into_vec::<f32>().unwrap();
    assert_eq!(v.as_ptr() as usize, out_ptr, "the output is taken back without a copy");
    assert_eq!(v[3], -xs.as_slice::<f32>().unwrap()[3]);
    let weak = Arc::downgrade(&xs.data);
    drop(xs);
    assert!(weak.upgrade().is_none(), "the input was released");
}

#[test]
fn output_that_is_an_input_shares_it() {
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[3]);
    let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    g.add_output(x);
    g.add_output(y);
    let xs = tensor(&[3], 2);
    let out = CpuDevice::new().unwrap().run(&g, std::slice::from_ref(&xs), &Bindings::new()).unwrap();
    assert_eq!(out[0], xs);
    check(&g, &[xs]);
}

#[test]
fn unfused_chain_reuses_arena_memory() {
    let options = lower::CompileOptions { fuse: false, ..lower::CompileOptions::default() };
    let options = lower::CompileOptions { optimize: false, ..options };
    let dev = CpuDevice::with_options(options).unwrap();
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[256]);
    let mut v = x;
    for i in 0..100 {
        let op = if i % 2 == 0 { UnaryOp::Neg } else { UnaryOp::Sqrt };
        let op = if i % 2 == 1 { UnaryOp::Neg } else { op };
        v = g.add(Op::Unary(op), &[v]).unwrap();
        let c = constant(&mut g, 0.001, v);
        v = g.add(Op::Binary(BinaryOp::Add), &[v, c]).unwrap();
    }
    g.add_output(v);
    let exe = dev.compile(&g).unwrap();
    assert!(exe.launches() >= 100, "unfused: {} launches", exe.launches());
    let mem = exe.memory(&Bindings::new()).unwrap();
    assert!(mem.arena_bytes < mem.naive_bytes, "{mem:?}");
    assert!(mem.arena_bytes <= 4 * 256 * 4, "{mem:?}");
    check_with(&dev, &g, &[tensor(&[256], 3)], &Bindings::new(), 1e-5);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let dev = CpuDevice::new().unwrap();
    let g = seq_graph();
    let b: Bindings = [(Symbol::new("seq"), 3)].into_iter().collect();
    let e = dev.run(&g, &[tensor(&[3, 4], 1)], &b).unwrap_err();
    assert!(matches!(e, RuntimeError::InputCount { expected: 2, got: 1 }), "{e}");
    let e = dev.run(&g, &[tensor(&[4, 4], 1), tensor(&[1, 4], 2)], &b).unwrap_err();
    assert!(matches!(e, RuntimeError::InputMismatch { slot: 0, .. }), "{e}");
    assert!(e.to_string().contains("f32[seq, 4]") || e.to_string().contains("[3, 4]"), "{e}");
    let wrong = HostTensor::from_vec(vec![1i32; 4], vec![1, 4]).unwrap();
    let e = dev.run(&g, &[tensor(&[3, 4], 1), wrong], &b).unwrap_err();
    assert!(matches!(e, RuntimeError::InputMismatch { slot: 1, .. }), "{e}");
}

/// Runs `exe` through the backend-generic runner only.
fn run_generic<B: Backend>(exe: &Runner<B>, inputs: &[HostTensor]) -> Vec<HostTensor> {
    assert_eq!(exe.launches(), exe.program().steps.len());
    exe.run(inputs, &Bindings::new()).unwrap()
}

#[test]
fn the_cpu_runs_through_the_generic_runner() {
    assert_eq!(<kiln_runtime::CpuCode as Backend>::NAME, "cpu");
    let dev = CpuDevice::new().unwrap();
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[2]);
    let y = g.add(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    g.add_output(y);
    let out = dev.run(&g, &[tensor(&[2], 1)], &Bindings::new()).unwrap();
    let compiled = dev.compile(&g).unwrap();
    assert_eq!(run_generic(&compiled, &[tensor(&[2], 1)]), out);
}

#[test]
fn large_elementwise_runs_split_over_threads() {
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[300, 1000]);
    let y = g.add(Op::Unary(UnaryOp::Exp2), &[x]).unwrap();
    let s = reduce(&mut g, ReduceOp::Sum, y, &[1]);
    g.add_output(y);
    g.add_output(s);
    check(&g, &[tensor(&[300, 1000], 4)]);
}

#[test]
fn symbolic_matmul() {
    let seq = Dim::sym("seq");
    let mut g = Graph::new();
    let x = input(&mut g, 0, DType::F32, &[seq, Dim::Const(16)]);
    let w = input_f32(&mut g, 1, &[16, 8]);
    // x[seq, 16] @ w[16, 8], spelled with symbolic shapes.
    let x4 = reshape_dims(&mut g, x, &[seq, Dim::Const(1), Dim::Const(16)]);
    let x4 = expand_dims(&mut g, x4, &[seq, Dim::Const(8), Dim::Const(16)]);
    let wt = permute(&mut g, w, &[1, 0]);
    let w4 = reshape(&mut g, wt, &[1, 8, 16]);
    let w4 = expand_dims(&mut g, w4, &[seq, Dim::Const(8), Dim::Const(16)]);
    let p = g.add(Op::Binary(BinaryOp::Mul), &[x4, w4]).unwrap();
    let s = reduce(&mut g, ReduceOp::Sum, p, &[2]);
    let y = reshape_dims(&mut g, s, &[seq, Dim::Const(8)]);
    g.add_output(y);
    let dev = CpuDevice::new().unwrap();
    for n in [3usize, 7, 130] {
        let b: Bindings = [(Symbol::new("seq"), n as i64)].into_iter().collect();
        check_with(&dev, &g, &[tensor(&[n, 16], n as u64), tensor(&[16, 8], 5)], &b, 1e-4);
    }
    assert_eq!(dev.stats().programs_compiled, 1);
}

#[test]
fn devices_and_executables_are_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CpuDevice>();
    send_sync::<kiln_runtime::Executable>();
    let dev = CpuDevice::new().unwrap();
    let g = seq_graph();
    let exe = dev.compile(&g).unwrap();
    // Concurrent runs of one executable (with different binding sets) each get scratch memory.
    std::thread::scope(|s| {
        for t in 0..4usize {
            let exe = exe.clone();
            s.spawn(move || {
                let g = seq_graph();
                for i in 0..20usize {
                    let seq = 1 + (t * 7 + i) % 9;
                    let b: Bindings = [(Symbol::new("seq"), seq as i64)].into_iter().collect();
                    let inputs = [tensor(&[seq, 4], i as u64), tensor(&[1, 4], t as u64)];
                    let want = air::eval(&g, &inputs, &b).unwrap();
                    let got = exe.run(&inputs, &b).unwrap();
                    close(&got[0], &want[0], 1e-5).unwrap();
                }
            });
        }
    });
}

/// `x: f32[4]` written at position `p` of a zeroed `f32[16]` (a pad by `p` and `12 - p`), where
/// `p` reaches the program only as the shape `[p, 0]` of an empty input: the way `kiln::jit`
/// passes a KV cache's write position (`Tensor::symbol`).
fn write_at_position() -> Graph {
    let mut g = Graph::new();
    let x = input_f32(&mut g, 0, &[4]);
    input(&mut g, 1, DType::I32, &[Dim::sym("p"), Dim::Const(0)]);
    // A carrier of a symbol nothing reads: its shape is still checked.
    input(&mut g, 2, DType::I32, &[Dim::sym("q"), Dim::Const(0)]);
    let p = Dim::sym("p");
    let padding = vec![(p, Dim::Const(12) - p)];
    let y = g.add(Op::Pad(Pad { padding, value: Scalar::Float(0.0) }), &[x]).unwrap();
    g.add_output(y);
    g
}

#[test]
fn positions_that_are_only_offsets_share_one_plan() {
    let dev = CpuDevice::new().unwrap();
    let exe = dev.compile(&write_at_position()).unwrap();
    let x = HostTensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], vec![4]).unwrap();
    let carrier = |n: usize| HostTensor::new(HostData::I32(Vec::new()), vec![n, 0]).unwrap();
    let bind = |p: usize, q: usize| -> Bindings {
        [(Symbol::new("p"), p as i64), (Symbol::new("q"), q as i64)].into_iter().collect()
    };
    for p in 0..=12usize {
        let out = exe.run(&[x.clone(), carrier(p), carrier(p + 1)], &bind(p, p + 1)).unwrap();
        let mut want = [0.0f32; 16];
        want[p..p + 4].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(out[0].as_slice::<f32>().unwrap(), &want[..], "p = {p}");
    }
    // Sizes, memory plan and launches do not depend on `p`: planned once, not once per position.
    assert_eq!(exe.binding_sets_planned(), 1);
    // A binding set that differs only in `q` is another binding set (its shapes are checked
    // with its own `q`), still with the same plan.
    exe.run(&[x.clone(), carrier(2), carrier(7)], &bind(2, 7)).unwrap();
    assert_eq!(exe.binding_sets_planned(), 1);
    // The empty inputs' shapes are still checked against the bindings.
    assert!(exe.run(&[x.clone(), carrier(3), carrier(3)], &bind(2, 3)).is_err());
    assert!(exe.run(&[x, carrier(2), carrier(4)], &bind(2, 3)).is_err());
}

/// The tiered JIT: a program's first runs use the quick tier's kernels, later ones the optimised
/// kernels the background thread swaps in behind the same executable; both match the interpreter,
/// and an optimised-only device compiles the same number of kernels without tiering up.
#[test]
fn tiered_jit_swaps_kernels_under_a_running_executable() {
    let g = softmax_graph();
    let inputs = [tensor(&[5, 33], 4)];
    let tiered = CpuDevice::with_jit_mode(kiln_runtime::JitMode::Tiered).unwrap();
    check_with(&tiered, &g, &inputs, &Bindings::new(), 1e-5);
    // A program that ran once has asked for nothing; its second run asks.
    tiered.wait_tier_up();
    assert_eq!(tiered.stats().kernels_tiered_up, 0);
    check_with(&tiered, &g, &inputs, &Bindings::new(), 1e-5);
    tiered.wait_tier_up();
    let stats = tiered.stats();
    assert!(stats.kernels_compiled >= 2, "{stats:?}");
    // Every quick kernel, compiled or run natively, is swapped for optimised code.
    assert_eq!(stats.kernels_tiered_up, stats.kernels_compiled + stats.kernels_native, "{stats:?}");
    check_with(&tiered, &g, &inputs, &Bindings::new(), 1e-5);
    assert_eq!(tiered.stats().programs_compiled, 1, "the same executable ran every time");

    // A kernel big enough to be a calibration candidate (98,304 elements): its binding set is
    // part-way through calibrating on the quick code when the swap lands, and starts again on
    // the optimised code; every run matches the interpreter throughout.
    let mut big = Graph::new();
    let x = input_f32(&mut big, 0, &[96, 1024]);
    let e = big.add(Op::Unary(UnaryOp::Exp2), &[x]).unwrap();
    let y = big.add(Op::Binary(BinaryOp::Mul), &[e, x]).unwrap();
    big.add_output(y);
    let big_inputs = [tensor(&[96, 1024], 5)];
    let want = air::eval(&big, &big_inputs, &Bindings::new()).unwrap();
    let exe = tiered.compile(&big).unwrap();
    for run in 0..30 {
        if run == 3 {
            tiered.wait_tier_up();
        }
        let got = exe.run(&big_inputs, &Bindings::new()).unwrap();
        close(&got[0], &want[0], 1e-5).unwrap_or_else(|e| panic!("run {run}: {e}"));
    }
    assert_eq!(exe.launches_run(), 30);

    let optimized = CpuDevice::with_jit_mode(kiln_runtime::JitMode::Optimized).unwrap();
    check_with(&optimized, &g, &inputs, &Bindings::new(), 1e-5);
    optimized.wait_tier_up();
    let o = optimized.stats();
    // The same kernels, all compiled at once (none native).
    let quick = stats.kernels_compiled + stats.kernels_native;
    assert_eq!((o.kernels_compiled, o.kernels_native, o.kernels_tiered_up), (quick, 0, 0), "{o:?}");
}

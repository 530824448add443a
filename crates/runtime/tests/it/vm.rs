//! The VM on hand-written programs whose loop kernels are Rust functions with the codegen ABI:
//! pointer tables, zero-copy inputs and outputs, the arena, range splitting, matmul launches and
//! input validation, independent of the lowering and the code generator.

use std::sync::Arc;

use kiln_runtime as runtime;

use air::dim::shape_of;
use air::{Bindings, DType, Dim, HostData, HostTensor, Scalar, Symbol, TensorType, UnaryOp};
use lower::kir::{Access, IExpr, Inst, Kernel, LoopKernel, MatOperand, MatmulKernel, Param, Reg, Stmt, Var};
use lower::{BufId, BufferInfo, BufferKind, Program, Step};
use runtime::vm::KernelFn;
use runtime::{Executable, LoopCode, RuntimeError};

/// `b1[i] = -b0[i]` for `i in start..end` (f32).
unsafe extern "C" fn neg_f32(bufs: *const *mut u8, _syms: *const i64, start: i64, end: i64) {
    unsafe {
        let (x, y) = (*bufs as *const f32, *bufs.add(1) as *mut f32);
        for i in start..end {
            *y.offset(i as isize) = -*x.offset(i as isize);
        }
    }
}

fn neg_kernel(extent: IExpr, n_syms: u32) -> Kernel {
    let i = Var(0);
    Kernel::Loops(LoopKernel {
        params: vec![
            Param { dtype: DType::F32, access: Access::Read },
            Param { dtype: DType::F32, access: Access::Write },
        ],
        n_syms,
        body: vec![Stmt::Loop {
            var: i,
            extent,
            parallel: true,
            body: vec![
                Stmt::Let {
                    reg: Reg(0),
                    dtype: DType::F32,
                    inst: Inst::Load { buf: 0, index: IExpr::Var(i), mask: None, other: Scalar::Float(0.0) },
                },
                Stmt::Let { reg: Reg(1), dtype: DType::F32, inst: Inst::Unary(UnaryOp::Neg, Reg(0)) },
                Stmt::Store { buf: 1, index: IExpr::Var(i), value: Reg(1) },
            ],
        }],
    })
}

fn buf(dtype: DType, numel: Dim, kind: BufferKind) -> BufferInfo {
    BufferInfo { dtype, numel, kind }
}

/// `x -> neg -> t -> neg -> t2 -> neg -> out`, all with `n` elements (`n` may be symbolic).
fn neg_chain(n: Dim) -> (Program, Vec<Option<TensorType>>) {
    let (extent, symbols, n_syms) = match n.as_const() {
        Some(c) => (IExpr::Const(c), vec![], 0),
        None => (IExpr::Sym(0), vec![Symbol::new("n")], 1),
    };
    let ty = TensorType::new(DType::F32, vec![n]);
    let program = Program {
        symbols,
        kernels: vec![neg_kernel(extent, n_syms)],
        steps: vec![
            Step { kernel: 0, args: vec![BufId(0), BufId(1)] },
            Step { kernel: 0, args: vec![BufId(1), BufId(2)] },
            Step { kernel: 0, args: vec![BufId(2), BufId(3)] },
        ],
        inits: vec![],
        data_checks: vec![],
        buffers: vec![
            buf(DType::F32, n, BufferKind::Input(0)),
            buf(DType::F32, n, BufferKind::Temp),
            buf(DType::F32, n, BufferKind::Temp),
            buf(DType::F32, n, BufferKind::Output(0)),
        ],
        outputs: vec![(BufId(3), ty.clone())],
        checks: vec![],
    };
    (program, vec![Some(ty)])
}

fn exe(program: Program, inputs: Vec<Option<TensorType>>) -> Executable {
    exe_with(program, inputs, neg_f32)
}

fn exe_with(program: Program, inputs: Vec<Option<TensorType>>, kernel: KernelFn) -> Executable {
    let fns: Vec<Option<LoopCode>> =
        program.kernels.iter().map(|k| matches!(k, Kernel::Loops(_)).then_some(kernel.into())).collect();
    Executable::new(program, inputs, fns, Arc::new(())).unwrap()
}

fn f32s(t: &HostTensor) -> &[f32] {
    t.as_slice::<f32>().unwrap()
}

fn no_bindings() -> Bindings {
    Bindings::new()
}

#[test]
fn chain_reads_inputs_in_place_and_hands_outputs_back() {
    let (p, tys) = neg_chain(Dim::Const(5));
    let exe = exe(p, tys);
    let x = HostTensor::from_vec(vec![1f32, 2., 3., 4., 5.], vec![5]).unwrap();
    let before = Arc::strong_count(&x.data);
    let out = exe.run(std::slice::from_ref(&x), &no_bindings()).unwrap();
    assert_eq!(f32s(&out[0]), &[-1., -2., -3., -4., -5.]);
    assert_eq!(out[0].shape, vec![5]);
    let addrs = exe.last_buffer_addresses();
    // The kernel read the caller's Vec, not a copy.
    assert_eq!(addrs[0], f32s(&x).as_ptr() as usize);
    // The returned Vec is the memory the last kernel wrote, and it is the only reference.
    assert_eq!(addrs[3], f32s(&out[0]).as_ptr() as usize);
    assert_eq!(Arc::strong_count(&out[0].data), 1);
    let ptr = f32s(&out[0]).as_ptr();
    let v = out.into_iter().next().unwrap().into_vec::<f32>().unwrap();
    assert_eq!(v.as_ptr(), ptr, "taking the output back copies nothing");
    // Temporaries are in the 64-byte-aligned arena.
    assert_eq!(addrs[1] % 64, 0);
    assert_eq!(addrs[2] % 64, 0);
    // The input is released by refcount: the run kept no reference.
    assert_eq!(Arc::strong_count(&x.data), before);
    let weak = Arc::downgrade(&x.data);
    drop(x);
    assert!(weak.upgrade().is_none());
}

#[test]
fn arena_is_reused_across_runs_and_grows_for_bigger_bindings() {
    let (p, tys) = neg_chain(Dim::sym("n"));
    let exe = exe(p, tys);
    let run = |n: usize| {
        let x = HostTensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), vec![n]).unwrap();
        let b: Bindings = [(Symbol::new("n"), n as i64)].into_iter().collect();
        let out = exe.run(&[x], &b).unwrap();
        assert_eq!(f32s(&out[0]), (0..n).map(|i| -(i as f32)).collect::<Vec<_>>().as_slice());
        exe.last_buffer_addresses()[1]
    };
    let a = run(100);
    let cap = exe.arena_capacity();
    assert_eq!(run(50), a, "a smaller run reuses the arena");
    assert_eq!(run(100), a);
    assert_eq!(exe.arena_capacity(), cap);
    run(1000);
    assert!(exe.arena_capacity() >= 2 * 1000 * 4);
}

/// The ranges `neg_f32_split` was called with: only `large_kernels_split_their_range` uses that
/// kernel, so no concurrently running test adds to them.
static SPLIT_RANGES: std::sync::Mutex<Vec<(i64, i64)>> = std::sync::Mutex::new(Vec::new());

/// [`neg_f32`] that records each call's range in [`SPLIT_RANGES`].
unsafe extern "C" fn neg_f32_split(bufs: *const *mut u8, syms: *const i64, start: i64, end: i64) {
    SPLIT_RANGES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((start, end));
    // SAFETY: the caller keeps the kernel ABI's contract.
    unsafe { neg_f32(bufs, syms, start, end) }
}

#[test]
fn large_kernels_split_their_range() {
    let n = 1usize << 20;
    let (p, tys) = neg_chain(Dim::Const(n as i64));
    let exe = exe_with(p, tys, neg_f32_split);
    let x = HostTensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), vec![n]).unwrap();
    let out = exe.run(&[x], &no_bindings()).unwrap();
    let mut ranges = std::mem::take(&mut *SPLIT_RANGES.lock().unwrap());
    assert_eq!(f32s(&out[0]).iter().enumerate().filter(|&(i, &v)| v != -(i as f32)).count(), 0);
    // Three launches, each covering 0..n exactly once however it was cut.
    ranges.sort_unstable();
    let covered: i64 = ranges.iter().map(|(lo, hi)| hi - lo).sum();
    assert_eq!(covered, 3 * n as i64, "{ranges:?}");
    assert_eq!(ranges.iter().filter(|r| r.0 == 0).count(), 3, "{ranges:?}");
    let threads = runtime::parallel::threads();
    if threads > 1 {
        assert!(ranges.len() >= 6, "3 launches over {threads} threads made {} calls: {ranges:?}", ranges.len());
    }
}

#[test]
fn inputs_are_validated() {
    let (p, tys) = neg_chain(Dim::sym("n"));
    let exe = exe(p, tys);
    let b: Bindings = [(Symbol::new("n"), 3)].into_iter().collect();
    let x = HostTensor::from_vec(vec![1f32, 2., 3.], vec![3]).unwrap();
    assert!(matches!(exe.run(&[], &b), Err(RuntimeError::InputCount { expected: 1, got: 0 })));
    assert!(matches!(exe.run(std::slice::from_ref(&x), &no_bindings()), Err(RuntimeError::Unbound(_))));
    let wrong_len = HostTensor::from_vec(vec![1f32, 2.], vec![2]).unwrap();
    let e = exe.run(&[wrong_len], &b).unwrap_err();
    assert!(matches!(e, RuntimeError::InputMismatch { slot: 0, .. }), "{e}");
    assert!(e.to_string().contains("f32[n]"), "{e}");
    let wrong_dtype = HostTensor::from_vec(vec![1f64, 2., 3.], vec![3]).unwrap();
    assert!(exe.run(&[wrong_dtype], &b).is_err());
    // A tensor whose data does not fill its shape (fields are public) is refused, not read.
    let lying = HostTensor { data: Arc::new(HostData::F32(vec![1.0])), shape: vec![3] };
    assert!(exe.run(&[lying], &b).is_err());
    let negative: Bindings = [(Symbol::new("n"), -1)].into_iter().collect();
    assert!(matches!(exe.run(std::slice::from_ref(&x), &negative), Err(RuntimeError::BadSize(_))));
    assert_eq!(f32s(&exe.run(&[x], &b).unwrap()[0]), &[-1., -2., -3.]);
}

fn operand(buf: u32, offset: i64, batch: i64, row: i64, col: i64) -> MatOperand {
    MatOperand {
        buf,
        offset: IExpr::Const(offset),
        batch_stride: IExpr::Const(batch),
        row_stride: IExpr::Const(row),
        col_stride: IExpr::Const(col),
    }
}

/// A program of one matmul kernel over inputs `a` (numel `na`) and `b` (numel `nb`).
#[allow(clippy::too_many_arguments)]
fn matmul_program(
    dtype: DType,
    (batch, m, n, k): (i64, i64, i64, i64),
    a: MatOperand,
    b: MatOperand,
    na: i64,
    nb: i64,
) -> (Program, Vec<Option<TensorType>>) {
    let params = vec![
        Param { dtype, access: Access::Read },
        Param { dtype, access: Access::Read },
        Param { dtype, access: Access::Write },
    ];
    let kernel = Kernel::Matmul(MatmulKernel {
        params,
        n_syms: 0,
        dtype,
        batch: IExpr::Const(batch),
        m: IExpr::Const(m),
        n: IExpr::Const(n),
        k: IExpr::Const(k),
        a,
        b,
        c: operand(2, 0, m * n, n, 1),
        accumulate: false,
    });
    let out_ty = TensorType::new(dtype, shape_of(&[batch as usize, m as usize, n as usize]));
    let program = Program {
        symbols: vec![],
        kernels: vec![kernel],
        steps: vec![Step { kernel: 0, args: vec![BufId(0), BufId(1), BufId(2)] }],
        inits: vec![],
        data_checks: vec![],
        buffers: vec![
            buf(dtype, Dim::Const(na), BufferKind::Input(0)),
            buf(dtype, Dim::Const(nb), BufferKind::Input(1)),
            buf(dtype, Dim::Const(batch * m * n), BufferKind::Output(0)),
        ],
        outputs: vec![(BufId(2), out_ty)],
        checks: vec![],
    };
    let tys = vec![
        Some(TensorType::new(dtype, shape_of(&[na as usize]))),
        Some(TensorType::new(dtype, shape_of(&[nb as usize]))),
    ];
    (program, tys)
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) % 17) as f64 - 8.0
        })
        .collect()
}

/// `(batch, m, n, k)` matmuls with `a` plain or transposed and `b` row-major, column-major (a
/// transposed weight, `x @ W^T`), column-major and shared by every batch entry, or column-major
/// with padded columns, checked against a triple loop.
#[test]
fn matmul_launches_match_the_definition() {
    for dtype in [DType::F32, DType::F64, DType::I32, DType::I64, DType::F16] {
        for &(batch, m, n, k) in &[(1i64, 3i64, 5i64, 4i64), (3, 7, 2, 9), (2, 64, 80, 70), (3, 50, 130, 67)] {
            for transposed in [false, true] {
                for b_layout in 0..4 {
                    // b's logical (b, q, j) element lives at bi*bs + q*br + j*bc.
                    let (bs, br, bc, nb) = match b_layout {
                        0 => (k * n, n, 1, batch * k * n),
                        1 => (k * n, 1, k, batch * k * n),
                        2 => (0, 1, k, k * n),
                        _ => ((k + 3) * n, 1, k + 3, batch * (k + 3) * n),
                    };
                    let na = batch * m * k;
                    // a's logical (b, i, p) element lives at b*m*k + i*k + p, or (transposed) p*m + i.
                    let a_op = if transposed { operand(0, 0, m * k, 1, m) } else { operand(0, 0, m * k, k, 1) };
                    let (p, tys) = matmul_program(dtype, (batch, m, n, k), a_op, operand(1, 0, bs, br, bc), na, nb);
                    let exe = exe(p, tys);
                    let (av, bv) = (values(na as usize, 1), values(nb as usize, 2));
                    let tensor = |v: &[f64], dtype| {
                        let data = match dtype {
                            DType::F32 => HostData::F32(v.iter().map(|&x| x as f32).collect()),
                            DType::F64 => HostData::F64(v.to_vec()),
                            DType::I32 => HostData::I32(v.iter().map(|&x| x as i32).collect()),
                            DType::I64 => HostData::I64(v.iter().map(|&x| x as i64).collect()),
                            _ => HostData::F16(v.iter().map(|&x| half::f16::from_f64(x)).collect()),
                        };
                        HostTensor::new(data, vec![v.len()]).unwrap()
                    };
                    let out = exe.run(&[tensor(&av, dtype), tensor(&bv, dtype)], &no_bindings()).unwrap();
                    let got = out[0].data.to_f64_vec();
                    for bi in 0..batch {
                        for i in 0..m {
                            for j in 0..n {
                                let mut want = 0.0;
                                for q in 0..k {
                                    let ai = if transposed { bi * m * k + q * m + i } else { bi * m * k + i * k + q };
                                    want += av[ai as usize] * bv[(bi * bs + q * br + j * bc) as usize];
                                }
                                let g = got[(bi * m * n + i * n + j) as usize];
                                // Small integers: exact in every dtype except f16 sums past 2048.
                                let tol = if dtype == DType::F16 { want.abs() * 1e-3 + 1.0 } else { 0.0 };
                                assert!(
                                    (g - want).abs() <= tol,
                                    "{dtype} {batch}x{m}x{n}x{k} t={transposed} b={b_layout}: {g} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn out_of_bounds_matmul_is_refused() {
    // `b` claims 4 rows of stride 5 in a buffer of 12 elements.
    let (p, tys) = matmul_program(DType::F32, (1, 2, 5, 4), operand(0, 0, 8, 4, 1), operand(1, 0, 20, 5, 1), 8, 12);
    let exe = exe(p, tys);
    let a = HostTensor::from_vec(vec![0f32; 8], vec![8]).unwrap();
    let b = HostTensor::from_vec(vec![0f32; 12], vec![12]).unwrap();
    let e = exe.run(&[a, b], &no_bindings()).unwrap_err();
    assert!(matches!(e, RuntimeError::InvalidProgram(_)), "{e}");
}

#[test]
fn malformed_programs_are_refused() {
    let (mut p, tys) = neg_chain(Dim::Const(4));
    p.steps[0].args.pop();
    let fns = vec![Some(LoopCode::from(neg_f32 as KernelFn))];
    assert!(matches!(Executable::new(p, tys.clone(), fns.clone(), Arc::new(())), Err(RuntimeError::InvalidProgram(_))));
    let (mut p, _) = neg_chain(Dim::Const(4));
    p.steps[0].args[1] = BufId(0); // writes the input
    assert!(Executable::new(p, tys.clone(), fns.clone(), Arc::new(())).is_err());
    let (mut p, _) = neg_chain(Dim::Const(4));
    if let Kernel::Loops(k) = &mut p.kernels[0] {
        k.n_syms = 3; // reads symbols the program does not have
    }
    assert!(Executable::new(p, tys, fns, Arc::new(())).is_err());
}

/// A batched matmul small enough to be a calibration candidate (threaded or on one thread, decided
/// by timing over the first runs, and again in the later calibration windows) gives the
/// definition's result on every run, whichever way the calibration goes, with `b` row-major and
/// column-major.
#[test]
fn calibrated_matmul_launches_agree_on_every_run() {
    let (batch, m, n, k) = (4i64, 64i64, 80i64, 64i64);
    let (na, nb) = (batch * m * k, batch * k * n);
    for b_op in [operand(1, 0, k * n, n, 1), operand(1, 0, k * n, 1, k)] {
        let col_major = b_op.row_stride == IExpr::Const(1);
        let (p, tys) = matmul_program(DType::F32, (batch, m, n, k), operand(0, 0, m * k, k, 1), b_op, na, nb);
        let exe = exe(p, tys);
        let (av, bv) = (values(na as usize, 3), values(nb as usize, 4));
        let a = HostTensor::from_vec(av.iter().map(|&x| x as f32).collect(), vec![na as usize]).unwrap();
        let b = HostTensor::from_vec(bv.iter().map(|&x| x as f32).collect(), vec![nb as usize]).unwrap();
        let mut want = vec![0.0; (batch * m * n) as usize];
        for bi in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    want[(bi * m * n + i * n + j) as usize] = (0..k)
                        .map(|q| {
                            let bj = if col_major { bi * k * n + j * k + q } else { bi * k * n + q * n + j };
                            av[(bi * m * k + i * k + q) as usize] * bv[bj as usize]
                        })
                        .sum();
                }
            }
        }
        let runs = runtime::vm::CALIBRATE_AGAIN[0] + 2 * runtime::vm::CALIBRATION_RUNS + 2;
        for run in 0..runs {
            let out = exe.run(&[a.clone(), b.clone()], &no_bindings()).unwrap();
            assert_eq!(out[0].data.to_f64_vec(), want, "run {run}, b column-major: {col_major}");
        }
    }
}

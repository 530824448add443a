//! The backend seam holds: a third backend that only writes kernels and buffers (each step runs
//! through `lower::exec`, the reference kir executor, on host buffers) runs through the shared
//! `Runner` and matches `air::interp`, symbolic sizes, bounds and data errors included, with the
//! runtime's validation, sizing, shape checks, input checks and memory plan for free.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_runtime as runtime;

use air::dim::shape_of;
use air::op::{Gather, Input};
use air::{Bindings, DType, Dim, Graph, HostData, HostTensor, Op, TensorType};
use lower::kir::Access;
use lower::{BufId, BufferInfo, BufferKind, Program, Step};
use runtime::{Backend, BindingSet, ErrorKind, Prepared, Runner, RuntimeError, Sizes};

/// The third backend: a program's kir kernels, run one step at a time by `lower::exec`.
struct RefCode {
    /// The kernel of each step ("compiled": the kir itself).
    kernels: Vec<lower::kir::Kernel>,
    launched: AtomicUsize,
}

/// One host array per buffer (temps too: this backend has no arena), and the status words.
#[derive(Default)]
struct RefBuffers {
    bufs: Vec<HostData>,
}

impl RefCode {
    fn new(prepared: &Prepared) -> RefCode {
        let p = prepared.program();
        let kernels = p.steps.iter().map(|s| p.kernels[s.kernel as usize].clone()).collect();
        RefCode { kernels, launched: AtomicUsize::new(0) }
    }
}

fn zeros(dtype: DType, n: usize) -> runtime::Result<HostData> {
    runtime::memory::zeroed_host_data(dtype, n)
}

impl Backend for RefCode {
    const NAME: &'static str = "ref";
    const CONCURRENT_RUNS: bool = true;
    type Launches = ();
    type Buffers = RefBuffers;

    fn buffer_bytes(&self, program: &Program, buf: usize, numel: usize) -> runtime::Result<usize> {
        Ok(numel * program.buffers[buf].dtype.size_bytes())
    }

    fn size(&self, _: &Prepared, _: &Sizes) -> runtime::Result<()> {
        Ok(())
    }

    fn bind(
        &self,
        buffers: &mut RefBuffers,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        inputs: &[HostTensor],
    ) -> runtime::Result<()> {
        let p = prepared.program();
        buffers.bufs.clear();
        for (i, b) in p.buffers.iter().enumerate() {
            buffers.bufs.push(match b.kind {
                BufferKind::Input(slot) => (*inputs[slot as usize].data).clone(),
                _ => zeros(b.dtype, sized.sizes.buf_numel[i])?,
            });
        }
        Ok(())
    }

    unsafe fn launch(
        &self,
        buffers: &mut RefBuffers,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        step: usize,
    ) -> runtime::Result<()> {
        let p = prepared.program();
        let kernel = &self.kernels[step];
        let args = &p.steps[step].args;
        // The step alone, as a program of its own: every argument an input (its current
        // contents), every written one an output too.
        let mut one = Program {
            symbols: p.symbols.clone(),
            kernels: vec![kernel.clone()],
            steps: vec![Step { kernel: 0, args: (0..args.len() as u32).map(BufId).collect() }],
            buffers: Vec::new(),
            outputs: Vec::new(),
            inits: Vec::new(),
            checks: Vec::new(),
            data_checks: Vec::new(),
        };
        let mut inputs = Vec::new();
        for (i, (arg, param)) in args.iter().zip(kernel.params()).enumerate() {
            let n = sized.sizes.buf_numel[arg.0 as usize];
            let numel = Dim::Const(n as i64);
            one.buffers.push(BufferInfo { dtype: param.dtype, numel, kind: BufferKind::Input(i as u32) });
            if param.access == Access::Write {
                one.outputs.push((BufId(i as u32), TensorType::new(param.dtype, shape_of(&[n]))));
            }
            inputs.push(HostTensor { data: Arc::new(buffers.bufs[arg.0 as usize].clone()), shape: vec![n] });
        }
        let bindings: Bindings = p.symbols.iter().cloned().zip(sized.sizes.syms.iter().copied()).collect();
        let mut written = lower::exec::run(&one, &inputs, &bindings)?.into_iter();
        for (arg, param) in args.iter().zip(kernel.params()) {
            if param.access == Access::Write {
                let out = written.next().ok_or_else(|| RuntimeError::InvalidProgram("missing output".into()))?;
                buffers.bufs[arg.0 as usize] = (*out.data).clone();
            }
        }
        self.launched.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    unsafe fn finish(
        &self,
        buffers: &mut RefBuffers,
        prepared: &Prepared,
        sized: &BindingSet<Self>,
        _: &[HostTensor],
    ) -> runtime::Result<Vec<HostTensor>> {
        let p = prepared.program();
        if let Some(i) = p.buffers.iter().position(|b| b.kind == BufferKind::Status) {
            let HostData::I32(words) = &buffers.bufs[i] else {
                return Err(RuntimeError::InvalidProgram("the status buffer is not i32".into()));
            };
            prepared.check_status(words)?;
        }
        Ok(p.outputs
            .iter()
            .zip(sized.sizes.output_shapes.iter())
            .map(|((buf, _), shape)| HostTensor {
                data: Arc::new(buffers.bufs[buf.0 as usize].clone()),
                shape: shape.clone(),
            })
            .collect())
    }
}

fn on_ref(g: &Graph) -> Runner<RefCode> {
    let program = lower::compile(g, &lower::CompileOptions::default()).unwrap();
    let prepared = Prepared::new(program, air::GraphKey::of(g).input_types()).unwrap();
    let code = RefCode::new(&prepared);
    Runner::with_backend(prepared, code)
}

fn parse(text: &str) -> Graph {
    air::text::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn f32s(shape: &[usize], seed: u32) -> HostTensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> =
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 250.0 - 2.0).collect();
    HostTensor::from_vec(v, shape.to_vec()).unwrap()
}

fn check(g: &Graph, inputs: &[HostTensor], bindings: &Bindings) {
    let exe = on_ref(g);
    let got = exe.run(inputs, bindings).unwrap();
    let want = air::interp::eval(g, inputs, bindings).unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        air::testing::assert_host(&format!("output {i}"), g, w, air::testing::Tol::both(1e-5));
    }
    assert_eq!(exe.backend().launched.load(Ordering::Relaxed), exe.launches(), "every step ran on the third backend");
}

#[test]
fn softmax_and_matmul_match_the_interpreter() {
    let softmax = "graph {\n n0 = input 0 : f32[8, 50]\n n1 = reduce max axes=[1] n0 : f32[8, 1]\n n2 = expand [8, 50] n1 : f32[8, 50]\n n3 = sub n0, n2 : f32[8, 50]\n n4 = exp2 n3 : f32[8, 50]\n n5 = reduce sum axes=[1] n4 : f32[8, 1]\n n6 = expand [8, 50] n5 : f32[8, 50]\n n7 = recip n6 : f32[8, 50]\n n8 = mul n4, n7 : f32[8, 50]\n return n8\n}";
    check(&parse(softmax), &[f32s(&[8, 50], 1)], &Bindings::new());
    // A batched matmul plus a bias: a matmul kernel that accumulates into what a loop wrote.
    let matmul = "graph {\n na = input 0 : f32[2, 5, 7]\n n1 = input 1 : f32[2, 7, 3]\n n2 = reshape [2, 5, 1, 7] na : f32[2, 5, 1, 7]\n n3 = expand [2, 5, 3, 7] n2 : f32[2, 5, 3, 7]\n n4 = permute [0, 2, 1] n1 : f32[2, 3, 7]\n n5 = reshape [2, 1, 3, 7] n4 : f32[2, 1, 3, 7]\n n6 = expand [2, 5, 3, 7] n5 : f32[2, 5, 3, 7]\n n7 = mul n3, n6 : f32[2, 5, 3, 7]\n n8 = reduce sum axes=[3] n7 : f32[2, 5, 3, 1]\n n9 = reshape [2, 5, 3] n8 : f32[2, 5, 3]\n nb = input 2 : f32[2, 5, 3]\n nc = add n9, nb : f32[2, 5, 3]\n return nc\n}";
    let g = parse(matmul);
    let program = lower::compile(&g, &lower::CompileOptions::default()).unwrap();
    assert!(program.kernels.iter().any(|k| matches!(k, lower::kir::Kernel::Matmul(_))), "{program}");
    check(&g, &[f32s(&[2, 5, 7], 2), f32s(&[2, 7, 3], 3), f32s(&[2, 5, 3], 4)], &Bindings::new());
}

#[test]
fn symbolic_sizes_and_bounds_errors_come_from_the_shared_half() {
    let g = common::window();
    for (n, m) in [(10, 6), (7, 7), (3, 1)] {
        check(&g, &[f32s(&[n as usize], 5)], &common::bind(n, m));
    }
    // One runner, several binding sets: each sized and planned once.
    let exe = on_ref(&g);
    for (n, m) in [(10, 6), (12, 2), (10, 6)] {
        let out = exe.run(&[f32s(&[n as usize], 6)], &common::bind(n, m)).unwrap();
        assert_eq!(out[0].shape, vec![m as usize]);
    }
    // Past the end: the interpreter's error, as a bounds error, before any launch.
    let launched = exe.backend().launched.load(Ordering::Relaxed);
    let e = exe.run(&[f32s(&[4], 7)], &common::bind(4, 9)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Bounds, "{e}");
    let RuntimeError::Bounds(b) = &e else { panic!("expected a bounds error, got {e}") };
    match air::interp::eval(&g, &[f32s(&[4], 7)], &common::bind(4, 9)) {
        Err(air::AirError::Bounds(want)) => assert_eq!(b, &want),
        other => panic!("the interpreter accepted bindings the runtime refused: {other:?}"),
    }
    assert_eq!(exe.backend().launched.load(Ordering::Relaxed), launched);
    // Bad inputs are refused by the shared input check, with what was expected and given.
    let e = exe.run(&[], &common::bind(4, 2)).unwrap_err();
    assert!(matches!(e, RuntimeError::InputCount { expected: 1, got: 0 }), "{e}");
    let ints = HostTensor::from_vec(vec![1i32; 4], vec![4]).unwrap();
    match exe.run(&[ints], &common::bind(4, 2)).unwrap_err() {
        RuntimeError::InputMismatch { slot: 0, expected, got, .. } => {
            assert_eq!((expected.dtype, got.dtype), (DType::F32, DType::I32));
            assert_eq!((expected.shape, got.shape), (vec![4], vec![4]));
        }
        other => panic!("expected an input mismatch, got {other}"),
    }
}

#[test]
fn data_dependent_errors_reach_the_caller() {
    let mut g = Graph::new();
    let src = g.add_leaf(Op::Input(Input { slot: 0 }), TensorType::new(DType::F32, shape_of(&[4]))).unwrap();
    let index = g.add_leaf(Op::Input(Input { slot: 1 }), TensorType::new(DType::I32, shape_of(&[3]))).unwrap();
    let y = g.add(Op::Gather(Gather { axis: 0 }), &[src, index]).unwrap();
    g.add_output(y);
    let ok = HostTensor::from_vec(vec![3i32, 0, 1], vec![3]).unwrap();
    check(&g, &[f32s(&[4], 8), ok], &Bindings::new());
    let bad = HostTensor::from_vec(vec![0i32, 7, 1], vec![3]).unwrap();
    let inputs = [f32s(&[4], 8), bad];
    let e = on_ref(&g).run(&inputs, &Bindings::new()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Bounds, "{e}");
    let want = air::interp::eval(&g, &inputs, &Bindings::new()).unwrap_err();
    assert!(e.to_string().contains("index 7 out of range"), "{e} (interpreter: {want})");
    assert!(want.to_string().contains("index 7 out of range"), "{want}");
}

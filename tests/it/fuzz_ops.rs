//! Fuzzing the facade on stable Rust (proptest): random sequences of tensor ops with random, often
//! invalid, shapes, axes, sizes and dtypes, realized on the CPU device. No sequence may panic:
//! an invalid op is an error value that `realize` returns, and a valid program runs.
//!
//! CI replays a fixed number of cases (`PROPTEST_CASES`, default 256, with CI's fixed seed);
//! `scripts/fuzz.sh` runs many more. Inputs that once broke an invariant are kept below as
//! regression tests.

use kiln::{DType, Device, Tensor};
use proptest::prelude::*;

const DTYPES: [DType; 7] = [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool, DType::F16, DType::BF16];

/// One op of a random program: which op, which tensors of the pool it reads, and small integers
/// (axes, sizes, starts; often out of range or negative on purpose).
#[derive(Clone, Debug)]
struct Step {
    op: u8,
    a: usize,
    b: usize,
    args: [i64; 4],
    list: Vec<i64>,
}

fn step() -> impl Strategy<Value = Step> {
    (
        any::<u8>(),
        any::<usize>(),
        any::<usize>(),
        prop::array::uniform4(-6i64..9),
        prop::collection::vec(-3i64..7, 0..5),
    )
        .prop_map(|(op, a, b, args, list)| Step { op, a, b, args, list })
}

/// A source tensor of `dtype` with `shape` (each dim at most 6) and varied values.
fn source(dtype: DType, shape: &[usize], seed: u64, device: Device) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n as u64)
        .map(|i| {
            let r = (seed ^ i).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            (r % 17) as f64 - 8.0 + if r.is_multiple_of(5) { 0.5 } else { 0.0 }
        })
        .collect();
    Tensor::from_vec(values, shape).cast(dtype).to_device(device).expect("a source tensor")
}

fn usizes(list: &[i64]) -> Vec<usize> {
    list.iter().map(|&v| v.unsigned_abs() as usize % 7).collect()
}

/// `t` on `device`, or `t` itself when it cannot move (an error tensor carries its error).
fn on(t: Tensor, device: Device) -> Tensor {
    t.to_device(device).unwrap_or(t)
}

/// Applies one step to the pool (every result joins the pool, errors included).
fn apply(pool: &mut Vec<Tensor>, s: &Step) {
    let x = pool[s.a % pool.len()].clone();
    let y = pool[s.b % pool.len()].clone();
    let [p, q, r, t] = s.args;
    let dtype = DTYPES[p.unsigned_abs() as usize % DTYPES.len()];
    let out = match s.op % 30 {
        0 => match q.rem_euclid(8) {
            0 => x.neg(),
            1 => x.exp(),
            2 => x.log(),
            3 => x.sqrt(),
            4 => x.sin(),
            5 => x.sigmoid(),
            6 => x.abs(),
            _ => x.logical_not(),
        },
        1 => match q.rem_euclid(6) {
            0 => x.floor(),
            1 => x.erf(),
            2 => x.reciprocal(),
            3 => x.gelu(),
            4 => x.silu(),
            _ => x.tanh(),
        },
        2 => match q.rem_euclid(8) {
            0 => x.add(&y),
            1 => x.sub(&y),
            2 => x.mul(&y),
            3 => x.div(&y),
            4 => x.maximum(&y),
            5 => x.pow(&y),
            6 => x.remainder(&y),
            _ => x.fmod(&y),
        },
        3 => match q.rem_euclid(5) {
            0 => x.lt(&y),
            1 => x.eq(&y),
            2 => x.logical_and(&y),
            3 => x.add(r),
            _ => x.div(r as f64 * 0.5),
        },
        4 => x.where_cond(&y, t),
        5 => x.reshape(&s.list),
        6 => x.permute(&s.list),
        7 => x.transpose(q, r),
        8 => x.expand(&s.list),
        9 => x.squeeze(q),
        10 => x.unsqueeze(q),
        11 => x.flatten(q, r),
        12 => x.narrow(q, r, t),
        13 => x.slice(q, r as isize, t as isize),
        14 => {
            let pads: Vec<(usize, usize)> =
                usizes(&s.list).chunks(2).map(|c| (c[0], *c.get(1).unwrap_or(&0))).collect();
            x.pad(&pads, t)
        }
        15 => match r.rem_euclid(4) {
            0 if t > 0 => x.sum_keepdim(&s.list),
            0 => x.sum(&s.list),
            1 if t > 0 => x.max_keepdim(&s.list),
            1 => x.max(&s.list),
            2 if t > 0 => x.min_keepdim(q),
            2 => x.min(q),
            _ if t > 0 => x.mean_keepdim(&s.list),
            _ => x.mean(&s.list),
        },
        16 => match r.rem_euclid(3) {
            0 => x.softmax(q),
            1 => x.log_softmax(q),
            _ if t > 0 => x.logsumexp_keepdim(&s.list),
            _ => x.logsumexp(&s.list),
        },
        17 => match (r > 0, t > 0) {
            (true, true) => x.argmax_keepdim(q),
            (true, false) => x.argmax(q),
            (false, true) => x.argmin_keepdim(q),
            (false, false) => x.argmin(q),
        },
        18 => x.matmul(&y),
        19 => kiln::cat(&[&x, &y], q),
        20 => kiln::stack(&[&x, &y], q),
        21 => x.gather(q, &y),
        22 => x.index_select(q, &y),
        23 => x.one_hot(r),
        24 => x.cast(dtype),
        25 => x.clamp(q, r),
        // A source made on the default device moves to the pool's (an invalid one keeps its error).
        26 => on(Tensor::arange(q, r, t), x.device()),
        27 => on(Tensor::full(usizes(&s.list), t, dtype), x.device()),
        28 => x.sum_all().add(y.mean_all()),
        _ => match kiln::grad(&x.sum_all(), &[&y]) {
            Ok(mut grads) => grads.remove(0),
            Err(_) => x.contiguous(),
        },
    };
    pool.push(out);
}

/// Builds and realizes one random program: sources, steps, then every tensor of the pool. Returns
/// how many realized without an error.
fn run(device: Device, sources: &[(usize, Vec<usize>)], steps: &[Step]) -> usize {
    let mut pool: Vec<Tensor> = sources
        .iter()
        .enumerate()
        .map(|(i, (d, shape))| source(DTYPES[d % DTYPES.len()], shape, i as u64, device))
        .collect();
    for s in steps {
        apply(&mut pool, s);
    }
    // Some at once (one program), then each on its own.
    let last: Vec<&Tensor> = pool.iter().rev().take(3).collect();
    let _ = kiln::realize(&last);
    pool.iter().filter(|t| t.realize().is_ok()).count()
}

/// The bits of every tensor's values (`None` for an error): what two runs of one program must
/// agree on.
fn outcomes(tensors: &[Tensor]) -> Vec<Option<Vec<u8>>> {
    tensors.iter().map(|t| t.to_host().ok().map(|h| h.data.as_bytes().to_vec())).collect()
}

/// One random program as a function of its sources, called through a `kiln::Recorder` with
/// sources of other values (the same shapes and dtypes) four times: each call's last three
/// error-free tensors hold what running the program directly gives, bit for bit (an error at
/// realize included), and so do their gradients with respect to the first float source.
fn run_recorded(sources: &[(usize, Vec<usize>)], steps: &[Step]) -> Result<(), TestCaseError> {
    let recorder = kiln::Recorder::new();
    let program = |args: &[Tensor]| {
        let mut pool: Vec<Tensor> = args.to_vec();
        for s in steps {
            apply(&mut pool, s);
        }
        // The last three that are not error tensors (an error output is never recorded).
        pool.iter().rev().filter(|t| t.error().is_none()).take(3).cloned().collect::<Vec<Tensor>>()
    };
    for call in 0..4u64 {
        let args: Vec<Tensor> = sources
            .iter()
            .enumerate()
            .map(|(i, (d, shape))| source(DTYPES[d % DTYPES.len()], shape, 100 * call + i as u64, Device::Cpu))
            .collect();
        let refs: Vec<&Tensor> = args.iter().collect();
        let recorded = recorder.call(&refs, program).expect("a recorded call of tensors");
        let direct = program(&args);
        // Gradients through a call (autodiff replays the recording) are the direct program's too.
        let grads = |outputs: &[Tensor]| -> Vec<Tensor> {
            let Some(wrt) = args.iter().find(|a| a.dtype().is_float()) else { return Vec::new() };
            outputs
                .iter()
                .filter(|o| o.dtype().is_float())
                .map(|o| match kiln::grad(&o.sum_all(), &[wrt]) {
                    Ok(mut g) => g.remove(0),
                    Err(e) => Tensor::op_error("grad", e.to_string()),
                })
                .collect()
        };
        let (g_recorded, g_direct) = (grads(&recorded), grads(&direct));
        prop_assert_eq!(outcomes(&recorded), outcomes(&direct), "call {}", call);
        prop_assert_eq!(outcomes(&g_recorded), outcomes(&g_direct), "gradients, call {}", call);
    }
    Ok(())
}

fn sources() -> impl Strategy<Value = Vec<(usize, Vec<usize>)>> {
    prop::collection::vec((0usize..7, prop::collection::vec(0usize..5, 0..4)), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig { max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_op_sequences_never_panic(
        sources in sources(),
        steps in prop::collection::vec(step(), 1..12),
    ) {
        let ok = run(Device::Cpu, &sources, &steps);
        prop_assert!(ok >= 1, "the sources themselves realize");
    }

    #[test]
    fn random_programs_called_as_recordings_give_their_own_results(
        sources in sources(),
        steps in prop::collection::vec(step(), 1..10),
    ) {
        run_recorded(&sources, &steps)?;
    }

    #[test]
    fn random_op_sequences_never_panic_on_the_interpreter(
        sources in sources(),
        steps in prop::collection::vec(step(), 1..8),
    ) {
        run(Device::Interp, &sources, &steps);
    }
}

#[test]
fn a_failed_product_of_a_vector_is_an_error_not_a_panic() {
    // Found by `random_op_sequences_never_panic_on_the_interpreter`: a product of a 1-D operand
    // whose result is an error tensor (no dims) underflowed dropping the vector's dim.
    let step = |op: u8, a: usize, b: usize, args: [i64; 4]| Step { op, a, b, args, list: vec![] };
    let steps = [
        step(41, 0, 0, [0, 0, -3, 0]),
        step(0, 0, 0, [0; 4]),
        step(176, 15343414938848455242, 0, [0, 0, 0, -1]),
        step(0, 0, 0, [0; 4]),
        step(168, 4188179574563482984, 1852641955149651557, [0; 4]),
    ];
    for device in [Device::Interp, Device::Cpu] {
        run(device, &[(0, vec![0, 2]), (0, vec![0])], &steps);
    }
}

#[test]
fn a_sum_over_an_empty_input_reads_nothing() {
    // Found by `random_op_sequences_never_panic` (a SIGSEGV): the load of `one_hot`'s index
    // over an empty input was hoisted out of the reduce loop of extent 0 (its index folded to a
    // constant) and read an empty buffer. Replayed, and the shapes it stands for checked against
    // their values on every device.
    let step = |op: u8, a: usize, b: usize, args: [i64; 4], list: Vec<i64>| Step { op, a, b, args, list };
    let steps = [
        step(23, 17735371286811185032, 16362700926662585245, [-1, -2, 5, 8], vec![-2, 4]),
        step(24, 7124519297294924613, 17340443733546995987, [-3, -6, 2, -6], vec![2, -2, 6]),
        step(59, 6292799606935103236, 17557474643120916915, [-6, 3, -4, 7], vec![1, 2, 0, 5]),
        step(76, 7293592058540295910, 13605026417363047651, [-6, -1, 3, -1], vec![4]),
        step(88, 1976196786219766586, 1706033649423543420, [4, 3, 4, 1], vec![-2]),
    ];
    for device in [Device::Interp, Device::Cpu] {
        for _ in 0..20 {
            run(device, &[(3, vec![0, 1]), (4, vec![0, 3, 0])], &steps);
            let x = source(DType::I64, &[0, 1], 0, device);
            assert_eq!(x.one_hot(5).sum_all().to_vec::<i64>().unwrap(), vec![0], "{device}");
            // An empty reduced axis under non-empty outer ones, and an empty outer one.
            let y = source(DType::F32, &[3, 0], 1, device);
            let bias = source(DType::F32, &[3], 2, device);
            let want: Vec<f32> = bias.to_vec::<f32>().unwrap();
            assert_eq!(y.sum(&[1]).add(&bias).to_vec::<f32>().unwrap(), want, "{device}");
            let z = source(DType::F32, &[0, 1], 3, device).expand(&[0, 4]);
            assert_eq!(z.sum(&[1]).to_vec::<f32>().unwrap(), Vec::<f32>::new(), "{device}");
        }
    }
}

#[test]
fn recorded_and_direct_programs_agree_on_half_composites_and_folded_transcendentals() {
    // Found by `random_programs_called_as_recordings_give_their_own_results`. Each source is a
    // scalar `f32`; the direct program sees it as a constant, the recording as a parameter.
    let step = |op: u8, a: usize, args: [i64; 4]| Step { op, a, b: 0, args, list: vec![] };
    // `tanh` of a bf16 cast: its steps rounded to bf16 where the graph was folded or split into
    // kernels, and not where one kernel computed them (0x3F80 against 0x3F7F).
    run_recorded(&[(0, vec![])], &[step(117, 0, [-6, 0, 0, 3]), step(151, 3238572392533664149, [0, -1, 0, 0])])
        .unwrap();
    // `sigmoid` of a constant `-6`: folded with `libm`'s `exp2` directly, computed with the CPU
    // kernel's approximation in the recording (an ulp apart).
    let steps = [
        step(57, 0, [2, 0, 0, -6]),
        step(0, 0, [0; 4]),
        step(94, 0, [0; 4]),
        step(162, 0, [0; 4]),
        step(30, 15988273428126641551, [0, -3, 0, 0]),
    ];
    run_recorded(&[(0, vec![])], &steps).unwrap();
}

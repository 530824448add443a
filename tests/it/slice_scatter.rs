//! `Tensor::slice_scatter` at a symbolic position: values against a host reference on every
//! device, the in-place update of a donated argument (`JitCache::call_owned`: same array, only
//! the new rows written; or a state array, `JitCache::call_with_state`, taken and put back), a
//! shared argument left unchanged, one trace for every position (given as a symbol tensor or as
//! a symbol's value), and a range past the end reported as an error.

use crate::support;

use support::{data_ptr, devices};

use std::sync::Arc;

use kiln::{Device, Dim, Tensor, jit};

const ROWS: usize = 6;
const COLS: usize = 3;

/// `cache[pos..pos + new.rows] = new`, then the sum of each row of the filled prefix.
fn step(a: &[Tensor]) -> Vec<Tensor> {
    let (cache, new, pos) = (&a[0], &a[1], a[2].shape()[0]);
    let updated = cache.slice_scatter(new, 0, pos);
    let filled = pos + new.shape()[0];
    let sums = updated.narrow(0, 0, filled).sum(&[1]);
    vec![updated, sums]
}

fn rows(n: usize, seed: f32) -> Vec<f32> {
    (0..n * COLS).map(|i| (i as f32 * 0.7 + seed).sin()).collect()
}

#[test]
fn a_cache_filled_step_by_step_matches_the_host_reference_and_is_updated_in_place() {
    for device in devices() {
        let mut f = jit(step);
        let mut cache = Tensor::zeros_on(&[ROWS, COLS], kiln::DType::F32, device);
        let mut reference = vec![0.0f32; ROWS * COLS];
        let mut pos = 0;
        // A prefill of 3 rows, then steps of 1: two traces (the row count of `new` is constant
        // per trace; the position is a symbol).
        for (i, n) in [3usize, 1, 1, 1].into_iter().enumerate() {
            let new_rows = rows(n, i as f32);
            reference[pos * COLS..(pos + n) * COLS].copy_from_slice(&new_rows);
            let new = Tensor::from_vec_on(new_rows, &[n, COLS], device);
            let before = data_ptr(&cache);
            let out = f.call_owned(vec![cache, new, Tensor::symbol("pos", pos).to_device(device).unwrap()]).unwrap();
            pos += n;
            cache = out[0].clone();
            assert_eq!(cache.to_vec::<f32>().unwrap(), reference, "{device} step {i}");
            let want: Vec<f32> = reference[..pos * COLS].chunks(COLS).map(|r| r.iter().sum()).collect();
            let got = out[1].to_vec::<f32>().unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{device} step {i}: {got:?} vs {want:?}");
            }
            if device == Device::Cpu && i > 0 {
                // The argument was given up: its array is the output's.
                assert_eq!(data_ptr(&cache), before, "{device} step {i}: the cache was copied");
            }
            drop(out);
        }
        assert_eq!(f.traces(), 2, "{device}");
    }
}

#[test]
fn a_shared_argument_is_copied_not_overwritten() {
    for device in devices() {
        let mut f = jit(step);
        let cache = Tensor::from_vec_on(rows(ROWS, 9.0), &[ROWS, COLS], device);
        let original = cache.to_vec::<f32>().unwrap();
        let new = Tensor::from_vec_on(rows(2, 1.0), &[2, COLS], device);
        let out = f
            .call_owned(vec![cache.clone(), new.clone(), Tensor::symbol("pos", 1).to_device(device).unwrap()])
            .unwrap();
        assert_eq!(cache.to_vec::<f32>().unwrap(), original, "{device}: the caller's tensor changed");
        let want = cache.slice_scatter(&new, 0, 1).to_vec::<f32>().unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), want, "{device}");
        // The borrowed form never takes the argument's array either.
        let out = f.call(&[&cache, &new, &Tensor::symbol("pos", 4).to_device(device).unwrap()]).unwrap();
        assert_eq!(cache.to_vec::<f32>().unwrap(), original, "{device}");
        assert_eq!(out[0].to_vec::<f32>().unwrap(), cache.slice_scatter(&new, 0, 4).to_vec::<f32>().unwrap());
    }
}

#[test]
fn a_position_past_the_end_is_an_error() {
    for device in devices() {
        let mut f = jit(step);
        let cache = Tensor::zeros_on(&[ROWS, COLS], kiln::DType::F32, device);
        let new = Tensor::from_vec_on(rows(2, 0.0), &[2, COLS], device);
        f.call(&[&cache, &new, &Tensor::symbol("pos", 4).to_device(device).unwrap()]).unwrap();
        let e = f.call(&[&cache, &new, &Tensor::symbol("pos", 5).to_device(device).unwrap()]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("slice_scatter") && msg.contains("pos") && msg.contains("slice_scatter.rs"),
            "{device}: {msg}"
        );
    }
}

#[test]
fn eager_slice_scatter_checks_its_arguments() {
    let cache = Tensor::zeros(&[4, 3], kiln::DType::F32);
    let e = cache.slice_scatter(&Tensor::zeros(&[2, 3], kiln::DType::F32), 0, 3).to_vec::<f32>().unwrap_err();
    assert!(e.to_string().contains("out of bounds"), "{e}");
    let e = cache.slice_scatter(&Tensor::zeros(&[2, 2], kiln::DType::F32), 0, 0).to_vec::<f32>().unwrap_err();
    assert!(e.to_string().contains("differs"), "{e}");
    let e = cache.slice_scatter(&Tensor::zeros(&[1, 3], kiln::DType::F64), 0, 0).to_vec::<f32>().unwrap_err();
    assert!(e.to_string().contains("f64"), "{e}");
    let got = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4])
        .slice_scatter(&Tensor::from_vec(vec![9.0f32, 8.0], &[2]), 0, Dim::Const(1))
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(got, vec![1.0, 9.0, 8.0, 4.0]);
}

/// The lowered program of `outputs` on the CPU: (inits, launches).
fn lowered(outputs: &[&Tensor]) -> (usize, usize) {
    let program = kiln::trace(outputs).unwrap();
    let exe = kiln::backend::cpu_device().unwrap().compile(&program.graph).unwrap();
    (exe.program().inits.len(), exe.program().steps.len())
}

#[test]
fn the_update_is_lowered_in_place_only_when_nothing_else_reads_the_base() {
    let cache = Tensor::zeros(&[ROWS, COLS], kiln::DType::F32);
    cache.realize().unwrap();
    let new = Tensor::from_vec(rows(1, 0.0), &[1, COLS]);
    let pos = Tensor::symbol("pos", 2);
    let at = pos.shape()[0];
    // Only the new row is written: one launch, the base's storage given to the output.
    assert_eq!(lowered(&[&cache.slice_scatter(&new, 0, at)]), (1, 1));
    // The base is read by another output too: no in-place update, every piece copied.
    let (inits, launches) = lowered(&[&cache.slice_scatter(&new, 0, at), &cache.sum_all()]);
    assert_eq!(inits, 0);
    assert!(launches >= 3, "{launches} launches");
    // The base is itself an output: no in-place update.
    assert_eq!(lowered(&[&cache.slice_scatter(&new, 0, at), &cache]).0, 0);
    // A computed base is not an input: no in-place update.
    assert_eq!(lowered(&[&cache.add(1.0f32).slice_scatter(&new, 0, at)]).0, 0);
}

#[test]
fn an_argument_first_shared_then_given_up_is_updated_in_place() {
    // The first call sees a shared cache (copied; the call keeps a handle to bind it faster next
    // time); the second is given the last outside handle and must still take the array.
    let device = Device::Cpu;
    let mut f = jit(step);
    let cache = Tensor::from_vec_on(rows(ROWS, 3.0), &[ROWS, COLS], device);
    let new = Tensor::from_vec_on(rows(1, 1.0), &[1, COLS], device);
    let pos = |p: usize| Tensor::symbol("pos", p).to_device(device).unwrap();
    let out = f.call_owned(vec![cache.clone(), new.clone(), pos(1)]).unwrap();
    assert_ne!(data_ptr(&out[0]), data_ptr(&cache), "a shared argument is copied");
    drop(out);
    let want = cache.slice_scatter(&new, 0, 2).to_vec::<f32>().unwrap();
    let before = data_ptr(&cache);
    let out = f.call_owned(vec![cache, new, pos(2)]).unwrap();
    assert_eq!(data_ptr(&out[0]), before, "the given-up argument was copied");
    assert_eq!(out[0].to_vec::<f32>().unwrap(), want);
}

#[test]
fn an_array_updated_in_place_comes_back_as_the_very_array_given() {
    // The program's run hands an array written in place back as the `Arc` it was given (so that
    // `kiln::jit` can refill the argument's handle with it), and copies one still shared
    // elsewhere, leaving that one unwritten. (A new `Arc` around the same elements may land at
    // the freed one's address, so this cannot tell a rewrapped array from the same one; the
    // copy it does tell.)
    let cache = Tensor::from_vec(rows(ROWS, 2.0), &[ROWS, COLS]);
    let new = Tensor::from_vec(rows(1, 0.0), &[1, COLS]);
    let pos = Tensor::symbol("pos", 2);
    let updated = cache.slice_scatter(&new, 0, pos.shape()[0]);
    let program = kiln::trace(&[&updated]).unwrap();
    let exe = kiln::backend::cpu_device().unwrap().compile(&program.graph).unwrap();
    assert_eq!(exe.program().inits.len(), 1);
    let slot = program.inputs.iter().position(|h| h.shape == [ROWS, COLS]).unwrap();
    let mut want = rows(ROWS, 2.0);
    want[2 * COLS..3 * COLS].copy_from_slice(&rows(1, 0.0));
    for shared in [false, true] {
        let mut inputs = program.inputs.clone();
        // An array of the caller's alone (the trace's inputs share `cache`'s).
        inputs[slot].data = Arc::new(inputs[slot].data.as_ref().clone());
        let given = Arc::as_ptr(&inputs[slot].data);
        let given_shape = inputs[slot].shape.as_ptr();
        let elsewhere = shared.then(|| inputs[slot].data.clone());
        let out = exe.run_taking(&mut inputs, &pos.bindings(), Vec::new()).unwrap();
        assert_eq!(std::ptr::eq(Arc::as_ptr(&out[0].data), given), !shared, "shared elsewhere: {shared}");
        // The output's shape is the input's own allocation, handed on (no allocation per run).
        assert_eq!(out[0].shape, [ROWS, COLS]);
        assert_eq!(out[0].shape.as_ptr(), given_shape, "shared elsewhere: {shared}");
        assert_eq!(out[0].data.to_f64_vec(), want.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
        if let Some(array) = elsewhere {
            assert_eq!(array.to_f64_vec(), program.inputs[slot].data.to_f64_vec(), "a shared array was written");
        }
    }
}

#[test]
fn a_state_array_at_a_symbol_position_is_updated_in_place_with_one_trace() {
    // `JitCache::call_with_state`: the cache is a host array the call takes and puts back, and
    // the closure names the position itself (each call binds its value, no tensor made).
    for device in devices() {
        let pos = Dim::sym("pos");
        let symbol = pos.as_symbol().unwrap().clone();
        // Arguments: the new row, then the cache; outputs: the filled rows' sums, then the cache.
        let write = |a: &[Tensor]| {
            let updated = a[1].slice_scatter(&a[0], 0, pos);
            vec![updated.narrow(0, 0, pos + 1).sum(&[1]), updated]
        };
        let mut f = kiln::JitCache::new();
        let zeros = kiln::HostData::filled(kiln::DType::F32, ROWS * COLS, kiln::Scalar::Int(0));
        let mut state = vec![kiln::HostTensor::new(zeros, vec![ROWS, COLS]).unwrap()];
        let mut reference = [0.0f32; ROWS * COLS];
        for p in 0..ROWS {
            let new_rows = rows(1, p as f32);
            reference[p * COLS..(p + 1) * COLS].copy_from_slice(&new_rows);
            let new = Tensor::from_vec_on(new_rows, &[1, COLS], device);
            let before = Arc::as_ptr(&state[0].data);
            let out = f.call_with_state(vec![new], &mut state, &[], &[(symbol.clone(), p as i64)], write).unwrap();
            assert_eq!(out.len(), 1, "{device}: the state's outputs are not returned");
            assert_eq!(state[0].shape, [ROWS, COLS]);
            assert_eq!(state[0].data.to_f64_vec(), reference.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
            let want: Vec<f32> = reference[..(p + 1) * COLS].chunks(COLS).map(|r| r.iter().sum()).collect();
            let got = out[0].to_vec::<f32>().unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{device} position {p}: {got:?} vs {want:?}");
            }
            if device == Device::Cpu {
                assert_eq!(Arc::as_ptr(&state[0].data), before, "{device} position {p}: the cache was copied");
            }
        }
        assert_eq!(f.traces(), 1, "{device}");
        // A tensor sharing the array (held by the caller) is not written under it: a copy is.
        let held = Tensor::from_host_on(state[0].clone(), device);
        let seen = held.to_vec::<f32>().unwrap();
        let new = Tensor::from_vec_on(rows(1, 9.0), &[1, COLS], device);
        f.call_with_state(vec![new], &mut state, &[], &[(symbol.clone(), 0)], write).unwrap();
        assert_eq!(held.to_vec::<f32>().unwrap(), seen, "{device}: a shared array was written");
        assert_eq!(state[0].data.to_f64_vec()[..COLS], rows(1, 9.0).iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
        // Past the end: an error naming the op, not a write out of bounds.
        let new = Tensor::from_vec_on(rows(1, 0.0), &[1, COLS], device);
        let e = f.call_with_state(vec![new.clone()], &mut state, &[], &[(symbol.clone(), ROWS as i64)], write);
        let msg = e.unwrap_err().to_string();
        assert!(msg.contains("slice_scatter") && msg.contains("pos"), "{device}: {msg}");
        // A value that contradicts the one an argument binds: an error.
        let zeros = kiln::HostData::filled(kiln::DType::F32, ROWS * COLS, kiln::Scalar::Int(0));
        let mut state = vec![kiln::HostTensor::new(zeros, vec![ROWS, COLS]).unwrap()];
        let marker = Tensor::from_vec_on(vec![0i32; 2], &[2], device).with_dims(vec![pos]);
        let e = f
            .call_with_state(vec![new.clone(), marker], &mut state, &[], &[(symbol.clone(), 3)], |a: &[Tensor]| {
                vec![a[2].slice_scatter(&a[0], 0, pos)]
            })
            .unwrap_err();
        assert!(e.to_string().contains("`pos` is bound to both 3 and 2"), "{device}: {e}");
        // A new value of another type than its state array's: an error at the trace.
        let zeros = kiln::HostData::filled(kiln::DType::F32, ROWS * COLS, kiln::Scalar::Int(0));
        let mut state = vec![kiln::HostTensor::new(zeros, vec![ROWS, COLS]).unwrap()];
        let e = kiln::JitCache::new()
            .call_with_state(vec![new], &mut state, &[], &[], |a: &[Tensor]| vec![a[1].narrow(0, 0, 2)])
            .unwrap_err();
        assert!(e.to_string().contains("state array 0"), "{device}: {e}");
    }
}

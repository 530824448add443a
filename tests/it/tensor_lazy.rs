//! Laziness, caching of realized data, zero-copy host data and symbolic dims.

use std::sync::Arc;

use kiln::prelude::*;
use kiln::{HostTensor, stats};

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape)
}

#[test]
fn building_computes_nothing() {
    let before = stats::graphs_executed();
    let x = t(&[1.0, 2.0, 3.0], &[3]);
    let y = (&x * 2.0).exp().sum(&[0]);
    let z = y.add(1.0).unsqueeze(0).matmul(&x.unsqueeze(0));
    assert!(!y.is_realized());
    assert!(!z.is_realized());
    z.check().unwrap();
    let _ = z.graph_text().unwrap();
    let _ = kiln::trace(&[&z, &y]).unwrap();
    assert_eq!(stats::graphs_executed(), before);
    assert!(x.is_realized(), "a source tensor holds data from the start");
}

#[test]
fn realize_once_then_reuse() {
    let x = t(&[1.0, 2.0], &[2]);
    let y = x.exp().mul(3.0);
    let start = stats::graphs_executed();
    y.realize().unwrap();
    assert!(y.is_realized());
    assert_eq!(stats::graphs_executed(), start + 1);
    y.realize().unwrap();
    let first = y.to_vec::<f32>().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), first);
    kiln::realize(&[&y, &y]).unwrap();
    assert_eq!(stats::graphs_executed(), start + 1, "a realized tensor is never recomputed");

    // A later program reads the realized tensor as an input instead of recomputing it.
    let z = y.add(1.0);
    let text = z.graph_text().unwrap();
    assert!(!text.contains("exp2"), "{text}");
    assert_eq!(text.matches("input").count(), 1, "{text}");
    z.realize().unwrap();
    assert_eq!(stats::graphs_executed(), start + 2);
}

#[test]
fn one_graph_for_many_outputs_and_shared_nodes() {
    let x = t(&[0.5, 1.5], &[2]);
    let shared = x.sin();
    let a = &shared + &shared;
    let b = shared.mul(&shared);
    let program = kiln::trace(&[&a, &b]).unwrap();
    let sins = program.graph.iter().filter(|(_, n)| n.op.mnemonic() == "sin").count();
    assert_eq!(sins, 1, "a shared subexpression is one air node");
    assert_eq!(program.graph.outputs().len(), 2);
    assert_eq!(program.inputs.len(), 1);

    let start = stats::graphs_executed();
    kiln::realize(&[&a, &b]).unwrap();
    assert_eq!(stats::graphs_executed(), start + 1);
    assert!(a.is_realized() && b.is_realized());
    assert!(!shared.is_realized(), "intermediates are not kept");
    let s = [0.5f32.sin(), 1.5f32.sin()];
    let got = a.to_vec::<f32>().unwrap();
    assert!((got[0] - 2.0 * s[0]).abs() < 1e-6 && (got[1] - 2.0 * s[1]).abs() < 1e-6);
}

#[test]
fn inputs_are_numbered_left_to_right() {
    let a = t(&[1.0], &[1]);
    let b = t(&[2.0], &[1]);
    let program = kiln::trace(&[&(&a - &b)]).unwrap();
    assert_eq!(program.inputs[0].as_slice::<f32>().unwrap(), &[1.0]);
    assert_eq!(program.inputs[1].as_slice::<f32>().unwrap(), &[2.0]);
}

#[test]
fn from_vec_into_vec_is_zero_copy() {
    let v: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let ptr = v.as_ptr();
    let x = Tensor::from_vec(v, &[10, 100]);
    let back = x.into_vec::<f32>().unwrap();
    assert_eq!(back.as_ptr(), ptr, "the same allocation comes back");
    assert_eq!(back[999], 999.0);

    // Shared handles copy instead, and leave the tensor intact.
    let v: Vec<i64> = vec![1, 2, 3];
    let ptr = v.as_ptr();
    let x = Tensor::from_vec(v, &[3]);
    let y = x.clone();
    let copy = y.into_vec::<i64>().unwrap();
    assert_ne!(copy.as_ptr(), ptr);
    assert_eq!(x.to_vec::<i64>().unwrap(), vec![1, 2, 3]);

    // A computed result can be taken out without a copy too.
    let r = x.mul(2).into_vec::<i64>().unwrap();
    assert_eq!(r, vec![2, 4, 6]);
}

#[test]
fn host_data_is_shared_and_released() {
    let host = HostTensor::from_vec(vec![1.0f32, 2.0, 3.0], vec![3]).unwrap();
    let x = Tensor::from_host(host.clone());
    assert_eq!(Arc::strong_count(&host.data), 2);
    assert!(Arc::ptr_eq(&x.to_host().unwrap().data, &host.data));
    let y = x.exp();
    drop(x);
    assert_eq!(Arc::strong_count(&host.data), 2, "the lazy node still needs its input");
    y.realize().unwrap();
    assert_eq!(Arc::strong_count(&host.data), 1, "a realized node lets go of its inputs");
    let z = Tensor::from_host(host.clone());
    drop(z);
    assert_eq!(Arc::strong_count(&host.data), 1);
}

#[test]
fn deep_chains_build_realize_and_drop() {
    let x = t(&[0.0], &[1]);
    let mut y = x.clone();
    for _ in 0..20_000 {
        y = y.add(1.0);
    }
    assert_eq!(y.item::<f32>().unwrap(), 20_000.0);
    let mut z = x.clone();
    for _ in 0..200_000 {
        z = z.neg();
    }
    drop(z); // Dropping a long lazy chain must not overflow the stack.
    // Nor one whose nodes the autograd registry also points to (weakly).
    let mut w = x.requires_grad_();
    for _ in 0..100_000 {
        w = w.neg().requires_grad_();
    }
    drop(w);
}

#[test]
fn tensors_cross_threads() {
    let x = t(&[1.0, 2.0, 3.0], &[3]);
    let y = x.mul(2.0);
    let handle = std::thread::spawn(move || y.sum_all().item::<f32>().unwrap());
    assert_eq!(handle.join().unwrap(), 12.0);
}

fn seq_program(n: usize) -> (Tensor, Vec<f32>) {
    let data: Vec<f32> = (0..n * 4).map(|i| (i % 7) as f32 * 0.5).collect();
    let host = HostTensor::from_vec(data.clone(), vec![n, 4]).unwrap();
    let x = Tensor::from_host_symbolic(host, &[Dim::sym("seq"), Dim::from(4)]);
    let y = x.softmax(-1).mul(&x).sum(&[0]).add(x.mean(&[0, 1]));
    // Reference on the host.
    let mut want = [0.0f32; 4];
    for r in 0..n {
        let row = &data[r * 4..r * 4 + 4];
        let m = row.iter().cloned().fold(f32::MIN, f32::max);
        let z: f32 = row.iter().map(|v| (v - m).exp()).sum();
        for c in 0..4 {
            want[c] += (row[c] - m).exp() / z * row[c];
        }
    }
    let mean = data.iter().sum::<f32>() / data.len() as f32;
    (y, want.iter().map(|w| w + mean).collect())
}

#[test]
fn symbolic_dims_share_one_program() {
    let (y3, want3) = seq_program(3);
    let (y7, want7) = seq_program(7);
    assert_eq!(y3.shape(), y7.shape());
    let program = kiln::trace(&[&y3]).unwrap();
    assert_eq!(program.graph.ty(program.graph.input_nodes()[0].1).to_string(), "f32[seq, 4]");
    let text3 = y3.graph_text().unwrap();
    let text7 = y7.graph_text().unwrap();
    assert!(text3.contains("seq"), "{text3}");
    assert_eq!(text3, text7, "the same program for seq = 3 and seq = 7");
    assert_eq!(kiln::trace(&[&y7]).unwrap().bindings.values().copied().collect::<Vec<_>>(), vec![7]);
    for (y, want) in [(&y3, &want3), (&y7, &want7)] {
        let got = y.to_vec::<f32>().unwrap();
        air::testing::assert_close("symbolic program", &got, want, air::testing::Tol { atol: 1e-4, rtol: 0.0 });
    }
}

#[test]
fn symbolic_shapes_and_dims() {
    let host = HostTensor::from_vec(vec![0.0f32; 12], vec![3, 4]).unwrap();
    let x = Tensor::from_host(host).with_dims(&["seq", "d"].map(Dim::sym));
    assert_eq!(x.shape().iter().map(|d| d.to_string()).collect::<Vec<_>>(), vec!["seq", "d"]);
    assert_eq!(x.dims().unwrap(), vec![3, 4], "a source tensor knows its concrete dims");
    let y = x.reshape(&[-1]).exp();
    assert_eq!(y.shape()[0].to_string(), "d*seq");
    assert!(y.dims().is_err(), "a lazy symbolic shape has no concrete dims yet");
    y.realize().unwrap();
    assert_eq!(y.dims().unwrap(), vec![12]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0; 12]);
    // A realized symbolic tensor carries its bindings into later programs.
    let z = y.add(1.0).sum_all();
    assert_eq!(z.item::<f32>().unwrap(), 24.0);
    // Symbolic narrow and cat.
    let h = HostTensor::from_vec((0..5).map(|i| i as f32).collect(), vec![5]).unwrap();
    let s = Tensor::from_host_symbolic(h, &[Dim::sym("n")]);
    let head = s.narrow(0, 1, &Dim::sym("n") - 2);
    assert_eq!(head.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    let both = cat(&[&s, &head], 0);
    assert_eq!(both.shape()[0].to_string(), "2*n - 2");
    assert_eq!(both.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0]);
    assert_eq!(s.mean_all().item::<f32>().unwrap(), 2.0);
}

#[test]
fn devices() {
    assert_eq!(Device::parse("interp").unwrap(), Device::Interp);
    assert_eq!(Device::parse(" INTERP ").unwrap(), Device::Interp);
    assert!(Device::parse("bogus").unwrap_err().to_string().contains("unknown device `bogus`"));
    assert_eq!(Device::parse("cpu").unwrap(), Device::Cpu);
    assert_eq!(Device::Interp.to_string(), "interp");
    let x = t(&[1.0], &[1]);
    let y = x.to_device(Device::Cpu).unwrap();
    assert!(Tensor::ptr_eq(&x, &y));
    assert_eq!(
        kiln::backend::execute(
            Device::Interp,
            &kiln::trace(&[&x.neg()]).unwrap().graph,
            vec![x.to_host().unwrap()],
            &Default::default()
        )
        .unwrap()[0]
            .as_slice::<f32>()
            .unwrap(),
        &[-1.0]
    );
}

#[test]
fn detach_stops_the_gradient() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]);
    let x = x.requires_grad_();
    let y = (&x * &x).sum_all() + (&x.detach() * &x.detach()).sum_all();
    let g = kiln::grad(&y, &[&x]).unwrap();
    assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn reshape_infers_minus_one_by_cancelling_shared_symbolic_dims() {
    // Splitting heads off a symbolic `[batch, seq, 32]`: the `-1` is 32 / 8.
    let data: Vec<f32> = (0..2 * 3 * 32).map(|i| i as f32).collect();
    let x = Tensor::from_vec(data.clone(), &[2, 3, 32]).with_dims(vec![Dim::sym("batch"), Dim::sym("seq"), 32.into()]);
    let y = x.reshape(vec![Dim::sym("batch"), Dim::sym("seq"), Dim::Const(-1), Dim::Const(8)]);
    assert_eq!(y.shape()[2], Dim::Const(4));
    assert_eq!(y.to_vec::<f32>().unwrap(), data);
    assert_eq!(y.dims().unwrap(), [2, 3, 4, 8]);
    // A symbolic dim the input does not have is still an error, never a guess.
    let z = x.reshape(vec![Dim::sym("other"), Dim::Const(-1)]);
    assert!(z.error().is_some());
}

#[test]
fn reshape_infers_minus_one_by_dividing_out_a_symbolic_term() {
    // DeBERTa's attention scores `[4*batch, seq, seq]` back to `[-1, 4, seq, seq]`: the `-1` is
    // `batch`, which is none of the input's dims.
    let (b, seq) = (Dim::sym("batch"), Dim::sym("seq"));
    let data: Vec<f32> = (0..4 * 2 * 3 * 3).map(|i| i as f32).collect();
    let heads = Tensor::from_vec(data.clone(), &[2, 4, 3, 3]).with_dims(vec![b, Dim::Const(4), seq, seq]);
    let x = heads.reshape(vec![Dim::Const(4) * b, seq, seq]);
    let y = x.reshape(vec![Dim::Const(-1), Dim::Const(4), seq, seq]);
    assert!(y.error().is_none(), "{:?}", y.error());
    assert_eq!(y.shape()[0], b);
    assert_eq!(y.dims().unwrap(), [2, 4, 3, 3]);
    assert_eq!(y.to_vec::<f32>().unwrap(), data);
    // Not exact: `[4*batch, seq, seq]` to `[-1, 8, seq, seq]` is an error, never a guess.
    assert!(x.reshape(vec![Dim::Const(-1), Dim::Const(8), seq, seq]).error().is_some());
}

#[test]
fn repeated_scalar_operands_share_one_constant_node_and_their_gradients_stay_right() {
    let x = t(&[1.0, 2.0, 3.0], &[3]).requires_grad_();
    let y = t(&[4.0, 5.0, 6.0], &[3]);
    // `0.5` twice and `1.0` twice: two constant nodes in the traced graph, not four.
    let z = x.mul(0.5).add(1.0).add(y.mul(0.5).add(1.0));
    let program = kiln::trace(&[&z]).unwrap();
    let consts = program.graph.iter().filter(|(_, n)| matches!(n.op, air::Op::Const(_))).count();
    assert_eq!(consts, 2, "{}", program.graph);
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![4.5, 5.5, 6.5]);
    // The shared constants are operands only: the gradient of x is its own 0.5 per element.
    let g = kiln::grad(&z.sum(&[0]), &[&x]).unwrap();
    assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![0.5, 0.5, 0.5]);
    // A different value, dtype or shape is another node.
    let w = x.mul(0.25).add(t(&[0.0; 6], &[2, 3]).mul(0.5).sum(&[0]));
    let program = kiln::trace(&[&w]).unwrap();
    let consts = program.graph.iter().filter(|(_, n)| matches!(n.op, air::Op::Const(_))).count();
    assert_eq!(consts, 2, "{}", program.graph);
}

#[test]
fn views_of_views_record_one_node_and_keep_values_and_gradients() {
    let count =
        |t: &Tensor, f: fn(&air::Op) -> bool| kiln::trace(&[t]).unwrap().graph.iter().filter(|(_, n)| f(&n.op)).count();
    let is_permute = |op: &air::Op| matches!(op, air::Op::Permute(_));
    let is_reshape = |op: &air::Op| matches!(op, air::Op::Reshape(_));
    let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let x = t(&data, &[2, 3, 4]);
    // Two transposes that cancel are the tensor itself; two that do not, one permute.
    assert!(Tensor::ptr_eq(&x.transpose(0, 2).transpose(0, 2), &x));
    let y = x.permute(&[1, 2, 0]).permute(&[2, 0, 1]).permute(&[0, 2, 1]);
    assert_eq!(count(&y, is_permute), 1);
    assert_eq!(y.to_vec::<f32>().unwrap(), x.permute(&[0, 2, 1]).contiguous().to_vec::<f32>().unwrap());
    // A reshape of a reshape reads the first's input.
    let r = x.reshape(&[6, 4]).reshape(&[4, 6]).reshape(&[24]);
    assert_eq!(count(&r, is_reshape), 1);
    assert_eq!(r.to_vec::<f32>().unwrap(), data);
    // `Linear`'s weight, transposed and transposed back by `matmul`, is read as it is.
    let w = t(&data[..12], &[3, 4]);
    let a = t(&[1.0, 2.0, 3.0, 4.0], &[1, 4]);
    let out = a.matmul(&w.transpose(0, 1));
    assert_eq!(count(&out, is_permute), 0, "{}", out.graph_text().unwrap());
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![20.0, 60.0, 100.0]);
    // Gradients flow through a composed view as through the two.
    let p = t(&data, &[2, 3, 4]).requires_grad_();
    let loss = p.permute(&[2, 0, 1]).permute(&[1, 2, 0]).mul(&x).sum_all();
    let g = kiln::grad(&loss, &[&p]).unwrap();
    assert_eq!(g[0].to_vec::<f32>().unwrap(), data);
    // A view the autograd registry holds stays in the graph: its own gradient is asked for.
    let q = t(&data, &[2, 3, 4]).requires_grad_();
    let mid = q.transpose(0, 1).requires_grad_();
    let back = mid.transpose(0, 1);
    assert!(!Tensor::ptr_eq(&back, &q));
    let g = kiln::grad(&back.mul(&x).sum_all(), &[&mid]).unwrap();
    assert_eq!(g[0].to_vec::<f32>().unwrap(), x.transpose(0, 1).contiguous().to_vec::<f32>().unwrap());
}

#[test]
fn floor_division_symbols_are_bound_from_their_definition_and_checked_against_it() {
    // `x[: 2*⌊h/2⌋]` of a symbolic `[h]`: the even prefix, whatever `h` is.
    let h = Dim::sym("h");
    let even = Dim::Const(2) * h.floor_div(2).unwrap();
    let of = |n: usize| Tensor::from_vec((0..n).map(|i| i as f32).collect(), &[n]).with_dims(vec![h]);
    let (x5, x9) = (of(5), of(9));
    let y5 = x5.narrow(0, 0, even);
    assert_eq!(y5.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0, 3.0]);
    assert_eq!(x9.narrow(0, 0, even).to_vec::<f32>().unwrap(), (0..8).map(|i| i as f32).collect::<Vec<_>>());
    // A result computed for h = 5 mixed with an input of h = 9: the floor's two values conflict,
    // an error naming it rather than a program run with the wrong one.
    let mixed = y5.add(x9.narrow(0, 0, even));
    let err = mixed.to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains("⌊(h)/2⌋") && err.contains("2 and 4"), "{err}");
}

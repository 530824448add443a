//! `#[derive(Module)]`: the names, kinds and order of the entries each field attribute declares,
//! and `set_training` reaching `#[training]` fields through children.

use kiln::{DType, Tensor};
use kiln_nn::{Dropout, Linear, Module, ModuleParams, ParamKind};

#[derive(Module)]
struct Cell {
    #[param(rename = "w_l0")]
    w: Tensor,
    #[buffer]
    count: Tensor,
    #[param]
    bias: Option<Tensor>,
    /// Not an entry: no attribute.
    #[allow(dead_code)]
    note: &'static str,
}

#[derive(Module)]
struct Stack {
    #[module(flatten)]
    cell: Cell,
    #[module]
    layers: Vec<Linear>,
    #[module]
    extra: Option<Linear>,
    #[module]
    drop: Dropout,
    #[training]
    training: bool,
}

impl Module for Stack {
    fn forward(&self, x: &Tensor) -> Tensor {
        x.clone()
    }
}

fn ones(n: usize) -> Tensor {
    Tensor::ones(&[n], DType::F32)
}

fn stack(bias: bool, extra: bool) -> Stack {
    Stack {
        cell: Cell { w: ones(2), count: ones(1), bias: bias.then(|| ones(2)), note: "" },
        layers: vec![Linear::new(2, 3, true), Linear::new(3, 2, false)],
        extra: extra.then(|| Linear::new(2, 2, false)),
        drop: Dropout::new(0.5),
        training: false,
    }
}

fn entries(m: &impl Module) -> Vec<(String, ParamKind)> {
    m.state_dict().into_iter().map(|(name, _, kind)| (name, kind)).collect()
}

#[test]
fn names_kinds_and_order_follow_the_fields() {
    let (w, b) = (ParamKind::Weight, ParamKind::Buffer);
    let want = [
        ("w_l0", w),
        ("count", b),
        ("bias", w),
        ("layers.0.weight", w),
        ("layers.0.bias", w),
        ("layers.1.weight", w),
        ("extra.weight", w),
    ];
    let want: Vec<(String, ParamKind)> = want.iter().map(|&(n, k)| (n.to_string(), k)).collect();
    assert_eq!(entries(&stack(true, true)), want);

    let without: Vec<(String, ParamKind)> =
        want.into_iter().filter(|(n, _)| n != "bias" && !n.starts_with("extra")).collect();
    assert_eq!(entries(&stack(false, false)), without);
}

#[test]
fn visit_mut_reaches_the_same_entries_in_the_same_order() {
    let mut m = stack(true, true);
    let mut names = Vec::new();
    m.visit_mut(&mut |name, t, _| {
        names.push(name.to_string());
        *t = t.mul(2.0f32);
    });
    let want: Vec<String> = entries(&m).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, want);
    assert_eq!(m.cell.w.to_host().unwrap().data.to_f64_vec(), vec![2.0, 2.0]);
}

#[test]
fn set_training_reaches_training_fields_and_children() {
    let mut m = stack(true, true);
    m.set_training(true);
    assert!(m.training && m.drop.training);
    m.set_training(false);
    assert!(!m.training && !m.drop.training);
}

/// `visit_tensors` (no names) reaches the tensors `visit` reaches, in its order, on a derived
/// module and on every model of the suite (flattened children, `Vec`s, `Option`s, boxed layers,
/// the recurrent cells' hand-written visitors) and the Transformer.
#[test]
fn visit_tensors_reaches_what_visit_reaches_in_the_same_order() {
    fn same(m: &dyn Module, what: &str) {
        let mut named: Vec<(Tensor, ParamKind)> = Vec::new();
        m.visit(&mut |_, t, kind| named.push((t.clone(), kind)));
        let mut bare: Vec<(Tensor, ParamKind)> = Vec::new();
        m.visit_tensors(&mut |t, kind| bare.push((t.clone(), kind)));
        assert_eq!(named.len(), bare.len(), "{what}");
        for (i, ((a, ka), (b, kb))) in named.iter().zip(&bare).enumerate() {
            assert!(Tensor::ptr_eq(a, b) && ka == kb, "{what}: entry {i} differs");
        }
        assert!(!bare.is_empty(), "{what}");
    }
    same(&stack(true, true), "stack");
    same(&stack(false, false), "stack without bias");
    for case in kiln_nn::zoo::all().unwrap() {
        same(case.model.as_ref(), case.name);
    }
    same(&kiln_nn::Transformer::new(16, 2, 2, 1e-5, 11).unwrap(), "transformer");
}

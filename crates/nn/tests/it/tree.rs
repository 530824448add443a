//! A module's parameters viewed as a `kiln::Tree`: names become key paths, and tree ops reach
//! every parameter in one program.

use kiln::Tensor;
use kiln_nn::{Module, Transformer};

#[test]
fn transformer_parameters_form_a_tree() {
    let model = Transformer::new(16, 2, 2, 1e-5, 11).unwrap();
    let tree = model.parameter_tree().unwrap();
    let named = model.named_parameters();
    assert_eq!(tree.num_leaves(), named.len());
    let q = tree.get_leaf("blocks.1.attn.q.weight").expect("a nested parameter by its dotted name");
    let (_, direct) = named.iter().find(|(n, _)| n == "blocks.1.attn.q.weight").unwrap();
    assert!(Tensor::ptr_eq(q, direct), "the tree holds the module's own tensors");
    // One lifted op over every parameter, realized as one program, agrees leaf by leaf.
    let sums = tree.map(|t| t.sum_all());
    sums.realize().unwrap();
    for (path, (_, t)) in sums.paths().iter().zip(&named) {
        let got = sums.get_leaf(path).unwrap().item::<f32>().unwrap();
        let want = t.sum_all().item::<f32>().unwrap();
        assert_eq!(got.to_bits(), want.to_bits(), "{path}");
    }
}

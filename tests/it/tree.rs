//! `kiln::Tree`: structure (paths, flatten/unflatten, errors naming key paths), combinators, and
//! tensor ops lifted over trees checked against the same ops on each leaf; realizing a tree runs
//! one program.

use kiln::prelude::*;
use kiln::{Tree, stats};

fn t(seed: usize, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| (((i * 7 + seed * 13) % 23) as f32 - 11.0) / 8.0).collect();
    Tensor::from_vec(data, shape)
}

fn nested() -> Tree<i32> {
    Tree::from_pairs([("b.x", 1), ("a", 2), ("b.y.z", 3), ("b.w", 4)]).unwrap()
}

#[test]
fn paths_keep_insertion_order_and_round_trip() {
    let tree = nested();
    assert_eq!(tree.paths(), ["b.x", "b.y.z", "b.w", "a"]);
    assert_eq!(tree.leaves(), [&1, &3, &4, &2]);
    assert_eq!(tree.num_leaves(), 4);
    assert_eq!(tree.get_leaf("b.y.z"), Some(&3));
    assert!(tree.get("b.y").is_some_and(|t| !t.is_leaf()));
    assert_eq!(tree.get_leaf("b.q"), None);
    assert_eq!(tree.get_leaf("a.x"), None, "a path through a leaf names nothing");
    let keys: Vec<&str> = tree.entries().map(|(k, _)| k).collect();
    assert_eq!(keys, ["b", "a"]);

    let flat: Vec<(String, i32)> = tree.flatten().into_iter().map(|(p, v)| (p, *v)).collect();
    let back = Tree::unflatten(flat.clone()).unwrap();
    assert_eq!(back, tree);
    assert_eq!(tree.clone().into_flat(), flat);

    // Module-style names keep declaration order (`2` before `10`).
    let params = Tree::from_pairs([("layers.2.weight", 0), ("layers.10.weight", 1), ("head.bias", 2)]).unwrap();
    assert_eq!(params.paths(), ["layers.2.weight", "layers.10.weight", "head.bias"]);

    let root = Tree::from_pairs([("", 7)]).unwrap();
    assert!(root.is_leaf());
    assert_eq!(root.flatten(), [(String::new(), &7)]);
    assert_eq!(Tree::<i32>::new().num_leaves(), 0);
    assert_eq!(format!("{:?}", nested()), r#"{"b": {"x": 1, "y": {"z": 3}, "w": 4}, "a": 2}"#);
}

#[test]
fn insert_replaces_and_builds_nodes() {
    let mut tree = Tree::new();
    assert_eq!(tree.insert("a.b", 1).unwrap(), None);
    assert_eq!(tree.insert("a.b", 5).unwrap(), Some(Tree::leaf(1)));
    tree.insert("c", Tree::from_pairs([("d", 2), ("e", 3)]).unwrap()).unwrap();
    assert_eq!(tree.paths(), ["a.b", "c.d", "c.e"]);
    assert_eq!(tree.leaves(), [&5, &2, &3]);
    let e = Tree::from_entries([("x", Tree::leaf(1)), ("y", tree.clone())]).unwrap();
    assert_eq!(e.paths(), ["x", "y.a.b", "y.c.d", "y.c.e"]);
}

fn message(e: Error) -> String {
    e.to_string()
}

#[test]
fn bad_keys_and_paths_are_errors() {
    let dup = message(Tree::from_pairs([("a.b", 1), ("a.b", 2)]).unwrap_err());
    assert!(dup.contains("key path `a.b` appears twice"), "{dup}");
    let through = message(Tree::from_pairs([("a", 1), ("a.b", 2)]).unwrap_err());
    assert!(through.contains("key path `a.b` goes through the leaf at `a`"), "{through}");
    let empty = message(Tree::from_pairs([("a..b", 1)]).unwrap_err());
    assert!(empty.contains("a key is empty"), "{empty}");
    let dotted = message(Tree::from_entries([("a.b", Tree::leaf(1))]).unwrap_err());
    assert!(dotted.contains("contains `.`"), "{dotted}");
    let twice = message(Tree::from_entries([("a", Tree::leaf(1)), ("a", Tree::leaf(2))]).unwrap_err());
    assert!(twice.contains("key `a` appears twice"), "{twice}");
    let root = message(Tree::from_pairs([("a", 1), ("", 2)]).unwrap_err());
    assert!(root.contains("root path"), "{root}");
    let mut leaf = Tree::leaf(1);
    let into_leaf = message(leaf.insert("x", 2).unwrap_err());
    assert!(into_leaf.contains("goes through the leaf at <root>"), "{into_leaf}");
}

#[test]
fn mismatched_structures_name_the_first_differing_path() {
    let a = nested();
    let only_left = Tree::from_pairs([("b.x", 1), ("a", 2), ("b.y.q", 3), ("b.w", 4)]).unwrap();
    let e = message(a.zip_with(&only_left, |x, y| x + y).unwrap_err());
    assert!(e.starts_with("zip_with: tree structures differ at `b.y.z`: only the left tree has it"), "{e}");
    assert!(e.contains("tests/it/tree.rs"), "the error names the caller's line: {e}");

    let extra = Tree::from_pairs([("b.x", 1), ("a", 2), ("b.y.z", 3), ("b.w", 4), ("b.v", 5)]).unwrap();
    let e = message(a.zip_with(&extra, |x, y| x + y).unwrap_err());
    assert!(e.contains("differ at `b.v`: only the right tree has it"), "{e}");

    let leaf_vs_node = Tree::from_pairs([("b.x", 1), ("a.k", 2), ("b.y.z", 3), ("b.w", 4)]).unwrap();
    let e = message(a.zip_with(&leaf_vs_node, |x, y| x + y).unwrap_err());
    assert!(e.contains("differ at `a`: the left tree has a leaf, the right tree a node with keys [k]"), "{e}");

    let e = message(Tree::leaf(1).zip_with(&a, |x, y| x + y).unwrap_err());
    assert!(e.contains("differ at <root>: the left tree has a leaf, the right tree a node with keys [b, a]"), "{e}");

    // Key order may differ; the left order is kept.
    let reordered = Tree::from_pairs([("a", 20), ("b.w", 40), ("b.y.z", 30), ("b.x", 10)]).unwrap();
    let sum = a.zip_with(&reordered, |x, y| x + y).unwrap();
    assert_eq!(sum.paths(), a.paths());
    assert_eq!(sum.leaves(), [&11, &33, &44, &22]);
    assert!(a.same_structure(&reordered));
    assert!(!a.same_structure(&extra));

    // Lifted tensor ops report the op name.
    let x = Tree::from_pairs([("p", t(0, &[2, 2])), ("q", t(1, &[2, 2]))]).unwrap();
    let y = Tree::from_pairs([("p", t(2, &[2, 2]))]).unwrap();
    let e = message(x.matmul(&y).realize().unwrap_err());
    assert!(e.starts_with("matmul: tree structures differ at `q`: only the left tree has it"), "{e}");
    let e = message((&x + &y).check().unwrap_err());
    assert!(e.starts_with("add: tree structures differ at `q`"), "{e}");
}

/// The leaf at `path` (which must be one).
fn leaf_of(tree: &Tree<Tensor>, path: &str) -> Tensor {
    tree.get_leaf(path).unwrap().clone()
}

/// The `(op, file, line)` of an `Error::Op`.
fn op_site(e: &Error) -> (&'static str, &'static str, u32) {
    match e {
        Error::Op { op, location, .. } => (op, location.file(), location.line()),
        other => panic!("expected an op error, got {other:?}"),
    }
}

#[test]
fn tree_ops_with_trees_and_scalars_both_return_trees_and_defer_errors_to_the_caller_line() {
    let x = Tree::from_pairs([("p", t(0, &[2, 2])), ("q", t(1, &[2, 2]))]).unwrap();
    let y = Tree::from_pairs([("p", t(2, &[2, 2]))]).unwrap();
    // Both forms are `Tree<Tensor>`, as tensor ops are `Tensor`: nothing to unwrap.
    let with_tree: Tree<Tensor> = &x + &x;
    let with_scalar: Tree<Tensor> = &x + 1.0;
    assert_eq!(with_tree.paths(), with_scalar.paths());
    let (want_tree, want_scalar) = (leaf_of(&x, "q").add(leaf_of(&x, "q")), leaf_of(&x, "q").add(1.0));
    assert_eq!(leaf_of(&with_tree, "q").to_vec::<f32>().unwrap(), want_tree.to_vec::<f32>().unwrap());
    assert_eq!(leaf_of(&with_scalar, "q").to_vec::<f32>().unwrap(), want_scalar.to_vec::<f32>().unwrap());

    // A structure mismatch keeps the left tree's structure, every leaf carrying the error, which
    // names this line.
    let (bad, line) = (&x + &y, line!());
    assert_eq!(bad.paths(), x.paths());
    for path in bad.paths() {
        let e = leaf_of(&bad, &path).to_vec::<f32>().unwrap_err();
        assert_eq!(op_site(&e), ("add", file!(), line), "{e}");
    }
    let (bad, line) = (x.matmul(&y), line!());
    assert_eq!(op_site(&bad.check().unwrap_err()), ("matmul", file!(), line));
    assert_eq!(op_site(&bad.realize().unwrap_err()), ("matmul", file!(), line));

    // An empty left tree still reports the mismatch, as one error leaf.
    let (bad, line) = (Tree::<Tensor>::new().mul(&y), line!());
    assert_eq!(bad.num_leaves(), 1);
    assert_eq!(op_site(&bad.check().unwrap_err()), ("mul", file!(), line));

    // A leaf op that fails (here a bool negated) names this line too, not `src/tree.rs`.
    let mask = Tree::from_pairs([("m", Tensor::from_vec(vec![true, false], &[2]))]).unwrap();
    let (bad, line) = (-&mask, line!());
    assert_eq!(op_site(&bad.check().unwrap_err()), ("neg", file!(), line));
    let (bad, line) = (&mask - true, line!());
    assert_eq!(op_site(&bad.check().unwrap_err()), ("sub", file!(), line));
}

#[test]
fn map_fold_reduce_with_leaves() {
    let tree = nested();
    let doubled = tree.map(|v| v * 2);
    assert_eq!(doubled.leaves(), [&2, &6, &8, &4]);
    let named = tree.map_with_path(|p, v| format!("{p}={v}"));
    assert_eq!(named.get_leaf("b.y.z").map(String::as_str), Some("b.y.z=3"));
    assert_eq!(tree.fold(0, |a, v| a * 10 + v), 1342);
    assert_eq!(tree.reduce(|a, b| a - b), Some(1 - 3 - 4 - 2));
    assert_eq!(Tree::<i32>::new().reduce(|a, b| a + b), None);
    let strings = tree.with_leaves(["w", "x", "y", "z"]).unwrap();
    assert_eq!(strings.get_leaf("a"), Some(&"z"));
    assert!(message(tree.with_leaves([1, 2, 3]).unwrap_err()).contains("fewer values than the tree's 4 leaves"));
    assert!(message(tree.with_leaves([1, 2, 3, 4, 5]).unwrap_err()).contains("more values"));
    let failed = tree.try_map(|v| if *v == 3 { Err(Error::Shape("three".into())) } else { Ok(*v) });
    assert_eq!(failed.unwrap_err(), Error::Shape("three".into()));
}

fn pairs(n: usize) -> (Tree<Tensor>, Tree<Tensor>) {
    let a = Tree::from_pairs((0..n).map(|i| (format!("g{}.node{i}", i % 3), t(2 * i, &[3, 4])))).unwrap();
    let b = Tree::from_pairs((0..n).map(|i| (format!("g{}.node{i}", i % 3), t(2 * i + 1, &[4, 5])))).unwrap();
    (a, b)
}

/// Every leaf of `tree`, bitwise equal to `expect(path)` realized on its own.
fn check_leaves(tree: &Tree<Tensor>, expect: impl Fn(&str) -> Tensor) {
    let got = tree.to_vecs::<f32>().unwrap();
    for (path, values) in got.flatten() {
        let want = expect(&path).to_vec::<f32>().unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(values), bits(&want), "leaf {path}");
    }
}

#[test]
fn lifted_ops_match_per_leaf_results() {
    let (a, b) = pairs(7);
    let leaf = |tree: &Tree<Tensor>, p: &str| tree.get_leaf(p).unwrap().clone();

    let prod = a.matmul(&b);
    check_leaves(&prod, |p| leaf(&a, p).matmul(&leaf(&b, p)));

    let chain = (&(&a + &a.sigmoid()) * 0.5).relu();
    check_leaves(&chain, |p| ((&leaf(&a, p) + &leaf(&a, p).sigmoid()) * 0.5).relu());

    let mixed = &a - &a.map(|x| x.exp());
    check_leaves(&mixed, |p| &leaf(&a, p) - &leaf(&a, p).exp());
    let quotient = (&a.abs() / 3.0).neg().tanh();
    check_leaves(&quotient, |p| (-(leaf(&a, p).abs() / 3.0)).tanh());
    let product = a.mul(&a).maximum(&a.square());
    check_leaves(&product, |p| leaf(&a, p).mul(leaf(&a, p)).maximum(leaf(&a, p).square()));

    let total = a.sum_all().reduce(|x, y| x + y).unwrap();
    let want: f32 = a.leaves().iter().map(|x| x.sum_all().item::<f32>().unwrap()).sum();
    assert!((total.item::<f32>().unwrap() - want).abs() < 1e-4);

    let neg = -&b;
    check_leaves(&neg, |p| -leaf(&b, p));
    assert_eq!(a.cast(DType::F64).leaves()[0].dtype(), DType::F64);
}

#[test]
fn realizing_a_tree_runs_one_program() {
    let (a, b) = pairs(9);
    let prod = a.matmul(&b).sigmoid();
    let program = kiln::trace(&prod.leaves()).unwrap();
    assert_eq!(program.graph.outputs().len(), 9);
    let before = stats::graphs_executed();
    prod.realize().unwrap();
    assert_eq!(stats::graphs_executed(), before + 1, "one graph for all leaves");
    assert!(prod.leaves().iter().all(|t| t.is_realized()));
    prod.realize().unwrap();
    assert_eq!(stats::graphs_executed(), before + 1, "realized leaves are not recomputed");
}

#[test]
fn outputs_that_are_inputs_and_shared_leaves() {
    let x = t(3, &[2, 3]);
    let lazy = x.exp();
    // A source tensor as a leaf, the same lazy tensor twice, and a view of the source.
    let tree = Tree::from_pairs([
        ("src", x.clone()),
        ("e1", lazy.clone()),
        ("e2", lazy.clone()),
        ("view", x.reshape(&[2, 3])),
        ("flat", x.reshape(&[6])),
    ])
    .unwrap();
    let before = stats::graphs_executed();
    let vals = tree.to_vecs::<f32>().unwrap();
    assert_eq!(stats::graphs_executed(), before + 1);
    let xs = x.to_vec::<f32>().unwrap();
    assert_eq!(vals.get_leaf("src"), Some(&xs));
    assert_eq!(vals.get_leaf("view"), Some(&xs));
    assert_eq!(vals.get_leaf("flat"), Some(&xs));
    assert_eq!(vals.get_leaf("e1"), vals.get_leaf("e2"));
    assert_eq!(vals.get_leaf("e1"), Some(&x.exp().to_vec::<f32>().unwrap()));

    // A tree whose leaves all hold data runs nothing.
    let sources = Tree::from_pairs([("a", x.clone()), ("b", t(4, &[1]))]).unwrap();
    let before = stats::graphs_executed();
    sources.realize().unwrap();
    assert_eq!(stats::graphs_executed(), before);

    // An error in any leaf comes back from realize.
    let bad = Tree::from_pairs([("ok", x.clone()), ("bad", x.matmul(&x))]).unwrap();
    assert!(bad.check().is_err());
    let e = bad.realize().unwrap_err().to_string();
    assert!(e.starts_with("matmul: shapes [2, 3] and [2, 3] do not match"), "{e}");
}

#[test]
fn a_tree_of_matmuls_on_the_cpu_matches_per_leaf_and_repeats_bitwise() {
    let cpu = Device::Cpu;
    let on = |x: Tensor| x.to_device(cpu).unwrap();
    let a = Tree::from_pairs((0..8).map(|i| (format!("n{i}"), on(t(2 * i, &[32, 64]))))).unwrap();
    let b = Tree::from_pairs((0..8).map(|i| (format!("n{i}"), on(t(2 * i + 1, &[64, 128]))))).unwrap();
    let first = a.matmul(&b).to_vecs::<f32>().unwrap();
    for (path, got) in first.flatten() {
        let want = a.get_leaf(&path).unwrap().matmul(b.get_leaf(&path).unwrap()).to_vec::<f32>().unwrap();
        air::testing::assert_close(&format!("leaf {path}"), got, &want, air::testing::Tol { atol: 1e-4, rtol: 0.0 });
    }
    for _ in 0..10 {
        assert_eq!(a.matmul(&b).to_vecs::<f32>().unwrap(), first, "a rerun changed the results");
    }
}

#[test]
fn wide_nodes_keep_insertion_order_and_compare_in_order() {
    // 20,000 keys in one node: lookups by key are hashed (a linear scan per key was quadratic).
    let n = 20_000;
    let keys: Vec<String> = (0..n).map(|i| format!("k{}", n - i)).collect();
    let mut tree = Tree::from_pairs(keys.iter().map(|k| (k.as_str(), 1.0f32))).unwrap();
    assert_eq!(tree.num_leaves(), n);
    assert!(keys.iter().all(|k| tree.get_leaf(k) == Some(&1.0)));
    // Replacing a key keeps its place; a new key goes last.
    assert_eq!(tree.insert("k7", 2.0f32).unwrap().and_then(|t| t.as_leaf().copied()), Some(1.0));
    tree.insert("new", 3.0f32).unwrap();
    let order: Vec<&str> = tree.entries().map(|(k, _)| k).collect();
    assert_eq!(order[n - 7], "k7");
    assert_eq!(order.last(), Some(&"new"));
    let doubled = tree.zip_with(&tree, |a, b| a + b).unwrap();
    assert_eq!(doubled.get_leaf("k7"), Some(&4.0));
    // Equal entries in another order are another tree, as with ordered entries.
    let ab = Tree::from_pairs([("a", 1), ("b", 2)]).unwrap();
    let ba = Tree::from_pairs([("b", 2), ("a", 1)]).unwrap();
    assert_ne!(ab, ba);
    assert!(ab.same_structure(&ba));
}

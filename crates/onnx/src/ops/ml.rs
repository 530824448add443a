//! The `ai.onnx.ml` domain, what scikit-learn models export to (skl2onnx): LinearRegressor,
//! LinearClassifier, Scaler, Normalizer, Binarizer, ArrayFeatureExtractor, TreeEnsembleRegressor,
//! TreeEnsembleClassifier, SVMRegressor and SVMClassifier, with the semantics of ONNX's reference
//! implementation (`onnx.reference.ops.aionnxml`). Class labels are integers (Kiln has no string
//! tensors: string labels are an error naming the node).
//!
//! A tree ensemble is walked, not unrolled: every tree's node tables (feature, threshold, rule,
//! children) are constants indexed by the current node of each row and tree, `[N, trees]`, and
//! one step moves every row down one level in every tree (leaves point to themselves), as many
//! steps as the deepest tree; then the leaves' weights are gathered and aggregated. The graph
//! grows with the depth, not with the number of nodes.

use kiln::{DType, Tensor, cat};

use super::{Ctx, OpResult, show};

/// `x` as a 2-D float matrix `[N, C]` (a vector is one row; integers become floats).
fn matrix(x: &Tensor) -> OpResult<Tensor> {
    let x = if matches!(x.dtype(), DType::F32 | DType::F64) { x.clone() } else { x.cast(DType::F32) };
    match x.ndim() {
        1 => Ok(x.unsqueeze(0)),
        2 => Ok(x),
        _ => Err(format!("X {} must be [N, C] or [C]", show(&x)).into()),
    }
}

/// A float constant `[rows, cols]` (row-major `values`) on `ctx`'s device, in `dtype`.
fn table(ctx: &Ctx, values: Vec<f32>, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec_on(values, shape, ctx.device).cast(dtype)
}

/// An i64 constant on `ctx`'s device.
fn ids(ctx: &Ctx, values: Vec<i64>) -> Tensor {
    let n = values.len();
    Tensor::from_vec_on(values, &[n], ctx.device)
}

/// The float list attribute `name`, or its double `_as_tensor` form (opset 3), or `None`.
fn floats_or_tensor(ctx: &Ctx, name: &str) -> OpResult<Option<Vec<f32>>> {
    if let Some(v) = ctx.floats(name)? {
        return Ok(Some(v));
    }
    Ok(ctx.tensor_attr(&format!("{name}_as_tensor"))?.map(|t| t.data.to_f64_vec().iter().map(|&v| v as f32).collect()))
}

/// The integer class labels; string labels are an error (no string tensors).
fn class_labels(ctx: &Ctx, ints: &str) -> OpResult<Option<Vec<i64>>> {
    if ctx.strings("classlabels_strings")?.is_some() {
        return Err("string class labels are not supported (Kiln has no string tensors)".into());
    }
    ctx.ints(ints)
}

/// ONNX-ML's post transforms of a score matrix `[N, K]`.
fn post_transform(ctx: &Ctx, scores: Tensor) -> OpResult<Tensor> {
    Ok(match ctx.string("post_transform")?.as_deref().unwrap_or("NONE") {
        "NONE" => scores,
        "LOGISTIC" => scores.sigmoid(),
        "SOFTMAX" => scores.softmax(-1),
        // Exact zeros are not exponentiated: they stay `0 * exp(-max)` before normalizing, and a
        // row that sums to zero is 0.5 everywhere.
        "SOFTMAX_ZERO" => {
            let max = scores.max_keepdim(-1);
            let zero = scores.abs().le(1e-7);
            let e = zero.where_cond(scores.mul(max.neg().exp()), scores.sub(&max).exp());
            let sum = e.sum_keepdim(-1);
            sum.eq(0.0).where_cond(e.zeros_like().add(0.5), e.div(&sum))
        }
        // sqrt(2) * erfinv(2v - 1), with the reference's approximation of erfinv (0 where
        // `(1 - x)(1 + x)` is 0, as the reference returns).
        "PROBIT" => {
            let x = scores.mul(2.0).sub(1.0);
            let sign = x.lt(0.0).where_cond(x.zeros_like().sub(1.0), x.zeros_like().add(1.0));
            let q = x.neg().add(1.0).mul(x.add(1.0));
            let w = q.log();
            let a = 0.147f64;
            let v = w.mul(0.5).add(2.0 / (std::f64::consts::PI * a));
            let inner = v.mul(&v).sub(w.mul(1.0 / a)).sqrt().sub(&v);
            let y = sign.mul(inner.sqrt()).mul(std::f64::consts::SQRT_2);
            q.eq(0.0).where_cond(y.zeros_like(), y)
        }
        other => return Err(format!("post_transform {other:?} is not supported").into()),
    })
}

/// The labels `labels[argmax(scores)]` (`[N]` int64).
fn argmax_labels(ctx: &Ctx, scores: &Tensor, labels: &[i64]) -> Tensor {
    ids(ctx, labels.to_vec()).index_select(0, &scores.argmax(1))
}

pub(super) fn linear_regressor(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = matrix(ctx.input(0)?)?;
    let c = x.shape()[1].as_const().ok_or("X's feature dim must be concrete")? as usize;
    let coef = ctx.floats("coefficients")?.ok_or("attribute coefficients is required")?;
    let targets = usize::try_from(ctx.int("targets", 1)?).ok().filter(|&t| t >= 1).ok_or("targets must be positive")?;
    if coef.len() != targets * c {
        return Err(format!("{} coefficients for {targets} targets of X {}", coef.len(), show(&x)).into());
    }
    let w = table(ctx, coef, &[targets, c], x.dtype());
    let mut y = x.matmul(&w.transpose(0, 1));
    if let Some(b) = ctx.floats("intercepts")?.filter(|b| !b.is_empty()) {
        let n = b.len();
        y = y.add(table(ctx, b, &[n], x.dtype()));
    }
    Ok(vec![post_transform(ctx, y)?])
}

pub(super) fn linear_classifier(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = matrix(ctx.input(0)?)?;
    let c = x.shape()[1].as_const().ok_or("X's feature dim must be concrete")? as usize;
    let coef = ctx.floats("coefficients")?.ok_or("attribute coefficients is required")?;
    if c == 0 || coef.is_empty() || !coef.len().is_multiple_of(c) {
        return Err(format!("{} coefficients do not fit X {}", coef.len(), show(&x)).into());
    }
    let k = coef.len() / c;
    let labels = class_labels(ctx, "classlabels_ints")?;
    let w = table(ctx, coef, &[k, c], DType::F32);
    let mut scores = x.cast(DType::F32).matmul(&w.transpose(0, 1));
    if let Some(b) = ctx.floats("intercepts")?.filter(|b| !b.is_empty()) {
        let n = b.len();
        scores = scores.add(table(ctx, b, &[n], DType::F32));
    }
    // One score for two classes: the first class's is its negation.
    if k == 1 && labels.as_ref().is_some_and(|l| l.len() == 2) {
        scores = cat(&[&scores.neg(), &scores], 1);
    }
    let threshold = if ctx.string("post_transform")?.as_deref().unwrap_or("NONE") == "NONE" { 0.0 } else { 0.5 };
    let scores = post_transform(ctx, scores)?;
    let label = if scores.shape()[1].as_const() != Some(1) {
        let labels = labels.unwrap_or_else(|| (0..scores.shape()[1].as_const().unwrap_or(0)).collect());
        argmax_labels(ctx, &scores, &labels)
    } else {
        // One score: the first label (1 without labels) where it reaches the threshold, else 0.
        let positive = labels.as_ref().and_then(|l| l.first().copied()).unwrap_or(1);
        scores.squeeze(1).ge(threshold).cast(DType::I64).mul(positive)
    };
    Ok(vec![label, scores])
}

pub(super) fn scaler(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    let dtype = if matches!(x.dtype(), DType::F64) { DType::F64 } else { DType::F32 };
    let vector = |name: &str| -> OpResult<Tensor> {
        let v = ctx
            .floats(name)?
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| vec![if name == "scale" { 1.0 } else { 0.0 }]);
        let n = v.len();
        Ok(table(ctx, v, &[n], dtype))
    };
    Ok(vec![x.cast(dtype).sub(vector("offset")?).mul(vector("scale")?)])
}

pub(super) fn normalizer(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = matrix(ctx.input(0)?)?;
    let norm = match ctx.string("norm")?.as_deref().unwrap_or("MAX") {
        "MAX" => x.abs().max_keepdim(1),
        "L1" => x.abs().sum_keepdim(1),
        "L2" => x.mul(&x).sum_keepdim(1).sqrt(),
        other => return Err(format!("norm {other:?} is not MAX, L1 or L2").into()),
    };
    Ok(vec![x.div(norm.maximum(1e-30))])
}

pub(super) fn binarizer(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = ctx.input(0)?;
    Ok(vec![x.gt(f64::from(ctx.float("threshold", 0.0)?)).cast(x.dtype())])
}

/// `data[..., indices]` along the last axis (a vector's result is one row).
pub(super) fn array_feature_extractor(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let (data, indices) = (ctx.input(0)?, ctx.input(1)?);
    let idx = indices.cast(DType::I64).flatten(0, -1);
    let data = if data.ndim() == 1 { data.unsqueeze(0) } else { data.clone() };
    Ok(vec![data.index_select(data.ndim() - 1, &idx)])
}

/// The walking tables of a tree ensemble (see the module docs), indexed by a global node number.
struct Forest {
    roots: Vec<i64>,
    feature: Vec<i64>,
    threshold: Vec<f32>,
    /// The node's rule: 0 LEQ, 1 LT, 2 GTE, 3 GT, 4 EQ, 5 NEQ; leaves any.
    rule: Vec<i64>,
    /// Where a missing value (NaN) goes: 1 to the true child.
    missing_true: Vec<i64>,
    if_true: Vec<i64>,
    if_false: Vec<i64>,
    depth: usize,
    /// `(tree id, node id)` to the global node number.
    index: std::collections::HashMap<(i64, i64), usize>,
}

const RULES: [&str; 6] = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"];

impl Forest {
    fn new(ctx: &Ctx) -> OpResult<Forest> {
        let list = |name: &str| -> OpResult<Vec<i64>> {
            ctx.ints(name)?.ok_or_else(|| format!("attribute {name} is required").into())
        };
        let (tree, node) = (list("nodes_treeids")?, list("nodes_nodeids")?);
        let (feature, if_true, if_false) =
            (list("nodes_featureids")?, list("nodes_truenodeids")?, list("nodes_falsenodeids")?);
        let threshold = floats_or_tensor(ctx, "nodes_values")?.unwrap_or_else(|| vec![0.0; tree.len()]);
        let modes = ctx.strings("nodes_modes")?.ok_or("attribute nodes_modes is required")?;
        let missing = ctx.ints("nodes_missing_value_tracks_true")?.unwrap_or_else(|| vec![0; tree.len()]);
        let n = tree.len();
        if [node.len(), feature.len(), if_true.len(), if_false.len(), threshold.len(), modes.len(), missing.len()]
            .iter()
            .any(|&l| l != n)
        {
            return Err("the nodes_* attributes differ in length".into());
        }
        let mut index = std::collections::HashMap::with_capacity(n);
        let mut roots = Vec::new();
        for (i, (&t, &id)) in tree.iter().zip(&node).enumerate() {
            if index.insert((t, id), i).is_some() {
                return Err(format!("node {id} of tree {t} is listed twice").into());
            }
            if !roots.iter().any(|&(rt, _)| rt == t) {
                roots.push((t, i));
            }
        }
        let mut rule = Vec::with_capacity(n);
        let (mut t_idx, mut f_idx) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            if modes[i] == "LEAF" {
                rule.push(0);
                t_idx.push(i as i64);
                f_idx.push(i as i64);
                continue;
            }
            let r = RULES
                .iter()
                .position(|&m| m == modes[i])
                .ok_or_else(|| format!("node mode {:?} is not supported", modes[i]))?;
            rule.push(r as i64);
            let child = |id: i64| {
                index.get(&(tree[i], id)).map(|&c| c as i64).ok_or_else(|| format!("tree {} has no node {id}", tree[i]))
            };
            t_idx.push(child(if_true[i])?);
            f_idx.push(child(if_false[i])?);
        }
        // The deepest leaf below each node, once per node (nodes that share children, a file's
        // diamond of them, cost no more), depth first without recursion; a cycle is an error.
        const UNSEEN: usize = usize::MAX;
        const OPEN: usize = usize::MAX - 1;
        let mut below = vec![UNSEEN; n];
        let children = |i: usize| [t_idx[i] as usize, f_idx[i] as usize];
        for &(_, root) in &roots {
            let mut stack = vec![root];
            while let Some(&i) = stack.last() {
                if modes[i] == "LEAF" {
                    below[i] = 0;
                    stack.pop();
                    continue;
                }
                match below[i] {
                    UNSEEN => {
                        below[i] = OPEN;
                        for c in children(i) {
                            match below[c] {
                                OPEN => return Err("a tree's nodes form a cycle".into()),
                                UNSEEN => stack.push(c),
                                _ => {}
                            }
                        }
                    }
                    OPEN => {
                        below[i] = 1 + children(i).iter().map(|&c| below[c]).max().unwrap_or(0);
                        stack.pop();
                    }
                    _ => {
                        stack.pop();
                    }
                }
            }
        }
        let depth = roots.iter().map(|&(_, r)| below[r]).max().unwrap_or(0);
        let roots = roots.into_iter().map(|(_, i)| i as i64).collect();
        Ok(Forest {
            roots,
            feature,
            threshold,
            rule,
            missing_true: missing,
            if_true: t_idx,
            if_false: f_idx,
            depth,
            index,
        })
    }

    /// The leaf each row reaches in each tree: `[N, trees]` global node numbers.
    fn leaves(&self, ctx: &Ctx, x: &Tensor) -> OpResult<Tensor> {
        let n = x.shape()[0];
        let c = x.shape()[1].as_const().ok_or("X's feature dim must be concrete")?;
        if let Some(&f) = self.feature.iter().find(|&&f| f < 0 || f >= c) {
            return Err(format!("feature {f} is outside X {}", show(x)).into());
        }
        let trees = self.roots.len();
        let x = x.cast(DType::F32);
        let gather = |t: &Tensor, at: &Tensor| t.index_select(0, &at.flatten(0, -1)).reshape(vec![n, trees.into()]);
        let (feature, threshold) =
            (ids(ctx, self.feature.clone()), table(ctx, self.threshold.clone(), &[self.threshold.len()], DType::F32));
        let (rule, missing) = (ids(ctx, self.rule.clone()), ids(ctx, self.missing_true.clone()));
        let (if_true, if_false) = (ids(ctx, self.if_true.clone()), ids(ctx, self.if_false.clone()));
        let used: Vec<i64> = (0..RULES.len() as i64).filter(|r| self.rule.contains(r)).collect();
        let mut at = ids(ctx, self.roots.clone()).unsqueeze(0).expand(vec![n, trees.into()]);
        for _ in 0..self.depth {
            let v = x.gather(1, &gather(&feature, &at));
            let th = gather(&threshold, &at);
            let r = gather(&rule, &at);
            let mut cond: Option<Tensor> = None;
            for &code in &used {
                let test = match code {
                    0 => v.le(&th),
                    1 => v.lt(&th),
                    2 => v.ge(&th),
                    3 => v.gt(&th),
                    4 => v.eq(&th),
                    _ => v.ne(&th),
                };
                cond = Some(match cond {
                    None => test,
                    Some(c) => r.eq(code).where_cond(&test, &c),
                });
            }
            let cond = cond.unwrap_or_else(|| v.ne(&v));
            let cond = v.ne(&v).where_cond(gather(&missing, &at).eq(1), &cond);
            at = cond.where_cond(gather(&if_true, &at), gather(&if_false, &at));
        }
        Ok(at)
    }
}

/// `[nodes, outputs]` weights: `weights[k]` added at `(node of (trees[k], nodes[k]), outputs[k])`;
/// and whether each leaf has a weight for every output.
fn leaf_weights(ctx: &Ctx, forest: &Forest, prefix: &str, outputs: usize) -> OpResult<(Vec<f32>, bool)> {
    let list = |name: &str| -> OpResult<Vec<i64>> {
        ctx.ints(&format!("{prefix}_{name}"))?.ok_or_else(|| format!("attribute {prefix}_{name} is required").into())
    };
    let (trees, nodes, out) = (list("treeids")?, list("nodeids")?, list("ids")?);
    let weights = floats_or_tensor(ctx, &format!("{prefix}_weights"))?
        .ok_or(format!("attribute {prefix}_weights is required"))?;
    if [nodes.len(), out.len(), weights.len()].iter().any(|&l| l != trees.len()) {
        return Err(format!("the {prefix}_* attributes differ in length").into());
    }
    let mut table = vec![0.0f32; forest.feature.len() * outputs];
    let mut set = vec![false; forest.feature.len() * outputs];
    for k in 0..trees.len() {
        let node = *forest
            .index
            .get(&(trees[k], nodes[k]))
            .ok_or_else(|| format!("tree {} has no node {}", trees[k], nodes[k]))?;
        let o = usize::try_from(out[k])
            .ok()
            .filter(|&o| o < outputs)
            .ok_or_else(|| format!("{prefix}_ids {} is out of range", out[k]))?;
        table[node * outputs + o] += weights[k];
        set[node * outputs + o] = true;
    }
    // A leaf is a node that leads to itself.
    let full = (0..forest.feature.len())
        .filter(|&i| forest.if_true[i] == i as i64)
        .all(|i| set[i * outputs..(i + 1) * outputs].iter().all(|&b| b));
    Ok((table, full))
}

pub(super) fn tree_ensemble_regressor(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = matrix(ctx.input(0)?)?;
    let forest = Forest::new(ctx)?;
    let targets =
        usize::try_from(ctx.int("n_targets", 1)?).ok().filter(|&t| t >= 1).ok_or("n_targets must be positive")?;
    let (weights, full) = leaf_weights(ctx, &forest, "target", targets)?;
    let aggregate = ctx.string("aggregate_function")?.unwrap_or_else(|| "SUM".into());
    // A leaf without a weight for a target counts as 0 in a sum but not in a minimum or maximum.
    if matches!(aggregate.as_str(), "MIN" | "MAX") && !full {
        return Err(format!("{aggregate} over leaves that lack a weight for some target is not supported").into());
    }
    let leaves = forest.leaves(ctx, &x)?;
    let (n, trees) = (x.shape()[0], forest.roots.len());
    let per_tree = table(ctx, weights, &[forest.feature.len(), targets], DType::F32)
        .index_select(0, &leaves.flatten(0, -1))
        .reshape(vec![n, trees.into(), targets.into()]);
    let mut y = match aggregate.as_str() {
        "SUM" => per_tree.sum(1),
        "AVERAGE" => per_tree.sum(1).div(trees as f64),
        "MIN" => per_tree.min(1),
        "MAX" => per_tree.max(1),
        other => return Err(format!("aggregate_function {other:?} is not supported").into()),
    };
    if let Some(base) = floats_or_tensor(ctx, "base_values")?.filter(|b| !b.is_empty()) {
        let k = base.len();
        y = y.add(table(ctx, base, &[k], DType::F32));
    }
    Ok(vec![post_transform(ctx, y)?.cast(if x.dtype() == DType::F64 { DType::F64 } else { DType::F32 })])
}

pub(super) fn tree_ensemble_classifier(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = matrix(ctx.input(0)?)?;
    let forest = Forest::new(ctx)?;
    let labels = class_labels(ctx, "classlabels_int64s")?.ok_or("attribute classlabels_int64s is required")?;
    let class_ids = ctx.ints("class_ids")?.ok_or("attribute class_ids is required")?;
    let classes = labels.len().max(1);
    let (weights, _) = leaf_weights(ctx, &forest, "class", classes)?;
    let leaves = forest.leaves(ctx, &x)?;
    let (n, trees) = (x.shape()[0], forest.roots.len());
    let mut scores = table(ctx, weights, &[forest.feature.len(), classes], DType::F32)
        .index_select(0, &leaves.flatten(0, -1))
        .reshape(vec![n, trees.into(), classes.into()])
        .sum(1);
    if let Some(base) = floats_or_tensor(ctx, "base_values")?.filter(|b| !b.is_empty()) {
        let k = base.len();
        scores = scores.add(table(ctx, base, &[k], DType::F32));
    }
    // Every weight for one class: a binary classifier's single score is the second column; the
    // first is `1 - score` (NONE, PROBIT) or `-score`.
    let transform = ctx.string("post_transform")?.unwrap_or_else(|| "NONE".into());
    let binary = class_ids.iter().all(|&c| c == class_ids[0]);
    if binary {
        let s = scores.narrow(1, 0, 1);
        let other = if matches!(transform.as_str(), "NONE" | "PROBIT") { s.neg().add(1.0) } else { s.neg() };
        let rest = if classes > 2 { vec![scores.narrow(1, 2, classes as i64 - 2)] } else { vec![] };
        let mut parts = vec![&other, &s];
        parts.extend(rest.iter());
        scores = cat(&parts, 1);
    }
    let scores = post_transform(ctx, scores)?;
    let label = if labels.len() == 1 {
        // One label (1): rows whose second column wins are 1, the others 0.
        if labels[0] != 1 {
            return Err(format!("a single class label {} is not supported (1 is)", labels[0]).into());
        }
        scores.argmax(1).eq(1).cast(DType::I64)
    } else {
        argmax_labels(ctx, &scores, &labels)
    };
    Ok(vec![label, scores])
}

/// The kernel values `[N, supports]` of the rows of `x` against `supports` support vectors of
/// `c` features (attribute `support_vectors`), by the node's `kernel_type` and `kernel_params`.
fn svm_kernel(ctx: &Ctx, x: &Tensor, supports: usize, c: usize) -> OpResult<Tensor> {
    let sv = ctx.floats("support_vectors")?.ok_or("attribute support_vectors is required")?;
    if sv.len() != supports * c {
        return Err(format!("{} support vector values for {supports} supports of X {}", sv.len(), show(x)).into());
    }
    let params = ctx.floats("kernel_params")?.unwrap_or_default();
    let (gamma, coef0, degree) = (
        f64::from(params.first().copied().unwrap_or(0.0)),
        f64::from(params.get(1).copied().unwrap_or(0.0)),
        params.get(2).copied().unwrap_or(0.0) as i32,
    );
    let sv = table(ctx, sv, &[supports, c], DType::F32);
    let dot = x.matmul(&sv.transpose(0, 1));
    Ok(match ctx.string("kernel_type")?.as_deref().unwrap_or("LINEAR") {
        "LINEAR" => dot,
        "POLY" => dot.mul(gamma).add(coef0).pow(f64::from(degree)),
        "SIGMOID" => dot.mul(gamma).add(coef0).tanh(),
        // |x - v|^2 as |x|^2 + |v|^2 - 2 x.v (clamped at 0 against rounding).
        "RBF" => {
            let d2 = x.mul(x).sum_keepdim(1).add(sv.mul(&sv).sum(1).unsqueeze(0)).sub(dot.mul(2.0));
            d2.maximum(0.0).mul(-gamma).exp()
        }
        other => return Err(format!("kernel_type {other:?} is not supported").into()),
    })
}

/// SVMClassifier with three or more classes: one against one over support vectors (each pair's
/// score from both classes' vectors, a vote to the first class where it is positive, the label
/// of the most votes), or linear (a score per class, the label of the highest). The pairwise
/// scores are the second output. Binary classifiers and probabilities (`prob_a`, a pairwise
/// coupling) are errors naming the node.
pub(super) fn svm_classifier(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = matrix(ctx.input(0)?)?.cast(DType::F32);
    let c = x.shape()[1].as_const().ok_or("X's feature dim must be concrete")? as usize;
    let labels = class_labels(ctx, "classlabels_ints")?.ok_or("attribute classlabels_ints is required")?;
    let k = labels.len();
    let coef = ctx.floats("coefficients")?.ok_or("attribute coefficients is required")?;
    let rho = ctx.floats("rho")?.ok_or("attribute rho is required")?;
    if k < 3 || rho.len() == 1 {
        return Err(format!(
            "a classifier of {k} classes with {} rho value(s) is not supported (three or more classes are)",
            rho.len()
        )
        .into());
    }
    if ctx.floats("prob_a")?.is_some_and(|p| !p.is_empty()) {
        return Err("probabilities (prob_a, prob_b) are not supported".into());
    }
    let per_class = ctx.ints("vectors_per_class")?.unwrap_or_default();
    let supports: usize = per_class.iter().map(|&v| v.max(0) as usize).sum();
    if supports == 0 {
        // liblinear: one score per class.
        if coef.len() != k * c {
            return Err(format!("{} coefficients for {k} classes of X {}", coef.len(), show(&x)).into());
        }
        let scores = x.matmul(&table(ctx, coef, &[k, c], DType::F32).transpose(0, 1)).add(f64::from(rho[0]));
        let label = argmax_labels(ctx, &scores, &labels);
        return Ok(vec![label, post_transform(ctx, scores)?]);
    }
    let pairs = k * (k - 1) / 2;
    if per_class.len() != k || coef.len() != (k - 1) * supports || rho.len() != pairs {
        return Err(format!(
            "vectors_per_class {per_class:?}, {} coefficients and {} rho values do not fit {k} classes",
            coef.len(),
            rho.len()
        )
        .into());
    }
    let mut start = Vec::with_capacity(k);
    let mut at = 0usize;
    for &v in &per_class {
        start.push(at);
        at += v.max(0) as usize;
    }
    // Column p of `weights` scores pair p = (i, j): class i's vectors by coefficient row j - 1,
    // class j's by row i. `first`/`second` send a pair's vote to i or j.
    let mut weights = vec![0.0f32; supports * pairs];
    let (mut first, mut second) = (vec![0.0f32; pairs * k], vec![0.0f32; pairs * k]);
    let mut p = 0;
    for i in 0..k {
        for j in i + 1..k {
            for v in start[i]..start[i] + per_class[i] as usize {
                weights[v * pairs + p] = coef[(j - 1) * supports + v];
            }
            for v in start[j]..start[j] + per_class[j] as usize {
                weights[v * pairs + p] = coef[i * supports + v];
            }
            first[p * k + i] = 1.0;
            second[p * k + j] = 1.0;
            p += 1;
        }
    }
    let kernel = svm_kernel(ctx, &x, supports, c)?;
    let scores =
        kernel.matmul(&table(ctx, weights, &[supports, pairs], DType::F32)).add(table(ctx, rho, &[pairs], DType::F32));
    let positive = scores.gt(0.0).cast(DType::F32);
    let votes = positive
        .matmul(&table(ctx, first, &[pairs, k], DType::F32))
        .add(positive.neg().add(1.0).matmul(&table(ctx, second, &[pairs, k], DType::F32)));
    Ok(vec![argmax_labels(ctx, &votes, &labels), post_transform(ctx, scores)?])
}

pub(super) fn svm_regressor(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let x = matrix(ctx.input(0)?)?.cast(DType::F32);
    let c = x.shape()[1].as_const().ok_or("X's feature dim must be concrete")? as usize;
    let coef = ctx.floats("coefficients")?.ok_or("attribute coefficients is required")?;
    let rho = ctx.floats("rho")?.and_then(|r| r.first().copied()).unwrap_or(0.0);
    let supports = usize::try_from(ctx.int("n_supports", 0)?).map_err(|_| "n_supports must not be negative")?;
    let score = if supports > 0 {
        if coef.len() != supports {
            return Err(format!("{} coefficients for {supports} supports", coef.len()).into());
        }
        svm_kernel(ctx, &x, supports, c)?.matmul(&table(ctx, coef, &[supports, 1], DType::F32))
    } else {
        if coef.len() != c {
            return Err(format!("{} coefficients for X {}", coef.len(), show(&x)).into());
        }
        x.matmul(&table(ctx, coef, &[c, 1], DType::F32))
    };
    let mut y = score.add(f64::from(rho));
    if ctx.int("one_class", 0)? != 0 {
        y = y.gt(0.0).where_cond(y.zeros_like().add(1.0), y.zeros_like().sub(1.0));
    }
    Ok(vec![post_transform(ctx, y)?])
}

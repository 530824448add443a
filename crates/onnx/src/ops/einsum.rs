//! Einsum: an equation's operands with their axes labelled, contracted into the output's labels.
//!
//! Each operand first loses its repeated labels (a diagonal) and the labels no other operand and
//! not the output has (a sum). Two operands are then one batched matmul: the labels both share
//! and the output keeps are the batch, the ones both share and the output drops are contracted,
//! the rest are each side's rows and columns. One operand is a permutation; three or more are
//! multiplied with broadcasting and summed over what the output drops.

use kiln::{Dim, Tensor};

use super::{Ctx, OpResult, show};

/// An axis label: a letter, or `0, 1, ...` for the dims an ellipsis stands for (aligned from
/// the right across operands, as broadcasting aligns them).
type Label = u8;

/// One operand: the tensor and the label of each of its axes.
struct Term {
    t: Tensor,
    labels: Vec<Label>,
}

pub(super) fn einsum(ctx: &Ctx) -> OpResult<Vec<Tensor>> {
    let equation: String = ctx.string("equation")?.ok_or("the equation attribute is required")?;
    let equation: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match equation.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (equation.as_str(), None),
    };
    let inputs = ctx.all();
    let specs: Vec<&str> = lhs.split(',').collect();
    if specs.len() != inputs.len() {
        return Err(
            format!("equation {equation:?} names {} operands; the node has {}", specs.len(), inputs.len()).into()
        );
    }
    // The most dims any ellipsis stands for.
    let mut ellipsis = 0;
    for (spec, t) in specs.iter().zip(&inputs) {
        let letters = spec.chars().filter(char::is_ascii_alphabetic).count();
        if spec.contains("...") {
            ellipsis = ellipsis.max(t.ndim().checked_sub(letters).ok_or("an operand has fewer dims than labels")?);
        }
    }
    let expand = |spec: &str, rank: Option<usize>| -> OpResult<Vec<Label>> {
        let letters = spec.chars().filter(char::is_ascii_alphabetic).count();
        let mut out = Vec::new();
        let mut rest = spec;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("...") {
                let count = match rank {
                    Some(r) => r.checked_sub(letters).ok_or("an operand has fewer dims than labels")?,
                    None => ellipsis,
                };
                out.extend((ellipsis - count..ellipsis).map(|i| i as Label));
                rest = after;
            } else {
                let c = rest.as_bytes()[0];
                if !c.is_ascii_alphabetic() {
                    return Err(format!("equation {equation:?}: {:?} is not a label", c as char).into());
                }
                out.push(c);
                rest = &rest[1..];
            }
        }
        Ok(out)
    };
    let mut terms = Vec::new();
    for (spec, t) in specs.iter().zip(&inputs) {
        let labels = expand(spec, Some(t.ndim()))?;
        if labels.len() != t.ndim() {
            return Err(
                format!("{spec:?} labels {} axes; the operand {} has {}", labels.len(), show(t), t.ndim()).into()
            );
        }
        terms.push(Term { t: (*t).clone(), labels });
    }
    let output: Vec<Label> = match rhs {
        Some(r) => expand(r, None)?,
        None => {
            // Implicit: the ellipsis dims, then the labels used once, in alphabetical order.
            let mut once: Vec<Label> = Vec::new();
            for c in b'A'..=b'z' {
                if c.is_ascii_alphabetic() && terms.iter().flat_map(|t| &t.labels).filter(|&&l| l == c).count() == 1 {
                    once.push(c);
                }
            }
            (0..ellipsis as Label).chain(once).collect()
        }
    };
    for l in &output {
        if !terms.iter().any(|t| t.labels.contains(l)) {
            return Err(format!("equation {equation:?}: output label {:?} is on no operand", *l as char).into());
        }
    }
    for i in 0..terms.len() {
        let keep: Vec<Label> = output
            .iter()
            .chain(terms.iter().enumerate().filter(|&(j, _)| j != i).flat_map(|(_, t)| &t.labels))
            .copied()
            .collect();
        terms[i] =
            simplify(std::mem::replace(&mut terms[i], Term { t: Tensor::scalar(0.0f32), labels: vec![] }), &keep)?;
    }
    let result = match terms.len() {
        1 => terms.pop().expect("one term"),
        2 => {
            let b = terms.pop().expect("two terms");
            let a = terms.pop().expect("two terms");
            contract(a, b, &output)?
        }
        _ => broadcast_all(terms, &output)?,
    };
    Ok(vec![arrange(result, &output)?.t])
}

/// `term` without repeated labels (each pair's diagonal taken) and without the labels not in
/// `keep` (summed over).
fn simplify(mut term: Term, keep: &[Label]) -> OpResult<Term> {
    while let Some((p, q)) = repeated(&term.labels) {
        term = diagonal(term, p, q)?;
    }
    let dropped: Vec<usize> = (0..term.labels.len()).filter(|&i| !keep.contains(&term.labels[i])).collect();
    if !dropped.is_empty() {
        term.t = term.t.sum(dropped.clone());
        term.labels = term.labels.iter().enumerate().filter(|(i, _)| !dropped.contains(i)).map(|(_, &l)| l).collect();
    }
    Ok(term)
}

/// The first two positions holding the same label.
fn repeated(labels: &[Label]) -> Option<(usize, usize)> {
    (0..labels.len()).find_map(|p| (p + 1..labels.len()).find(|&q| labels[q] == labels[p]).map(|q| (p, q)))
}

/// The diagonal of axes `p < q` (same label): the two moved last, `[.., n, n]` read at stride
/// `n + 1` as `[.., n]`, in place of axis `p`.
fn diagonal(term: Term, p: usize, q: usize) -> OpResult<Term> {
    let Term { t, labels } = term;
    let n = t.shape()[p].as_const().ok_or("a diagonal needs a concrete dim")?;
    if t.shape()[q].as_const() != Some(n) {
        return Err(format!("the repeated label's axes of {} differ in size", show(&t)).into());
    }
    let rank = t.ndim();
    let mut order: Vec<usize> = (0..rank).filter(|&i| i != p && i != q).collect();
    order.extend([p, q]);
    let moved = t.permute(order.clone());
    let mut flat: Vec<Dim> = moved.shape()[..rank - 2].to_vec();
    flat.push(Dim::from(n * n));
    let mut pads = vec![(0, 0); rank - 1];
    pads[rank - 2] = (0, n as usize);
    let mut rows: Vec<Dim> = moved.shape()[..rank - 2].to_vec();
    rows.extend([Dim::from(n), Dim::from(n + 1)]);
    let diag = moved.reshape(flat).pad(&pads, 0.0).reshape(rows).narrow(rank as i64 - 1, 0, 1).squeeze(rank - 1);
    let mut new_labels: Vec<Label> = order[..rank - 2].iter().map(|&i| labels[i]).collect();
    new_labels.push(labels[p]);
    Ok(Term { t: diag, labels: new_labels })
}

/// Two operands as one batched matmul, the result labelled batch, rows, columns.
fn contract(a: Term, b: Term, output: &[Label]) -> OpResult<Term> {
    let shared = |l: &Label| a.labels.contains(l) && b.labels.contains(l);
    let batch: Vec<Label> = a.labels.iter().filter(|l| shared(l) && output.contains(l)).copied().collect();
    let summed: Vec<Label> = a.labels.iter().filter(|l| shared(l) && !output.contains(l)).copied().collect();
    let rows: Vec<Label> = a.labels.iter().filter(|l| !shared(l)).copied().collect();
    let cols: Vec<Label> = b.labels.iter().filter(|l| !shared(l)).copied().collect();
    let size = |t: &Term, l: Label| -> Dim { t.t.shape()[t.labels.iter().position(|&x| x == l).expect("labelled")] };
    // A shared dim of size 1 on one side broadcasts against the other's.
    let batch_dims: Vec<Dim> = batch
        .iter()
        .map(|&l| {
            let (x, y) = (size(&a, l), size(&b, l));
            if x.as_const() == Some(1) { y } else { x }
        })
        .collect();
    // Symbolic sizes merge as polynomials (Funnel contracts over a symbolic sequence).
    let product = |dims: Vec<Dim>| -> OpResult<Dim> {
        dims.iter()
            .try_fold(Dim::Const(1), |acc, d| acc.checked_mul(d))
            .ok_or_else(|| "the product of the contracted, row or column dims overflows".into())
    };
    let m = product(rows.iter().map(|&l| size(&a, l)).collect())?;
    let k = product(summed.iter().map(|&l| size(&a, l)).collect())?;
    let n = product(cols.iter().map(|&l| size(&b, l)).collect())?;
    let lhs = arrange(a, &[batch.clone(), rows.clone(), summed.clone()].concat())?;
    let rhs = arrange(b, &[batch.clone(), summed, cols.clone()].concat())?;
    let mut lhs_shape: Vec<Dim> = lhs.t.shape()[..batch.len()].to_vec();
    lhs_shape.extend([m, k]);
    let mut rhs_shape: Vec<Dim> = rhs.t.shape()[..batch.len()].to_vec();
    rhs_shape.extend([k, n]);
    let y = lhs.t.reshape(lhs_shape).matmul(&rhs.t.reshape(rhs_shape));
    let mut shape = batch_dims;
    let (ra, cb) = (&lhs.t, &rhs.t);
    shape.extend(ra.shape()[batch.len()..batch.len() + rows.len()].iter().copied());
    shape.extend(cb.shape()[cb.ndim() - cols.len()..].iter().copied());
    Ok(Term { t: y.reshape(shape), labels: [batch, rows, cols].concat() })
}

/// Three or more operands: each laid out over every label (size 1 where it lacks one),
/// multiplied with broadcasting, summed over the labels the output drops.
fn broadcast_all(terms: Vec<Term>, output: &[Label]) -> OpResult<Term> {
    let mut all: Vec<Label> = output.to_vec();
    for t in &terms {
        for &l in &t.labels {
            if !all.contains(&l) {
                all.push(l);
            }
        }
    }
    let mut laid_out = Vec::with_capacity(terms.len());
    for term in terms {
        let present: Vec<Label> = all.iter().filter(|l| term.labels.contains(l)).copied().collect();
        let mut t = arrange(term, &present)?.t;
        for (i, l) in all.iter().enumerate() {
            if !present.contains(l) {
                t = t.unsqueeze(i);
            }
        }
        laid_out.push(t);
    }
    let mut t = laid_out.into_iter().reduce(|a, b| a.mul(&b)).ok_or("no operands")?;
    if all.len() > output.len() {
        t = t.sum((output.len()..all.len()).collect::<Vec<_>>());
    }
    Ok(Term { t, labels: output.to_vec() })
}

/// `term` with its axes permuted into `order` (which holds exactly its labels).
fn arrange(term: Term, order: &[Label]) -> OpResult<Term> {
    if term.labels == order {
        return Ok(term);
    }
    let perm: Vec<usize> = order
        .iter()
        .map(|l| term.labels.iter().position(|x| x == l).ok_or("an output label is missing from the result"))
        .collect::<Result<_, _>>()?;
    Ok(Term { t: term.t.permute(perm), labels: order.to_vec() })
}

//! Fuzzing the text parser on stable Rust (proptest): random bytes, random token soup and mutated
//! valid programs. `parse` must never panic; whatever it accepts must verify (`Ok` or `Err`),
//! print, and parse back from its print.
//!
//! CI replays a fixed number of cases (`PROPTEST_CASES`, default 256, with CI's fixed seed);
//! `scripts/fuzz.sh` runs many more. Inputs that once panicked are kept below as regression tests.

use kiln_air::{parse, print_renumbered};
use proptest::prelude::*;

/// Valid programs covering every op kind, attributes, symbolic dims and comments.
const SEEDS: &[&str] = &[
    "graph {\n  n0 = input 0 : f32[4, seq]\n  n1 = const 1.0 : f32[4, seq]\n  n2 = add n0, n1 : f32[4, seq]\n  n3 = reduce sum axes=[1] n2 : f32[4, 1]\n  n4 = reshape [2, seq * 2] n2 : f32[2, seq * 2]\n  n5 = pad [(0, 1), (2, seq)] value=0.0 n3 : f32[5, seq + 3]\n  n6 = permute [1, 0] n5 : f32[seq + 3, 5]\n  return n3, n4, n6\n}\n",
    "graph {\n  n0 = input 0 : f32[4, seq]\n  n1 = reduce max axes=[1] n0 : f32[4, 1]\n  n2 = expand [4, seq] n1 : f32[4, seq]\n  n3 = shrink [(1, 3), (0, seq - 1)] n2 : f32[2, seq - 1]\n  n4 = iota axis=1 : i32[4, seq]\n  n5 = cast f32 n4 : f32[4, seq]\n  n6 = cmplt n5, n0 : bool[4, seq]\n  n7 = where n6, n0, n2 : f32[4, seq]\n  n8 = neg n7 : f32[4, seq]\n  return n3, n8\n}\n",
    "graph {\n  // a comment\n  x = input 0 : f64[3]\n  y = exp2 x : f64[3]\n  z = log2 y : f64[3]\n  w = sin z : f64[3]\n  v = recip w : f64[3]\n  u = sqrt v : f64[3]\n  return u, x\n}\n",
    "graph {\n  n0 = input 0 : i64[2, 3]\n  n1 = input 1 : i64[2, 3]\n  n2 = max n0, n1 : i64[2, 3]\n  n3 = mod n2, n1 : i64[2, 3]\n  n4 = cmpeq n3, n0 : bool[2, 3]\n  n5 = not n4 : bool[2, 3]\n  n6 = const true : bool[2, 3]\n  n7 = and n5, n6 : bool[2, 3]\n  return n7\n}\n",
    "graph {\n  n0 = const -inf : bf16[]\n  n1 = const nan : f16[1]\n  return n0, n1\n}\n",
    "graph {\n  return\n}\n",
];

/// Tokens of the text form, for random token soup and insertions.
const TOKENS: &[&str] = &[
    "graph",
    "{",
    "}",
    "return",
    "=",
    ",",
    ":",
    "[",
    "]",
    "(",
    ")",
    " ",
    "\n",
    "n0",
    "n1",
    "n2",
    "x",
    "input",
    "const",
    "iota",
    "add",
    "mul",
    "reduce",
    "sum",
    "max",
    "axes=",
    "axis=",
    "reshape",
    "expand",
    "permute",
    "pad",
    "shrink",
    "value=",
    "cast",
    "where",
    "f32",
    "i32",
    "i64",
    "bool",
    "f16",
    "bf16",
    "f64",
    "seq",
    "seq * 2",
    "seq + 1",
    "-",
    "0",
    "1",
    "-1",
    "3",
    "1.5",
    "nan",
    "-inf",
    "true",
    "//",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551616",
    "99999999999999999999",
    "1e400",
    "4294967295",
    "é",
    "\u{0}",
    "\t",
];

/// What parsing `text` must do: no panic; an accepted graph verifies without panicking, prints,
/// and its print parses again to the same print.
fn check(text: &str) {
    let Ok(graph) = parse(text) else { return };
    let _ = graph.verify();
    let printed = print_renumbered(&graph);
    let again = parse(&printed)
        .unwrap_or_else(|e| panic!("the print of an accepted graph does not parse: {e}\n{printed}\nfrom\n{text}"));
    assert_eq!(print_renumbered(&again), printed, "print -> parse -> print changed the text of\n{text}");
}

#[test]
fn the_seeds_are_valid() {
    for seed in SEEDS {
        let g = parse(seed).unwrap_or_else(|e| panic!("{e}\n{seed}"));
        g.verify().unwrap_or_else(|e| panic!("{e:?}\n{seed}"));
        check(seed);
    }
}

/// One edit of a valid program.
#[derive(Clone, Debug)]
enum Edit {
    Insert(prop::sample::Index, usize),
    Delete(prop::sample::Index, usize),
    Replace(prop::sample::Index, usize),
    DuplicateLine(prop::sample::Index),
    SwapLines(prop::sample::Index, prop::sample::Index),
    Byte(prop::sample::Index, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<prop::sample::Index>(), 0..TOKENS.len()).prop_map(|(i, t)| Edit::Insert(i, t)),
        (any::<prop::sample::Index>(), 1usize..8).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<prop::sample::Index>(), 0..TOKENS.len()).prop_map(|(i, t)| Edit::Replace(i, t)),
        any::<prop::sample::Index>().prop_map(Edit::DuplicateLine),
        (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Byte(i, b)),
    ]
}

/// Applies `edit` to `text` (on char boundaries, so the result stays a `str`).
fn apply(text: &str, edit: &Edit) -> String {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: &prop::sample::Index| if chars.is_empty() { 0 } else { i.index(chars.len() + 1) };
    let splice = |lo: usize, hi: usize, with: &str| -> String {
        let mut s: String = chars[..lo].iter().collect();
        s.push_str(with);
        s.extend(&chars[hi.min(chars.len())..]);
        s
    };
    match edit {
        Edit::Insert(i, t) => splice(at(i), at(i), TOKENS[*t]),
        Edit::Delete(i, n) => splice(at(i), (at(i) + n).min(chars.len()), ""),
        Edit::Replace(i, t) => {
            // Replaces the word (or symbol) at the position.
            let lo = at(i).min(chars.len());
            let hi = (lo..chars.len()).find(|&j| !chars[j].is_alphanumeric()).unwrap_or(chars.len()).max(lo + 1);
            splice(lo, hi.min(chars.len()), TOKENS[*t])
        }
        Edit::DuplicateLine(i) => {
            let mut lines: Vec<&str> = text.lines().collect();
            if !lines.is_empty() {
                let k = i.index(lines.len());
                lines.insert(k, lines[k]);
            }
            lines.join("\n")
        }
        Edit::SwapLines(a, b) => {
            let mut lines: Vec<&str> = text.lines().collect();
            if !lines.is_empty() {
                let (a, b) = (a.index(lines.len()), b.index(lines.len()));
                lines.swap(a, b);
            }
            lines.join("\n")
        }
        Edit::Byte(i, b) => {
            let mut bytes = text.as_bytes().to_vec();
            if !bytes.is_empty() {
                let k = i.index(bytes.len());
                bytes[k] = *b;
            }
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn random_token_soup_never_panics(tokens in prop::collection::vec(0..TOKENS.len(), 0..60)) {
        let mut text = String::from("graph {\n");
        text.extend(tokens.iter().map(|&t| TOKENS[t]));
        text.push_str("\n}\n");
        check(&text);
    }

    #[test]
    fn mutated_valid_programs_never_panic(
        seed in 0..SEEDS.len(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let mut text = SEEDS[seed].to_string();
        for e in &edits {
            text = apply(&text, e);
        }
        check(&text);
    }
}

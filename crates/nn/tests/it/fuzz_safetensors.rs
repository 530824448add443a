//! Fuzzing the safetensors weight loader on stable Rust (proptest): random bytes, truncated and
//! mutated valid files, and hand-made headers with hostile shapes, offsets and dtypes. Reading and
//! loading must never panic: every input gives `Ok` or an `Err`, and a loaded tensor realizes.
//!
//! CI replays a fixed number of cases (`PROPTEST_CASES`, default 256, with CI's fixed seed);
//! `scripts/fuzz.sh` runs many more.

use std::collections::HashMap;

use kiln::Tensor;
use kiln_nn::{Linear, Module, Sequential, load_state_dict, read_safetensors, to_safetensors_bytes};
use proptest::prelude::*;

/// A small model and its weights as a valid safetensors file.
fn model() -> Sequential {
    kiln::manual_seed(3);
    Sequential::new().push(Linear::new(3, 4, true)).push(Linear::new(4, 2, false))
}

fn valid_file() -> Vec<u8> {
    to_safetensors_bytes(&model()).expect("the model saves")
}

/// What reading `bytes` must do: never panic; on success every tensor realizes (or errs) and
/// loading into the model is `Ok` or `Err`.
fn read_and_load(bytes: &[u8]) {
    let Ok(tensors) = read_safetensors(bytes) else { return };
    for t in tensors.values() {
        // Realizing a source tensor checks nothing new, but a sum makes a program of it.
        let _ = t.realize();
        let _ = t.sum_all().realize();
    }
    let mut m = model();
    let _ = load_state_dict(&mut m, &tensors, true);
    let _ = load_state_dict(&mut m, &tensors, false);
}

/// A safetensors file from a JSON header and a data section.
fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

#[test]
fn a_valid_file_round_trips() {
    let tensors = read_safetensors(&valid_file()).unwrap();
    assert_eq!(tensors.len(), 3);
    let mut m = model();
    load_state_dict(&mut m, &tensors, true).unwrap();
    let original: HashMap<String, Tensor> = model().state_dict().into_iter().map(|(n, t, _)| (n, t)).collect();
    for (name, t) in &tensors {
        let (got, want) = (t.to_vec::<f32>().unwrap(), original[name].to_vec::<f32>().unwrap());
        air::testing::assert_equal(name, &got, &want);
    }
}

#[test]
fn hostile_headers_are_errors() {
    let cases = [
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}"#,
        r#"{"a":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}}"#,
        r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[8,4]}}"#,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}}"#,
        r#"{"a":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}"#,
        r#"{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}"#,
        r#"{"a":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[0,3]}}"#,
        r#"{"a":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F16","shape":[0],"data_offsets":[0,0]}}"#,
        r#"{"__metadata__":{"x":"y"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
        "{}",
        "",
        "[",
    ];
    let data = [7u8, 0, 1, 2, 255, 0, 0, 0];
    for header in cases {
        read_and_load(&with_header(header, &data));
        read_and_load(&with_header(header, &data[..3]));
    }
    // A header length past the end, and one so large it cannot be allocated.
    read_and_load(&u64::MAX.to_le_bytes());
    read_and_load(&[255, 255, 255, 255, 0, 0, 0, 0, b'{']);
    read_and_load(&[]);
}

/// Bool data must hold 0 or 1: a byte like 7 reads as `true` or is refused, never as a bool whose
/// bit pattern is invalid.
#[test]
fn bool_bytes_other_than_zero_and_one() {
    let bytes = with_header(r#"{"a":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}"#, &[0, 1, 7]);
    if let Ok(t) = read_safetensors(&bytes) {
        let v = t["a"].to_vec::<bool>().unwrap();
        assert_eq!(v, [false, true, true]);
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        read_and_load(&bytes);
    }

    #[test]
    fn random_bytes_after_a_plausible_header_length_never_panic(
        len in 0u64..200,
        rest in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend(rest);
        read_and_load(&bytes);
    }

    #[test]
    fn truncated_valid_files_never_panic(cut in any::<prop::sample::Index>()) {
        let file = valid_file();
        read_and_load(&file[..cut.index(file.len())]);
    }

    #[test]
    fn mutated_valid_files_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..8),
    ) {
        let mut file = valid_file();
        for (at, byte, how) in edits {
            let i = at.index(file.len());
            match how {
                0 => file[i] = byte,
                1 => file[i] ^= 1 << (byte % 8),
                2 => {
                    file.insert(i, byte);
                }
                _ => {
                    file.remove(i);
                }
            }
            if file.is_empty() {
                break;
            }
        }
        read_and_load(&file);
    }

    #[test]
    fn mutated_headers_never_panic(
        dtype in prop::sample::select(vec!["F32", "F64", "F16", "BF16", "I32", "I64", "BOOL", "U8", "I8", "U64", "X"]),
        shape in prop::collection::vec(prop::sample::select(vec![0u64, 1, 2, 3, 4, 8, 1 << 32, u64::MAX]), 0..4),
        start in prop::sample::select(vec![0u64, 1, 4, 8, 16, u64::MAX]),
        end in prop::sample::select(vec![0u64, 1, 4, 8, 12, 16, 24, u64::MAX]),
        name in "[a-z.]{0,6}",
        data in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let shape: Vec<String> = shape.iter().map(u64::to_string).collect();
        let header = format!(
            r#"{{"{name}":{{"dtype":"{dtype}","shape":[{}],"data_offsets":[{start},{end}]}}}}"#,
            shape.join(",")
        );
        read_and_load(&with_header(&header, &data));
    }
}

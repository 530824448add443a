//! `pipeline::run_in_place`: the cached forward's runs take the key/value cache the last run
//! returned instead of copying it, and compute what `Executable::run` on shared inputs does
//! (which copies each cache into its output first).

use std::sync::Arc;

use kiln_cli::model::GptConfig;
use kiln_cli::pipeline;
use kiln_cli::profile_cmd::profile_transformer;
use lower::{BufferKind, CompileOptions};

#[test]
fn runs_in_place_take_back_the_cache_they_returned() {
    let config = GptConfig { layers: 2, start_pos: Some(2), ..GptConfig::default() };
    let p = profile_transformer(config, &CompileOptions::default()).unwrap();
    let program = p.compiled.exe.program();
    let slots: Vec<usize> = program
        .inits
        .iter()
        .map(|&(_, from)| match program.buffers[from.0 as usize].kind {
            BufferKind::Input(slot) => slot as usize,
            other => panic!("a cache update starts from {other:?}"),
        })
        .collect();
    assert_eq!(slots.len(), 4, "two blocks' keys and values are updated in place");
    let reference = p.compiled.exe.run(&p.traced.inputs, &p.traced.bindings).unwrap();

    let mut inputs = pipeline::owned_inputs(&p.compiled, &p.traced);
    for (slot, traced) in slots.iter().map(|&s| (s, &p.traced.inputs[s])) {
        assert!(!Arc::ptr_eq(&inputs[slot].data, &traced.data), "the cache is copied once, before the runs");
    }
    for run in 0..3 {
        // Addresses, not `Arc`s: holding one would make the run copy. A copy is made while the
        // original lives, so it cannot land at the same address.
        let address = |inputs: &[air::HostTensor], s: usize| inputs[s].data.as_bytes().as_ptr() as usize;
        let before: Vec<usize> = slots.iter().map(|&s| address(&inputs, s)).collect();
        let outputs = pipeline::run_in_place(&p.compiled, &mut inputs, &p.traced.bindings).unwrap();
        for (&slot, &before) in slots.iter().zip(&before) {
            assert_eq!(address(&inputs, slot), before, "run {run} copied the cache in slot {slot}");
        }
        // The same position again: the same logits and the same cache as a run on shared inputs.
        for (i, (got, want)) in outputs.iter().zip(&reference).enumerate() {
            assert_eq!(got.shape, want.shape, "output {i}");
            let (got, want) = (got.as_slice::<f32>().unwrap(), want.as_slice::<f32>().unwrap());
            let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
            // Calibration may split a launch differently from one run to the next.
            assert!(worst <= 1e-5, "run {run}, output {i}: differs by {worst}");
        }
    }
}

//! Time per facade forward of the 2-layer Transformer of `kiln bench transformer-compile` (record
//! the lazy forward, `kiln::realize` it): `facade_forward [LAYERS] [ITERS]`; `RECORD=1` times the
//! recording alone. A loop long enough to profile (`perf record`).

use std::time::Instant;

use kiln::{Device, Tensor};
use nn::{Module, Transformer, TransformerConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layers: usize = std::env::args().nth(1).map_or(Ok(2), |s| s.parse())?;
    let iters: usize = std::env::args().nth(2).map_or(Ok(5000), |s| s.parse())?;
    let record_only = std::env::var_os("RECORD").is_some();
    kiln::manual_seed(0);
    let config =
        TransformerConfig { dim: 64, n_heads: 8, n_layers: layers, norm_eps: 1e-5, vocab_size: 64, max_seq_len: 64 };
    let mut model = Transformer::from_config(config)?;
    model.to_device(Device::Cpu)?;
    let tokens = Tensor::from_vec((0..30i32).map(|i| i % 64).collect::<Vec<_>>(), &[10, 3]);
    for _ in 0..100 {
        model.forward(&tokens).realize()?;
    }
    let start = Instant::now();
    for _ in 0..iters {
        let y = model.forward(&tokens);
        if !record_only {
            y.realize()?;
        }
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("{layers} layers: {us:.1} us per {}", if record_only { "recording" } else { "facade forward" });
    Ok(())
}

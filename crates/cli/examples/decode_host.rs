//! Time and host time (outside the program's run) per decoding step of `nn::Transformer`:
//! `decode_host [LAYERS] [STEPS] [DIM] [VOCAB]` (default 12 layers, 4000 steps, dim 64, vocab
//! 64: GPT-2 small's depth with tiny widths, where the facade's per-call work shows; `12 100 768
//! 50257` for GPT-2 small's shapes). `FLUSH=1` reads 600 MB between steps, as a GPT-2 step's
//! weights do, to show what cold caches cost the host side; `SPANS=1` prints the last step's
//! profile spans; `FULL=1` calls `forward_at` (every position's logits, as `kiln bench decode`
//! does) rather than `forward_at_last`. Allocations are counted, as in the `kiln` binary.

use std::time::Instant;

use kiln::{Device, Tensor};
use nn::{Module, Transformer, TransformerConfig};

#[global_allocator]
static ALLOC: kiln::profile::CountingAlloc = kiln::profile::CountingAlloc::SYSTEM;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layers: usize = std::env::args().nth(1).map_or(Ok(12), |s| s.parse())?;
    let steps: usize = std::env::args().nth(2).map_or(Ok(4000), |s| s.parse())?;
    let dim: usize = std::env::args().nth(3).map_or(Ok(64), |s| s.parse())?;
    let vocab: usize = std::env::args().nth(4).map_or(Ok(64), |s| s.parse())?;
    kiln::manual_seed(0);
    let config = TransformerConfig {
        dim,
        n_heads: 8.min(dim / 8).max(1),
        n_layers: layers,
        norm_eps: 1e-5,
        vocab_size: vocab,
        max_seq_len: 320,
    };
    let mut model = Transformer::from_config(config)?;
    model.to_device(Device::Cpu)?;
    let mut cache = model.kv_cache(1)?;
    let flush: Option<Vec<u32>> = std::env::var_os("FLUSH").map(|_| (0..150_000_000u32).collect());
    let full = std::env::var_os("FULL").is_some();
    let mut times = Vec::new();
    let mut host = Vec::new();
    let t_all = Instant::now();
    for step in 0..steps {
        if cache.len() + 1 > 300 {
            cache.reset();
            let _ = model.forward_at_last(&Tensor::from_vec(vec![1i32; 8], &[1, 8]), 0, &mut cache)?;
        }
        let tok = Tensor::from_vec(vec![(step % vocab) as i32], &[1, 1]);
        if let Some(f) = &flush {
            std::hint::black_box(f.iter().step_by(16).fold(0u32, |a, &b| a.wrapping_add(b)));
        }
        let t0 = Instant::now();
        let (r, report) = kiln::profile::profile(|| {
            if full {
                model.forward_at(&tok, cache.len(), &mut cache)
            } else {
                model.forward_at_last(&tok, cache.len(), &mut cache)
            }
        });
        let _ = r?;
        let run: f64 = report.spans.iter().filter(|s| s.name == "run").map(|s| s.duration.as_secs_f64()).sum();
        times.push(t0.elapsed().as_secs_f64() * 1e6);
        if step == steps - 1 && std::env::var_os("SPANS").is_some() {
            let mut agg: std::collections::BTreeMap<String, f64> = Default::default();
            for s in &report.spans {
                *agg.entry(s.name.to_string()).or_default() += s.duration.as_secs_f64() * 1e6;
            }
            println!("total {:.1} us; spans {agg:?}", report.total.as_secs_f64() * 1e6);
        }
        host.push((report.total.as_secs_f64() - run) * 1e6);
    }
    if let Ok(m) = std::fs::read_to_string("/proc/self/smaps_rollup")
        && let Some(l) = m.lines().find(|l| l.starts_with("AnonHugePages"))
    {
        print!("[{l}] ");
    }
    times.sort_by(f64::total_cmp);
    host.sort_by(f64::total_cmp);
    println!(
        "{layers} layers, {steps} steps in {:.2} s: median step {:.1} us, median host {:.1} us, traces {}",
        t_all.elapsed().as_secs_f64(),
        times[times.len() / 2],
        host[host.len() / 2],
        cache.traces()
    );
    Ok(())
}

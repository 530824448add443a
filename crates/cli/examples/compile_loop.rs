//! Compiles the cached Transformer forward at two depths, alternating (a fresh code generator and
//! no program cache each time), and prints each pass's median per depth and the per-layer
//! difference; also a steady target for a sampling profiler: `compile_loop [LAYERS_A LAYERS_B N]`.

#[global_allocator]
static ALLOC: kiln_cli::Allocator = kiln_cli::ALLOCATOR;

use std::collections::BTreeMap;

use kiln_cli::model::GptConfig;
use kiln_cli::profile_cmd::profile_transformer;
use kiln_cli::timing::median;
use lower::CompileOptions;

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    let (a, b, n) =
        (args.first().copied().unwrap_or(2), args.get(1).copied().unwrap_or(8), args.get(2).copied().unwrap_or(30));
    let options = CompileOptions::default();
    let config = |layers| GptConfig { layers, start_pos: Some(2), ..GptConfig::default() };
    profile_transformer(config(1), &options)?;
    // Per depth: pass name -> samples (ms); "end to end" included.
    let mut samples: [BTreeMap<String, Vec<f64>>; 2] = Default::default();
    for _ in 0..n {
        for (i, layers) in [a, b].into_iter().enumerate() {
            let p = profile_transformer(config(layers), &options)?;
            for row in p.report.passes() {
                samples[i].entry(row.name).or_default().push(row.time.as_secs_f64() * 1e3);
            }
            samples[i].entry("end to end".into()).or_default().push(p.report.end_to_end().as_secs_f64() * 1e3);
        }
    }
    println!("{:<16} {:>9} {:>9} {:>11}", "pass", format!("d{a} ms"), format!("d{b} ms"), "per layer");
    for (name, va) in &samples[0] {
        let Some(vb) = samples[1].get(name) else { continue };
        let (ma, mb) = (median(va), median(vb));
        println!("{name:<16} {ma:>9.3} {mb:>9.3} {:>11.4}", (mb - ma) / (b - a) as f64);
    }
    Ok(())
}

//! Per-pass medians of an imported ONNX model's first call in a warm process, every compile cache
//! emptied before each call, as `kiln profile onnx` reports them for one:
//! `onnx_phases MODEL.onnx N [name=size ...]` (the passes of `kiln bench onnx`'s "first call, warm
//! process", which `examples/onnx_first_calls` times whole).

#[global_allocator]
static ALLOC: kiln_cli::Allocator = kiln_cli::ALLOCATOR;

use std::collections::BTreeMap;

use kiln_cli::onnx_cmd;
use kiln_cli::timing::median;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: onnx_phases MODEL.onnx N [name=size ...]";
    let path = args.next().ok_or_else(|| anyhow::anyhow!(usage))?;
    let n: usize = args.next().map_or(Ok(40), |a| a.parse())?;
    let dims = onnx_cmd::parse_dims(&args.collect::<Vec<_>>())?;
    let options = lower::CompileOptions::default();
    // Per pass name: samples (ms); "end to end" included.
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for _ in 0..n.max(1) {
        kiln::backend::cpu_device()?.clear_caches();
        let (_, p) = onnx_cmd::profile(std::path::Path::new(&path), &dims, &options, false, true)?;
        for row in p.report.passes() {
            samples.entry(row.name).or_default().push(row.time.as_secs_f64() * 1e3);
        }
        samples.entry("end to end".into()).or_default().push(p.report.end_to_end().as_secs_f64() * 1e3);
    }
    println!("{path}: median of {n} first calls in the warm process, ms");
    for (name, v) in &samples {
        println!("{name:<16} {:>8.3}", median(v));
    }
    Ok(())
}

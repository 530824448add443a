//! Times an imported ONNX model's first call (import, trace, compile, run) again and again in one
//! warm process, every compile cache emptied before each, for a sampling profiler:
//! `perf record ... onnx_first_calls MODEL.onnx N [name=size ...] [idle_us=US]` (`idle_us`: the
//! process sleeps that long before each call, its pool threads then asleep).

#[global_allocator]
static ALLOC: kiln_cli::Allocator = kiln_cli::ALLOCATOR;

use std::collections::HashMap;

use kiln::{Device, Tensor};
use kiln_cli::onnx_cmd;
use kiln_onnx::Model;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: onnx_first_calls MODEL.onnx N [name=size ...] [idle_us=US]";
    let path = args.next().ok_or_else(|| anyhow::anyhow!(usage))?;
    let n: usize = args.next().map_or(Ok(50), |a| a.parse())?;
    let mut dims = HashMap::new();
    let mut idle = std::time::Duration::ZERO;
    for a in args {
        let (k, v) = a.split_once('=').ok_or_else(|| anyhow::anyhow!("expected name=size, got {a}"))?;
        match k {
            "idle_us" => idle = std::time::Duration::from_micros(v.parse()?),
            _ => drop(dims.insert(k.to_string(), v.parse()?)),
        }
    }
    let model = Model::load(std::path::Path::new(&path))?;
    let x = onnx_cmd::inputs(&model, &dims, Device::Cpu)?;
    let args: Vec<&Tensor> = x.iter().collect();
    let times = onnx_cmd::warm_first_calls_after(&model, &args, n.max(1), idle)?;
    println!("{path}: first call in the warm process, median {:.3} ms over {n}", kiln_cli::timing::median(&times));
    Ok(())
}

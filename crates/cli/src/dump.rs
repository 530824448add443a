//! `--dump DIR`: the graph after each pass of the profiled compilation (air text and DOT), the
//! kernel IR of the program, the Cranelift IR of every loop kernel and the WGSL of every kernel.
//!
//! The graphs are the ones the profiled compile itself produced: `lower`'s pass observer lends
//! each pass's result, and the pipeline keeps a copy when a dump is asked for (see
//! [`crate::pipeline::compile`]). Nothing is replayed here.

use std::path::{Path, PathBuf};

use air::Graph;
use anyhow::Context as _;
use lower::Pass;
use lower::kir::Kernel;

use crate::pipeline::Compiled;

/// Writes the dump files into `dir` (created if needed): `00-traced.air`/`.dot`, then for each
/// kept graph pass `NN-<pass>.air`/`.dot` (with `.stats` for `optimize`), the program's kir, and
/// per kernel its CLIF and WGSL. Returns the paths written.
pub fn write(dir: &Path, traced: &Graph, compiled: &Compiled) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut written = Vec::new();
    let mut put = |name: String, text: String| -> anyhow::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    put("00-traced.air".into(), air::text::print(traced))?;
    put("00-traced.dot".into(), air::dot::to_dot(traced))?;
    let mut n = 0;
    for (pass, graph) in &compiled.graphs {
        n += 1;
        put(format!("{n:02}-{pass}.air"), air::text::print(graph))?;
        put(format!("{n:02}-{pass}.dot"), air::dot::to_dot(graph))?;
        if *pass == Pass::Optimize {
            put(format!("{n:02}-{pass}.stats"), compiled.rewrite.to_string())?;
        }
    }
    let program = compiled.program();
    put(format!("{:02}-program.kir", n + 1), program.to_string())?;
    for (i, kernel) in program.kernels.iter().enumerate() {
        if let Kernel::Loops(k) = kernel {
            let clif = codegen::clif_text(k).unwrap_or_else(|e| format!("; clif_text failed: {e}\n"));
            put(format!("{:02}-k{i}.clif", n + 2), clif)?;
        }
        let wgsl = match codegen::wgsl::generate(kernel) {
            Ok(w) => w.source,
            Err(e) => format!("// no WGSL for this kernel: {e}\n"),
        };
        put(format!("{:02}-k{i}.wgsl", n + 3), wgsl)?;
    }
    Ok(written)
}

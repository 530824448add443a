//! Runs the `kiln` binary for each suite with `--smoke --out <tmpdir>` and checks that the CSV,
//! JSON and SVG files exist and parse (the memory, unary and matmul suites on wgpu too, where an
//! adapter exists); and runs `kiln profile transformer` with a trace and a dump.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kiln(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("the kiln binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "kiln {args:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("smoke-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn files_with(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the output folder exists")
        .map(|e| e.expect("a readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

/// Checks the files of one suite: every CSV has a header and rows of its width, the JSON parses
/// and holds every table, every SVG is one `<svg>` document with at least one curve point.
fn check_suite(suite: &str, extra: &[&str]) {
    // One folder per suite and flags, so runs of one suite on two devices do not collide.
    let dir = fresh_dir(&[suite].iter().chain(extra).copied().collect::<Vec<_>>().join("-").replace("--", ""));
    let mut args = vec!["bench", suite, "--smoke", "--out"];
    let dir_str = dir.to_str().expect("a UTF-8 path");
    args.push(dir_str);
    args.extend_from_slice(extra);
    let stdout = kiln(&args);
    assert!(stdout.contains(&format!("# kiln bench {suite}")), "{stdout}");

    let csvs = files_with(&dir, "csv");
    assert!(!csvs.is_empty(), "{suite}: no CSV in {}", dir.display());
    for csv in &csvs {
        let text = std::fs::read_to_string(csv).expect("CSV readable");
        let mut lines = text.lines();
        let header = lines.next().expect("a header line");
        let width = header.split(',').count();
        let rows: Vec<&str> = lines.collect();
        assert!(!rows.is_empty(), "{}: no rows", csv.display());
        for row in rows {
            // Cells never hold commas in these suites except quoted names; count outside quotes.
            let mut cells = 1;
            let mut quoted = false;
            for c in row.chars() {
                match c {
                    '"' => quoted = !quoted,
                    ',' if !quoted => cells += 1,
                    _ => {}
                }
            }
            assert_eq!(cells, width, "{}: row {row:?} has {cells} cells, header {width}", csv.display());
        }
    }

    let json_path = dir.join(format!("{suite}.json"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("JSON readable")).expect("JSON parses");
    assert_eq!(json["suite"], suite);
    let tables = json["tables"].as_object().expect("a tables object");
    assert_eq!(tables.len(), csvs.len());
    for table in tables.values() {
        assert!(!table["rows"].as_array().expect("rows").is_empty());
    }

    let svgs = files_with(&dir, "svg");
    assert!(!svgs.is_empty(), "{suite}: no SVG");
    for svg in &svgs {
        let text = std::fs::read_to_string(svg).expect("SVG readable");
        assert!(text.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""), "{}", svg.display());
        assert!(text.trim_end().ends_with("</svg>"));
        assert_eq!(text.matches("<svg").count(), 1);
        assert!(text.contains("<circle"), "{}: no data point", svg.display());
    }
}

#[test]
fn transformer_compile_smoke() {
    check_suite("transformer-compile", &[]);
}

#[test]
fn transformer_compile_fresh_process_smoke() {
    check_suite("transformer-compile", &["--fresh-process", "2"]);
    // The folder `check_suite` wrote (it names folders after the suite and flags).
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smoke-transformer-compile-fresh-process-2");
    let csv = std::fs::read_to_string(dir.join("transformer-compile_fresh.csv")).expect("the fresh-process table");
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "one row per smoke depth (1, 2):\n{csv}");
    for row in rows {
        let cells: Vec<&str> = row.split(',').collect();
        assert_eq!(cells[1], "2", "two processes per mode: {row}");
        for ms in &cells[2..] {
            let ms: f64 = ms.parse().unwrap_or_else(|_| panic!("a time in {row}"));
            assert!(ms > 0.0 && ms < 60_000.0, "{row}");
        }
    }
    let forward = std::fs::read_to_string(dir.join("transformer-compile_forward.csv")).expect("the forward table");
    assert!(forward.contains("facade forward (record + kiln::realize)"), "{forward}");
    assert!(forward.contains("bare Executable::run"), "{forward}");
}

#[test]
fn transformer_first_call_prints_its_time() {
    let out = kiln(&["bench", "transformer-first-call", "--layers", "1", "--prewarm"]);
    let ms: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix(kiln_cli::bench::transformer::FIRST_CALL_PREFIX))
        .unwrap_or_else(|| panic!("no time printed:\n{out}"))
        .trim()
        .parse()
        .expect("a number");
    assert!(ms > 0.0, "{out}");
}

/// The compile benchmark on the forward with a key/value cache at start position 2.
#[test]
fn transformer_compile_cached_smoke() {
    check_suite("transformer-compile", &["--start-pos", "2"]);
}

#[test]
fn decode_smoke() {
    check_suite("decode", &[]);
    check_suite("decode", &["--model", "tiny"]);
}

#[test]
fn dist_smoke() {
    check_suite("dist", &[]);
}

/// `kiln profile transformer --start-pos 2`: the cached forward's per-pass table.
#[test]
fn profile_transformer_at_a_start_position() {
    let stdout = kiln(&["profile", "transformer", "--layers", "1", "--start-pos", "2", "--cold"]);
    assert!(stdout.contains("tokens (10, 3) at start position 2"), "{stdout}");
    assert!(stdout.contains("codegen") && stdout.contains("end to end"), "{stdout}");
}

/// `kiln profile model`: a model of the suite, predict and fit, with the launch table.
#[test]
fn profile_model_predict_and_fit_with_launches() {
    let predict = kiln(&["profile", "model", "conv-32", "--launches", "3"]);
    assert!(predict.contains("conv-32 (predict)") && predict.contains("top 3 kernels by time"), "{predict}");
    assert!(predict.contains("after one untimed compilation and run of the same program"), "{predict}");
    // Each listed kernel's time in the program's first run beside its steady time.
    assert!(predict.contains("first run: ") && predict.contains("first us"), "{predict}");
    let row = predict.lines().find(|l| l.trim_start().starts_with('k') && l.contains('%')).expect("a kernel row");
    let first_us: f64 = row.split_whitespace().nth(4).and_then(|v| v.parse().ok()).expect("a first-run time");
    assert!(first_us > 0.0, "{row}");
    // The im2col product reads its `b` from the padded input in place on AVX-512F hosts
    // (`runtime::window`), and says so; its copy is skipped.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        assert!(predict.contains("matmul batch 1 m 32 n 5408 k 9 (a row-major, b read in place"), "{predict}");
        let all = kiln(&["profile", "model", "conv-32", "--launches", "8"]);
        assert!(all.contains("loops (a copy skipped: its product reads its source)"), "{all}");
    }
    let fit = kiln(&["profile", "model", "dense-tiny", "--fit", "--cold"]);
    assert!(fit.contains("dense-tiny (loss and gradients)") && fit.contains("codegen"), "{fit}");
    assert!(fit.contains("(cold: the first compilation of this process"), "{fit}");
    let bad = Command::new(env!("CARGO_BIN_EXE_kiln")).args(["profile", "model", "no-such-model"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("no-such-model"));
}

#[test]
fn unary_smoke() {
    check_suite("unary", &[]);
}

#[test]
fn embedding_smoke() {
    check_suite("embedding", &[]);
}

#[test]
fn models_smoke() {
    check_suite("models", &[]);
}

#[test]
fn tree_matmul_smoke() {
    check_suite("tree-matmul", &[]);
}

#[test]
fn matmul_smoke() {
    check_suite("matmul", &[]);
}

#[test]
fn memory_smoke() {
    check_suite("memory", &[]);
}

/// Whether a wgpu adapter exists; prints why a test is skipped when not, and fails instead when
/// `KILN_REQUIRE_VULKAN=1`.
fn have_wgpu() -> bool {
    match kiln::Device::Wgpu.probe() {
        Ok(_) => true,
        Err(e) => {
            let required = std::env::var("KILN_REQUIRE_VULKAN").is_ok_and(|v| v == "1");
            assert!(!required, "KILN_REQUIRE_VULKAN=1 but no wgpu device: {e}");
            eprintln!("skipped: no wgpu device ({e})");
            false
        }
    }
}

/// The memory suite on wgpu (with its buffer counts).
#[test]
fn memory_wgpu_smoke() {
    if have_wgpu() {
        check_suite("memory", &["--device", "wgpu"]);
    }
}

/// The unary suite on wgpu: single, eager and lazy rows.
#[test]
fn unary_wgpu_smoke() {
    if have_wgpu() {
        check_suite("unary", &["--device", "wgpu"]);
    }
}

#[test]
fn matmul_wgpu_smoke() {
    if have_wgpu() {
        check_suite("matmul", &["--device", "wgpu"]);
    }
}

#[test]
fn profile_transformer_prints_one_table_and_writes_trace_and_dump() {
    let dir = fresh_dir("profile");
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let trace = dir.join("trace.json");
    let dump = dir.join("dump");
    let stdout = kiln(&[
        "profile",
        "transformer",
        "--layers",
        "1",
        "--trace",
        trace.to_str().expect("UTF-8"),
        "--dump",
        dump.to_str().expect("UTF-8"),
    ]);
    for needle in ["pass", "optimize", "emit-kernels", "codegen", "first-run", "totals:", "peak memory planned:"] {
        assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    }
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace written")).expect("trace parses");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    assert!(events.len() >= 8);
    for e in events {
        assert_eq!(e["ph"], "X");
        assert!(e["ts"].as_f64().is_some() && e["dur"].as_f64().is_some());
        assert_eq!((e["pid"].as_u64(), e["tid"].as_u64()), (Some(1), Some(1)));
    }
    for name in ["00-traced.air", "00-traced.dot", "01-optimize.air", "01-optimize.dot", "02-program.kir"] {
        let text = std::fs::read_to_string(dump.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!text.is_empty(), "{name} is empty");
    }
    assert!(!files_with(&dump, "clif").is_empty(), "no CLIF dumped");
}

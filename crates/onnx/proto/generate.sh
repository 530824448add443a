#!/usr/bin/env bash
# Regenerates crates/onnx/src/proto/onnx.rs from the vendored onnx.proto (copied from the onnx
# 1.22.0 wheel) with prost-build and protox (a pure-Rust protobuf compiler, so no protoc). The
# generated file is committed: building kiln-onnx needs neither this script nor its crates.
# Usage: bash crates/onnx/proto/generate.sh   (needs cargo and access to crates.io)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${TMPDIR:-/tmp}/kiln-onnx-protogen"
mkdir -p "$work/src"
cat > "$work/Cargo.toml" <<'TOML'
[package]
name = "kiln-onnx-protogen"
version = "0.1.0"
edition = "2021"
publish = false
[dependencies]
prost-build = "=0.14.6"
protox = "=0.9.1"
[workspace]
TOML
cat > "$work/src/main.rs" <<'RS'
fn main() {
    let mut args = std::env::args().skip(1);
    let (dir, out) = (args.next().expect("proto dir"), args.next().expect("out dir"));
    let fds = protox::compile(["onnx.proto"], [dir.as_str()]).expect("onnx.proto compiles");
    prost_build::Config::new().out_dir(&out).compile_fds(fds).expect("prost-build generates");
}
RS
out="$here/../src/proto"
mkdir -p "$out"
(cd "$work" && cargo run --quiet --release -- "$here" "$out")
echo "wrote $out/onnx.rs"

"""Exports the model suite of ../shared/anchors/bench_models.py (the nine models of `kiln bench
models`, random-initialized, eval mode) to ONNX the way ../shared/anchors/bench_onnxruntime.py
does (torch.onnx.export, opset 17, dynamic batch axis, input `x`), for `kiln bench onnx` and
scripts/anchor_onnx_onnxruntime.py side by side (scripts/bench-onnx-suite.sh).

Usage: python scripts/export_model_suite.py OUT_DIR
Writes OUT_DIR/<name>.onnx and prints one line per model: `<name> <batch> <dims,of,one,sample>`.
"""
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "shared", "anchors"))
from bench_models import NAMES, builder  # noqa: E402

import torch  # noqa: E402

warnings.filterwarnings("ignore")
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
build = builder()
for name in NAMES:
    model, x, _ = build(name)
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, (x,), os.path.join(out, f"{name}.onnx"), input_names=["x"], output_names=["y"],
                          opset_version=17, dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, dynamo=False)
    print(name, x.shape[0], ",".join(str(d) for d in x.shape[1:]))

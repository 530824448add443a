"""onnxruntime on an ONNX file, the anchor of `kiln bench onnx`: session creation (median of 15, and
the fastest of the 15: in one process onnxruntime alternates between a fast and a slow mode, see
BENCHMARKS.md s58; `kiln bench onnx` times as many warm first calls) and steady `run` (median over at least 0.5 s, after 10 warm-up runs), CPU, 2
intra-op threads.

Usage: python scripts/anchor_onnx_onnxruntime.py MODEL.onnx BATCH SHAPE
  e.g. python scripts/anchor_onnx_onnxruntime.py crates/onnx/tests/fixtures/cnn.onnx 3 3,8,8
       python scripts/anchor_onnx_onnxruntime.py crates/onnx/tests/fixtures/gpt2.onnx 3 9
The input is named `x` (as in crates/onnx/tests/fixtures/gen_onnx.py's exports).
"""
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

path, batch, shape = sys.argv[1], int(sys.argv[2]), tuple(int(s) for s in sys.argv[3].split(","))
opts = ort.SessionOptions()
opts.intra_op_num_threads = 2
opts.inter_op_num_threads = 1
created = []
for _ in range(15):
    t0 = time.perf_counter()
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    created.append((time.perf_counter() - t0) * 1e3)
# The same inputs `kiln bench onnx` feeds (crates/cli/src/onnx_cmd.rs): sin(0.731 i) for floats,
# zeros for integers (a token model's ids).
if session.get_inputs()[0].type == "tensor(int64)":
    x = {"x": np.zeros((batch,) + shape, dtype=np.int64)}
else:
    x = {"x": np.sin(np.arange(batch * np.prod(shape), dtype=np.float32) * 0.731).reshape((batch,) + shape)}
for _ in range(10):
    session.run(None, x)
runs = []
end = time.perf_counter() + 0.5
while time.perf_counter() < end or len(runs) < 20:
    t0 = time.perf_counter()
    session.run(None, x)
    runs.append((time.perf_counter() - t0) * 1e3)
print(f"onnxruntime {path.split('/')[-1]} batch {batch}: session {statistics.median(created):.3f} ms "
      f"(fastest {min(created):.3f}), run {statistics.median(runs):.4f} ms")

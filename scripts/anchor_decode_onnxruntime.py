"""Decode anchor on onnxruntime: GPT-2 (random weights from a config, nothing downloaded) exported
to ONNX with explicit past keys/values, then decoded with a KV cache on onnxruntime's CPU
provider, on the protocol of ../shared/anchors/bench_decode.py (and `kiln bench decode`): per
past length P (8, and 256 where the context allows) prefill P tokens (timed after a warm-up), then
32 greedy steps, median ms per new token; batch 1, 2 threads then 1.

The exported step is written out here (transformers' own forward keeps its cache in a Python
object that the exporter does not take): inputs `ids [1, s]`, `past_k`, `past_v`
`[layers, 1, heads, P, head_dim]`; outputs the last position's logits and the presents
`[layers, 1, heads, P + s, head_dim]` (the concatenation onnxruntime's own GPT-2 exports do). It
is checked against transformers' logits (max abs diff <= 1e-4) before timing.

Run: /path/to/venv/bin/python scripts/anchor_decode_onnxruntime.py [--only tiny]
Needs torch, transformers, onnx and onnxruntime.
"""
import os
import sys
import tempfile

ANCHORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "anchors")
sys.path.insert(0, ANCHORS)
from common import emit, parse_results, run_guarded, table, wait_for_idle  # noqa: E402

CONFIGS = {
    "tiny": dict(n_embd=64, n_head=8, n_layer=2, vocab_size=64, n_positions=64),
    "gpt2": dict(n_embd=768, n_head=12, n_layer=12, vocab_size=50257, n_positions=1024),
}
STEPS = 32


def step_module(model):
    import torch

    class Step(torch.nn.Module):
        def __init__(self, hf):
            super().__init__()
            self.hf = hf
            cfg = hf.config
            self.h, self.d = cfg.n_head, cfg.n_embd // cfg.n_head

        def forward(self, ids, past_k, past_v):
            t = self.hf.transformer
            p = past_k.shape[3]
            s = ids.shape[1]
            pos = torch.arange(s, dtype=torch.long).unsqueeze(0) + p
            x = t.wte(ids) + t.wpe(pos)
            ks, vs = [], []
            total = p + s
            # Query i (absolute position p + i) sees keys 0 ..= p + i.
            qpos = torch.arange(s).unsqueeze(1) + p
            kpos = torch.arange(total).unsqueeze(0)
            mask = kpos > qpos
            for i, block in enumerate(t.h):
                a = block.ln_1(x)
                qkv = block.attn.c_attn(a)
                q, k, v = qkv.split(self.h * self.d, dim=2)
                q = q.view(1, s, self.h, self.d).transpose(1, 2)
                k = torch.cat([past_k[i], k.view(1, s, self.h, self.d).transpose(1, 2)], dim=2)
                v = torch.cat([past_v[i], v.view(1, s, self.h, self.d).transpose(1, 2)], dim=2)
                ks.append(k)
                vs.append(v)
                scores = (q @ k.transpose(-1, -2)) / (self.d ** 0.5)
                scores = scores.masked_fill(mask, float("-inf"))
                y = torch.softmax(scores, dim=-1) @ v
                y = y.transpose(1, 2).reshape(1, s, self.h * self.d)
                x = x + block.attn.c_proj(y)
                x = x + block.mlp(block.ln_2(x))
            logits = self.hf.lm_head(t.ln_f(x[:, -1:, :]))
            return logits, torch.stack(ks), torch.stack(vs)

    return Step(model).eval()


def child(threads, names):
    if threads == 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    import statistics
    import time
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    # The exported files (600+ MB for GPT-2 small) go when the process ends, error or not.
    tmp_dir = tempfile.TemporaryDirectory()
    tmp = tmp_dir.name
    for name in names:
        cfg = GPT2Config(**CONFIGS[name])
        model = GPT2LMHeadModel(cfg).eval()
        params = sum(p.numel() for p in model.parameters())
        step = step_module(model)
        L, H, D = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head
        empty = torch.zeros(L, 1, H, 0, D)
        ids = torch.randint(0, cfg.vocab_size, (1, 5))
        path = os.path.join(tmp, f"{name}.onnx")
        with torch.no_grad():
            torch.onnx.export(step, (ids, empty, empty), path, input_names=["ids", "past_k", "past_v"],
                              output_names=["logits", "present_k", "present_v"], dynamo=False,
                              dynamic_axes={"ids": {1: "s"}, "past_k": {3: "p"}, "past_v": {3: "p"},
                                            "present_k": {3: "t"}, "present_v": {3: "t"}}, opset_version=17)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        # Check against transformers: a prefill of 5, then one cached step.
        with torch.no_grad():
            want = model(input_ids=torch.cat([ids, ids[:, :1]], 1)).logits[:, -1].numpy()
        e = np.zeros((L, 1, H, 0, D), dtype=np.float32)
        _, pk, pv = sess.run(None, {"ids": ids.numpy(), "past_k": e, "past_v": e})
        got, _, _ = sess.run(None, {"ids": ids[:, :1].numpy(), "past_k": pk, "past_v": pv})
        diff = float(np.abs(got[:, -1] - want).max())
        if not diff <= 1e-4:
            raise SystemExit(f"{name}: onnxruntime differs from transformers by {diff}")
        for past in (8, 256):
            if past + STEPS > cfg.n_positions:
                continue
            prompt = torch.randint(0, cfg.vocab_size, (1, past)).numpy()
            for _ in range(3):  # warm-up, then keep the last
                t0 = time.perf_counter()
                logits, pk, pv = sess.run(None, {"ids": prompt, "past_k": e, "past_v": e})
                prefill_ms = (time.perf_counter() - t0) * 1e3
            tok = logits[:, -1].argmax(-1).reshape(1, 1).astype(np.int64)
            steps = []
            for _ in range(STEPS):
                t0 = time.perf_counter()
                logits, pk, pv = sess.run(None, {"ids": tok, "past_k": pk, "past_v": pv})
                tok = logits[:, -1].argmax(-1).reshape(1, 1).astype(np.int64)
                steps.append((time.perf_counter() - t0) * 1e3)
            ms = statistics.median(steps)
            emit({"threads": threads, "model": name, "params": params, "past": past, "prefill_ms": prefill_ms,
                  "token_ms": ms, "tok_s": 1e3 / ms, "check": diff})


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), sys.argv[3].split(","))
        return
    names = list(CONFIGS)
    if "--only" in sys.argv:
        names = sys.argv[sys.argv.index("--only") + 1].split(",")
    wait_for_idle()
    rows = []
    for threads in (2, 1):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        p, other, tries = run_guarded([sys.executable, __file__, "--child", str(threads), ",".join(names)],
                                      env=env, label=f"onnxruntime {threads} thr")
        if p.returncode != 0:
            print(p.stderr[-3000:])
            continue
        for r in parse_results(p.stdout):
            rows.append([r["model"], f"{r['params']:,}", str(threads), str(r["past"]), r["prefill_ms"],
                         r["token_ms"], r["tok_s"], f"{r['check']:.1e}"])
        print(f"[onnxruntime {threads} thr] other load {other if other is None else round(other * 100)}%, tries {tries}")
    print("## Decode with a KV cache: onnxruntime CPU (GPT-2 exported with past keys/values), batch 1\n")
    print(table(["model", "parameters", "threads", "past length", "prefill ms", "ms / new token", "tokens/s",
                 "max diff vs transformers"], rows))


if __name__ == "__main__":
    main()

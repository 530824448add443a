"""Kiln against onnxruntime on a zoo of exported models: tiny, randomly initialized Hugging Face
`transformers` models (from their configs, nothing downloaded) exported by torch.onnx.export with
dynamic batch and sequence axes, by the TorchScript exporter (opset 17) and, where `onnxscript`
imports, the dynamo exporter (opset 20); six vision models with a dynamic image size too; and, where
scikit-learn and skl2onnx import, small scikit-learn models. Each model runs on onnxruntime at
two sizes, then through `kiln onnx run --expect` on the same inputs (rtol 1e-4, atol 1e-5); the
script prints one line per model and size and a summary, and exits 1 if any fails.

    python scripts/onnx-zoo.py [--device cpu|interp|wgpu] [--only NAME,...] [--keep DIR]

It needs torch, transformers, onnx and onnxruntime (the anchors venv has them); onnxscript,
scikit-learn and skl2onnx are optional (e.g. `pip install --target DIR onnxscript onnx_ir
scikit-learn skl2onnx onnxconverter-common` and DIR on PYTHONPATH). Kiln is built in release mode.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import onnxruntime as ort
import torch

warnings.filterwarnings("ignore")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hf_models():
    import transformers as T

    def lm(cfg_cls, model_cls, **kw):
        cfg = cfg_cls(**kw)
        cfg._attn_implementation = "eager"
        return model_cls(cfg)

    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    # name, constructor, input kind (token ids, pixels, audio features or samples), attention mask
    yield "bert", lambda: lm(T.BertConfig, T.BertModel, vocab_size=99, max_position_embeddings=64, **small), "ids", True
    yield "roberta", lambda: lm(T.RobertaConfig, T.RobertaModel, vocab_size=99, max_position_embeddings=64, **small), "ids", True
    yield "distilbert", lambda: lm(T.DistilBertConfig, T.DistilBertModel, vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64), "ids", True
    yield "albert", lambda: lm(T.AlbertConfig, T.AlbertModel, vocab_size=99, embedding_size=16, max_position_embeddings=64, **small), "ids", True
    yield "electra", lambda: lm(T.ElectraConfig, T.ElectraModel, vocab_size=99, embedding_size=16, max_position_embeddings=64, **small), "ids", True
    yield "llama", lambda: lm(T.LlamaConfig, T.LlamaForCausalLM, vocab_size=99, max_position_embeddings=64, num_key_value_heads=2, **small), "ids", False
    yield "mistral", lambda: lm(T.MistralConfig, T.MistralForCausalLM, vocab_size=99, max_position_embeddings=64, num_key_value_heads=2, **small), "ids", False
    yield "qwen2", lambda: lm(T.Qwen2Config, T.Qwen2ForCausalLM, vocab_size=99, max_position_embeddings=64, num_key_value_heads=2, **small), "ids", False
    yield "phi", lambda: lm(T.PhiConfig, T.PhiForCausalLM, vocab_size=99, max_position_embeddings=64, **small), "ids", False
    yield "gpt_neox", lambda: lm(T.GPTNeoXConfig, T.GPTNeoXForCausalLM, vocab_size=99, max_position_embeddings=64, **small), "ids", False
    yield "opt", lambda: lm(T.OPTConfig, T.OPTForCausalLM, vocab_size=99, max_position_embeddings=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32), "ids", False
    yield "bloom", lambda: lm(T.BloomConfig, T.BloomForCausalLM, vocab_size=99, hidden_size=32, n_layer=2, n_head=4), "ids", False
    yield "gptj", lambda: lm(T.GPTJConfig, T.GPTJForCausalLM, vocab_size=99, n_positions=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4), "ids", False
    yield "t5enc", lambda: lm(T.T5Config, T.T5EncoderModel, vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4), "ids", True
    yield "vit", lambda: lm(T.ViTConfig, T.ViTModel, image_size=16, patch_size=4, num_channels=3, **small), "pix", False
    yield "resnet", lambda: lm(T.ResNetConfig, T.ResNetModel, num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"), "pix", False
    yield "wav2vec2", lambda: lm(T.Wav2Vec2Config, T.Wav2Vec2Model, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(8, 8), conv_stride=(4, 2), conv_kernel=(8, 4), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4), "wav", False
    yield "swin", lambda: lm(T.SwinConfig, T.SwinModel, image_size=32, patch_size=4, num_channels=3, embed_dim=8, depths=[1, 1], num_heads=[2, 2], window_size=4), "pix", False
    yield "deberta", lambda: lm(T.DebertaV2Config, T.DebertaV2Model, vocab_size=99, max_position_embeddings=64, **small), "ids", True
    yield "mobilebert", lambda: lm(T.MobileBertConfig, T.MobileBertModel, vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16), "ids", True
    yield "gemma", lambda: lm(T.GemmaConfig, T.GemmaForCausalLM, vocab_size=99, max_position_embeddings=64, num_key_value_heads=2, head_dim=8, **small), "ids", False
    yield "bart", lambda: lm(T.BartConfig, T.BartModel, vocab_size=99, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2), "ids", True
    yield "clip_text", lambda: lm(T.CLIPTextConfig, T.CLIPTextModel, vocab_size=99, max_position_embeddings=64, eos_token_id=2, **small), "ids", True
    yield "dinov2", lambda: lm(T.Dinov2Config, T.Dinov2Model, image_size=16, patch_size=4, num_channels=3, **small), "pix", False
    yield "beit", lambda: lm(T.BeitConfig, T.BeitModel, image_size=16, patch_size=4, num_channels=3, use_relative_position_bias=True, **small), "pix", False
    yield "gpt_bigcode", lambda: lm(T.GPTBigCodeConfig, T.GPTBigCodeForCausalLM, vocab_size=99, n_positions=64, n_embd=32, n_layer=2, n_head=4, multi_query=True), "ids", False
    yield "mpnet", lambda: lm(T.MPNetConfig, T.MPNetModel, vocab_size=99, max_position_embeddings=64, **small), "ids", True
    yield "squeezebert", lambda: lm(T.SqueezeBertConfig, T.SqueezeBertModel, vocab_size=99, max_position_embeddings=64, embedding_size=32, **small), "ids", True
    yield "funnel", lambda: lm(T.FunnelConfig, T.FunnelBaseModel, vocab_size=99, d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1]), "ids", True
    yield "xglm", lambda: lm(T.XGLMConfig, T.XGLMForCausalLM, vocab_size=99, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64, max_position_embeddings=64), "ids", False
    yield "stablelm", lambda: lm(T.StableLmConfig, T.StableLmForCausalLM, vocab_size=99, max_position_embeddings=64, num_key_value_heads=2, **small), "ids", False
    yield "olmo", lambda: lm(T.OlmoConfig, T.OlmoForCausalLM, vocab_size=99, max_position_embeddings=64, num_key_value_heads=2, **small), "ids", False
    yield "mobilevit", lambda: lm(T.MobileViTConfig, T.MobileViTModel, image_size=32, num_channels=3, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32], patch_size=2), "pix", False
    yield "levit", lambda: lm(T.LevitConfig, T.LevitModel, image_size=32, num_channels=3, hidden_sizes=[16, 32, 48], num_attention_heads=[2, 2, 2], depths=[1, 1, 1], key_dim=[8, 8, 8], patch_size=16, stride=2), "pix", False
    yield "convnext", lambda: lm(T.ConvNextConfig, T.ConvNextModel, num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2), "pix", False
    yield "whisper_enc", lambda: T.WhisperModel(T.WhisperConfig(vocab_size=99, num_mel_bins=8, d_model=32, encoder_layers=2, encoder_attention_heads=4, decoder_layers=1, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)).encoder, "feat", False
    yield "falcon", lambda: lm(T.FalconConfig, T.FalconForCausalLM, vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4), "ids", False
    yield "segformer", lambda: lm(T.SegformerConfig, T.SegformerModel, num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]), "pix", False
    yield "yolos", lambda: lm(T.YolosConfig, T.YolosModel, image_size=[32, 32], patch_size=8, num_detection_tokens=4, **small), "pix", False
    yield "bigbird", lambda: lm(T.BigBirdConfig, T.BigBirdModel, vocab_size=99, max_position_embeddings=64, attention_type="original_full", **small), "ids", True
    yield "gpt2", lambda: lm(T.GPT2Config, T.GPT2Model, vocab_size=99, n_positions=64, n_embd=32, n_layer=2, n_head=4), "ids", True
    yield "qwen3", lambda: lm(T.Qwen3Config, T.Qwen3ForCausalLM, vocab_size=99, max_position_embeddings=64, num_key_value_heads=2, head_dim=8, **small), "ids", False
    yield "gemma2", lambda: lm(T.Gemma2Config, T.Gemma2ForCausalLM, vocab_size=99, max_position_embeddings=64, num_key_value_heads=2, head_dim=8, **small), "ids", False
    yield "regnet", lambda: lm(T.RegNetConfig, T.RegNetModel, num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8), "pix", False
    yield "poolformer", lambda: lm(T.PoolFormerConfig, T.PoolFormerModel, num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1]), "pix", False
    yield "mobilenet_v2", lambda: lm(T.MobileNetV2Config, T.MobileNetV2Model, num_channels=3, image_size=32, depth_multiplier=0.25), "pix", False
    # Vision models with a dynamic height and width too (strided windows over symbolic sizes).
    yield "resnet_hw", lambda: lm(T.ResNetConfig, T.ResNetModel, num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"), "pix_hw", False
    yield "convnext_hw", lambda: lm(T.ConvNextConfig, T.ConvNextModel, num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2), "pix_hw", False
    yield "mobilenet_v2_hw", lambda: lm(T.MobileNetV2Config, T.MobileNetV2Model, num_channels=3, image_size=32, depth_multiplier=0.25), "pix_hw", False
    yield "segformer_hw", lambda: lm(T.SegformerConfig, T.SegformerModel, num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]), "pix_hw", False
    yield "regnet_hw", lambda: lm(T.RegNetConfig, T.RegNetModel, num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8), "pix_hw", False
    yield "poolformer_hw", lambda: lm(T.PoolFormerConfig, T.PoolFormerModel, num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1]), "pix_hw", False


class Wrap(torch.nn.Module):
    """A model as a function of one input (and a mask) to its logits or last hidden state."""

    def __init__(self, m, kind, mask):
        super().__init__()
        self.m, self.kind, self.mask = m, kind, mask

    def forward(self, x, mask=None):
        kw = {"attention_mask": mask} if self.mask else {}
        if self.kind.startswith("pix"):
            o = self.m(pixel_values=x)
        elif self.kind == "feat":
            o = self.m(input_features=x)
        elif self.kind == "wav":
            o = self.m(input_values=x)
        else:
            o = self.m(input_ids=x, **kw)
        return o.logits if getattr(o, "logits", None) is not None else o.last_hidden_state


def inputs(name, kind, mask, rng):
    """(example for export, dynamic axes by input name, the two test feeds)."""
    if kind == "ids":
        ex = (torch.zeros((2, 5), dtype=torch.int64),)
        axes = {"x": {0: "batch", 1: "seq"}}
        feeds = [{"x": rng.integers(0, 99, (b, s)).astype(np.int64)} for b, s in ((1, 5), (3, 9))]
    elif kind == "pix":
        side = 16 if name in ("vit", "dinov2", "beit", "deit") else 32
        ex = (torch.zeros((2, 3, side, side)),)
        axes = {"x": {0: "batch"}}
        feeds = [{"x": rng.standard_normal((b, 3, side, side)).astype(np.float32)} for b in (1, 3)]
    elif kind == "pix_hw":
        ex = (torch.zeros((2, 3, 32, 32)),)
        axes = {"x": {0: "batch", 2: "h", 3: "w"}}
        feeds = [{"x": rng.standard_normal(s).astype(np.float32)} for s in ((1, 3, 32, 32), (2, 3, 45, 37))]
    elif kind == "feat":
        ex = (torch.zeros((2, 8, 32)),)
        axes = {"x": {0: "batch"}}
        feeds = [{"x": rng.standard_normal((b, 8, 32)).astype(np.float32)} for b in (1, 3)]
    else:
        ex = (torch.zeros((2, 400)),)
        axes = {"x": {0: "batch", 1: "len"}}
        feeds = [{"x": rng.standard_normal((b, n)).astype(np.float32)} for b, n in ((1, 400), (3, 560))]
    if mask:
        ex = ex + (torch.ones((2, 5), dtype=torch.int64),)
        axes["mask"] = {0: "batch", 1: "seq"}
        for f in feeds:
            f["mask"] = np.ones(f["x"].shape, dtype=np.int64)
            f["mask"][0, -1] = 0
    return ex, axes, feeds


def export(model, ex, axes, path, dynamo):
    names = list(axes)
    if dynamo:
        dim = torch.export.Dim
        shapes = tuple({k: (dim("batch", min=1, max=64) if v == "batch" else dim(v, min=2, max=4096))
                        for k, v in axes[n].items()} for n in names)
        torch.onnx.export(model, ex, dynamo=True, input_names=names, output_names=["y"],
                          dynamic_shapes=shapes).save(path)
    else:
        torch.onnx.export(model, ex, path, dynamo=False, opset_version=17, input_names=names, output_names=["y"],
                          dynamic_axes={**axes, "y": {0: "batch"}})


def sklearn_models():
    from sklearn import cluster, decomposition, ensemble, linear_model, neighbors, neural_network, pipeline
    from sklearn import preprocessing as P
    from sklearn import svm, tree

    r, c2, c3 = "r", "c2", "c3"
    yield "linreg", linear_model.LinearRegression(), r
    yield "ridge", linear_model.Ridge(), r
    yield "logreg2", linear_model.LogisticRegression(), c2
    yield "logreg3", linear_model.LogisticRegression(), c3
    yield "scaled_logreg", pipeline.make_pipeline(P.StandardScaler(), linear_model.LogisticRegression()), c3
    yield "minmax_ridge", pipeline.make_pipeline(P.MinMaxScaler(), linear_model.Ridge()), r
    yield "dtree_r", tree.DecisionTreeRegressor(max_depth=4), r
    yield "dtree_c", tree.DecisionTreeClassifier(max_depth=4), c3
    yield "rf_r", ensemble.RandomForestRegressor(n_estimators=5, max_depth=4, random_state=0), r
    yield "rf_c", ensemble.RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0), c3
    yield "gb_r", ensemble.GradientBoostingRegressor(n_estimators=10, max_depth=3), r
    yield "gb_c2", ensemble.GradientBoostingClassifier(n_estimators=10, max_depth=3), c2
    yield "gb_c3", ensemble.GradientBoostingClassifier(n_estimators=10, max_depth=3), c3
    yield "svr", svm.SVR(), r
    yield "svc", svm.SVC(), c3
    yield "linsvc", svm.LinearSVC(), c3
    yield "knn_r", neighbors.KNeighborsRegressor(3), r
    yield "mlp_c", neural_network.MLPClassifier((16,), max_iter=50, random_state=0), c3
    yield "pca", decomposition.PCA(3), None
    yield "kmeans", cluster.KMeans(3, n_init=2, random_state=0), None
    yield "normalizer", P.Normalizer(), None
    yield "binarizer", P.Binarizer(threshold=0.1), None
    yield "scaler", P.StandardScaler(), None


def kiln_run(kiln, path, feeds, outputs, out_dir, tag, device):
    """`kiln onnx run` on `feeds` with `outputs` as references: (ok, first line of the reason)."""
    args = [kiln, "onnx", "run", path, "--device", device, "--rtol", "1e-4", "--atol", "1e-5"]
    for name, value in feeds.items():
        f = os.path.join(out_dir, f"{tag}_in_{name}.npy")
        np.save(f, value)
        args += ["--input", f"{name}={f}"]
    for name, value in outputs.items():
        f = os.path.join(out_dir, f"{tag}_want_{name}.npy")
        np.save(f, value)
        args += ["--expect", f"{name}={f}"]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode == 0:
        return True, ""
    lines = [l.strip() for l in (p.stdout + p.stderr).splitlines() if "DIFFERS" in l or "error" in l]
    return False, (lines[0] if lines else p.stderr.strip()[:200])[:200]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", default=None, help="write the models and inputs here (else a temporary folder)")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "kiln-cli", "--bin", "kiln"], cwd=ROOT, check=True)
    kiln = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "kiln")
    tmp = tempfile.TemporaryDirectory()
    out_dir = a.keep or tmp.name
    os.makedirs(out_dir, exist_ok=True)
    try:
        import onnxscript  # noqa: F401

        exporters = [False, True]
    except ImportError:
        exporters = [False]
        print("(onnxscript is not importable: the dynamo exporter is skipped)")
    results = []
    for name, make, kind, mask in hf_models():
        if only and name not in only:
            continue
        for dynamo in exporters:
            label = f"{name} ({'dynamo' if dynamo else 'torchscript'})"
            torch.manual_seed(0)
            rng = np.random.default_rng(1)
            ex, axes, feeds = inputs(name, kind, mask, rng)
            path = os.path.join(out_dir, f"{name}_{'dynamo' if dynamo else 'ts'}.onnx")
            try:
                model = Wrap(make(), kind, mask).eval()
                export(model, ex, axes, path, dynamo)
                sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                wants = [dict(zip([o.name for o in sess.get_outputs()], sess.run(None, f))) for f in feeds]
            except Exception as e:  # an export or onnxruntime failure is the peer's, not Kiln's
                print(f"SKIP {label}: export or onnxruntime failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            for i, (f, w) in enumerate(zip(feeds, wants)):
                ok, why = kiln_run(kiln, path, f, w, out_dir, f"{os.path.basename(path)}_{i}", a.device)
                shape = "x".join(str(d) for d in f["x"].shape)
                results.append(ok)
                print(f"{'PASS' if ok else 'FAIL'} {label} x {shape}{'' if ok else ': ' + why}", flush=True)
    try:
        from skl2onnx import to_onnx
    except ImportError:
        to_onnx = None
        print("(scikit-learn or skl2onnx is not importable: the scikit-learn models are skipped)")
    if to_onnx is not None:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((64, 6)).astype(np.float32)
        targets = {
            "r": (x @ rng.standard_normal(6) + 0.1 * rng.standard_normal(64)).astype(np.float32),
            "c2": (x[:, 0] + x[:, 1] > 0).astype(np.int64),
            "c3": np.digitize(x[:, 0] + 0.5 * x[:, 2], [-0.5, 0.5]).astype(np.int64),
        }
        for name, model, y in sklearn_models():
            if only and name not in only:
                continue
            model.fit(x, targets[y]) if y else model.fit(x)
            classifier = y in ("c2", "c3")
            # Probabilities (or scores) as a tensor: ZipMap's maps are no tensor Kiln has.
            options = {id(model): {"zipmap": False}} if classifier else None
            path = os.path.join(out_dir, f"sk_{name}.onnx")
            try:
                onx = to_onnx(model, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
            except Exception:
                onx = to_onnx(model, x[:1], target_opset={"": 17, "ai.onnx.ml": 3})
            with open(path, "wb") as fh:
                fh.write(onx.SerializeToString())
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            input_name = sess.get_inputs()[0].name
            for rows in (5, 2):
                feed = {input_name: x[-rows:]}
                want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
                ok, why = kiln_run(kiln, path, feed, want, out_dir, f"sk_{name}_{rows}", a.device)
                results.append(ok)
                print(f"{'PASS' if ok else 'FAIL'} scikit-learn {name} x {rows} rows{'' if ok else ': ' + why}",
                      flush=True)
    passed = sum(results)
    print(f"\n{passed} of {len(results)} runs match onnxruntime on {a.device}")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()

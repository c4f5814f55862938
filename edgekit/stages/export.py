"""export: a transformers folder -> ONNX, TFLite or TorchScript with a model.json sidecar, checked against the
PyTorch model on real test sentences (max_abs_diff, label_agreement)."""
import copy
import io
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from edgekit import families, native, runtime, targets
from edgekit.artifact import Artifact, size_mb, through_temp, write_json
from edgekit.errors import EdgekitError
from edgekit.stages import evaluate

EXPORTERS = ("torchscript", "dynamo")
DYNAMO_OPSET = 18  # the lowest opset the dynamo exporter writes valid files at here
LIMITS = {"exporter": EXPORTERS, "opset": "[10, 23]", "min_label_agreement": "[0, 1]"}  # opsets the exporter and
# ORT's quantizer take (9 fails in the exporter; 23 is torch's newest); and recipe.COMMON
REVISION = 10  # 2: max_length is always the last TFLite bucket (a shorter last bucket cut inputs training kept)
# 3: TFLite graph rewrites (one Q|K|V projection, an additive mask built from the 0/1 one): see rewrite
# 4: and the last layer computes the first token's row alone (TFLite and ONNX); 5: DistilBERT's too
# 6: ONNX gets the Q|K|V projection and the additive mask too, and constant Reshape shapes (fixed_reshapes)
# 7: ONNX embeddings without the token-type lookup (no_token_types)
# 8: tokenizer.json truncates at max_length on its own
# 9: a TFLite model.json names the output its signatures return (output_0, [1, labels]; was logits, ["batch", labels])
# 10: tokenizer.json truncates on the tokenizer's side (truncation_side: left kept a text's start)
REWRITES = {"onnx": ("deberta_attention", "first_token_last_layer", "fused_qkv", "additive_mask", "no_token_types"),
            "tflite": ("deberta_attention", "first_token_last_layer", "fused_qkv", "additive_mask")}
# Families that build more than one mask from the 0/1 mask: ModernBERT's sliding-window layers see only nearby
# tokens, and its mean pooling reads the mask too. An additive mask given in its place would drop the window, which
# the check's 8-token sample lies inside: additive_mask is not tried for them.
OWN_MASKS = ("modernbert",)


def run(artifact: Artifact, out_dir: Path, ctx, *, format: str | list = "auto", exporter: str = "torchscript",
        opset: int = 17, buckets: list | None = None, check_sentences: int = 200,
        min_label_agreement: float = 0.99, rewrites: bool = True) -> Artifact:
    """format: `auto` (what the recipe's targets run: ONNX for x86, ONNX and TFLite for arm64), one format or a list.
    `onnx` (dynamic batch and sequence), `tflite` (litert-torch; static shapes, so one signature per
    sequence bucket in one file with shared weights: the runtime picks the smallest bucket that fits; max_length
    is always the last bucket, so TFLite truncates where training and ONNX do; by default 32, 64, 128 below
    max_length, then max_length) or
    `torchscript` (a traced module, model.pt; a legacy format, for PyTorch Mobile and libtorch users).
    Several formats go into one folder each (`onnx/`, `tflite/`, ...), all named in the manifest.
    exporter (ONNX): `torchscript` (default) traces eager attention, the graph ONNX Runtime fuses into its
    Attention, EmbedLayerNormalization and SkipLayerNormalization kernels (measured: 1.36x faster INT8 than
    `dynamo`, the torch.export-based exporter, whose SDPA graph ORT does not fuse; it writes opset 18 or newer).
    rewrites: the exact graph rewrites of `rewrite` (the last layer computes the only row a classifier reads, one
    Q|K|V projection, an additive mask; ONNX also `fixed_reshapes`), each kept only where the logits match the plain
    model's; false exports the model as transformers runs it (bench/peers.py: the usual path)."""
    formats = targets.formats_for(ctx.targets, format)
    if artifact.kind != "hf":
        raise EdgekitError(f"export needs a transformers model, got a {artifact.kind} artifact; put export before quantize")
    if buckets is None:
        buckets = [b for b in (32, 64, 128) if b < ctx.max_length] + [ctx.max_length]
    if "tflite" in formats and (problem := bucket_problem(buckets, ctx.max_length)):
        raise EdgekitError(problem)
    if "tflite" in formats:
        buckets = sorted(set(buckets) | {ctx.max_length})
    model = families.named(families.load_model(artifact.path, pairs=ctx.splits.pairs), ctx.splits.labels)
    tokenizer = families.load_tokenizer(artifact.path)
    reference = runtime.HFModel(artifact.path, pairs=ctx.splits.pairs)  # compare() feeds it the file's ids
    if ctx.splits.multi_label:  # the run's thresholds, as evaluate gives them to the teacher (a stage's folder
        # has them in its config already: f1 tunes them again to the same numbers, from the same logits)
        reference.thresholds = model.config.edgekit_thresholds = evaluate.cuts_for(artifact.path, ctx)
    outputs = {}
    for f in formats:
        folder = out_dir if len(formats) == 1 else out_dir / f
        runs_on = ",".join(t for t in ctx.targets if f in targets.TARGETS[t]["formats"])
        if ctx.progress:  # seconds to minutes each (TFLite converts once per bucket), then a check on test sentences
            shapes = f" (buckets {', '.join(map(str, buckets))})" if f == "tflite" else ""
            print(f"  {f}{shapes} for {runs_on}", file=sys.stderr, flush=True)
        outputs[f] = export_one(model, tokenizer, folder, f, runs_on, exporter, opset, sorted(set(buckets)),
                                ctx.max_length, in_run(artifact.path, folder, out_dir.parent), rewrites,
                                ctx.splits.pairs)
        check = compare(reference, runtime.load(outputs[f].path), ctx.splits.test[:check_sentences])
        outputs[f].metrics.update(check, size_mb=size_mb(outputs[f]))
        if check["label_agreement"] < min_label_agreement:
            raise EdgekitError(f"{f} export disagrees with PyTorch on {1 - check['label_agreement']:.1%} of test "
                               f"sentences (max_abs_diff {check['max_abs_diff']:.3g}); the file is saved at "
                               f"{outputs[f].path}")
    first = outputs[formats[0]]
    return Artifact(first.path, first.kind, first.metrics, outputs if len(formats) > 1 else {})


def export_one(model, tokenizer, out_dir: Path, format: str, target: str, exporter: str, opset: int, buckets: list,
               max_length: int, source: str, rewrites: bool = True, pairs: bool = False) -> Artifact:
    """One FP32 export with its model.json sidecar and tokenizer.json beside it. `pairs`: the model reads text
    pairs (model.json `text_pair`), checked on pairs; BERT's family derives their token types in the graph from the
    separator (families.derive_segments), so the inputs are the same two."""
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = [("an example sentence", "for tracing"), ("and a second", "one")] if pairs else \
        ["an example sentence for tracing", "and a second one"]
    sample = tokenizer(texts, padding=True, return_tensors="pt")
    sample = (sample["input_ids"], sample["attention_mask"])
    inputs = [{"name": n, "dtype": "int64", "shape": ["batch", "sequence"]} for n in ("input_ids", "attention_mask")]
    if exporter == "dynamo":  # it writes opset 18; its conversion down to 17 left an opset-18 Split (invalid model)
        opset = max(opset, DYNAMO_OPSET)
    extra = {"exporter": exporter, "opset": opset,
             "onnxruntime": {"disabled_optimizers": runtime.ORT_DISABLED_OPTIMIZERS}} if format == "onnx" else {}
    if format == "onnx":
        path = out_dir / "model.onnx"
        wrapper, applied = rewrite(model, sample, REWRITES["onnx"] if rewrites else ())
        to_onnx(wrapper.model, sample, path, exporter, opset, max_length, wrapper.additive_mask)
        extra["graph_rewrites"] = applied + (["fixed_reshapes"] if rewrites and fixed_reshapes(path, sample) else [])
    elif format == "tflite":
        path = out_dir / "model.tflite"
        applied = to_tflite(model, path, buckets, sample, REWRITES["tflite"] if rewrites else (), pairs)
        inputs = [{"name": n, "dtype": "int32", "shape": [1, "bucket"]} for n in ("args_0", "args_1")]
        extra = {"buckets": buckets, "signatures": {str(b): f"seq{b}" for b in buckets}, "graph_rewrites": applied}
    else:
        path = out_dir / "model.pt"
        to_torchscript(model, sample, path)
    longest = max(buckets) if format == "tflite" else max_length
    save_tokenizer(tokenizer, out_dir / "tokenizer.json", longest)
    labels = families.label_names(model.config)
    outputs = tflite_outputs(path, extra["signatures"]) if format == "tflite" else [
        {"name": "logits", "dtype": "float32", "shape": ["batch", len(labels)]}]  # TorchScript: its one return value
    meta = {"format": format, "target": target, "quantization": None, "labels": labels,
            "max_length": longest, "tokenizer": "tokenizer.json",
            "pad_id": tokenizer.pad_token_id, "inputs": inputs, "outputs": outputs,
            "source": source, **extra, **({"text_pair": True} if pairs else {}),  # TorchScript INT8 re-traces source
            **({"multi_label": True} if families.is_multi_label(model.config) else {}),
            **({"thresholds": t} if (t := getattr(model.config, "edgekit_thresholds", None)) and
               families.is_multi_label(model.config) else {})}
    write_json(out_dir / "model.json", meta)
    return Artifact(path, format, {"params": sum(p.numel() for p in model.parameters())})


def tflite_outputs(path: Path, signatures: dict) -> list:
    """model.json's `outputs` of a .tflite file as its signatures (bucket -> name) return them: name, dtype and
    shape, the same in every bucket, and for an integer output (full-integer INT8) the `scale` and `zero_point` per
    bucket (each signature is calibrated on its own) that give the logits back: (q - zero_point) * scale."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(str(path))
    details = {b: interpreter.get_signature_runner(name).get_output_details() for b, name in signatures.items()}
    described = [[{"name": k, "dtype": np.dtype(d["dtype"]).name, "shape": d["shape"].tolist()} for k, d in o.items()]
                 for o in details.values()]
    if any(d != described[0] for d in described):
        raise EdgekitError(f"the signatures of {path} return outputs of different names, types or shapes")
    for out in described[0]:
        if np.issubdtype(out["dtype"], np.integer):
            params = {b: o[out["name"]]["quantization"] for b, o in details.items()}
            out.update(scale={b: float(s) for b, (s, _) in params.items()},
                       zero_point={b: int(z) for b, (_, z) in params.items()})
    return described[0]


def in_run(source: Path, folder: Path, run: Path) -> str:
    """The exported model's source as model.json keeps it: relative to the file's folder where the source lies in
    the same run folder (RUN/02-distill/model), so that a moved or copied run still finds it and a deployed sidecar
    names no build-machine path; absolute where it lies elsewhere (an asset, a teacher folder)."""
    source = Path(source).resolve()
    return os.path.relpath(source, folder.resolve()) if source.is_relative_to(run.resolve()) else str(source)


def save_tokenizer(tokenizer, path: Path, max_length: int) -> None:
    """tokenizer.json as a device app reads it with the `tokenizers` library alone: truncation at the model's
    max_length on (transformers applies it per call and saves it off, so a long text ran past the position table
    in plain onnxruntime), on the side the model was trained with (`truncation_side: left` keeps a text's end),
    padding off (the model.json says how each format pads)."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.enable_truncation(max_length, direction=tokenizer.truncation_side)
    backend.no_padding()
    backend.save(str(path), pretty=False)  # 0.47 MB for a 30k-piece vocabulary, not 0.71


def bucket_problem(buckets: list, max_length: int) -> str:
    """What is wrong with TFLite sequence buckets ('' if nothing); edgekit.recipe asks before any stage runs."""
    if not isinstance(buckets, list) or not buckets or any(
            not isinstance(b, int) or isinstance(b, bool) or not 2 <= b <= max_length for b in buckets):
        return f"export.buckets {buckets} must be sequence lengths in [2, max_length={max_length}]"
    return ""


def to_tflite(model, path: Path, buckets: list, sample: tuple | None = None,
              rewrites: tuple = REWRITES["tflite"], pairs: bool = False) -> list:
    """One .tflite file with a signature `seqN` per bucket N (batch 1, int32 inputs); weights are shared.
    Returns the graph rewrites applied (see `rewrite`), checked on `sample`. `pairs`: token types are read, not
    all 0, so they are not folded away."""
    try:
        with native.hidden_output():  # TensorFlow's and absl's banners on import
            import litert_torch
    except ImportError:
        raise EdgekitError("TFLite export needs litert-torch: pip install 'edgekit[tflite]'")
    wrapper, applied = rewrite(model if pairs else fold_token_types(model), sample, rewrites, int32=True)
    converter = None
    for b in buckets:
        args = (torch.ones((1, b), dtype=torch.int32), torch.ones((1, b), dtype=torch.int32))
        converter = (litert_torch if converter is None else converter).signature(f"seq{b}", wrapper, args)
    with through_temp(path, path.with_suffix(".tflite.tmp")) as tmp, warnings.catch_warnings(), native.hidden_output():
        warnings.simplefilter("ignore")  # its [START]/[DONE] steps and the converter's native log went among the
        converter.convert().export(str(tmp))  # results of `edgekit compress`; errors still raise
    return applied


def rewrite(model, sample: tuple | None = None, names: tuple = REWRITES["tflite"], int32: bool = False):
    """(the module to export, the rewrites kept): `model` in eager attention with each rewrite in `names` tried in
    turn and kept only if the logits on `sample` (token ids and a mask with padding; by default random ids, the
    second row half padded) match the plain model's. All are exact up to float rounding:
    - `first_token_last_layer` (BERT-like layouts, DistilBERT): the last layer computes the first token's output
      alone, the only row the classifier reads ([CLS] / <s>): keys and values for every token, but the query,
      attention output, LayerNorms and FFN for one row instead of L. edge-small (3 layers), 1 x 128 tokens,
      1 thread: TFLite 1.96 -> 1.43 ms, ONNX 2.38 -> 1.73 ms.
    - `fused_qkv` (BERT-like layouts: see bert_like): one Q|K|V projection per layer instead of three, the
      1/sqrt(head_dim) score scale folded into the Q rows. A dynamic-range FULLY_CONNECTED quantizes its input
      on every call, so three projections of one input quantized it three times; and the score scale was a
      multiply over every [heads, L, L] score.
    - `additive_mask`: the 0/1 mask turned into the additive one in the wrapper, a [1, 1, 1, L] multiply,
      instead of the integer compare / select / gather ops transformers builds it from, which LiteRT runs in its
      reference kernels. With `fused_qkv`: edge-small 1.967 -> 1.883 ms, edge-base 5.229 -> 5.096 ms (TFLite).
      ONNX, both with `fixed_reshapes` (2026-12-01, AVX2 EPYC, edge-small's pruned student, dynamic INT8): 177 ->
      109 nodes after ONNX Runtime's fusions, p50 at 128 tokens 0.975x over 7 interleaved rounds.
    - `no_token_types` (BERT, ELECTRA; ONNX: the TFLite converter folds these lookups into constants itself):
      token-type row 0 folded into the position table and the token-type lookup dropped; an export never feeds
      token types, and transformers builds the all-zero ids from the positions (Shape, Gather, Expand, Where ...:
      19 of edge-small's 109 nodes).
    - `deberta_attention` (DeBERTa-v2/v3, whose layers the others do not touch): each layer with one Q|K|V
      projection (the score scale in the query rows), its relative-position keys and queries projected once at
      export instead of on every call (transformers projects all 2 x position_buckets rows of the position table
      per layer), and the last layer on the first token's row. bench/deberta_export.py, 128 tokens: TFLite
      dynamic INT8 0.77x / 0.55x the time (v3-xsmall / -small shapes) for 4.5 / 4.1 MB of stored tables; ONNX
      INT8 about the same time and size (ONNX Runtime's pre-processing folds those projections itself)."""
    model.config._attn_implementation = "eager"  # explicit matmul-softmax-matmul, with an additive float mask
    if sample is None:
        ids = torch.randint(5, min(100, model.config.vocab_size), (2, 8), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        mask[1, 4:] = 0
        sample = (ids, mask)
    ids, mask = (t.int() for t in sample)
    with torch.no_grad():
        want = _Logits(model, int32=True).eval()(ids, mask)
    current, masked, applied = model, False, []
    for name in names:
        if name == "additive_mask" and model.config.model_type in OWN_MASKS:
            continue
        candidate = current if name == "additive_mask" else REWRITE[name](copy.deepcopy(current))
        if candidate is None:
            continue
        trial = _Logits(candidate, int32=True, additive_mask=masked or name == "additive_mask").eval()
        with torch.no_grad():
            if torch.allclose(trial(ids, mask), want, atol=1e-4, rtol=1e-4):
                current, masked, applied = candidate, trial.additive_mask, applied + [name]
    return _Logits(current, int32=int32, additive_mask=masked).eval(), applied


def fuse_qkv(model):
    """`model` with each BERT-style self-attention's query, key and value merged into one Linear (None if the
    family has no such module). The forward is transformers' eager attention, written for the merged projection."""
    if not bert_like(model):
        return None
    for block in families.layers(model):
        if isinstance(block, _FirstTokenLayer):
            continue
        att = block.get_submodule("attention.self")
        qkv = merged((att.query, att.attention_head_size ** -0.5), (att.key, 1.0), (att.value, 1.0))
        block.attention.self = _FusedSelfAttention(qkv, att.query.out_features // att.attention_head_size)
    return model


def merged(*parts) -> torch.nn.Linear:
    """One Linear whose output is the outputs of `parts` ((Linear, scale) each, same input) side by side."""
    out = torch.nn.Linear(parts[0][0].in_features, sum(linear.out_features for linear, _ in parts))
    with torch.no_grad():
        out.weight.copy_(torch.cat([linear.weight * scale for linear, scale in parts]))
        out.bias.copy_(torch.cat([linear.bias * scale for linear, scale in parts]))
    return out


def bert_like(model) -> bool:
    """Layers laid out as transformers' BERT (attention.self.query ...): BERT, RoBERTa, XLM-R, CamemBERT, data2vec-text,
    ERNIE, ELECTRA."""
    return families.FAMILIES.get(model.config.model_type, {}).get("q") == "attention.self.query"  # not DeBERTa's


def first_token_tail(model):
    """`model` whose last layer returns only the first token's hidden state (None for families without such a
    layer here: ALBERT shares its layer across depth, MPNet adds a relative position bias)."""
    layer = _FirstTokenLayer if bert_like(model) else \
        _FirstTokenDistilLayer if model.config.model_type == "distilbert" else None
    if layer is None:
        return None
    layers = families.layers(model)
    layers[len(layers) - 1] = layer(layers[len(layers) - 1])
    return model


class _FirstTokenLayer(torch.nn.Module):
    """A BERT-style layer that computes the first token's output only: [b, L, d] -> [b, 1, d]. The query carries
    the 1/sqrt(head_dim) score scale; key and value are one projection."""

    def __init__(self, layer):
        super().__init__()
        att = layer.attention.self
        self.project(att.query, att.key, att.value, att.attention_head_size)
        self.attention_output, self.intermediate, self.output = layer.attention.output, layer.intermediate, layer.output

    def project(self, q, k, v, head_dim: int) -> None:
        self.heads = q.out_features // head_dim
        self.query = merged((q, head_dim ** -0.5))  # names that say attention (report.part_of)
        self.key_value = merged((k, 1.0), (v, 1.0))

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        first = hidden_states[:, :1]
        k, v = self.key_value(hidden_states).split(self.key_value.out_features // 2, dim=-1)
        return self.finish(attend(self.query(first), k, v, attention_mask, self.heads), first)

    def finish(self, context, first):
        attended = self.attention_output(context, first)
        return self.output(self.intermediate(attended), attended)


class _FirstTokenDistilLayer(_FirstTokenLayer):
    """The same for a DistilBERT block (out_lin, sa_layer_norm, ffn, output_layer_norm)."""

    def __init__(self, block):
        torch.nn.Module.__init__(self)
        att = block.attention
        self.project(att.q_lin, att.k_lin, att.v_lin, att.attention_head_size)
        self.attention_out, self.sa_layer_norm = att.out_lin, block.sa_layer_norm
        self.ffn, self.output_layer_norm = block.ffn, block.output_layer_norm

    def finish(self, context, first):
        attended = self.sa_layer_norm(self.attention_out(context) + first)
        return self.output_layer_norm(self.ffn(attended) + attended)


class _FusedSelfAttention(torch.nn.Module):
    def __init__(self, qkv, heads: int):
        super().__init__()
        self.qkv, self.heads = qkv, heads

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        # split with a fixed width: ONNX then gets one Split, where chunk computes the sizes from the shape at run time
        return attend(*self.qkv(hidden_states).split(self.qkv.out_features // 3, dim=-1), attention_mask,
                      self.heads), None


def attend(q, k, v, mask, heads: int):
    """transformers' eager attention for projections [b, m, heads * d] (queries; the score scale already in q) and
    [b, L, heads * d] (keys, values) and an additive mask [b, 1, 1 or L, L] -> context [b, m, heads * d]."""
    (b, m, width), n = q.shape, k.shape[1]
    q = q.view(b, m, heads, width // heads).transpose(1, 2)
    k = k.view(b, n, heads, width // heads).permute(0, 2, 3, 1)  # already transposed for q @ k
    v = v.view(b, n, heads, width // heads).transpose(1, 2)
    scores = torch.matmul(q, k)
    if mask is not None:  # one query row: its row of a [L, L] mask ([b, 1, 1, L] masks hold every row already)
        scores = scores + (mask if m == n or mask.shape[2] == 1 else mask[:, :, :m])
    return torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, m, width)


def no_token_types(model):
    """`model` whose embeddings are `_Embeddings` (None for families other than BERT and ELECTRA: RoBERTa and MPNet
    count positions from the padding, DistilBERT has no token types)."""
    if model.config.model_type not in ("bert", "electra"):
        return None
    model.base_model.embeddings = _Embeddings(model.base_model.embeddings)
    return model


class _Embeddings(torch.nn.Module):
    """BERT's embeddings for token type 0 alone: word + position rows, the type-0 row folded into each position's
    -> LayerNorm. The same module names, so the quantizer and the size report see the same tables."""

    def __init__(self, embeddings):
        super().__init__()
        self.word_embeddings, self.LayerNorm = embeddings.word_embeddings, embeddings.LayerNorm
        self.position_embeddings = copy.deepcopy(embeddings.position_embeddings)
        with torch.no_grad():
            self.position_embeddings.weight += embeddings.token_type_embeddings.weight[0]
        self.register_buffer("position_ids", embeddings.position_ids, persistent=False)

    def forward(self, input_ids, **kwargs):  # token_type_ids, position_ids: never fed by an export
        positions = self.position_embeddings(self.position_ids[:, :input_ids.shape[1]])
        return self.LayerNorm(self.word_embeddings(input_ids) + positions)


def deberta_attention(model):
    """`model` with every layer a `_DebertaLayer` (None for other families, and for DeBERTa without relative
    attention, which runs as BERT does)."""
    if model.config.model_type != "deberta-v2" or not model.config.relative_attention:
        return None
    encoder = model.base_model.encoder
    rel, last = encoder.get_rel_embedding(), len(encoder.layer) - 1
    encoder.layer = torch.nn.ModuleList([_DebertaLayer(layer, rel, i == last) for i, layer in enumerate(encoder.layer)])
    return model


class _DebertaLayer(torch.nn.Module):
    """A DeBERTa-v2 layer as an export computes it (see `rewrite`): the same scores, content to content, content to
    position (c2p) and position to content (p2c), over the encoder's relative position buckets; `first_only`: the
    first token's row alone, the one the pooler reads."""

    def __init__(self, layer, rel_embeddings, first_only: bool = False):
        super().__init__()
        att = layer.attention.self
        self.heads, self.types, self.span, self.first_only = (att.num_attention_heads, att.pos_att_type,
                                                              att.pos_ebd_size, first_only)
        head_dim = att.query_proj.out_features // self.heads
        scale = (head_dim * (1 + ("c2p" in self.types) + ("p2c" in self.types))) ** -0.5
        self.attention_qkv = merged((att.query_proj, scale), (att.key_proj, 1.0), (att.value_proj, 1.0))
        rel = rel_embeddings[:2 * self.span].detach()
        keys = att.key_proj if att.share_att_key else getattr(att, "pos_key_proj", None)
        queries = att.query_proj if att.share_att_key else getattr(att, "pos_query_proj", None)
        with torch.no_grad():  # [heads, head_dim, 2 span]: a query (key) times this scores every relative position
            per_head = lambda x: x.view(-1, self.heads, head_dim).permute(1, 2, 0).contiguous()  # noqa: E731
            if "c2p" in self.types:
                self.register_buffer("attention_position_keys", per_head(keys(rel)))
            if "p2c" in self.types:
                self.register_buffer("attention_position_queries", per_head(queries(rel) * scale))
        self.attention_output, self.intermediate, self.output = layer.attention.output, layer.intermediate, layer.output

    def forward(self, hidden_states, attention_mask, query_states=None, relative_pos=None, rel_embeddings=None,
                output_attentions=False):  # the encoder's call; its mask is [b, 1, L, L] of 0/1
        b, n, _ = hidden_states.shape
        q, k, v = self.attention_qkv(hidden_states).split(self.attention_qkv.out_features // 3, dim=-1)
        first = hidden_states[:, :1] if self.first_only else hidden_states
        q = q[:, :1] if self.first_only else q
        m = q.shape[1]
        q, k, v = (t.view(b, t.shape[1], self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2))
        rel = relative_pos.view(n, n)  # bucket of i - j, computed once per call by the encoder
        top = 2 * self.span - 1
        if "c2p" in self.types:
            index = torch.clamp(rel[:m] + self.span, 0, top).expand(b, self.heads, m, n)
            scores = scores + torch.gather(torch.matmul(q, self.attention_position_keys), -1, index)
        if "p2c" in self.types:  # key j's score for the position of i relative to j: bucket(j - i)
            index = torch.clamp(self.span - rel.transpose(0, 1)[:m], 0, top).expand(b, self.heads, m, n)
            by_key = torch.matmul(k, self.attention_position_queries).transpose(-1, -2)  # [b, heads, 2 span, L]
            scores = scores + torch.gather(by_key, -2, index)
        scores = scores.masked_fill(~attention_mask[:, :, :m].bool(), torch.finfo(scores.dtype).min)
        context = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, m, -1)
        attended = self.attention_output(context, first)
        return self.output(self.intermediate(attended), attended), None


REWRITE = {"first_token_last_layer": first_token_tail, "fused_qkv": fuse_qkv, "no_token_types": no_token_types,
           "deberta_attention": deberta_attention}


def fold_token_types(model):
    """A copy of `model` whose token-type row 0 is added into the position table and zeroed. The converter folds
    each bucket's position + token-type lookups into float [1, L, hidden] constants; an export never feeds token
    types (always 0), so with row 0 zero it drops that constant and its add (-0.34 MB on minilm-l6, 3 buckets;
    the sum is the same, up to float rounding)."""
    model = copy.deepcopy(model)
    for m in model.modules():
        types, positions = getattr(m, "token_type_embeddings", None), getattr(m, "position_embeddings", None)
        if isinstance(types, torch.nn.Embedding) and isinstance(positions, torch.nn.Embedding) \
                and types.weight.shape[1] == positions.weight.shape[1]:
            with torch.no_grad():
                positions.weight += types.weight[0]
                types.weight.zero_()
    return model


def to_torchscript(model, sample: tuple, path: Path) -> None:
    """Trace `model` to TorchScript: input_ids and attention_mask in, logits out. The same bytes whatever was traced
    before in this process: a class traced twice is renamed `___torch_mangle_N` in the process's compilation unit,
    so quantize's file (traced after export's) was 14 KB larger than a resumed run's, and its hash differed."""
    model.config._attn_implementation = "eager"
    process_unit = torch.jit._state._python_cu  # read by torch's compiler at each use: the trace gets its own, and
    torch.jit._state._python_cu = torch._C.CompilationUnit()  # what the process scripts before or after keeps its
    try:  # (left swapped, a class scripted before could not be used in a function scripted after)
        with warnings.catch_warnings():  # the trace's warnings, and save's "`torch.jit.save` is deprecated"
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(_Logits(model).eval(), sample, check_trace=False)
            buffer = io.BytesIO()  # serialized in memory, written from Python: torch's own file writer aborted the
            torch.jit.save(traced, buffer)  # process on a full disk (exit 134, from C++), leaving a half-written file
    finally:
        torch.jit._state._python_cu = process_unit
    with through_temp(path, path.with_suffix(".pt.tmp")) as tmp:
        tmp.write_bytes(buffer.getvalue())


def to_onnx(model, sample: tuple, path: Path, exporter: str = "torchscript", opset: int = 17, max_length: int = 512,
            additive_mask: bool = False) -> None:
    """Write `model` (a sequence classifier) to `path` as ONNX: input_ids and attention_mask in, logits out
    (`additive_mask`: the model is fed the additive float mask, see `rewrite`)."""
    model.config._attn_implementation = "eager"  # explicit matmul-softmax-matmul: the pattern runtimes fuse
    wrapper = _Logits(model, additive_mask=additive_mask).eval()
    names = {"input_names": ["input_ids", "attention_mask"], "output_names": ["logits"], "opset_version": opset}
    with through_temp(path, path.with_suffix(".onnx.tmp")) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' own deprecation chatter is not the user's concern
        if exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=max_length)
            torch.onnx.export(wrapper, sample, str(tmp), dynamo=True, external_data=False, verbose=False,
                              dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
                              **names)
        else:
            axes = {0: "batch", 1: "sequence"}
            torch.onnx.export(wrapper, sample, str(tmp), dynamo=False, **names,
                              dynamic_axes={"input_ids": axes, "attention_mask": axes, "logits": {0: "batch"}})


def infer_shapes(model):
    """ONNX Runtime's symbolic shape inference (auto_merge), SymbolicShapeInference.infer_shapes' steps without its
    last one: where it cannot infer every shape, that saves the graph as sym_shape_infer_temp.onnx into the current
    folder (the user's) before it raises; running it from a scratch folder changed the working directory of the
    whole process, under the host's other threads."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inference = SymbolicShapeInference(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    inference._preprocess(model)
    complete = False
    while inference.run_:
        complete = inference._infer_impl()
    inference._update_output_from_vi()
    if not complete:
        raise ValueError("incomplete symbolic shape inference")
    return inference.out_mp_


def fixed_reshapes(path: Path, sample: tuple) -> int:
    """Give every Reshape whose output shape follows from its input's (by ONNX Runtime's symbolic shape inference)
    a constant target shape, 0 where a dimension is copied from the input and -1 for at most one other, then drop
    the Shape / Gather / Unsqueeze / Concat chains that computed it. Exact: the same shapes, fewer nodes (the
    traced `view(b, L, heads, d)` of every attention computes its target from the input's shape at run time,
    about 6 tiny ops per Reshape, each a kernel launch ONNX Runtime pays on every call). Kept only if the logits
    match the original graph's on `sample` (ids, mask), its first row one token shorter and the sample twice over:
    other batch sizes and lengths than the traced ones; returns the count (0: left as is)."""
    import onnx

    original = onnx.load(str(path))
    model = copy.deepcopy(original)
    try:  # auto_merge: the position table's Min(512, sequence) rows are the sequence's
        inferred = infer_shapes(original)
    except Exception:  # noqa: BLE001 - an optimisation only: the graph stays valid without it
        return 0
    dims = {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                     for d in v.type.tensor_type.shape.dim]
            for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    fixed = 0
    for node in model.graph.node:
        source, target = dims.get(node.input[0]) if node.op_type == "Reshape" else None, dims.get(node.output[0])
        if not source or not target or any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        shape = [constant_dim(d, source[j] if j < len(source) else None) for j, d in enumerate(target)]
        if shape.count(-1) > 1:
            continue
        name = f"{node.name or node.output[0]}_fixed_shape"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(shape, np.int64), name))
        node.input[1] = name
        fixed += 1
    drop_dead_nodes(model.graph)
    ids, mask = (t.numpy().astype(np.int64) for t in sample)
    feeds = [{"input_ids": i, "attention_mask": m} for i, m in
             ((ids, mask), (ids[:1, :-1], mask[:1, :-1]), (np.tile(ids, (2, 1)), np.tile(mask, (2, 1))))]
    if not fixed or not same_logits(original, model, feeds):
        return 0
    with through_temp(path, path.with_suffix(".onnx.tmp")) as tmp:
        onnx.save(model, str(tmp))
    return fixed


def constant_dim(target, source):
    """A Reshape target dimension as a constant: its size where known, 0 where it is the input's same dimension
    (a symbolic size), -1 otherwise."""
    if isinstance(target, int) and target > 0:
        return target
    return 0 if target and target == source else -1


def same_logits(a, b, feeds: list) -> bool:
    """Two ONNX models give the same first output (1e-5) on every feed; `b` failing to load or run is not."""
    import onnxruntime as ort

    def session(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])

    try:
        candidate = session(b)
        got = [candidate.run(None, feed)[0] for feed in feeds]
    except Exception:  # noqa: BLE001 - onnxruntime raises its own Fail / InvalidArgument classes
        return False
    reference = session(a)
    return all(w.shape == g.shape and np.allclose(w, g, atol=1e-5, rtol=1e-5)
               for w, g in zip((reference.run(None, feed)[0] for feed in feeds), got))


def drop_dead_nodes(graph) -> None:
    """Remove nodes none of whose outputs reach the graph's outputs (and initializers nothing reads)."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    del graph.node[:]
    graph.node.extend(reversed(keep))
    unused = [t for t in graph.initializer if t.name not in needed]
    for t in unused:
        graph.initializer.remove(t)


class _Logits(torch.nn.Module):
    """Inputs by position, logits out: the graph ONNX and the device runtimes see. TFLite runtimes feed int32 ids."""

    def __init__(self, model, int32: bool = False, additive_mask: bool = False):
        super().__init__()
        self.model = model
        self.int32 = int32
        self.additive_mask = additive_mask

    def forward(self, input_ids, attention_mask):
        if self.int32:
            input_ids, attention_mask = input_ids.long(), attention_mask.long()
        if self.additive_mask:  # [batch, 1, 1, L]: 0 where attended, the lowest float where padded
            attention_mask = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def compare(reference, candidate, examples: list, batch_size: int = 32) -> dict:
    """max_abs_diff of logits and label_agreement of candidate against reference on the same token ids (for a
    multi-label model, the share of texts given the same set of labels)."""
    from edgekit.runtime import decided

    multi = getattr(reference, "multi_label", False)
    diffs, agree = [], 0
    texts = [t for t, _ in examples]
    for s in range(0, len(texts), batch_size):
        batch = candidate.encode(texts[s:s + batch_size])
        a, b = reference.logits(batch), candidate.logits(batch)
        diffs.append(float(np.abs(a - b).max()))
        agree += sum(x == y for x, y in zip(decided(a, multi, getattr(reference, "thresholds", None)),
                                             decided(b, multi, getattr(candidate, "thresholds", None))))
    return {"max_abs_diff": round(max(diffs), 6), "label_agreement": round(agree / max(1, len(texts)), 4)}

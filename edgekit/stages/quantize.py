"""quantize: every exported format, for every target of the recipe, one artifact each.

mode      ONNX (ONNX Runtime)                              TFLite (ai-edge-quantizer)       TorchScript (torch.ao)
dynamic   INT8 weights, activations quantized on the fly    dynamic-range INT8 weights       dynamic INT8 Linear
static    INT8 QDQ, activations calibrated on train data    full-integer INT8, calibrated    (not offered)
fp16      FP16 weights and compute, float I/O               FP16 weights                     (not offered)

Embeddings are quantized too (INT8 Gather / embedding lookup; 8-bit rows for TorchScript). `fuse: true` runs ONNX
Runtime's transformer optimizer before INT8 (attention becomes one QAttention kernel); measured here on minilm-l6
it was slower (14.4 ms vs 12-13 ms at 128 tokens) than quantizing the plain graph and letting ONNX Runtime fuse
at load time, so it is off by default. Target settings (reduce_range, signedness, engine): edgekit.targets.

TFLite INT8 files are compacted afterwards (edgekit.tflite_file: quantization tables shared between bucket
signatures, internal debug names dropped; outputs identical).

Static INT8 calibrates on the first `calibration_size` training sentences and, beside them, a quarter as many
texts that fill each length the file takes (each TFLite bucket; ONNX up to max_length), made by joining those
sentences: ranges from short sentences alone flipped labels on longer inputs (tiny models: 13 to 22 of 36 inputs of
12+ tokens). Its check against the FP32 file likewise adds longer texts joined from the test sentences.

`max_accuracy_drop`: the drop against the FP32 export is measured on the validation split, one sentence at a time;
when it is larger, ONNX keeps its most sensitive weight nodes in float (sensitivity = mean logit error with that
node alone quantized, on 64 validation sentences), the worst 1, 2, 4, ... of them until the drop holds; TFLite and
TorchScript step down to a milder method (static -> dynamic -> fp16). What was kept or changed is recorded in the
sidecar and the manifest.
"""
import contextlib
import json
import logging
import os
import random
import shutil
import sys
import threading
import warnings
from pathlib import Path

import numpy as np

from edgekit import native, runtime, targets, tflite_file
from edgekit.artifact import Artifact, size_mb, through_temp, write_json
from edgekit.gate import faithful
from edgekit.errors import EdgekitError
from edgekit.progress import bar as progress_bar
from edgekit.stages.evaluate import correct
from edgekit.stages.export import compare, tflite_outputs

MODES = ("dynamic", "static", "fp16")
CALIBRATIONS = ("minmax", "entropy", "percentile")
OFFERED = {"onnx": MODES, "tflite": MODES, "torchscript": ("dynamic",)}
LIMITS = {"mode": MODES, "calibration": CALIBRATIONS, "calibration_size": "[1, inf)", "max_accuracy_drop": "[0, 1)",
          "weights": ("int8", "uint8")}  # and recipe.COMMON
FALLBACK = {"static": "dynamic", "dynamic": "fp16"}  # milder methods, for formats without per-node exclusion
FILES = {"onnx": "model.onnx", "tflite": "model.tflite", "torchscript": "model.pt"}
LOW_AGREEMENT = 0.9  # under it INT8 changed many labels (bench/results/quantize.json's variants: 0.915-1.0)
REVISION = 5  # 2: static INT8 calibrates and is checked on texts that fill each length the file takes too (see
# `filled`); a TFLite model.json states the output its file returns (output_0; INT8: scale and zero point per bucket)
# 3: static ONNX INT8 quantizes only weight MatMuls and embedding tables (ORT's QDQ put Q|DQ around Q.K^T, probs.V
# and Softmax too); max_accuracy_drop can keep a Gemm (classifier, pooler) in float and probes weight nodes only
# 4: max_accuracy_drop's drop is a share of sentences, unrounded (a difference of accuracies rounded to 4 places read
# 301 of 30,000, 0.01003, as 0.01); 5: a TorchScript file is the same bytes whether or not export traced in the
# same process (class names were mangled: 14 KB more)


def run(artifact: Artifact, out_dir: Path, ctx, *, mode: str | dict = "dynamic", per_channel: bool = True,
        reduce_range: bool | None = None, fuse: bool = False, calibration: str = "minmax",
        calibration_size: int = 128, max_accuracy_drop: float | None = None, check_sentences: int = 200,
        weights: str = "int8") -> Artifact:
    """mode: one mode for every format, or one per format ({onnx: static, tflite: dynamic, torchscript: dynamic}).
    reduce_range: None takes the target's setting (7-bit weights on x86 without VNNI).
    weights (ONNX dynamic): int8, or uint8, whose u8 x u8 kernels cannot saturate on x86 without VNNI (optimum-cli's
    avx2 config; 1.06-1.17x int8's time for mpnet-base on an AVX2 CPU)."""
    sources = artifact.all()
    if artifact.kind == "hf":
        raise EdgekitError("quantize needs an exported model (onnx, tflite or torchscript); put export before quantize")
    modes = mode if isinstance(mode, dict) else {a.kind: mode for a in sources.values()}
    if problems := mode_problems(modes, [a.kind for a in sources.values()], weights):
        raise EdgekitError(problems[0])
    calib = []
    if "static" in modes.values():
        calib = [t for t, _ in ctx.splits.train[:calibration_size]]
        if not calib:
            raise EdgekitError("static quantization needs calibration data: the training split is empty; give data "
                               "with a train split or use mode: dynamic")
    if max_accuracy_drop is not None and not ctx.splits.validation:
        raise EdgekitError("quantize.max_accuracy_drop needs a validation split to measure on")
    by_format = {a.kind: a for a in sources.values()}
    pairs = targets.pairs(ctx.targets, list(by_format))
    outputs, done = {}, {}
    for target, fmt in pairs:
        source = Path(by_format[fmt].path)
        folder = out_dir if len(pairs) == 1 else out_dir / f"{target}-{fmt}"
        settings = {"mode": modes[fmt], "per_channel": per_channel, "fuse": fuse, "calibration": calibration,
                    **target_settings(target, fmt, reduce_range), **({"weights": weights} if fmt == "onnx" else {})}
        if settings["mode"] != "static":  # the activation type only calibrated ONNX uses: x86 and arm64 dynamic
            settings.pop("activations", None)  # INT8 are one file, made and checked once (was: twice, two copies)
        key = json.dumps([fmt, settings], sort_keys=True)
        same = done.get(key)
        if same:  # another target with identical settings: the same file, hard-linked
            folder.mkdir(parents=True, exist_ok=True)
            for f in Path(same.path).parent.iterdir():
                (folder / f.name).unlink(missing_ok=True)
                os.link(f, folder / f.name)
            meta = json.loads((folder / "model.json").read_text())
            write_json(folder / "model.json", dict(meta, target=target))
            outputs[f"{target}-{fmt}"] = Artifact(folder / FILES[fmt], fmt, dict(same.metrics))
            if ctx.progress:  # the log named the first target's file only
                print(f"  {target}-{fmt}: the {next(n for n, a in outputs.items() if a is same)} file (the same "
                      f"settings)", file=sys.stderr, flush=True)
            continue
        if ctx.progress:  # a file takes seconds (a BERT-base one, and max_accuracy_drop's checks, minutes)
            print(f"  {target}-{fmt}: {settings['mode']} INT8" if settings["mode"] != "fp16" else f"  {target}-{fmt}: fp16",
                  file=sys.stderr, flush=True)
        with quiet():
            out = quantize_one(source, folder, fmt, target, settings, calib, ctx, max_accuracy_drop)
        check, longer = check_examples(out, ctx.splits.test[:check_sentences])
        out.metrics.update(compare(runtime.load(source), runtime.load(out.path), check + longer),
                           size_mb=size_mb(out), size_ratio=round(size_mb(out) / size_mb(by_format[fmt]), 4),
                           params=by_format[fmt].metrics.get("params"))
        if out.metrics["label_agreement"] < LOW_AGREEMENT:  # said, not refused: the accuracy budget decides
            print(f"edgekit: warning: {target}-{fmt} in {settings['mode']} mode gives its FP32 file's label on only "
                  f"{out.metrics['label_agreement']:.0%} of {len(check)} test sentences"
                  f"{f' and {len(longer)} longer texts joined from them' if longer else ''}; check its accuracy, or "
                  f"try another quantize.mode or quantize.max_accuracy_drop", file=sys.stderr, flush=True)
        outputs[f"{target}-{fmt}"] = done[key] = out
    first = next(iter(outputs.values()))
    return Artifact(first.path, first.kind, first.metrics, outputs if len(outputs) > 1 else {})


def check_examples(out: Artifact, examples: list) -> tuple:
    """(test examples, longer ones) to check a quantized file on: static INT8 also on a quarter as many texts
    joined from the test sentences, up to the file's max_length, where its calibrated ranges may fall short."""
    texts = [t for t, _ in examples]
    if out.metrics["quantization"]["mode"] != "static" or not texts:
        return examples, []
    tokenizer = runtime.SidecarTokenizer(out.path)
    return examples, [(t, None) for t in joined(texts, tokenizer.encode, tokenizer.meta["max_length"])]


def joined(texts: list, encode, high: int, low: int = 0) -> list:
    """A quarter as many texts as `texts` (at least one), joined from them, spread evenly over (low, high] tokens:
    what static INT8 calibrates and is checked on beside the sentences themselves."""
    return filled(texts, encode, spread(low, high, max(1, len(texts) // 4)))


def filled(texts: list, encode, lengths: list) -> list:
    """One text per length in `lengths`, of at least that many tokens (or as many as the tokenizer keeps): `texts`
    joined in a seeded random order."""
    rng, out = random.Random(0), []
    for length in lengths:
        parts = []
        while len(parts) < length and encode([_join(parts)])["input_ids"].shape[1] < length:
            parts.append(rng.choice(texts))
        out.append(_join(parts))
    return out


def _join(parts: list):
    """Texts joined with spaces; text pairs joined side by side: (a1 a2 .., b1 b2 ..)."""
    if parts and isinstance(parts[0], tuple):
        return tuple(" ".join(p[i] for p in parts) for i in range(2))
    return " ".join(parts)


def spread(low: int, high: int, count: int) -> list:
    """`count` lengths evenly over (low, high], the last one `high`."""
    return [low + (high - low) * (i + 1) // count for i in range(count)]


def target_settings(target: str, fmt: str, reduce_range) -> dict:
    t = targets.TARGETS[target]
    if fmt == "onnx":
        return {"reduce_range": t["reduce_range"] if reduce_range is None else reduce_range,
                "activations": t["static_activations"]}
    if fmt == "torchscript":
        return {"engine": t["torch_engine"]}
    return {}


def mode_problems(modes: dict, formats: list, weights: str) -> list:
    """Why the modes (format -> mode) cannot quantize these formats with these weights; edgekit.recipe asks
    before any stage runs."""
    problems = [f"quantize.mode {'has no mode' if modes.get(f) is None else modes[f] + ' is not offered'} for {f} "
                f"(offered: {', '.join(OFFERED[f])}); give another mode, or one per format such as "
                f"{{onnx: static, torchscript: dynamic}}" for f in dict.fromkeys(formats) if modes.get(f) not in OFFERED[f]]
    if problems:  # a mode given for a format this run does not make (said only beside a missing one: harmless alone)
        problems += [f"quantize.mode names {f}, which this run does not export (it exports "
                     f"{', '.join(dict.fromkeys(formats))})" for f in modes if f not in formats]
    if weights == "uint8" and "onnx" not in formats:  # it would change nothing, silently
        problems.append(f"quantize.weights 'uint8' applies to ONNX only, and this run exports "
                        f"{', '.join(dict.fromkeys(formats))}; leave it out, or add an ONNX target")
    elif weights == "uint8" and modes.get("onnx") != "dynamic":
        problems.append(f"quantize.weights {weights!r} with ONNX mode {modes.get('onnx')}: give int8, or uint8 "
                        f"with an ONNX export in mode dynamic")
    return problems


def quantize_one(source: Path, folder: Path, fmt: str, target: str, settings: dict, calib: list, ctx,
                 max_drop) -> Artifact:
    """Quantize one file into `folder` (model, model.json, tokenizer), within max_drop when it is given."""
    runtime.load(source)  # a truncated or foreign file stops here, with one line, not inside a quantizer
    folder.mkdir(parents=True, exist_ok=True)
    meta = json.loads((source.parent / "model.json").read_text())
    shutil.copy(source.parent / meta["tokenizer"], folder / meta["tokenizer"])
    moved = {"source": os.path.relpath((source.parent / meta["source"]).resolve(), folder.resolve())} \
        if meta.get("source") and not Path(meta["source"]).is_absolute() else {}  # relative to this sidecar's folder
    write_json(folder / "model.json", dict(meta, target=target, **moved))  # sidecar first: runtime.load reads it
    target_file = folder / FILES[fmt]
    mode, report = settings["mode"], {}
    quantize_file(source, target_file, fmt, settings, calib, meta)
    if max_drop is not None:
        examples = ctx.splits.validation[:1000]
        hits = correct(runtime.load(source), examples, 1, ctx.progress, f"{target}-{fmt} FP32 validation")
        base = sum(hits)
        drop = drop_from(base, target_file, examples, ctx, f"{target}-{fmt} {mode} validation")
        report = {"fp32_accuracy": base / len(hits), "first_drop": drop, "kept_float": [], "method_changes": []}
        if drop > max_drop and fmt == "onnx":
            drop, report["kept_float"] = keep_sensitive_in_float(source, target_file, settings, calib, meta, examples,
                                                                 base, max_drop, ctx)
        while drop > max_drop and fmt != "onnx" and FALLBACK.get(mode) in OFFERED[fmt]:
            report["method_changes"].append(f"{mode} -> {FALLBACK[mode]}")
            mode = FALLBACK[mode]
            quantize_file(source, target_file, fmt, dict(settings, mode=mode), calib, meta)
            drop = drop_from(base, target_file, examples, ctx, f"{target}-{fmt} {mode} validation")
        report.update(accuracy_drop=drop, max_accuracy_drop=max_drop, met=drop <= max_drop,
                      drop_measured_on=f"validation ({len(examples)} sentences)")
        if drop <= max_drop and (report["method_changes"] or report["kept_float"]) and ctx.progress:
            kept, tried = (f"{m} INT8" if m != "fp16" else "fp16" for m in (mode, settings["mode"]))  # the line
            if report["kept_float"]:  # above named the mode tried first
                kept = f"{kept} with {len(report['kept_float'])} sensitive node(s) in float"
            print(f"  {target}-{fmt}: {tried} lost {report['first_drop']:.4f} of validation accuracy "
                  f"(quantize.max_accuracy_drop {max_drop:g}); kept {kept}, which loses {drop:.4f}", file=sys.stderr,
                  flush=True)
        if drop > max_drop:  # said, not refused: the accuracy budget decides
            kept = f"with every quantizable node ({len(report['kept_float'])}) kept in float" if fmt == "onnx" else \
                f"in {mode} mode, the mildest offered for {fmt}"
            print(f"edgekit: warning: {target}-{fmt} loses {faithful(drop, lambda d: d <= max_drop)} of validation "
                  f"accuracy {kept}, over quantize.max_accuracy_drop {max_drop}; give the recipe an accuracy budget "
                  f"to stop such a run, or try another quantize.mode", file=sys.stderr, flush=True)
    quantization = {"tool": {"onnx": "onnxruntime", "tflite": "ai-edge-quantizer", "torchscript": "torch.ao"}[fmt],
                    **applied(fmt, mode, settings), "mode": mode,
                    "weights": "fp16" if mode == "fp16" else settings.get("weights", "int8"),
                    "activations": activations(fmt, mode, settings), **report}
    outputs = {"outputs": tflite_outputs(target_file, meta["signatures"])} if fmt == "tflite" else {}  # INT8 or FP32
    write_json(folder / "model.json", dict(meta, target=target, quantization=quantization, **moved, **outputs))
    return Artifact(target_file, fmt, {"quantization": quantization})


def drop_from(base: int, path: Path, examples: list, ctx, desc: str) -> float:
    """The accuracy the model at `path` loses against the FP32 export (`base` of the examples right), from the two
    counts: 301 of 30,000 (0.01003) is over a max_accuracy_drop of 0.01 (a difference of accuracies rounded to 4
    places read 0.01 and passed)."""
    hits = correct(runtime.load(path), examples, 1, ctx.progress, desc)
    return (base - sum(hits)) / len(hits)


def applied(fmt: str, mode: str, settings: dict) -> dict:
    """The settings as the tool applied them, for the sidecar: per_channel, fuse and calibration steer ONNX Runtime
    only; ai-edge-quantizer's INT8 weights are per channel with min-max ranges, torch.ao's Linear weights per tensor."""
    if fmt == "onnx":  # calibration is for static ranges, fuse for the dynamic and fp16 graphs
        dropped = {"dynamic": ("calibration",), "static": ("fuse",)}.get(mode, ("calibration", "per_channel",
                                                                               "reduce_range"))
        return {k: v for k, v in settings.items() if k not in dropped}
    kept = {k: v for k, v in settings.items() if k not in ("per_channel", "fuse", "calibration")}
    if mode == "fp16":
        return kept
    if fmt == "tflite":
        return dict(kept, per_channel=True, **({"calibration": "minmax"} if mode == "static" else {}))
    return dict(kept, per_channel=False)


def activations(fmt: str, mode: str, settings: dict) -> str:
    if mode == "static":
        return settings.get("activations", "int8")
    if mode == "dynamic":
        return "int8 (dynamic)"
    return "fp32" if fmt == "tflite" else "fp16"  # TFLite FP16 stores weights in half and computes in float


def quantize_file(source: Path, target: Path, fmt: str, settings: dict, calib: list, meta: dict,
                  exclude: list = ()) -> None:
    with through_temp(target, target.with_name(target.name + ".tmp")) as tmp:
        if fmt == "onnx":
            onnx_quantize(source, tmp, settings, calib, exclude)
        elif fmt == "tflite":
            with native.hidden_output():  # ai-edge-quantizer's progress bars and TensorFlow's native log
                tflite_quantize(source, tmp, settings["mode"], calib, meta)
        else:
            torchscript_quantize(source.parent / meta.get("source", ""), tmp, settings["engine"],
                                 meta.get("text_pair", False))


@contextlib.contextmanager
def quiet():
    """The quantizers warn on the root logger once per tensor (shared buffers, 1-D weights); what matters is
    checked afterwards against the FP32 model instead. Only this thread's records below ERROR are dropped: the
    root logger's level is the process's, and the host's other threads lost their warnings meanwhile."""
    root, thread, own = logging.getLogger(), threading.get_ident(), logging.getLogger("onnxruntime")
    level = own.level  # its named loggers (shape inference, preprocessing) log below it

    def keep(record):
        return record.thread != thread or record.levelno >= logging.ERROR

    root.addFilter(keep)
    own.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.removeFilter(keep)
        own.setLevel(level)


# --- ONNX -------------------------------------------------------------------------------------------------------

def onnx_quantize(source: Path, target: Path, settings: dict, calib: list, exclude=()) -> None:
    import onnx

    prepared = target.with_name(target.name + ".prepared")
    try:
        if settings["mode"] == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            model = fused(source) if settings["fuse"] else onnx.load(str(source))
            onnx.save(convert_float_to_float16(model, keep_io_types=True), str(target))
            return
        prepare(source, prepared, settings)
        int8(prepared, target, settings, calib, exclude)
    finally:
        prepared.unlink(missing_ok=True)


def prepare(source: Path, dest: Path, settings: dict) -> None:
    """The graph INT8 is applied to: fused by ORT's transformer optimizer (`fuse`, dynamic only), else ORT's
    quantization pre-processing (folding, shapes). Static QDQ stays on the plain graph: ONNX Runtime fuses QDQ
    patterns itself when it loads the file."""
    if settings["mode"] == "dynamic" and settings["fuse"]:
        import onnx

        onnx.save(fused(source), str(dest))
    else:
        preprocess(source, dest)


def preprocess(source: Path, dest: Path) -> None:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(source), str(dest), skip_symbolic_shape=True)


def int8(prepared: Path, target: Path, settings: dict, calib: list, exclude=(), only=None) -> None:
    """Dynamic or static INT8 of a prepared graph, per `settings`."""
    if settings["mode"] == "dynamic":
        int8_dynamic(prepared, target, settings["per_channel"], settings["reduce_range"], exclude, only, prep=False,
                     weights=settings.get("weights", "int8"))
    else:
        int8_static(prepared, target, settings, calib, exclude, only)


def fused(source: Path):
    """ONNX Runtime's transformer optimizer: Attention, SkipLayerNormalization, EmbedLayerNormalization, Gelu
    fused in the graph file (num_heads and hidden size read from the graph), so INT8 keeps the fused kernels."""
    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    return optimize_model(str(source), model_type="bert", num_heads=0, hidden_size=0, opt_level=1).model


def int8_dynamic(source: Path, target: Path, per_channel: bool = True, reduce_range: bool = False, exclude=(),
                 only=None, prep: bool = True, weights: str = "int8") -> None:
    """ONNX Runtime dynamic INT8 of `source` written to `target` (through a temporary file)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    prepared = target.with_name(target.name + ".prepared.tmp")
    try:  # an error or Ctrl-C leaves no temp file (a BERT-base one is hundreds of MB)
        with through_temp(target, target.with_name(target.name + ".q.tmp")) as tmp:
            if prep:
                preprocess(source, prepared)
            graph = prepared if prep else source
            quantize_dynamic(str(graph), str(tmp), per_channel=per_channel,
                             reduce_range=reduce_range,
                             weight_type=QuantType.QUInt8 if weights == "uint8" else QuantType.QInt8,
                             nodes_to_exclude=as_matmuls(list(exclude) + ([] if only else batched_weights(graph))),
                             nodes_to_quantize=as_matmuls(only) if only else None,
                             extra_options={"DefaultTensorType": 1})  # FLOAT: fused contrib ops carry no inferred types
    finally:
        prepared.unlink(missing_ok=True)


def as_matmuls(names: list) -> list:
    """Node names as ONNX Runtime's dynamic quantizer matches them: it first turns each Gemm into a MatMul (and an
    Add) named `<name>_MatMul`, so a Gemm named alone (the classifier, the pooler) was never excluded nor probed."""
    return [x for n in names for x in (n, f"{n}_MatMul")]


WEIGHT_INPUT = {"MatMul": 1, "Gemm": 1, "Attention": 1, "Gather": 0, "EmbedLayerNormalization": 2}


def weight_nodes(graph, op_types=tuple(WEIGHT_INPUT)) -> list:
    """Names of the nodes INT8 turns into integer ones: a MatMul or Gemm whose B, a Gather whose table, ... is a
    float initializer of 2 dimensions (not an activation, not an index constant, nor DeBERTa's batched weights)."""
    floats = {t.name for t in graph.initializer if t.data_type == 1 and len(t.dims) == 2}
    return [n.name for n in graph.node if n.op_type in op_types and n.name
            and len(n.input) > WEIGHT_INPUT[n.op_type] and n.input[WEIGHT_INPUT[n.op_type]] in floats]


def batched_weights(graph) -> list:
    """MatMul nodes whose constant operand has more than 2 dimensions (DeBERTa's per-head position keys and
    queries: export.deberta_attention). ONNX Runtime's INT8 MatMuls take a 2-D weight (per-channel dynamic INT8
    of one failed at run time: 'b zero point is not valid'), so they stay float, as the activation x activation
    MatMuls they replace were. `graph`: an ONNX GraphProto, or the file to read it from (0.8 s for a 70 MB one;
    a call quantizing `only` some nodes skips it: keep_sensitive_in_float never names these)."""
    import onnx

    if not hasattr(graph, "node"):
        graph = onnx.load(str(graph), load_external_data=False).graph
    rank = {t.name: len(t.dims) for t in graph.initializer}
    return [n.name for n in graph.node if n.op_type == "MatMul" and rank.get(n.input[1], 2) > 2]


def int8_static(source: Path, target: Path, settings: dict, calib: list, exclude=(), only=None) -> None:
    """Static INT8 in QDQ form: activation ranges (minmax, entropy or percentile) from `calib` sentences and texts
    joined from them up to max_length (`filled`). Only weight MatMuls and the embedding Gathers: QDQ around every
    op (LayerNorm, Softmax, activation x activation MatMuls) measured 75.8 ms against 20.5 ms for dynamic INT8 at
    128 tokens, and S8S8 QDQ has no fast x86 kernel (88 ms against 32 ms for U8S8 under the same load), hence the
    targets' activation types."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, \
        quantize_static

    tokenizer = runtime.SidecarTokenizer(source)  # model.json and tokenizer lie beside `source`
    encode = tokenizer.encode
    calib = calib + joined(calib, encode, tokenizer.meta["max_length"])
    if settings["calibration"] == "minmax":  # each sentence alone, at its own length: no padding in the ranges
        items = [encode([t]) for t in calib]
    else:  # ONNX Runtime's histogram calibrators stack every tensor, so all inputs take one width (padded)
        batch = encode(calib)
        items = [{k: v[i:i + 1] for k, v in batch.items()} for i in range(len(calib))]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(items)

        def get_next(self):
            return next(self.items, None)

    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[settings["calibration"]]
    activation = QuantType.QInt8 if settings["activations"] == "int8" else QuantType.QUInt8
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph  # MatMulConstBOnly does not hold in ORT's QDQ
    with through_temp(target, target.with_name(target.name + ".q.tmp")) as tmp:  # path: nodes_to_quantize keeps
        quantize_static(str(source), str(tmp), Reader(), quant_format=QuantFormat.QDQ, activation_type=activation,
                        weight_type=QuantType.QInt8, per_channel=settings["per_channel"],  # Q|DQ from Q.K^T,
                        reduce_range=settings["reduce_range"], calibrate_method=method,  # probs.V and Softmax
                        nodes_to_exclude=list(exclude), nodes_to_quantize=only or weight_nodes(graph, STATIC_OPS),
                        op_types_to_quantize=list(STATIC_OPS),
                        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True, "DefaultTensorType": 1,
                                       "MatMulConstBOnly": True})


STATIC_OPS = ("MatMul", "Gather")  # static QDQ: weight MatMuls and embedding tables; Gemm (pooler, classifier) float


def keep_sensitive_in_float(source: Path, target: Path, settings: dict, calib: list, meta: dict, examples: list,
                            base: int, max_drop: float, ctx):
    """Order the quantizable nodes by how much quantizing each alone moves the logits, then keep the worst in
    float (1, 2, 4, ... of them) until the accuracy drop holds. Returns (drop, kept node names)."""
    import onnx

    prepared = target.with_name("prepared.onnx.tmp")
    probe = target.with_name("probe.onnx")
    try:  # a stop anywhere leaves neither file (prepared is a whole FP32 copy)
        prepare(source, prepared, settings)  # the graph quantize_file quantizes: node names match
        graph = onnx.load(str(prepared)).graph  # the nodes this mode turns into integer ones, and no others
        nodes = weight_nodes(graph, STATIC_OPS if settings["mode"] == "static" else tuple(WEIGHT_INPUT))
        sample = [t for t, _ in (ctx.splits.validation[:64])]
        reference = runtime.load(source)
        batch = reference.encode(sample)
        want = reference.logits(batch)
        errors = {}
        for name in progress_bar(nodes, desc="sensitivity", unit="node", disable=not ctx.progress):
            int8(prepared, probe, settings, calib[:32], only=[name])
            errors[name] = float(np.abs(runtime.OnnxModel(probe).logits(batch) - want).mean())
        order = sorted(nodes, key=lambda n: -errors[n])
        drop = None
        for k in sorted({min(2 ** i, len(order)) for i in range(len(order).bit_length() + 1)}):
            quantize_file(source, target, "onnx", settings, calib, meta, exclude=order[:k])
            drop = drop_from(base, target, examples, ctx, f"{k} node(s) kept in float, validation")
            if drop <= max_drop:
                return drop, order[:k]
        return drop, order
    finally:
        prepared.unlink(missing_ok=True)
        probe.unlink(missing_ok=True)


# --- TFLite -----------------------------------------------------------------------------------------------------

def tflite_quantize(source: Path, target: Path, mode: str, calib: list, meta: dict) -> None:
    from ai_edge_quantizer import qtyping, quantizer, recipe, recipe_manager
    from ai_edge_quantizer.algorithm_manager import AlgorithmName

    if mode == "dynamic":  # the embedding table per-tensor: 30,522 row scales cost 0.37 MB, accuracy the same
        manager = recipe_manager.RecipeManager()
        manager.load_quantization_recipe(recipe.dynamic_wi8_afp32())
        manager.add_dynamic_config(regex=".*", operation_name=qtyping.TFLOperationName.EMBEDDING_LOOKUP, num_bits=8,
                                   granularity=qtyping.QuantGranularity.TENSORWISE)
        chosen = manager.get_quantization_recipe()
    elif mode == "static":
        chosen = recipe.static_wi8_ai8()
    else:
        manager = recipe_manager.RecipeManager()
        manager.add_weight_only_config(regex=".*", operation_name=qtyping.TFLOperationName.ALL_SUPPORTED, num_bits=16,
                                       algorithm_key=AlgorithmName.FLOAT_CASTING)
        chosen = manager.get_quantization_recipe()
    q = quantizer.Quantizer(str(source), chosen)
    result = None
    if q.need_calibration:
        tokenizer = runtime.SidecarTokenizer(source)
        data, buckets = {}, sorted(meta["buckets"])
        for shorter, b in zip([0] + buckets, buckets):  # short sentences padded, then texts filling the bucket:
            # last, since ai-edge-quantizer's ranges are moving averages (0.95) over the rows, not their extremes
            rows = []
            for text in calib + joined(calib, tokenizer.encode, b, shorter):
                enc = tokenizer.encode([text], max_length=b)
                ids = np.full((1, b), meta["pad_id"], dtype=np.int32)
                mask = np.zeros((1, b), dtype=np.int32)
                n = enc["input_ids"].shape[1]
                ids[0, :n], mask[0, :n] = enc["input_ids"][0], 1
                rows.append({meta["inputs"][0]["name"]: ids, meta["inputs"][1]["name"]: mask})
            data[meta["signatures"][str(b)]] = rows
        result = q.calibrate(data, num_threads=os.cpu_count() or 1)
    q.quantize(result, enable_progress_bar=False, enable_progress_report=False).export_model(str(target), overwrite=True)
    tflite_file.compact(target)


# --- TorchScript ------------------------------------------------------------------------------------------------

def torchscript_quantize(source: Path, target: Path, engine: str, pairs: bool = False) -> None:
    """Dynamic INT8 Linear layers and 8-bit embedding rows (torch.ao) of the transformers model at `source`,
    traced again for the target's engine."""
    import torch

    from edgekit import families
    from edgekit.stages.export import to_torchscript

    if not (source / "config.json").is_file():
        raise EdgekitError(f"TorchScript INT8 re-traces the transformers model it was exported from, and "
                           f"{source} is gone; run export again")
    if engine not in torch.backends.quantized.supported_engines:
        raise EdgekitError(f"this torch has no '{engine}' quantized engine (has: "
                           f"{', '.join(torch.backends.quantized.supported_engines)})")
    torch.backends.quantized.engine = engine
    model = families.load_model(source, pairs=pairs).eval()
    spec = {torch.nn.Linear: torch.ao.quantization.default_dynamic_qconfig}
    for name, m in model.named_modules():  # word and position tables; token types are read through a
        if isinstance(m, torch.nn.Embedding) and m.num_embeddings >= 64:  # non-contiguous view the op refuses
            spec[name] = torch.ao.quantization.float_qparams_weight_only_qconfig
    model = torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8)
    ids = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])  # any ids inside the vocabulary: tracing needs shapes
    to_torchscript(model, (ids, (ids != 0).long()), target)

"""quantize: ONNX Runtime dynamic INT8 (weights INT8 per channel or per tensor, activations quantized on the fly),
embeddings included. The result is checked against its FP32 source on real test sentences."""
import json
import os
import shutil
from pathlib import Path

from edgekit import runtime
from edgekit.artifact import Artifact, size_mb, write_json
from edgekit.errors import EdgekitError
from edgekit.stages.export import compare

MODES = ("dynamic",)


def run(artifact: Artifact, out_dir: Path, ctx, *, mode: str = "dynamic", per_channel: bool = True,
        reduce_range: bool = False, check_sentences: int = 200) -> Artifact:
    if mode not in MODES:
        raise EdgekitError(f"quantize.mode '{mode}' is not supported; supported: {', '.join(MODES)}")
    if artifact.kind != "onnx":
        raise EdgekitError(f"quantize needs an ONNX artifact, got {artifact.kind}; put export (format: onnx) before quantize")
    source = Path(artifact.path)
    runtime.check_onnx(source)  # a truncated or foreign file stops here, not inside the quantizer
    out_dir.mkdir(parents=True, exist_ok=True)
    int8_dynamic(source, out_dir / "model.onnx", per_channel, reduce_range)
    meta = json.loads((source.parent / "model.json").read_text())
    shutil.copy(source.parent / meta["tokenizer"], out_dir / meta["tokenizer"])
    meta["quantization"] = {"tool": "onnxruntime", "mode": mode, "weights": "int8", "per_channel": per_channel,
                            "reduce_range": reduce_range}
    write_json(out_dir / "model.json", meta)
    quantized = Artifact(out_dir / "model.onnx", "onnx", {"params": artifact.metrics.get("params")})
    check = compare(runtime.OnnxModel(source), runtime.OnnxModel(out_dir / "model.onnx"), ctx.splits.test[:check_sentences])
    quantized.metrics.update(check, size_mb=size_mb(quantized))
    return quantized


def int8_dynamic(source: Path, target: Path, per_channel: bool = True, reduce_range: bool = False) -> None:
    """ONNX Runtime dynamic INT8 of `source` written to `target` (through a temporary file)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = target.with_name(target.name + ".prepared.tmp")
    tmp = target.with_name(target.name + ".tmp")
    quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
    quantize_dynamic(str(prepared), str(tmp), per_channel=per_channel, reduce_range=reduce_range,
                     weight_type=QuantType.QInt8)
    prepared.unlink()
    os.replace(tmp, target)

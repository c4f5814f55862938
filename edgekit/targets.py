"""Deployment targets: which formats each CPU family runs, and the INT8 settings that suit it.

`targets: [x86, arm64]` in a recipe makes export write every format those targets need and quantize write one
artifact per target and format, each with its own model.json (`target`, `quantization`).

- x86: x86-64 with VNNI (AVX512-VNNI or AVX-VNNI: Intel since Cascade Lake / Alder Lake, AMD since Zen 4).
  ONNX Runtime's u8s8 kernels use the full 8-bit range there; static QDQ uses u8 activations (s8s8 QDQ has no
  fast x86 kernel: 2.7x slower here).
- x86-avx2: older x86-64 without VNNI. u8s8 products can saturate in VPMADDUBSW, so weights use 7 bits
  (reduce_range), as ONNX Runtime's quantization guide advises.
- arm64: Raspberry Pi 4/5, phones, Graviton. ONNX Runtime (full range, signed activations for static QDQ) and
  TFLite (XNNPACK). TorchScript is not offered: PyTorch Mobile is deprecated in favour of ExecuTorch.
"""
from edgekit.errors import EdgekitError

FORMATS = ("onnx", "tflite", "torchscript")
TARGETS = {
    "x86": {"formats": ("onnx", "tflite", "torchscript"), "default": ("onnx",), "reduce_range": False,
            "static_activations": "uint8", "torch_engine": "x86"},
    "x86-avx2": {"formats": ("onnx", "tflite", "torchscript"), "default": ("onnx",), "reduce_range": True,
                 "static_activations": "uint8", "torch_engine": "fbgemm"},
    "arm64": {"formats": ("onnx", "tflite"), "default": ("onnx", "tflite"), "reduce_range": False,
              "static_activations": "int8", "torch_engine": None},
}


def check(targets) -> list:
    """The recipe's `targets` as a list of known names, or one line saying what is allowed."""
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise EdgekitError(f"targets must be a list of target names from: {', '.join(TARGETS)}")
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise EdgekitError(f"unknown target {', '.join(unknown)}; targets: {', '.join(TARGETS)}")
    if len(set(targets)) != len(targets):
        raise EdgekitError(f"targets {targets} names a target twice")
    return targets


def formats_for(targets: list, asked) -> list:
    """The formats export writes: the ones asked for (each must run on every target that wants it), or with
    `auto` the union of the targets' default formats."""
    if asked == "auto":
        return list(dict.fromkeys(f for t in targets for f in TARGETS[t]["default"]))
    formats = [asked] if isinstance(asked, str) else list(asked)
    unknown = [str(f) for f in formats if f not in FORMATS]
    if unknown or not formats or len(set(formats)) != len(formats):
        raise EdgekitError(f"export.format {asked!r}: give auto, one format or a list of distinct formats from "
                           f"{', '.join(FORMATS)}")
    for f in formats:
        runs_it = [t for t in targets if f in TARGETS[t]["formats"]]
        if not runs_it:
            raise EdgekitError(f"export format '{f}' cannot run on target {', '.join(targets)} (which runs "
                               f"{', '.join(TARGETS[targets[0]]['formats'])}); drop the format or add a target that runs it")
    return formats


def pairs(targets: list, formats: list) -> list:
    """(target, format) for every artifact quantize writes: each target with each exported format it runs."""
    return [(t, f) for t in targets for f in formats if f in TARGETS[t]["formats"]]

"""What one stage hands the next: a path, its kind, and what is known about it (metrics)."""
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("hf", "onnx")  # hf: a transformers folder (config.json, model.safetensors, tokenizer); onnx: model.onnx + model.json


@dataclass
class Artifact:
    path: Path
    kind: str
    metrics: dict = field(default_factory=dict)

    def to_json(self, root: Path) -> dict:
        path = Path(self.path)
        shown = str(path.relative_to(root)) if path.is_absolute() and path.is_relative_to(root) else str(path)
        return {"path": shown, "kind": self.kind, "metrics": self.metrics}

    @classmethod
    def from_json(cls, d: dict, root: Path) -> "Artifact":
        path = Path(d["path"])
        return cls(path if path.is_absolute() else root / path, d["kind"], dict(d.get("metrics", {})))


WEIGHT_SUFFIXES = (".onnx", ".safetensors", ".tflite", ".pt", ".data")


def weight_files(path: Path) -> list:
    """The files holding a model's weights: a model file and its external data, or a folder's weight files
    (tokenizer and sidecars excluded)."""
    path = Path(path)
    if path.is_file():
        return [path] + sorted(path.parent.glob(path.name + ".data"))
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def weights_mb(path: Path) -> float:
    """Bytes of the weights a device must hold, in MB (10^6)."""
    return round(sum(p.stat().st_size for p in weight_files(path)) / 1e6, 3)


def size_mb(artifact: Artifact) -> float:
    return weights_mb(artifact.path)


def write_json(path: Path, obj) -> None:
    """Write JSON through a temporary file and a rename: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

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


def files(artifact: Artifact) -> list:
    """The files an artifact is made of (a folder's files, or a model file and its sidecars)."""
    path = Path(artifact.path)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return sorted(p for p in path.parent.iterdir() if p.is_file())


def size_mb(artifact: Artifact) -> float:
    """Bytes of the weights a device must hold (tokenizer and sidecars excluded), in MB (10^6)."""
    weights = [p for p in files(artifact) if p.suffix in (".onnx", ".safetensors", ".tflite", ".pt", ".data")]
    return round(sum(p.stat().st_size for p in weights) / 1e6, 3)


def write_json(path: Path, obj) -> None:
    """Write JSON through a temporary file and a rename: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

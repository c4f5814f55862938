"""What one stage hands the next: a path, its kind, and what is known about it (metrics)."""
import contextlib
import json
import mmap
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.errors import EdgekitError

# hf: a transformers folder (config.json, model.safetensors, tokenizer); onnx, tflite, torchscript: a model file with
# its model.json sidecar and tokenizer.json beside it
KINDS = ("hf", "onnx", "tflite", "torchscript")


@dataclass
class Artifact:
    """`outputs`: when a stage writes several deployable files (one per target and format), each by name
    (`x86-onnx`, `arm64-tflite`, ...); the artifact itself is the first of them, the one later stages report."""
    path: Path
    kind: str
    metrics: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)

    def all(self) -> dict:
        """name -> Artifact for every deployable output (just this one when the stage wrote one)."""
        return self.outputs or {self.kind: self}

    def to_json(self, root: Path) -> dict:
        path = Path(self.path)
        shown = str(path.relative_to(root)) if path.is_absolute() and path.is_relative_to(root) else str(path)
        out = {"path": shown, "kind": self.kind, "metrics": self.metrics}
        if self.outputs:
            out["outputs"] = {name: a.to_json(root) for name, a in self.outputs.items()}
        return out

    @classmethod
    def from_json(cls, d: dict, root: Path) -> "Artifact":
        path = Path(d["path"])
        outputs = {name: cls.from_json(o, root) for name, o in (d.get("outputs") or {}).items()}
        return cls(path if path.is_absolute() else root / path, d["kind"], dict(d.get("metrics", {})), outputs)

    def moved(self, old: Path, new: Path) -> "Artifact":
        """The same artifact after its folder `old` was renamed to `new`."""
        path = Path(self.path)
        path = new / path.relative_to(old) if path.is_relative_to(old) else path
        return Artifact(path, self.kind, self.metrics, {n: a.moved(old, new) for n, a in self.outputs.items()})


WEIGHT_SUFFIXES = (".onnx", ".safetensors", ".tflite", ".pt", ".data")


def weight_files(path: Path) -> list:
    """The files holding a model's weights: a model file and its external data, or a folder's weight files
    (tokenizer and sidecars excluded)."""
    path = Path(path)
    if path.is_file():
        return [path] + (onnx_data_files(path) if path.suffix == ".onnx" else [])
    files = {p.resolve(): p for p in path.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES}
    for data in [d for p in list(files.values()) if p.suffix == ".onnx" for d in onnx_data_files(p)]:
        files.setdefault(data.resolve(), data)  # a data file the folder scan found too is counted once
    return sorted(files.values())


def onnx_data_files(path: Path) -> list:
    """The external data files an ONNX model's tensors name: `model.onnx.data` as edgekit writes it,
    `model.onnx_data` as Optimum does, or any other name; each once, and only inside the model's folder (ONNX
    Runtime loads no other), by their resolved paths. Needs the onnx package only for a model that has external
    data."""
    with open(path, "rb") as f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if data.find(b"location") < 0:  # no tensor says where its data is: the file holds every weight
                    return []
        except ValueError:  # an empty file
            return []
    try:
        import onnx
    except ImportError:
        raise EdgekitError(f"{path} keeps its weights in external data files, and finding them needs the onnx "
                           f"package; pip install onnx (no torch needed)") from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # not an ONNX model: loading it says so
        return []
    folder = path.parent.resolve()
    names = {entry.value for tensor in _onnx_tensors(model.graph) for entry in tensor.external_data
             if entry.key == "location"}
    return sorted(folder / name for name in names
                  if (folder / name).resolve().is_relative_to(folder) and (folder / name).is_file())


def _onnx_tensors(graph):
    """Every tensor of an ONNX graph and of the graphs inside its nodes (If, Loop, Scan)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attribute in node.attribute:
            yield from [attribute.t] if attribute.HasField("t") else []
            yield from attribute.tensors
            for inner in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _onnx_tensors(inner)


def weights_mb(path: Path) -> float:
    """Bytes of the weights a device must hold, in MB (10^6), to the byte: a budget compares this number, so it is not
    rounded further (a 6,000,499-byte file is over `size_mb <= 6`)."""
    return round(sum(p.stat().st_size for p in weight_files(path)) / 1e6, 6)


def size_mb(artifact: Artifact) -> float:
    return weights_mb(artifact.path)


@contextlib.contextmanager
def through_temp(path: Path, tmp: Path = None):
    """The temp file (or folder) a writer fills, renamed onto `path` when the block ends without an error and removed
    when it does not (a full disk, Ctrl-C, SIGTERM): a reader sees the old file or the new one, never half, and no
    temp file stays behind. A folder replacing another is two steps (the old one goes first): a stop between them
    leaves none, which the writers here (prune steps, stages from the shared cache) redo. `tmp`: its name (by
    default a hidden one beside `path`); one a killed writer left is removed first."""
    tmp = tmp or path.with_name(f".{path.name}.{os.getpid()}.tmp")
    remove(tmp)
    try:
        yield tmp
        if tmp.is_dir() and path.is_dir():  # a folder cannot be renamed onto a full one
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        remove(tmp)


def remove(path: Path) -> None:
    """Delete a file or a folder, if it is there."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_json(path: Path, obj) -> None:
    """Write JSON through a temporary file and a rename (through_temp), flushed to disk first."""
    with through_temp(path) as tmp, open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())


def written_into(path: Path) -> bool:
    """Whether `path` is written into as it is, not replaced through a temp file and a rename: a pipe, a terminal or a
    device, or any path under /dev or /proc (/dev/stdout links to the shell's redirect, which may be a regular file;
    the rename replaced /dev/stdout itself, for root)."""
    return path.exists() and (not path.is_file() or path.absolute().parts[1:2] in (("dev",), ("proc",)))


def write_text(path: Path, text: str) -> None:
    """Text (a markdown table, a report) the same way as write_json: the old file or the new one, never half (in the
    folder a link points to: the link stays). Written into what written_into names (gate --json /dev/stdout)."""
    if written_into(path):
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
        return
    with through_temp(path.resolve()) as tmp:
        tmp.write_text(text, encoding="utf-8")

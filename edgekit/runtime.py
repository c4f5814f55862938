"""load(path) -> a callable model: texts in, labels and probabilities out, the same for every format.

    model = edgekit.load("artifacts/distilbert-int8/05-quantize/model.onnx")
    model(["a gripping, funny film"])  # {"labels": ["fresh"], "probs": array([[0.08, 0.92]])}
"""
import json
from pathlib import Path

import numpy as np

from edgekit.errors import EdgekitError


def load(path, threads: int = 0):
    path = Path(path)
    if path.is_dir() and (path / "model.onnx").is_file():
        path = path / "model.onnx"
    if path.is_dir() and (path / "config.json").is_file():
        return HFModel(path, threads)
    if path.is_dir() and (path / "model.pt").is_file():
        path = path / "model.pt"
    if path.suffix == ".onnx" and path.is_file():
        return OnnxModel(path, threads)
    if path.suffix == ".pt" and path.is_file():
        return TorchScriptModel(path, threads)
    raise EdgekitError(f"cannot load {path}: give a transformers folder (config.json), or a .onnx or TorchScript .pt "
                       f"file with its model.json")


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class HFModel:
    kind = "hf"

    def __init__(self, path: Path, threads: int = 0):
        import torch

        from edgekit import families

        if threads:
            torch.set_num_threads(threads)
        self.model = families.load_model(path)
        self.tokenizer = families.load_tokenizer(path)
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]
        self.max_length = min(getattr(self.tokenizer, "model_max_length", 512) or 512, 512)

    def encode(self, texts, max_length=None):
        enc = self.tokenizer(list(texts), truncation=True, max_length=max_length or self.max_length,
                             padding=True, return_tensors="np")
        return {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": enc["attention_mask"].astype(np.int64)}

    def logits(self, batch: dict) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = self.model(input_ids=torch.from_numpy(batch["input_ids"]),
                             attention_mask=torch.from_numpy(batch["attention_mask"]))
        return out.logits.float().numpy()

    def __call__(self, texts, max_length=None) -> dict:
        return predict(self, texts, max_length)


def read_sidecar(model_file: Path) -> dict:
    from edgekit import schemas

    sidecar = model_file.parent / "model.json"
    if not sidecar.is_file():
        raise EdgekitError(f"{model_file} has no model.json beside it; re-export it with edgekit")
    try:
        meta = json.loads(sidecar.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EdgekitError(f"{sidecar} is not valid JSON ({getattr(e, 'msg', e)}); re-export the model")
    schemas.validate(meta, schemas.MODEL_JSON, str(sidecar))
    if not (model_file.parent / meta["tokenizer"]).is_file():
        raise EdgekitError(f"{sidecar} names tokenizer {meta['tokenizer']}, which is not beside it; re-export the model")
    return meta


def check_onnx(path: Path) -> None:
    """The ONNX checker before any runtime sees the file: a truncated or foreign file stops here."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except Exception as e:
        raise EdgekitError(f"{path} is not a valid ONNX model ({str(e).splitlines()[0][:160]}); re-export it")


class SidecarTokenizer:
    """Tokenization from the sidecar's tokenizer.json with the `tokenizers` package (no transformers)."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.meta = read_sidecar(path)
        self.labels = self.meta["labels"]
        self.max_length = self.meta["max_length"]
        self.tokenizer = Tokenizer.from_file(str(path.parent / self.meta["tokenizer"]))
        self.tokenizer.no_padding()

    def encode(self, texts, max_length=None):
        self.tokenizer.enable_truncation(min(max_length or self.max_length, self.max_length))
        encs = self.tokenizer.encode_batch(list(texts))
        width = max(len(e.ids) for e in encs)
        ids = np.full((len(encs), width), self.meta["pad_id"], dtype=np.int64)
        mask = np.zeros((len(encs), width), dtype=np.int64)
        for row, e in enumerate(encs):
            ids[row, :len(e.ids)] = e.ids
            mask[row, :len(e.ids)] = 1
        return {"input_ids": ids, "attention_mask": mask}


def predict(model, texts, max_length=None) -> dict:
    """texts -> {labels, probs}, the same for every format."""
    probs = softmax(model.logits(model.encode(texts, max_length)))
    return {"labels": [model.labels[i] for i in probs.argmax(-1)], "probs": probs}


class TorchScriptModel:
    kind = "torchscript"

    def __init__(self, path: Path, threads: int = 0):
        import torch

        self.sidecar = SidecarTokenizer(path)
        self.meta, self.labels, self.encode = self.sidecar.meta, self.sidecar.labels, self.sidecar.encode
        if threads:
            torch.set_num_threads(threads)
        try:
            self.module = torch.jit.load(str(path), map_location="cpu").eval()
        except Exception as e:
            raise EdgekitError(f"torch.jit cannot load {path} ({str(e).splitlines()[0][:160]}); re-export it")

    def logits(self, batch: dict) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.module(torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])).numpy()

    def __call__(self, texts, max_length=None) -> dict:
        return predict(self, texts, max_length)


class OnnxModel:
    kind = "onnx"

    def __init__(self, path: Path, threads: int = 0):
        import onnxruntime as ort

        self.sidecar = SidecarTokenizer(path)
        self.meta, self.labels, self.encode = self.sidecar.meta, self.sidecar.labels, self.sidecar.encode
        check_onnx(path)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise EdgekitError(f"onnxruntime cannot load {path} ({str(e).splitlines()[0][:160]}); the file is "
                               f"damaged or not ONNX: re-export it")
        self.input_names = [i.name for i in self.session.get_inputs()]

    def logits(self, batch: dict) -> np.ndarray:
        return self.session.run(None, {k: batch[k] for k in self.input_names})[0]

    def __call__(self, texts, max_length=None) -> dict:
        return predict(self, texts, max_length)

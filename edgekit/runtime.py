"""load(path) -> a callable model: texts in, labels and probabilities out, the same for every format.

    model = edgekit.load("artifacts/distilbert-int8/04-quantize/model.onnx")  # or the run folder: its final model
    model(["a gripping, funny film"])  # {"labels": ["fresh"], "probs": array([[0.92, 0.08]])} (fresh, rotten)
"""
import json
import os
import threading
from pathlib import Path

import numpy as np

from edgekit import native
from edgekit.errors import EdgekitError, UsageError


def load(path, threads: int = 0, max_length: int = 0):
    """A callable model, safe to call from several threads. `max_length` truncates every call's texts (a call's own
    max_length wins), never past what the model takes: an exported file's model.json max_length, a transformers
    folder's position table. `threads` sets ONNX Runtime's and LiteRT's threads for this model only, but for a
    transformers folder or a TorchScript .pt it calls torch.set_num_threads: every torch model in the process."""
    threads = whole_number("threads", threads, 1)
    max_length = whole_number("max_length", max_length, MIN_LENGTH)
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes) or str(path).strip() == "":
        raise EdgekitError(f"load takes a path (a string or pathlib.Path), got {path!r}: give a run folder, a "
                           f"transformers folder, or a .onnx, .tflite or .pt file")  # "" was the working folder
    path = Path(path).expanduser()
    if not path.exists():
        raise EdgekitError(f"{path} does not exist; give a run folder, a transformers folder, or a .onnx, .tflite or "
                           f".pt file")
    if path.name == "manifest.json" or (path / "manifest.json").is_file():  # a finished run: its final model
        from edgekit.gate import load_manifest

        manifest, run = load_manifest(path)
        path = run / manifest["final"]["path"]
    if path.is_dir() and (path / "model.onnx").is_file():
        path = path / "model.onnx"
    if path.is_dir() and (path / "config.json").is_file():
        from edgekit.pipeline import resolve_model

        resolve_model(str(path))  # a whole folder: config, weights that open, tokenizer files
        return HFModel(path, threads, max_length)
    for name in ("model.pt", "model.tflite"):
        if path.is_dir() and (path / name).is_file():
            path = path / name
    if path.suffix == ".onnx" and path.is_file():
        return OnnxModel(path, threads, max_length)
    if path.suffix == ".pt" and path.is_file():
        return TorchScriptModel(path, threads, max_length)
    if path.suffix == ".tflite" and path.is_file():
        return TFLiteModel(path, threads, max_length)
    if path.is_dir():  # a stage folder of a run (03-export, 04-quantize): one subfolder per format or target
        inside = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix in (".onnx", ".pt", ".tflite")
                        or any((p / n).is_file() for n in ("config.json", "model.onnx", "model.pt", "model.tflite")))
        if inside:
            raise EdgekitError(f"{path} is not a model but holds {len(inside)}: {', '.join(inside)}; give one of "
                               f"them, e.g. {path / inside[0]}")
    raise EdgekitError(f"cannot load {path}: give a transformers folder (config.json), or a .onnx, .tflite or "
                       f"TorchScript .pt file with its model.json")


# Every family's tokenizer adds 2 special tokens to one text ([CLS] .. [SEP], <s> .. </s>); below 3 the tokenizers
# library ignores the limit (truncation off) and transformers does the same
MIN_LENGTH = 3


def whole_number(name: str, value, least: int) -> int:
    """`value` as an int: 0 (the default), or a whole number >= least (a Python or numpy integer, not a bool)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and (value == 0 or value >= least):
        return int(value)
    raise UsageError(f"{name}={short(value)}: give a whole number >= {least}, or 0 for the default")


def short(value) -> str:
    """A user value's repr for a one-line message, cut to about 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(logits, -60.0, 60.0)))


def decided(logits: np.ndarray, multi_label: bool, thresholds=None) -> list:
    """Per row of logits, what the model says: a class id (the largest logit), or for a multi-label model a tuple of
    0/1, 1 for each label whose probability (sigmoid) is over its threshold (`thresholds`, one per label, the
    model's own: model.json's or its config's edgekit_thresholds; without them 0.5, a logit over 0)."""
    if multi_label:
        cut = [0.0] * np.shape(logits)[-1] if thresholds is None else [logit(t) for t in thresholds]
        return [tuple(int(v > c) for v, c in zip(row, cut)) for row in np.asarray(logits)]
    return [int(i) for i in np.asarray(logits).argmax(-1)]


def logit(p: float) -> float:
    """The logit whose sigmoid is the probability p (0.5: 0.0 exactly)."""
    return 0.0 if p == 0.5 else float(np.log(p / (1.0 - p)))


class Reloads:
    """A loaded model pickles (and copies) as a `Reloaded`: the file it was loaded from, its load settings and a
    stamp of the files it read (files_stamp), not its sessions, interpreters and locks."""

    def remember(self, path, *settings) -> None:
        path = Path(path).absolute()
        self.loaded_with = (type(self), path, *settings)  # a class pickles by its name
        self.stamp = files_stamp(path)

    def __reduce__(self):
        return Reloaded, (self.loaded_with, self.stamp)


def files_stamp(path: Path) -> list:
    """[name, bytes, sha256 of the first and last MiB] of the files a model at `path` reads: a folder's config.json
    and weights, or the file and the model.json beside it. Milliseconds for any size; a copy to another machine
    keeps it (a modification time would not), retrained weights do not."""
    import hashlib

    files = [path / "config.json", *sorted(path.glob("*.safetensors"))] if path.is_dir() else \
        [path, path.with_name("model.json")]
    stamp = []
    for f in (f for f in files if f.is_file()):
        size = f.stat().st_size
        with open(f, "rb") as fh:
            head = fh.read(1 << 20)
            fh.seek(max(len(head), size - (1 << 20)))
            stamp.append([f.name, size, hashlib.sha256(head + fh.read()).hexdigest()])
    return stamp


LOADED, LOADING = {}, threading.Lock()  # (loaded_with, stamp) -> the model, loaded once per process and kept


class Reloaded:
    """A model unpickled in another process (a process pool that spawns, Ray, Spark) or copied: it takes the same
    calls and loads its file at the first one, once per process. So a file moved, deleted or changed since it was
    loaded fails that call, with one line, where a process pool sends the error back to the caller (an error while
    unpickling a task is lost: the pool hangs)."""

    def __init__(self, loaded_with: tuple, stamp: list):
        self.loaded_with, self.stamp = tuple(loaded_with), stamp

    def __reduce__(self):
        return Reloaded, (self.loaded_with, self.stamp)

    def model(self):
        key = repr((self.loaded_with, self.stamp))
        with LOADING:
            if key not in LOADED:
                model_class, path, *settings = self.loaded_with
                if not path.exists():
                    raise EdgekitError(f"this pickled edgekit model reloads {path}, which is not there in this process "
                                       f"(moved or deleted); put it back, or load the model where it is")
                if files_stamp(path) != self.stamp:
                    raise EdgekitError(f"{path} changed after this pickled edgekit model was loaded from it (another "
                                       f"run or export wrote there); load the model again")
                LOADED[key] = model_class(path, *settings)
            return LOADED[key]

    def __call__(self, texts, max_length=None) -> dict:
        return self.model()(texts, max_length)

    def __getattr__(self, name):  # labels, meta, encode, logits ...: the loaded model's
        if name.startswith("__") or name in ("loaded_with", "stamp"):
            raise AttributeError(name)
        return getattr(self.model(), name)


class HFModel(Reloads):
    kind = "hf"
    meta = None  # inside a run: {"text_pair": whether the run read pairs}

    def __init__(self, path: Path, threads: int = 0, max_length: int = 0, pairs: bool = False):
        import torch

        from edgekit import families

        self.remember(path, threads, max_length, pairs)
        if threads:
            torch.set_num_threads(threads)
        self.model = families.load_model(path)
        self.tokenizer = families.load_tokenizer(path)
        self.separator = families.pair_separator(self.tokenizer) if families.uses_segments(self.model) else None
        if pairs and self.separator is not None:  # its logits() read pairs from the start (export's reference)
            families.derive_segments(self.model, self.separator)
        self.labels = families.label_names(self.model.config)
        self.multi_label = families.is_multi_label(self.model.config)
        self.thresholds = getattr(self.model.config, "edgekit_thresholds", None) if self.multi_label else None
        check_thresholds(self.thresholds, len(self.labels), f"{Path(path) / 'config.json'} edgekit_thresholds",
                         "give one probability in (0, 1) per label, or drop the key (0.5 for each)")
        if recipe := run_recipe(Path(path)):  # a stage's model takes what its run was trained on, as the exports do;
            data = recipe.get("data")  # any other folder takes single texts and pairs
            self.meta = {"text_pair": isinstance(data, dict) and bool(data.get("text_pair_column"))}
        self.longest = min(512, families.max_tokens(self.model.config))  # past the position table torch fails
        declared = getattr(self.tokenizer, "model_max_length", 0) or 0  # a stage's model: the run's max_length
        self.max_length = min(max_length or run_max_length(recipe) or (declared if declared <= 512 else 0)
                              or self.longest, self.longest)
        self.lock = threading.Lock()  # a fast tokenizer's call sets truncation on its shared backend, then encodes

    def encode(self, texts, max_length=None):
        texts = list(texts)
        # pairs to a model that does not read its token types from its ids (a folder no pair run saved): this
        # call's types, as the tokenizer gives them (the model kept none: a single text after it, holding the
        # string "[SEP]", read its words after that as a second text)
        typed = bool(texts) and isinstance(texts[0], tuple) and self.separator is not None and \
            getattr(self.model.base_model.embeddings, "edgekit_segments", None) is None
        with self.lock:
            enc = self.tokenizer(texts, truncation=True, padding=True, return_tensors="np",
                                 max_length=min(max_length or self.max_length, self.longest),
                                 **({"return_token_type_ids": True} if typed else {}))
        batch = {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")}
        return dict(batch, token_type_ids=enc["token_type_ids"].astype(np.int64)) if typed else batch

    def logits(self, batch: dict) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = self.model(**{k: torch.from_numpy(v) for k, v in batch.items()})
        return out.logits.float().numpy()

    def __call__(self, texts, max_length=None) -> dict:
        return predict(self, texts, max_length)


def run_max_length(recipe: dict) -> int:
    """The max_length of a run's recipe (run_recipe), so a stage's model truncates where the run's exported files
    do; 0 for {} (a folder outside a run) or a value that is not a number."""
    try:
        return int(recipe.get("max_length") or 0)
    except (ValueError, TypeError):
        return 0


def run_recipe(folder: Path) -> dict:
    """The recipe of the edgekit run whose stage's model `folder` is (RUN/03-prune/model); {} elsewhere."""
    for parent in list(folder.resolve().parents)[:2]:
        try:
            recipe = json.loads((parent / "manifest.json").read_text())["recipe"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(recipe, dict):
            return recipe
    return {}


def check_thresholds(cuts, labels: int, where: str, fix: str) -> None:
    """A model's own thresholds (model.json's `thresholds`, a folder's config `edgekit_thresholds`): none, or one
    probability in (0, 1) per label; anything else is refused in one line (one for two labels left the second label
    out of every prediction, as decided() zips them with the logits)."""
    if cuts is not None and not (isinstance(cuts, list) and len(cuts) == labels and all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < 1 for t in cuts)):
        given = f"gives {len(cuts)} thresholds" if isinstance(cuts, list) else f"is {str(cuts)[:40]}, not a list,"
        raise EdgekitError(f"{where} {given} for {labels} labels; {fix}")


def read_sidecar(model_file: Path) -> dict:
    from edgekit import schemas

    sidecar = model_file.parent / "model.json"
    if not sidecar.is_file():
        raise EdgekitError(f"{model_file} has no model.json beside it; re-export it with edgekit")
    try:
        meta = json.loads(sidecar.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EdgekitError(f"{sidecar} is not valid JSON ({getattr(e, 'msg', e)}); re-export the model") from None
    schemas.validate(meta, schemas.MODEL_JSON, str(sidecar))
    check_thresholds(meta.get("thresholds"), len(meta["labels"]), str(sidecar),
                     "give one per label, or re-export the model")
    if not (model_file.parent / meta["tokenizer"]).is_file():
        raise EdgekitError(f"{sidecar} names tokenizer {meta['tokenizer']}, which is not beside it; re-export the model")
    return meta


def check_onnx(path: Path) -> None:
    """The ONNX checker on a file onnxruntime could not load: a truncated or foreign file, said in its words."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except Exception as e:
        raise EdgekitError(f"{path} is not a valid ONNX model ({str(e).splitlines()[0][:160]}); "
                           f"re-export it") from None


class SidecarTokenizer:
    """Tokenization from the sidecar's tokenizer.json with the `tokenizers` package (no transformers)."""

    def __init__(self, path: Path, max_length: int = 0):
        from tokenizers import Tokenizer

        self.meta = read_sidecar(path)
        self.labels = self.meta["labels"]
        self.multi_label = bool(self.meta.get("multi_label"))  # a sigmoid per label, any number of them true
        self.thresholds = self.meta.get("thresholds") if self.multi_label else None  # each label's, tuned
        self.longest = self.meta["max_length"]  # the file takes no more
        self.max_length = min(max_length or self.longest, self.longest)  # load(max_length=): every call's default
        self.lock = threading.Lock()  # truncation is the shared tokenizer's state: set and used under one lock
        try:
            self.tokenizer = Tokenizer.from_file(str(path.parent / self.meta["tokenizer"]))
        except Exception as e:  # the tokenizers library raises a bare Exception on a bad file
            raise EdgekitError(f"{path.parent / self.meta['tokenizer']} is not a tokenizer file ({str(e)[:120]}); "
                               f"re-export the model") from None
        self.tokenizer.no_padding()
        self.side = (self.tokenizer.truncation or {}).get("direction", "right")  # left: a text's end is kept

    def encode(self, texts, max_length=None):
        with self.lock:
            self.tokenizer.enable_truncation(min(max_length or self.max_length, self.longest), direction=self.side)
            encs = self.tokenizer.encode_batch(list(texts))
        width = max(len(e.ids) for e in encs)
        ids = np.full((len(encs), width), self.meta["pad_id"], dtype=np.int64)
        mask = np.zeros((len(encs), width), dtype=np.int64)
        for row, e in enumerate(encs):
            ids[row, :len(e.ids)] = e.ids
            mask[row, :len(e.ids)] = 1
        return {"input_ids": ids, "attention_mask": mask}


def dynamic_int8(meta: dict) -> bool:
    return (meta.get("quantization") or {}).get("mode") == "dynamic"


def each_alone(logits, batch: dict) -> np.ndarray:
    """Dynamic INT8 takes each activation's range over the whole input, other sentences and padding included, so
    a batch runs one sentence at a time at its own length: the logits a device gets for each."""
    lengths = np.maximum(batch["attention_mask"].sum(1), 1)
    return np.concatenate([logits({k: v[i:i + 1, :n] for k, v in batch.items()}) for i, n in enumerate(lengths)])


def check_length(batch: dict, meta: dict) -> None:
    """Token ids longer than the model accepts are refused, never cut silently (encode() truncates texts)."""
    n = batch["input_ids"].shape[1]
    if n > meta["max_length"]:
        raise EdgekitError(f"the input has {n} tokens; this model accepts at most {meta['max_length']}: truncate it "
                           f"(encode() does) or export with a larger max_length")


def as_texts(texts) -> list:
    """A call's texts as a list: one string is one text, never its characters."""
    if isinstance(texts, str):
        return [texts]
    got = f"{type(texts).__name__} {short(texts)}"
    if isinstance(texts, (bytes, bytearray)):  # iterated, they are ints
        raise EdgekitError(f"a model takes texts (strings), got {got}; decode the bytes first: .decode('utf-8')")
    if isinstance(texts, (dict, set, frozenset)):  # a dict's keys, a set's order: predictions nobody can map back
        raise EdgekitError(f"a model takes a string or a list of strings, got {got}; give a list of the texts, in "
                           f"the order you want the predictions")
    if not hasattr(texts, "__iter__") or isinstance(texts, np.ndarray) and texts.ndim == 0:
        raise EdgekitError(f"a model takes a string or a list of strings, got {got}; give str(...) or a list")
    if hasattr(texts, "columns"):  # a DataFrame iterates its column names: those were predicted on
        raise EdgekitError(f"a model takes a list of texts, got a {type(texts).__name__}; give one column, "
                           f"df['text'].tolist(), or pairs as df[['text', 'text_pair']].values")
    texts = [as_pair(t) if isinstance(t, (tuple, list, np.ndarray)) else t for t in texts]
    odd = next((i for i, t in enumerate(texts) if not isinstance(t, (str, tuple))), None)
    if odd is not None:  # which one: a NaN (a pandas gap) among 10,000 texts
        decode = "; decode bytes first: .decode('utf-8')" if isinstance(texts[odd], (bytes, bytearray)) else \
            "; give a pair as a tuple: (text, text_pair)" if isinstance(texts[odd], dict) else ""
        raise EdgekitError(f"a model takes texts (strings), got {type(texts[odd]).__name__} {short(texts[odd])} at "
                           f"index {odd}{decode}")
    return texts


def as_pair(t) -> tuple:
    """A text pair (text, text_pair) as a tuple: from a tuple, a JSON list or a row of a 2-column array of strings."""
    items = list(t)
    if len(items) != 2 or not all(isinstance(x, str) for x in items):
        raise EdgekitError(f"a text pair is two strings (text, text_pair), got {type(t).__name__} {short(t)}; give "
                           f"each pair as a tuple of two strings")
    return tuple(str(x) for x in items)  # numpy's str_ as str


def check_pairs(texts: list, meta: dict | None) -> None:
    """Text pairs and single texts are not mixed in one call, and an exported file (its model.json: `meta`) gets
    what it was trained on; a transformers folder (meta None) takes either."""
    pairs = [isinstance(t, tuple) for t in texts]
    if any(pairs) and not all(pairs):
        raise EdgekitError(f"text {pairs.index(not pairs[0])} is {'a single text' if pairs[0] else 'a pair'} and "
                           f"text 0 is {'a pair' if pairs[0] else 'a single text'}; give all texts as pairs "
                           f"(text, text_pair) or all as strings")
    if meta is not None and pairs[0] != bool(meta.get("text_pair")):
        raise EdgekitError("this model reads text pairs; give a list of pairs: model([(text, text_pair), ...])"
                           if not pairs[0] else "this model reads single texts, not pairs; give each input as one "
                                                "string")


CHUNK = 64  # texts per runtime call: one call of 1,000 texts took 3.1 GB more (FP32, 384 wide, 6 layers)


def predict(model, texts, max_length=None) -> dict:
    """texts (a list of strings, or one string; for a model of text pairs, a list of (text, text_pair)) ->
    {labels, probs}, the same for every format. A multi-label model gives each text a list of labels (those over
    its threshold, maybe none: runtime.decided) and each label's own probability (a sigmoid: a row need not sum
    to 1)."""
    max_length = 0 if max_length is None else whole_number("max_length", max_length, MIN_LENGTH)
    texts = as_texts(texts)
    if not texts:
        return {"labels": [], "probs": np.zeros((0, len(model.labels)), dtype=np.float32)}
    check_pairs(texts, getattr(model, "meta", None))
    for i, t in enumerate(texts):
        try:
            "".join(t).encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate, from surrogateescape decoding or JSON: tokenizers raised
            raise EdgekitError(f"text {i} is not valid Unicode ({e.reason} at character {e.start}); decode the input "
                               f"with errors='replace' or fix its encoding") from None
    multi = getattr(model, "multi_label", False)
    scale = sigmoid if multi else softmax
    logits = np.concatenate([model.logits(model.encode(texts[s:s + CHUNK], max_length))
                             for s in range(0, len(texts), CHUNK)])  # memory follows a chunk, not the whole list
    said = decided(logits, multi, getattr(model, "thresholds", None))
    return {"labels": [[model.labels[i] for i, v in enumerate(y) if v] for y in said] if multi else
            [model.labels[i] for i in said], "probs": scale(logits)}


class TorchScriptModel(Reloads):
    kind = "torchscript"

    def __init__(self, path: Path, threads: int = 0, max_length: int = 0):
        import torch

        self.remember(path, threads, max_length)
        self.path, self.sidecar = Path(path), SidecarTokenizer(path, max_length)
        self.meta, self.labels, self.encode = self.sidecar.meta, self.sidecar.labels, self.sidecar.encode
        self.multi_label, self.thresholds = self.sidecar.multi_label, self.sidecar.thresholds
        if threads:
            torch.set_num_threads(threads)
        with native.hidden_output():  # an INT8 file's load warns once that quantized tensors are deprecated
            try:
                self.module = torch.jit.load(str(path), map_location="cpu").eval()
            except Exception as e:
                raise EdgekitError(f"torch.jit cannot load {path} ({str(e).splitlines()[0][:160]}); "
                                   f"re-export it") from None
        self.per_sentence = dynamic_int8(self.meta)

    def logits(self, batch: dict) -> np.ndarray:
        import torch

        check_length(batch, self.meta)
        if self.per_sentence and len(batch["input_ids"]) > 1:
            return each_alone(self.logits, batch)
        with torch.no_grad():
            return self.module(torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])).numpy()

    def __call__(self, texts, max_length=None) -> dict:
        return predict(self, texts, max_length)


# Written into every ONNX sidecar (`onnxruntime.disabled_optimizers`) and honoured by edgekit.load, the latency
# tool and device_bench. ONNX Runtime fuses Add + LayerNormalization of INT8 graphs into SkipLayerNormalization,
# whose CPU kernel measured 1.83 ms per inference of minilm-l6 at 128 tokens on 1 thread against 0.33 ms for the
# two ops it replaces (INT8 13.1 -> 11.4 ms, FP32 unchanged: its graph is not fused).
ORT_DISABLED_OPTIMIZERS = ["SkipLayerNormFusion"]


def disabled_optimizers(meta: dict) -> list:
    names = (meta.get("onnxruntime") or {}).get("disabled_optimizers", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise EdgekitError(f"model.json onnxruntime.disabled_optimizers is {names!r}; give a list of ONNX Runtime "
                           f"optimizer names, e.g. {ORT_DISABLED_OPTIMIZERS}")
    return names


class OnnxModel(Reloads):
    kind = "onnx"

    def __init__(self, path: Path, threads: int = 0, max_length: int = 0):
        import onnxruntime as ort

        self.remember(path, threads, max_length)
        self.path, self.sidecar = Path(path), SidecarTokenizer(path, max_length)
        self.meta, self.labels, self.encode = self.sidecar.meta, self.sidecar.labels, self.sidecar.encode
        self.multi_label, self.thresholds = self.sidecar.multi_label, self.sidecar.thresholds
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        disabled = disabled_optimizers(self.meta)
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                                disabled_optimizers=disabled)
        except Exception as e:
            check_onnx(path)  # the checker's reason where it has one (importing onnx took 0.66 s of every load)
            raise EdgekitError(f"onnxruntime cannot load {path} ({str(e).splitlines()[0][:160]}); the file is "
                               f"damaged or not ONNX: re-export it") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.per_sentence = dynamic_int8(self.meta)

    def logits(self, batch: dict) -> np.ndarray:
        check_length(batch, self.meta)
        if self.per_sentence and len(batch["input_ids"]) > 1:
            return each_alone(self.logits, batch)
        return self.session.run(None, {k: batch[k] for k in self.input_names})[0]

    def __call__(self, texts, max_length=None) -> dict:
        return predict(self, texts, max_length)


class TFLiteModel(Reloads):
    """A .tflite file with one signature per sequence bucket: each sentence runs in the smallest bucket that
    holds it, so short inputs do not pay for the longest one."""

    kind = "tflite"

    def __init__(self, path: Path, threads: int = 0, max_length: int = 0):
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise EdgekitError("running .tflite files needs ai-edge-litert: pip install 'edgekit[tflite]'")
        self.remember(path, threads, max_length)
        self.path, self.sidecar = Path(path), SidecarTokenizer(path, max_length)
        self.lock = threading.Lock()  # a LiteRT interpreter runs one invocation at a time: calls from threads wait
        self.meta, self.labels, self.encode = self.sidecar.meta, self.sidecar.labels, self.sidecar.encode
        self.multi_label, self.thresholds = self.sidecar.multi_label, self.sidecar.thresholds
        self.buckets = sorted(self.meta.get("buckets") or [self.meta["max_length"]])
        self.names = [i["name"] for i in self.meta["inputs"]]
        try:  # the interpreter checks the flatbuffer before anything runs; the first invoke prints XNNPACK's
            with native.hidden_output():  # "Created TensorFlow Lite XNNPACK delegate for CPU." to stderr
                self.interpreter = Interpreter(str(path), num_threads=threads or None)
                self.runners = {b: self.interpreter.get_signature_runner(self.meta["signatures"][str(b)])
                                for b in self.buckets}
                self.logits({"input_ids": np.zeros((1, 1), np.int64), "attention_mask": np.ones((1, 1), np.int64)})
        except (ValueError, RuntimeError, KeyError) as e:
            raise EdgekitError(f"the TFLite interpreter cannot load {path} ({str(e).splitlines()[0][:160]}); "
                               f"re-export it") from None

    def bucket_for(self, length: int) -> int:
        return next((b for b in self.buckets if b >= length), self.buckets[-1])

    def logits(self, batch: dict) -> np.ndarray:
        check_length(batch, self.meta)
        rows = []
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
            n = int(mask.sum())
            b = self.bucket_for(n)
            padded = np.full((1, b), self.meta["pad_id"], dtype=np.int32)
            padded_mask = np.zeros((1, b), dtype=np.int32)
            padded[0, :min(n, b)] = ids[:min(n, b)]
            padded_mask[0, :min(n, b)] = 1
            with self.lock:
                out = next(iter(self.runners[b](**{self.names[0]: padded, self.names[1]: padded_mask}).values()))[0]
                if out.dtype != np.float32:  # full-integer models return quantized logits: scale them back
                    scale, zero = next(iter(self.runners[b].get_output_details().values()))["quantization"]
                    out = (out.astype(np.float32) - zero) * scale
            rows.append(out)
        return np.stack(rows)

    def __call__(self, texts, max_length=None) -> dict:
        return predict(self, texts, max_length)

"""The on-device runner: one model file and its model.json in (optionally a labelled CSV), one result JSON out.

    python -m device_bench MODEL [--data test.csv] [--out result.json] [--runs 50] [--warmup 10] [--batch 8]
                                 [--threads 1] [--seq-len 128] [--emulated]

It imports only numpy, `tokenizers` and one runtime (onnxruntime for .onnx, ai-edge-litert for .tflite), so
copying this folder to a device with those packages is enough. Measured, in this order: load time and the memory
after loading; latency p50/p90/p99 at batch 1 and a fixed sequence length after warm-up; throughput at batch 1
and at batch N; latency on real sentences with tokenization included and accuracy (when --data is given);
peak RSS (VmHWM). The result is written once, at the end, through a temporary file: a failed run writes none, and
its error says so when an earlier run's result is at --out. A pipe, a device or a path under /dev or /proc is written
into (--out /dev/stdout: the result alone on stdout, the closing line on stderr).
Unknown sidecar keys are ignored.
"""
import argparse
import contextlib
import csv
import faulthandler
import hashlib
import io
import json
import math
import mmap
import os
import platform
import resource
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import numpy as np

REQUIRED = ("format", "inputs", "outputs", "labels", "max_length", "tokenizer", "pad_id")
RUNTIME_PACKAGE = {"onnx": "onnxruntime", "tflite": "ai-edge-litert"}
MAX_BATCH = 4096


class BenchError(Exception):
    """A problem with the model, its sidecar, the data or this device's Python: one line, exit 1."""


def read_sidecar(model: Path, meta_path: Path = None) -> dict:
    kind = file_format(model)  # a missing or unreadable model is said as such, before its sidecar
    meta_path = meta_path or model.parent / "model.json"
    try:
        meta = json.loads(meta_path.read_text())
    except OSError:
        raise BenchError(f"{meta_path} not found; copy the model.json exported with {model.name} beside it")
    except ValueError as e:
        raise BenchError(f"{meta_path} is not valid JSON ({e}); copy the model.json exported with {model.name}")
    missing = [k for k in REQUIRED if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise BenchError(f"{meta_path} lacks {', '.join(missing)}; it is not an edgekit model.json: re-export the model")
    if meta["format"] != kind:
        raise BenchError(f"{model.name} is a {kind} file but {meta_path.name} says {meta['format']}: the sidecar "
                         f"does not match the model; copy the model.json exported with this file")
    if not (model.parent / meta["tokenizer"]).is_file() or "/" in meta["tokenizer"]:
        raise BenchError(f"{meta_path.name} names tokenizer {meta['tokenizer']!r}, which is not beside {model.name}; "
                         f"copy it too")
    cuts = meta.get("thresholds")
    if cuts is not None and not (isinstance(cuts, list) and len(cuts) == len(meta["labels"]) and all(
            isinstance(c, (int, float)) and not isinstance(c, bool) and 0 < c < 1 for c in cuts)):
        raise BenchError(f"{meta_path.name} thresholds {str(cuts)[:80]} are not one probability in (0, 1) per label "
                         f"({len(meta['labels'])}); copy the model.json exported with {model.name}")
    return meta


def file_format(model: Path) -> str:
    """What the bytes say: TFLite flatbuffers carry 'TFL3' at offset 4; ONNX is a protobuf (.onnx)."""
    try:
        with open(model, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise BenchError(f"cannot read {model} ({e.strerror}); give an .onnx or .tflite file")
    if head[4:8] == b"TFL3":
        return "tflite"
    if model.suffix == ".onnx":
        return "onnx"
    raise BenchError(f"{model} is neither ONNX (.onnx) nor TFLite (no TFL3 header); give an exported model file")


class Tokenizer:
    """tokenizer.json through the `tokenizers` package: ids and attention mask, padded to the longest."""

    def __init__(self, path: Path, meta: dict):
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise BenchError(missing_package("tokenizers"))
        try:
            self.tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on a bad file
            raise BenchError(f"{path.name} is not a tokenizer file ({str(e)[:100]}); copy the one exported with the model")
        self.tok.no_padding()
        self.max_length, self.pad_id = meta["max_length"], meta["pad_id"]
        self.side = (self.tok.truncation or {}).get("direction", "right")  # as exported: left keeps a text's end

    def encode(self, texts, max_length=None):
        self.tok.enable_truncation(min(max_length or self.max_length, self.max_length), direction=self.side)
        encs = self.tok.encode_batch(list(texts))
        width = max(len(e.ids) for e in encs)
        ids = np.full((len(encs), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encs), width), dtype=np.int64)
        for row, e in enumerate(encs):
            ids[row, :len(e.ids)] = e.ids
            mask[row, :len(e.ids)] = 1
        return ids, mask


def missing_package(name: str) -> str:
    return (f"{name} is not installed for {sys.executable}; pip install {name} there (or, from edgekit's source tree, "
            f"pip install \"./device_bench[{'tflite' if name == 'ai-edge-litert' else 'onnx'}]\"; an ssh target can "
            f"set venv: true instead)")


class OnnxRunner:
    def __init__(self, path: Path, meta: dict, threads: int):
        try:
            import onnxruntime as ort
        except ImportError:
            raise BenchError(missing_package("onnxruntime"))
        self.runtime, self.version = "onnxruntime", ort.__version__
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        # edgekit's sidecar names ONNX Runtime fusions that are slower on CPU (SkipLayerNormFusion for INT8)
        section = meta.get("onnxruntime") or {}
        disabled = section.get("disabled_optimizers", []) if isinstance(section, dict) else section
        if not isinstance(disabled, list) or not all(isinstance(n, str) for n in disabled):
            raise BenchError(f"model.json onnxruntime.disabled_optimizers is {disabled!r}; give a list of ONNX Runtime "
                             f"optimizer names (e.g. [\"SkipLayerNormFusion\"]) or copy the model.json exported with "
                             f"{path.name}")
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                                disabled_optimizers=list(disabled))
        except Exception as e:
            raise BenchError(f"onnxruntime cannot load {path.name} ({str(e).splitlines()[0][:140]}); copy the file again "
                             f"or re-export it")
        have = [i.name for i in self.session.get_inputs()]
        want = [i["name"] for i in meta["inputs"]]
        if sorted(have) != sorted(want):
            raise BenchError(f"model.json lists inputs {want} but {path.name} takes {have}: the sidecar does not match "
                             f"the model; copy the model.json exported with this file")
        self.names = want

    def logits(self, ids, mask):
        feed = dict(zip(self.names, (ids, mask)))
        return self.session.run(None, feed)[0]


class TFLiteRunner:
    """One signature per sequence bucket (batch 1): each row runs in the smallest bucket that holds it."""

    def __init__(self, path: Path, meta: dict, threads: int, native_log: bool = False):
        self.native_log = native_log
        try:
            from ai_edge_litert.interpreter import Interpreter
            import ai_edge_litert
            self.runtime, self.version = "ai-edge-litert", getattr(ai_edge_litert, "__version__", "?")
        except ImportError:
            try:
                from tflite_runtime.interpreter import Interpreter
                import tflite_runtime
                self.runtime, self.version = "tflite-runtime", getattr(tflite_runtime, "__version__", "?")
            except ImportError:
                raise BenchError(missing_package("ai-edge-litert"))
        if self.version == "?":
            self.version = package_version(self.runtime)
        self.buckets = sorted(meta.get("buckets") or [meta["max_length"]])
        signatures = meta.get("signatures") or {}
        try:
            self.interpreter = Interpreter(str(path), num_threads=threads or None)
            found = self.interpreter.get_signature_list()
        except (ValueError, RuntimeError) as e:
            raise BenchError(f"the TFLite interpreter cannot load {path.name} ({str(e).splitlines()[0][:140]}); copy "
                             f"the file again or re-export it")
        wanted = [signatures.get(str(b)) for b in self.buckets]
        if not all(w in found for w in wanted):
            raise BenchError(f"model.json names signatures {wanted} but {path.name} has {sorted(found)}: the sidecar "
                             f"does not match the model; copy the model.json exported with this file")
        self.runners = {b: self.interpreter.get_signature_runner(signatures[str(b)]) for b in self.buckets}
        self.names = [i["name"] for i in meta["inputs"]]
        if sorted(self.names) != sorted(found[wanted[0]]["inputs"]):
            raise BenchError(f"model.json lists inputs {self.names} but {path.name} takes {found[wanted[0]]['inputs']}: "
                             f"the sidecar does not match the model; copy the model.json exported with this file")
        self.pad_id = meta["pad_id"]
        self.fresh = set(self.buckets)  # signatures not yet invoked

    def logits(self, ids, mask):
        rows = []
        for row_ids, row_mask in zip(ids, mask):
            n = int(row_mask.sum())
            b = next((b for b in self.buckets if b >= n), self.buckets[-1])
            n = min(n, b)
            padded = np.full((1, b), self.pad_id, dtype=np.int32)
            padded_mask = np.zeros((1, b), dtype=np.int32)
            padded[0, :n] = row_ids[:n]
            padded_mask[0, :n] = 1
            with native_info_dropped(self.native_log) if b in self.fresh else contextlib.nullcontext():
                out = next(iter(self.runners[b](**{self.names[0]: padded, self.names[1]: padded_mask}).values()))[0]
            self.fresh.discard(b)
            if out.dtype != np.float32:  # full-integer models return quantized logits: scale them back
                scale, zero = next(iter(self.runners[b].get_output_details().values()))["quantization"]
                out = (out.astype(np.float32) - zero) * scale
            rows.append(out)
        return np.stack(rows)


@contextlib.contextmanager
def native_info_dropped(keep: bool = False):
    """LiteRT's INFO lines ("INFO: Created TensorFlow Lite XNNPACK delegate for CPU.", written to file descriptor 2
    past Python on a signature's first invoke) are dropped; anything else written meanwhile is passed on after it.
    A crash inside (SIGSEGV, SIGABRT) loses what the runtime wrote and says Python's fatal error and traceback on
    stderr; `keep` (--native-log) or DEVICE_BENCH_NATIVE_LOG=1 leaves stderr alone, so the runtime's words stay."""
    if sys.stderr is not None:
        sys.stderr.flush()
    try:
        if keep or os.environ.get("DEVICE_BENCH_NATIVE_LOG") == "1":
            raise OSError
        log = tempfile.TemporaryFile()
    except OSError:  # asked, or no writable temp folder (some Android shells): nothing kept apart
        with crash_reported(2):
            yield
        return
    with log:
        try:
            saved = os.dup(2)
        except OSError:  # stderr closed
            yield
            return
        os.dup2(log.fileno(), 2)
        try:
            with crash_reported(saved):  # to the real stderr, not into the log that dies with the process
                yield
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            kept = [line for line in log.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith("INFO: ")]
            if kept and sys.stderr is not None:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


@contextlib.contextmanager
def crash_reported(fd: int):
    """Python's faulthandler on file descriptor `fd` meanwhile: a crash in native code says where it happened (one
    already enabled, by -X faulthandler, is left as it is)."""
    try:
        real = None if faulthandler.is_enabled() else open(fd, "w", closefd=False)
    except OSError:  # a closed descriptor: nowhere to say it
        real = None
    if real is None:
        yield
        return
    with real:
        faulthandler.enable(real)
        try:
            yield
        finally:
            faulthandler.disable()


def package_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return "?"


def percentiles(ms: list) -> dict:
    a = np.array(ms)
    return {f"p{q}": round(float(np.percentile(a, q)), 3) for q in (50, 90, 99)}


def timed(fn, runs: int, warmup: int) -> list:
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return ms


def memory_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process; ru_maxrss where /proc is absent (a chroot, macOS)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale, 1)


ARM_PARTS = {"0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
             "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
             "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78",
             "0xd44": "Cortex-X1", "0xd46": "Cortex-A510", "0xd47": "Cortex-A710", "0xd48": "Cortex-X2",
             "0xd49": "Neoverse-N2", "0xd4d": "Cortex-A715", "0xd4f": "Neoverse-V2", "0xd80": "Cortex-A520",
             "0xd81": "Cortex-A720"}


def cpu_name() -> str:
    """The CPU's name from /proc/cpuinfo: x86 `model name`, a board's `Model`, or ARM cores by their part number."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if fields.get(key):
            return fields[key]
    if fields.get("CPU part"):
        return f"{ARM_PARTS.get(fields['CPU part'], 'ARM')} (part {fields['CPU part']})"
    return platform.processor() or platform.machine()


# /proc/cpuinfo flags that decide how fast INT8 runs, best first: what the runtimes' INT8 kernels use
INT8_ISA = (("amx_int8", "AMX-INT8"), ("avx512_vnni", "AVX512-VNNI"), ("avx_vnni", "AVX-VNNI"),
            ("avx512bw", "AVX-512 without VNNI"), ("avx2", "AVX2 without VNNI"), ("i8mm", "Arm I8MM"),
            ("asimddp", "Arm dot product"), ("asimd", "Arm NEON without dot product"))


def int8_isa(text: str = "") -> str:
    """The best INT8 instruction set the CPU reports (`flags` on x86, `Features` on ARM), or '' when unknown.
    Without VNNI (x86) or dot product (ARM) INT8 products take several instructions each, so the same file runs
    2-3x slower: latencies only compare between CPUs that share this."""
    if not text:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ""
    flags = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return next((name for flag, name in INT8_ISA if flag in flags), "")


def unquoted(field: str) -> str:
    """A plain TSV's field quoted whole the way pandas writes one ("a ""b"" c") unquoted; other quotes are text."""
    inner = field[1:-1]
    if len(field) >= 2 and field[0] == field[-1] == '"' and '"' not in inner.replace('""', ""):
        return inner.replace('""', '"')
    return field


def read_labelled(path: Path, labels: list, text_column: str, label_column: str, pair_column: str = "",
                  multi_label: bool = False, separator: str = "|", flag_columns: tuple = ()) -> tuple:
    """(texts, label ids) from a CSV, TSV or JSONL file as edgekit compress reads them: a row with an empty text or
    label is left out, labels by name, or by index when the file uses integers. With `pair_column` (a model for
    text pairs) each text is the pair (text, text_pair). Every row is checked before anything is timed. For a
    multi-label model each label cell holds its labels' names cut at `separator` (an empty cell: none of them), or
    with `flag_columns` (the model's label names) each of those columns holds 0 or 1 (a row with one empty or -1,
    Jigsaw's mark for a text not scored, is left out); each label id is a tuple of 0/1, one per label."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read labelled file {path} ({e}); give a UTF-8 CSV, TSV or JSONL file with columns "
                         f"{','.join([text_column, *(flag_columns or [label_column])])}")
    texts_of = [text_column] + ([pair_column] if pair_column else [])
    columns = texts_of + list(flag_columns or [label_column])
    numbered = list(_records(path, text, columns))
    if not numbered or any(c not in numbered[0][1] for c in columns):
        found = ", ".join(map(str, numbered[0][1]))[:120] if numbered else ""
        raise BenchError(f"{path} needs a header with columns {', '.join(columns)} and at least one row"
                         + (f"; it has {found}" if found else "; it has none")
                         + ((" (the columns --label-columns names)" if flag_columns else
                             "; --text-column and --label-column name others") if found else "")
                         + (" (the model reads text pairs; --text-pair-column names the second text's column)"
                            if pair_column else ""))
    kept = []
    for n, row in numbered:
        values = [row.get(c) for c in texts_of]
        if flag_columns:
            label = flagged(row, flag_columns, path, n)  # the names of the columns holding 1
            if label is None:
                continue  # not scored: no label, as compress leaves it out
        else:
            label = row.get(label_column)
            if label is None or label.strip() in ("nan", "NaN", "NAN") or (not multi_label and not label.strip()):
                if not multi_label or label is None:
                    continue  # a missing label (pandas writes one as nan)
                label = ""  # no label: a multi-label row may have none
            label = unicodedata.normalize("NFC", label).strip()  # NFD (macOS) is NFC
        if any(v is None or v.strip() == "" for v in values):
            continue  # no text: the row carries no example; a text "nan" is one, as compress reads it (edgekit.data),
            # so the device scores the sentences evaluate scored
        try:
            "".join(values + ([] if isinstance(label, set) else [label])).encode("utf-8")
        except UnicodeEncodeError:
            raise BenchError(f"{path} line {n} holds half a character (an unpaired surrogate, \\ud800-\\udfff: an "
                             f"emoji cut in two where the file was written); fix or remove that row")
        kept.append((n, values, label))
    if not kept:
        raise BenchError(f"{path} has no row with both a text and a label")
    index = {name: i for i, name in enumerate(labels)}
    texts = [tuple(t) if pair_column else t[0] for _, t, _ in kept]
    if multi_label:
        sets = [(n, label if isinstance(label, set) else {x.strip() for x in label.split(separator)} - {""})
                for n, _, label in kept]
        if unknown := sorted({x for _, s in sets for x in s if x not in index}):
            first = next(n for n, s in sets if set(s) - set(index))
            raise BenchError(f"{path} has labels the multi-label model does not know ({', '.join(unknown[:5])}; the "
                             f"first on line {first}); the model's labels: {', '.join(labels)}, each row's cut at "
                             f"{separator}")
        return texts, [tuple(int(name in s) for name in labels) for _, s in sets]
    if all(label in index for _, _, label in kept):
        ids = [index[label] for _, _, label in kept]
    elif all(label.isdigit() for _, _, label in kept):
        if outside := [(n, label) for n, _, label in kept if int(label) >= len(labels)]:
            raise BenchError(f"{path} line {outside[0][0]} has label {outside[0][1]}, outside 0..{len(labels) - 1} "
                             f"(the model's {len(labels)} labels: {', '.join(labels)})")
        ids = [int(label) for _, _, label in kept]
    else:
        n, label = next((n, label) for n, _, label in kept if label not in index)
        unknown = sorted({label for _, _, label in kept if label not in index})
        raise BenchError(f"{path} has labels the model does not know ({', '.join(unknown[:5])}; the first on line "
                         f"{n}); the model's labels: {', '.join(labels)}; give the test split of the data the model "
                         f"was trained on")
    return texts, ids


FLAGS = {"1": 1, "1.0": 1, "true": 1, "yes": 1, "0": 0, "0.0": 0, "false": 0, "no": 0}  # edgekit.data's


def flagged(row: dict, columns: tuple, path: Path, n: int):
    """The set of `columns` whose 0/1 cell holds 1, as edgekit.data reads them: None where one, read in order, is
    empty or -1 (Jigsaw's mark for a text not scored)."""
    names = set()
    for column in columns:
        cell = (row.get(column) or "").strip()
        if cell.lower() in ("", "-1", "-1.0", "nan"):
            return None
        if cell.lower() not in FLAGS:
            raise BenchError(f"{path} line {n}: label column {column} holds {cell[:40]!r}; a label column holds 0 or "
                             f"1 (true or false); threshold a score first")
        if FLAGS[cell.lower()]:
            names.add(column)
    return names


def _records(path: Path, text: str, columns: list):
    """(line, {column: value or None}) of each row; values as edgekit compress reads them (JSON's true as "true")."""
    lines = text.splitlines()
    if path.suffix == ".jsonl":
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise BenchError(f"{path} line {n} is not JSON ({getattr(e, 'msg', e)}); each line must be one "
                                 f"JSON object")
            if not isinstance(record, dict):
                raise BenchError(f"{path} line {n} is not a JSON object; each line must be one JSON object")
            if any(isinstance(record.get(c), (list, dict)) for c in columns):
                raise BenchError(f"{path} line {n} gives a list or an object as a text or label; give strings")
            yield n, {k: None if v is None else json.dumps(v) if isinstance(v, bool) else str(v)
                      for k, v in record.items()}
        return
    if path.suffix == ".tsv" and len({line.count("\t") for line in lines if line.strip()}) == 1:  # plain (GLUE's):
        numbered = [(n, [unquoted(x) for x in line.split("\t")]) for n, line in enumerate(lines, 1) if line.strip()]
    else:  # quotes are text there
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if path.suffix == ".tsv" else ",")
        try:
            numbered = [(reader.line_num, row) for row in reader if row]
        except csv.Error as e:
            raise BenchError(f"{path} line {reader.line_num}: {e}; check the quotes on that line")
    if not numbered:
        return
    (_, header), sep = numbered[0], "tab" if path.suffix == ".tsv" else "comma"
    needed = 1 + max((header.index(c) for c in columns if c in header), default=-1)
    for n, row in numbered[1:]:
        while len(row) > len(header) and not row[-1].strip():  # trailing empty fields shift nothing
            row = row[:-1]
        if len(row) > len(header) or len(row) < needed:
            raise BenchError(f"{path} line {n} has {len(row)} field{'s' if len(row) != 1 else ''}, the header has "
                             f"{len(header)}; put a text that holds a {sep} in double quotes, and give every row a "
                             f"{sep} before each value (an empty value leaves the row out)")
        yield n, dict(zip(header, row))


def option_problem(model: Path, meta: dict, args) -> str:
    """'' or why an option does not fit this model (a wrong command line: exit 2)."""
    if args.text_pair_column and not meta.get("text_pair"):
        return (f"--text-pair-column {args.text_pair_column} given, but {model.name} reads single texts (its "
                f"model.json has no text_pair); leave the option out")
    if args.text_pair_column and args.text_pair_column in (args.text_column, args.label_column):
        return (f"--text-pair-column {args.text_pair_column} names the text or label column; give the column of each "
                f"row's second text")
    if (args.label_separator is not None or args.label_columns) and not meta.get("multi_label"):
        flag = "--label-columns" if args.label_columns else "--label-separator"
        return (f"{flag} given, but {model.name} is a single-label classifier (its model.json has no multi_label): "
                f"each row's label cell holds one label; leave the option out")
    if args.label_separator is not None and args.label_columns:
        return ("--label-columns and --label-separator both say how a row gives its labels; give one: --label-columns "
                "for a 0/1 column per label, --label-separator for one cell of label names")
    if args.label_separator == "":
        return "--label-separator is empty; give the text that cuts a label cell into names, such as | or ;"
    named = columns_of(args.label_columns)
    if unknown := [c for c in named if c not in meta["labels"]]:
        return (f"--label-columns names {', '.join(unknown[:5])}, not among the model's labels "
                f"({', '.join(meta['labels'])}); name a column for each of them")
    if named and (missing := [c for c in meta["labels"] if c not in named]):
        return (f"--label-columns leaves out the model's label{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing[:5])}; name a 0/1 column for each of its labels ({', '.join(meta['labels'])})")
    return ""


def columns_of(label_columns: str) -> list:
    """--label-columns as a list of column names, each once: cut at commas."""
    return list(dict.fromkeys(n.strip() for n in label_columns.split(",") if n.strip()))


def f1_micro(said: list, gold: list) -> "float | None":
    """Multi-label F1 over every (sentence, label) decision pooled, as edgekit's evaluate scores it; None where no
    label is given or said."""
    tp = sum(p == g == 1 for y, label in zip(said, gold) for p, g in zip(y, label))
    wrong = sum(p != g for y, label in zip(said, gold) for p, g in zip(y, label))
    return 2 * tp / (2 * tp + wrong) if tp or wrong else None


def logit(p: float) -> float:
    """The logit whose sigmoid is the probability p: a label applies where its logit is over its threshold's."""
    return 0.0 if p == 0.5 else math.log(p / (1.0 - p))


def bench(model: Path, meta: dict, args) -> dict:
    if args.data:  # read and checked whole before anything is timed: a bad row is said at once
        pair_column = (args.text_pair_column or "text_pair") if meta.get("text_pair") else ""
        texts, gold = read_labelled(Path(args.data), meta["labels"], args.text_column, args.label_column, pair_column,
                                    bool(meta.get("multi_label")), args.label_separator or "|",
                                    tuple(columns_of(args.label_columns)))
    started = time.perf_counter()
    runner = OnnxRunner(model, meta, args.threads) if meta["format"] == "onnx" else \
        TFLiteRunner(model, meta, args.threads, args.native_log)
    tokenizer = Tokenizer(model.parent / meta["tokenizer"], meta)
    load_s = time.perf_counter() - started
    rss_after_load = memory_mb("VmRSS")
    seq_len = min(args.seq_len, meta["max_length"])
    ids, mask = tokenizer.encode(["the " * seq_len], max_length=seq_len)  # real ids, exactly seq_len when it fits
    t = time.perf_counter()
    out = runner.logits(ids, mask)
    first_ms = (time.perf_counter() - t) * 1e3
    if out.shape[-1] != len(meta["labels"]):
        raise BenchError(f"the model returns {out.shape[-1]} scores but model.json lists {len(meta['labels'])} labels: "
                         f"the sidecar does not match the model; copy the model.json exported with this file")
    single = timed(lambda: runner.logits(ids, mask), args.runs, args.warmup)
    big_ids, big_mask = np.repeat(ids, args.batch, 0), np.repeat(mask, args.batch, 0)
    batch_runs = max(3, args.runs // 5)
    batched = timed(lambda: runner.logits(big_ids, big_mask), batch_runs, 1)
    result = {
        "model": model.name, "model_sha256": sha256(model), "format": meta["format"],
        "size_mb": round(weights_bytes(model) / 1e6, 6),
        "load_s": round(load_s, 3), "first_inference_ms": round(first_ms, 3), "rss_after_load_mb": rss_after_load,
        "latency_ms": percentiles(single), "seq_len": int(ids.shape[1]), "runs": args.runs, "warmup": args.warmup,
        "throughput": {"batch_1": round(1e3 * len(single) / sum(single), 2),
                       f"batch_{args.batch}": round(1e3 * args.batch * len(batched) / sum(batched), 2)},
        "batch": args.batch, "batch_mode": "one call" if meta["format"] == "onnx" else "one call per row (static batch 1)",
    }
    if meta["format"] == "tflite":  # the signature that ran: the smallest bucket holding seq_len tokens
        result["bucket"] = next((b for b in runner.buckets if b >= ids.shape[1]), runner.buckets[-1])
    if args.data:
        predictions, sentence_ms = [], []
        cuts = [logit(t) for t in meta.get("thresholds") or [0.5] * len(meta["labels"])] \
            if meta.get("multi_label") else None  # model.json's tuned thresholds, as edgekit.load decides
        for text in texts:  # one sentence at a time, tokenization included: the path a device app takes
            t = time.perf_counter()
            out = runner.logits(*tokenizer.encode([text]))[0]  # a multi-label model: each label over its threshold
            predictions.append(tuple(int(v > c) for v, c in zip(out, cuts)) if cuts else int(out.argmax(-1)))
            sentence_ms.append((time.perf_counter() - t) * 1e3)
        result.update(accuracy=sum(p == g for p, g in zip(predictions, gold)) / len(gold),  # unrounded: budgets
                      examples=len(gold), sentence_latency_ms=percentiles(sentence_ms), predictions=predictions)
        if cuts and (f1 := f1_micro(predictions, gold)) is not None:
            result["f1_micro"] = f1  # unrounded, as accuracy
    result.update(peak_rss_mb=memory_mb("VmHWM"), runtime=runner.runtime, runtime_version=runner.version,
                  tokenizers_version=package_version("tokenizers"), numpy_version=np.__version__,
                  python=platform.python_version(), machine=platform.machine(), cpu=cpu_name(), int8_isa=int8_isa(),
                  cpu_count=os.cpu_count(), threads=args.threads, system=platform.system(),
                  emulated=bool(args.emulated), complete=True)
    return result


def sha256(path: Path) -> str:
    """The model file's SHA-256: edgekit merges a result only for the bytes the run holds (a file of the same name
    left on a device from another run is refused)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in weight_files(model))


def weight_files(model: Path) -> list:
    """The model file and, for ONNX, each external data file its tensors name (`model.onnx.data` as edgekit writes
    it, `model.onnx_data` as Optimum does, or any other name), each once."""
    model = Path(model)
    if model.suffix != ".onnx":
        return [model]
    with open(model, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return [model]
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data.find(b"location") < 0:  # no tensor says where its external data is: the file holds every weight
                return [model]
            try:
                names = sorted(set(_onnx_locations(data, 0, len(data), "model")))
            except (IndexError, ValueError):  # not a protobuf: loading it says so
                return [model]
    folder = model.parent.resolve()  # a location outside the model's folder is not loaded (ONNX Runtime refuses it)
    return [model] + [folder / name for name in names
                      if (folder / name).resolve().is_relative_to(folder) and (folder / name).is_file()]


# the message fields _onnx_locations walks, by (message, field number): ModelProto.graph; GraphProto node,
# initializer, sparse_initializer; NodeProto attribute; AttributeProto t, g, tensors, graphs; SparseTensorProto
# values, indices; TensorProto external_data, whose entries are (key, value) string pairs
_ONNX_FIELDS = {("model", 7): "graph", ("graph", 1): "node", ("graph", 5): "tensor", ("graph", 15): "sparse",
                ("node", 5): "attribute", ("attribute", 5): "tensor", ("attribute", 6): "graph",
                ("attribute", 10): "tensor", ("attribute", 11): "graph", ("sparse", 1): "tensor",
                ("sparse", 2): "tensor", ("tensor", 13): "entry"}


def _onnx_locations(data: bytes, start: int, end: int, message: str):
    """The `location` of every tensor with external data in an ONNX protobuf (the onnx package is not needed on the
    device): only the fields above are read, every other one is skipped by its length."""
    entry, i = {}, start
    while i < end:
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(data, i)
        elif wire == 1 or wire == 5:
            i += 8 if wire == 1 else 4
        elif wire == 2:
            length, i = _varint(data, i)
            inner = _ONNX_FIELDS.get((message, number))
            if message == "entry":
                entry[number] = data[i:i + length]
            elif inner:
                yield from _onnx_locations(data, i, i + length, inner)
            i += length
        else:
            raise ValueError(f"protobuf wire type {wire}")
    if message == "entry" and entry.get(1) == b"location":
        yield entry.get(2, b"").decode("utf-8", "replace")


def _varint(data: bytes, i: int) -> tuple:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return value, i


def model_file(path: Path) -> Path:
    """MODEL as given, or the one model file in a folder given instead (edgekit's export folders hold one)."""
    if not path.is_dir():
        return path
    found = sorted(p for p in path.iterdir() if p.suffix in (".onnx", ".tflite"))
    if len(found) != 1:
        raise BenchError(f"{path} is a folder holding {len(found)} model files"
                         f"{' (' + ', '.join(p.name for p in found) + ')' if found else ''}; give the .onnx or "
                         f".tflite file to run")
    return found[0]


def written_into(path: Path) -> bool:
    """Whether --out is written into as it is, not replaced through a temp file and a rename: a pipe, a terminal or a
    device, or any path under /dev or /proc (/dev/stdout links to the shell's redirect, which may be a regular file;
    the rename replaced /dev/stdout itself, for root). edgekit.artifact.written_into, which this package cannot
    import."""
    return path.exists() and (not path.is_file() or path.absolute().parts[1:2] in (("dev",), ("proc",)))


def write_result(path: Path, result: dict) -> None:
    into = written_into(path)
    path = path if into else path.resolve()  # through a link: the file it points to is replaced, the link stays
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if into:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(result, indent=2) + "\n")
        else:
            tmp.write_text(json.dumps(result, indent=2))
            os.replace(tmp, path)
    except BaseException as e:  # a full disk, a folder that went away, Ctrl-C: no half-written file left
        with contextlib.suppress(OSError):  # a read-only folder refuses the unlink too
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise BenchError(f"cannot write {path} ({e.strerror}); free space or give another --out, then run again")
        raise


def earlier(out: Path) -> str:
    """Said after a failed run's error: a result file already at --out is an earlier run's, not this one's."""
    return f" ({out} is an earlier run's result, not this one's)" if out.is_file() and not written_into(out) else ""


class Parser(argparse.ArgumentParser):
    """A wrong command line in one line (argparse's own error prints the usage block first), exit 2."""

    def error(self, message):
        self.exit(2, f"device_bench: error: {message}; see {self.prog} --help\n")


def parser():
    prog = "device-bench" if Path(sys.argv[0]).name == "device-bench" else "python -m device_bench"
    p = Parser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("model", help="an .onnx or .tflite file with model.json and its tokenizer beside it")
    p.add_argument("--meta", help="the model.json (default: beside the model)")
    p.add_argument("--data", help="a labelled CSV, TSV or JSONL file: accuracy, tokenized here")
    p.add_argument("--text-column", default="text")
    p.add_argument("--label-column", default="label")
    p.add_argument("--text-pair-column", default="", help="a model for text pairs: the second text's column "
                   "(default text_pair)")
    p.add_argument("--label-separator", metavar="SEP", help="a multi-label model: what cuts a label cell into the "
                   "row's label names (default |)")
    p.add_argument("--label-columns", default="", metavar="A,B,...", help="a multi-label model: --data has a 0/1 "
                   "column per label, named as the model's labels (Jigsaw's toxic,severe_toxic,...); a row with one "
                   "empty or -1 is left out")
    p.add_argument("--out", default="result.json", help="where the result JSON goes (default result.json)")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=8, help=f"the N of the batch-N throughput (at most {MAX_BATCH})")
    p.add_argument("--threads", type=int, default=1, help="0: the runtime's default")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per input for latency (capped at max_length)")
    p.add_argument("--emulated", action="store_true", help="mark latency as measured under emulation")
    p.add_argument("--native-log", action="store_true", help="leave what the TFLite runtime writes on stderr: its "
                   "INFO lines, and a crash's last words (DEVICE_BENCH_NATIVE_LOG=1 does the same)")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    for flag, value, least in (("--runs", args.runs, 1), ("--warmup", args.warmup, 0), ("--batch", args.batch, 1),
                               ("--threads", args.threads, 0), ("--seq-len", args.seq_len, 2)):
        if value < least:
            p.error(f"{flag} {value}: give a whole number >= {least}")
    if args.batch > MAX_BATCH:  # the batch is one array in memory: 10^8 rows of 128 tokens is 100 GB
        p.error(f"--batch {args.batch}: give a whole number from 1 to {MAX_BATCH}")
    out = Path(args.out)  # checked before the benchmark runs, not after it
    if out.is_dir():
        p.error(f"--out {args.out} is a folder; give the path of the result JSON file")
    if written_into(out):  # a pipe or a device: written into, whatever its folder allows
        if not os.access(out, os.W_OK):
            p.error(f"--out {args.out} cannot be written by this user; give a file path or a pipe this user can write")
    elif not out.absolute().parent.is_dir():
        p.error(f"--out {args.out}: folder {out.absolute().parent} does not exist; create it or give a path in a "
                f"folder that exists")
    elif not os.access(out.absolute().parent, os.W_OK):
        p.error(f"--out {args.out}: folder {out.absolute().parent} is not writable (a read-only file system or "
                f"permissions); give a path in a folder this user can write")
    try:
        model = model_file(Path(args.model))
        meta = read_sidecar(model, Path(args.meta) if args.meta else None)
        if problem := option_problem(model, meta, args):
            p.error(problem)
        result = bench(model, meta, args)
        write_result(out, result)
    except BenchError as e:
        print(f"device_bench: error: {e}{earlier(out)}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"device_bench: error: out of memory (loading the model or data, or the batch of {args.batch}); free "
              f"memory on the device, or give a smaller --batch or --seq-len{earlier(out)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("device_bench: interrupted; no result written (any earlier --out file is as it was); run again",
              file=sys.stderr)
        return 130
    print(json.dumps({**{k: result[k] for k in ("latency_ms", "peak_rss_mb", "runtime", "machine")},
                      "written": str(out.absolute())}),  # the whole result: --out defaults to the current folder
          file=sys.stderr if written_into(out) else sys.stdout)  # --out /dev/stdout: the result alone there
    return 0

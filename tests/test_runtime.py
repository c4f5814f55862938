import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgekit import data, runtime
from edgekit.artifact import Artifact
from edgekit.errors import EdgekitError
from edgekit.pipeline import Context
from edgekit.stages import export


@pytest.fixture
def exported(tmp_path, model_dir, csv_file):
    splits = data.load(str(csv_file))
    ctx = Context(splits, Artifact(model_dir, "hf"), 0, 32, False)
    return export.run(Artifact(model_dir, "hf"), tmp_path / "onnx", ctx, check_sentences=16)


def test_export_checks_itself_and_writes_the_sidecar(exported, model_dir):
    assert exported.metrics["label_agreement"] >= 0.99 and exported.metrics["max_abs_diff"] < 1e-4
    meta = json.loads((exported.path.parent / "model.json").read_text())
    assert [i["name"] for i in meta["inputs"]] == ["input_ids", "attention_mask"]
    assert meta["max_length"] == 32 and meta["tokenizer"] == "tokenizer.json"
    hf, onnx = runtime.load(model_dir), runtime.load(exported.path)
    texts = ["the movie was good", "bad plot " * 40]
    assert hf.encode(texts, 32)["input_ids"].tolist() == onnx.encode(texts)["input_ids"].tolist()
    assert abs(hf(texts, 32)["probs"] - onnx(texts)["probs"]).max() < 1e-4


def test_the_onnx_artifact_runs_without_edgekit(exported):
    script = f"""
import json, sys, numpy as np, onnxruntime as ort
from tokenizers import Tokenizer
folder = {str(exported.path.parent)!r}
meta = json.load(open(folder + "/model.json"))
tok = Tokenizer.from_file(folder + "/" + meta["tokenizer"])
session = ort.InferenceSession(folder + "/model.onnx")
for text in ("the movie was good", "bad plot " * 200):  # the long one ran past the position table: ORT failed
    ids = np.array([tok.encode(text).ids], dtype=np.int64)
    out = session.run(None, {{"input_ids": ids, "attention_mask": np.ones_like(ids)}})[0]
    print(ids.shape[1], meta["labels"][int(out.argmax())], json.dumps(out[0].tolist()))
assert "edgekit" not in sys.modules and "torch" not in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" ", 2) for line in done.stdout.splitlines()]
    assert [int(r[0]) for r in rows][1] == 32  # truncated at model.json's max_length by tokenizer.json itself
    assert all(r[1] in ("neg", "pos") for r in rows)  # the tiny model's unnamed labels take the data's names
    ours = runtime.load(exported.path)(["the movie was good", "bad plot " * 200])["probs"]
    assert abs(runtime.softmax(np.array([json.loads(r[2]) for r in rows])) - ours).max() < 1e-5


def test_missing_or_damaged_sidecar_and_model_are_clear_errors(exported):
    folder = exported.path.parent
    (folder / "model.json").write_text("{not json")
    with pytest.raises(EdgekitError, match="model.json is not valid JSON"):
        runtime.load(exported.path)
    (folder / "model.json").write_text(json.dumps({"inputs": []}))
    with pytest.raises(EdgekitError, match="model.json is invalid at top level: 'format' is a required property"):
        runtime.load(exported.path)
    meta = {"format": "onnx", "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 2]}], "labels": ["a", "b"],
            "max_length": 32, "tokenizer": "../../etc/passwd", "pad_id": 0}
    (folder / "model.json").write_text(json.dumps(meta))
    with pytest.raises(EdgekitError, match="invalid at tokenizer"):
        runtime.load(exported.path)
    (folder / "model.json").unlink()
    with pytest.raises(EdgekitError, match="no model.json beside it"):
        runtime.load(exported.path)


def test_truncated_onnx_file_is_refused(exported, tmp_path):
    meta = json.loads((exported.path.parent / "model.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.onnx").write_bytes(exported.path.read_bytes()[:2000])
    (bad / "model.json").write_text(json.dumps(meta))
    (bad / "tokenizer.json").write_bytes((exported.path.parent / "tokenizer.json").read_bytes())
    with pytest.raises(EdgekitError, match="is not a valid ONNX model") as raised:
        runtime.load(bad / "model.onnx")
    assert raised.value.__suppress_context__  # the message says the cause: no second, chained traceback above it


def test_unknown_path_names_what_loads(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"0")
    with pytest.raises(EdgekitError, match="cannot load .*weights.bin: give a transformers folder"):
        runtime.load(tmp_path / "weights.bin")
    with pytest.raises(EdgekitError, match="nothing.onnx does not exist"):
        runtime.load(tmp_path / "nothing.onnx")
    for bad in (None, 123, b"/x", "", "  "):  # a pathlib TypeError; "" loaded the working folder's run
        with pytest.raises(EdgekitError, match=f"load takes a path .*got {re.escape(repr(bad))}"):
            runtime.load(bad)


def test_the_dynamo_exporter_writes_a_valid_file_at_the_default_opset(model_dir, csv_file, tmp_path):
    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)
    art = export.run(Artifact(model_dir, "hf"), tmp_path / "d", ctx, exporter="dynamo", check_sentences=8)
    meta = json.loads((tmp_path / "d" / "model.json").read_text())  # was: not a valid ONNX model (Split)
    assert art.metrics["label_agreement"] == 1.0 and meta["opset"] == 18 and meta["exporter"] == "dynamo"


def test_a_damaged_model_folder_is_one_line_not_a_traceback(model_dir, tmp_path):
    import shutil

    cut = tmp_path / "cut"  # an interrupted copy
    shutil.copytree(model_dir, cut)
    (cut / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes()[:20000])
    with pytest.raises(EdgekitError, match="cut/model.safetensors is damaged or incomplete .*; copy or save the model"):
        runtime.load(cut)
    (cut / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes())
    (cut / "config.json").write_text("{}")
    with pytest.raises(EdgekitError, match="config.json names no model_type"):
        runtime.load(cut)


def retokenize(folder, change):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    change(tokenizer)
    tokenizer.save_pretrained(folder)


@pytest.mark.parametrize("damage, message", [  # each was a traceback from inside the first stage, or from --dry-run
    (lambda d: (d / "config.json").write_text(json.dumps(dict(json.loads((d / "config.json").read_text()),
                                                              num_hidden_layers="four"))),
     "the config.json cannot be read (StrictDataclassFieldValidationError"),
    (lambda d: (d / "config.json").write_text(json.dumps(dict(json.loads((d / "config.json").read_text()),
                                                              model_type="mine", auto_map={"AutoConfig": "mine.C"}))),
     "needs its own code to load (trust_remote_code), which edgekit never runs"),
    (lambda d: (d / "tokenizer.json").write_text('{"version": "1.0", "trunc'), "the tokenizer cannot be read"),
    (lambda d: (d / "config.json").write_text(json.dumps(dict(json.loads((d / "config.json").read_text()),
                                                              model_type="gpt2"))),
     "model type 'gpt2' is not supported; supported: bert"),
    (lambda d: retokenize(d, lambda t: setattr(t, "pad_token", None)), "the tokenizer has no padding token"),
    (lambda d: retokenize(d, lambda t: t.add_tokens(["<url>", "<user>"], special_tokens=True)),
     "the tokenizer has 76 token ids, the model's embedding table 74 rows (tokens added without resizing it); run "
     "model.resize_token_embeddings(len(tokenizer))"),
], ids=["config-types", "custom-code", "tokenizer-cut", "other-family", "no-pad", "more-ids-than-rows"])
def test_a_foreign_or_damaged_model_folder_is_refused_in_one_line_before_anything_runs(model_dir, tmp_path, damage,
                                                                                        message):
    import shutil

    from edgekit import pipeline

    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    damage(folder)
    (folder / "mine.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")  # custom code that must never run
    with pytest.raises(EdgekitError, match=re.escape(message)):
        pipeline.resolve_model(str(folder))
    assert not (tmp_path / "ran").exists()


def test_a_pickle_only_model_folder_is_never_unpickled(model_dir, tmp_path):
    """The rule: no pickles from files when a safe format exists. A hostile pytorch_model.bin was handed to
    torch.load (stopped only by its weights-only unpickler, with a traceback); a harmless one was loaded."""
    import os
    import shutil

    import torch

    from edgekit import families, pipeline

    folder = tmp_path / "bin"
    shutil.copytree(model_dir, folder)
    (folder / "model.safetensors").unlink()
    torch.save(families.load_model(model_dir).state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(EdgekitError, match="holds its weights only as pytorch_model.bin, a pickle, which edgekit does "
                                           "not load; if you trust the file, convert it once"):
        pipeline.resolve_model(str(folder))

    class Hostile:
        def __reduce__(self):
            return os.makedirs, (str(tmp_path / "ran"),)
    torch.save({"x": Hostile()}, folder / "pytorch_model.bin")
    with pytest.raises(EdgekitError, match="a pickle, which edgekit does not load"):
        pipeline.resolve_model(str(folder))
    with pytest.raises(Exception):  # below the folder check too: transformers is told safetensors only
        families.load_model(folder)
    assert not (tmp_path / "ran").exists()


def test_a_run_folder_or_its_manifest_loads_the_final_model(tiny_recipe, tmp_path):
    from edgekit import pipeline, recipe

    run = tmp_path / "run"
    manifest = pipeline.run(recipe.load(str(tiny_recipe)), run, progress=False)
    final = runtime.load(run / manifest["final"]["path"])(["a fine film"])
    for path in (run, run / "manifest.json"):
        assert np.array_equal(runtime.load(path)(["a fine film"])["probs"], final["probs"])
    manifest["final"] = None  # as an unfinished run's
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgekitError, match="manifest.json is from an unfinished run; run the same compress command"):
        runtime.load(run)


def test_one_string_is_one_text_and_no_texts_is_no_predictions(exported):
    model = runtime.load(exported.path)
    one, listed = model("a gripping film"), model(["a gripping film"])  # was one prediction per character
    assert one["labels"] == listed["labels"] and one["probs"].shape == (1, 2)
    empty = model([])
    assert empty["labels"] == [] and empty["probs"].shape == (0, 2)
    with pytest.raises(EdgekitError, match="a model takes texts"):
        model([1, 2])
    with pytest.raises(EdgekitError, match="got float nan at index 2"):  # which of 10,000 texts is pandas' gap
        model(["a", "b", float("nan")])
    with pytest.raises(EdgekitError, match="give a pair as a tuple: \\(text, text_pair\\)"):
        model([{"text": "a", "text_pair": "b"}])

    class Frame(list):  # what matters of a pandas DataFrame: iterating it gives its column names
        columns = ["text"]
    with pytest.raises(EdgekitError, match="got a Frame; give one column, df\\['text'\\].tolist\\(\\)"):
        model(Frame(["text"]))  # was a prediction for the word "text"


def test_torchscript_export_checks_itself_and_loads_with_the_same_call(tmp_path, model_dir, csv_file):
    splits = data.load(str(csv_file))
    ctx = Context(splits, Artifact(model_dir, "hf"), 0, 32, False)
    traced = export.run(Artifact(model_dir, "hf"), tmp_path / "ts", ctx, format="torchscript", check_sentences=40)
    assert traced.path.name == "model.pt" and traced.kind == "torchscript"
    assert traced.metrics["label_agreement"] == 1.0 and traced.metrics["max_abs_diff"] < 1e-4  # varied lengths
    texts = ["the movie was good", "bad " * 20]
    assert abs(runtime.load(traced.path)(texts)["probs"] - runtime.load(model_dir)(texts, 32)["probs"]).max() < 1e-4
    meta = json.loads((traced.path.parent / "model.json").read_text())
    assert meta["format"] == "torchscript" and "opset" not in meta


def test_a_format_the_target_cannot_run_is_refused_before_running():
    from edgekit import recipe
    from edgekit.errors import UsageError

    with pytest.raises(UsageError, match="export format 'torchscript' cannot run on target arm64"):
        recipe.load("distilbert-int8", ["export.format=torchscript", "targets=[arm64]"])
    with pytest.raises(UsageError, match="unknown target riscv; targets: x86, x86-avx2, arm64"):
        recipe.load("distilbert-int8", ["targets=[riscv]"])
    assert recipe.load("distilbert-int8", ["export.format=torchscript"])["targets"] == ["x86"]


def test_tflite_export_has_one_signature_per_bucket_and_picks_the_smallest(tmp_path, model_dir, csv_file):
    pytest.importorskip("litert_torch")
    splits = data.load(str(csv_file))
    ctx = Context(splits, Artifact(model_dir, "hf"), 0, 32, False)
    lite = export.run(Artifact(model_dir, "hf"), tmp_path / "tfl", ctx, format="tflite", buckets=[8, 16, 32],
                      check_sentences=40)
    assert lite.path.name == "model.tflite" and lite.metrics["label_agreement"] == 1.0
    assert lite.metrics["max_abs_diff"] < 1e-4
    model = runtime.load(lite.path)
    assert [model.bucket_for(n) for n in (3, 8, 9, 16, 31, 40)] == [8, 8, 16, 16, 32, 32]
    texts = ["the movie was good", "bad " * 20]
    assert abs(model(texts)["probs"] - runtime.load(model_dir)(texts, 32)["probs"]).max() < 1e-4
    meta = json.loads((lite.path.parent / "model.json").read_text())
    assert meta["buckets"] == [8, 16, 32] and meta["inputs"][0]["dtype"] == "int32"


def test_tflite_buckets_always_reach_max_length(tmp_path, model_dir, csv_file):
    pytest.importorskip("litert_torch")
    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)
    lite = export.run(Artifact(model_dir, "hf"), tmp_path / "tfl", ctx, format="tflite", buckets=[16], check_sentences=8)
    meta = json.loads((lite.path.parent / "model.json").read_text())
    assert meta["buckets"] == [16, 32] and meta["max_length"] == 32  # a 20-token sentence is not cut at 16
    assert runtime.load(lite.path).bucket_for(20) == 32


def test_default_tflite_buckets_fit_a_short_max_length(tmp_path, model_dir, csv_file):
    pytest.importorskip("litert_torch")
    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 48, False)
    lite = export.run(Artifact(model_dir, "hf"), tmp_path / "tfl", ctx, format="tflite", check_sentences=8)
    meta = json.loads((lite.path.parent / "model.json").read_text())
    assert meta["buckets"] == [32, 48] and meta["max_length"] == 48  # 32/64/128 below max_length, then max_length


def test_truncated_tflite_is_refused(tmp_path, model_dir, csv_file):
    pytest.importorskip("ai_edge_litert")
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "model.tflite").write_bytes(b"TFL3" + b"\0" * 64)
    (folder / "tokenizer.json").write_text("{}")
    meta = {"format": "tflite", "inputs": [{"name": "args_0", "dtype": "int32", "shape": [1, "bucket"]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 2]}], "labels": ["a", "b"],
            "max_length": 32, "tokenizer": "tokenizer.json", "pad_id": 0, "buckets": [32], "signatures": {"32": "seq32"}}
    (folder / "model.json").write_text(json.dumps(meta))
    with pytest.raises(EdgekitError, match="is not a tokenizer file"):
        runtime.load(folder / "model.tflite")
    (folder / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    with pytest.raises(EdgekitError, match="the TFLite interpreter cannot load") as raised:
        runtime.load(folder / "model.tflite")
    assert raised.value.__suppress_context__ and raised.value.__cause__ is None


def test_bad_buckets_are_one_line(tmp_path, model_dir, csv_file):
    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)
    with pytest.raises(EdgekitError, match="export.buckets \\[64\\] must be sequence lengths in \\[2, max_length=32\\]"):
        export.run(Artifact(model_dir, "hf"), tmp_path / "x", ctx, format="tflite", buckets=[64])


def test_a_transformers_folder_truncates_where_the_recipe_does(model_dir):
    long = ["good " * 100]
    assert runtime.load(model_dir).encode(long)["input_ids"].shape[1] > 32  # its own limit
    assert runtime.load(model_dir, max_length=32).encode(long)["input_ids"].shape[1] == 32  # evaluate's teacher


def test_a_stage_folder_inside_a_run_truncates_where_the_run_does(tmp_path):
    from edgekit import testing

    folder = testing.make_model_dir(tmp_path / "run" / "03-prune" / "model")  # 128 positions, tokenizer says 1e30
    long = ["good " * 1000]
    assert runtime.load(folder).encode(long)["input_ids"].shape[1] == 128  # was 512: torch failed past 128
    assert runtime.load(folder)(long)["probs"].shape == (1, 2)
    (tmp_path / "run" / "manifest.json").write_text(json.dumps({"recipe": {"max_length": 24}}))
    assert runtime.load(folder).encode(long)["input_ids"].shape[1] == 24  # as the run's exported files do
    assert runtime.load(folder, max_length=64).encode(long)["input_ids"].shape[1] == 64


def test_a_stage_folder_copied_out_of_its_run_still_truncates_where_the_run_did(one_run, tmp_path):
    """The run's max_length (32) was read from RUN/manifest.json only: a copied folder cut texts at 128."""
    import shutil

    for stage in ("01-finetune", "02-distill"):
        copy = shutil.copytree(one_run / stage / "model", tmp_path / stage)
        long = ["good " * 200]
        assert runtime.load(copy).encode(long)["input_ids"].shape[1] == 32
        assert runtime.load(copy, max_length=64).encode(long)["input_ids"].shape[1] == 64  # a default, not a cap
        assert json.loads((copy / "tokenizer_config.json").read_text())["model_max_length"] == 32


def test_a_text_that_is_not_valid_unicode_is_one_line(exported):
    with pytest.raises(EdgekitError, match="text 1 is not valid Unicode"):  # tokenizers raised a TypeError
        runtime.load(exported.path)(["fine", "bad \ud800 movie"])


def test_the_readme_snippet_runs_the_onnx_and_tflite_files_as_edgekit_does(model_dir, csv_file, tmp_path):
    pytest.importorskip("litert_torch")
    from pathlib import Path

    from edgekit import cli, testing

    recipe = tmp_path / "r.yaml"
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, ("export", "quantize")).replace(
        "stages:", "targets: [x86, arm64]\nstages:", 1))
    assert cli.main(["compress", "--recipe", str(recipe), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    snippet = readme.split("truncates at `max_length` by itself:\n\n```python\n")[1].split("```")[0]
    folder = tmp_path / "run" / "02-quantize"
    text = "a gripping, funny film"  # the ONNX part alone, then the whole snippet (its TFLite part last)
    for code, model in ((snippet.split("\nfrom ai_edge_litert")[0], "x86-onnx/model.onnx"),
                        (snippet, "arm64-tflite/model.tflite")):
        done = subprocess.run([sys.executable, "-c", code + "\nprint(json.dumps(np.asarray(logits).tolist()))"],
                              cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        logits = np.array(json.loads(done.stdout.splitlines()[-1]))
        assert abs(runtime.softmax(logits) - runtime.load(folder / model)([text])["probs"]).max() < 1e-5


@pytest.mark.parametrize("kwargs", [{"threads": -3}, {"threads": 1.5}, {"max_length": -1}, {"threads": "2"},
                                    {"max_length": 1}, {"max_length": True}])
def test_load_refuses_thread_and_length_values_it_cannot_use(model_dir, kwargs):
    import edgekit
    from edgekit.errors import UsageError

    with pytest.raises(UsageError, match=f"{next(iter(kwargs))}=.*: give a whole number >= [13], or 0 for the default"):
        edgekit.load(model_dir, **kwargs)  # threads=-3 was taken silently; max_length=1 turned truncation off


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    """One tiny model exported once to every format (TFLite with buckets 16 and 32), and its transformers folder."""
    import importlib.util

    from edgekit import testing

    tmp = tmp_path_factory.mktemp("formats")
    model_dir = testing.make_model_dir(tmp / "tiny-bert")
    ctx = Context(data.load(str(testing.make_csv(tmp / "reviews.csv"))), Artifact(model_dir, "hf"), 0, 32, False)
    names = ["onnx", "torchscript"] + (["tflite"] if importlib.util.find_spec("litert_torch") else [])
    art = export.run(Artifact(model_dir, "hf"), tmp / "export", ctx, format=names, buckets=[16], check_sentences=8)
    return dict({f: a.path for f, a in art.outputs.items()}, hf=model_dir)


def from_threads(model, calls: dict, times: int = 200) -> list:
    """Each of `calls` ({name: (texts, max_length)}) in its own thread, `times` times on the one model: the calls
    whose answer differs from the same call made alone (empty when the model is safe to share)."""
    import threading

    alone = {k: model(texts, max_length=n)["probs"] for k, (texts, n) in calls.items()}
    wrong = []

    def work(k):
        for _ in range(times):
            try:
                if abs(model(calls[k][0], max_length=calls[k][1])["probs"] - alone[k]).max() > 1e-6:
                    wrong.append(k)
            except Exception as e:  # noqa: BLE001 - any error counts: LiteRT read another call's ids, out of bounds
                wrong.append(f"{k}: {e}")
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often: a race shows within a few calls
    try:
        threads = [threading.Thread(target=work, args=(k,)) for k in calls]
        [t.start() for t in threads]
        [t.join() for t in threads]
    finally:
        sys.setswitchinterval(switch)
    return wrong


@pytest.mark.parametrize("fmt", ["hf", "onnx", "torchscript", "tflite"])
def test_a_loaded_model_pickles_as_its_file_and_runs_in_a_spawned_process(formats, fmt):
    """Was: TypeError, cannot pickle '_thread.lock' object: a model could not be handed to a process pool that spawns
    (Python's default on macOS, forkserver on Linux from 3.14), Ray or Spark."""
    import multiprocessing
    import pickle

    if fmt not in formats:
        pytest.skip("litert-torch is not installed")
    model = runtime.load(formats[fmt], max_length=8)
    texts = ["good movie", "awful plot and dull acting all the way through the film"]
    want = model(texts)
    again = pickle.loads(pickle.dumps(model))
    settings = again if fmt == "hf" else again.sidecar
    assert again is not model and settings.max_length == 8  # the load's max_length comes along
    assert np.abs(again(texts)["probs"] - want["probs"]).max() < 1e-6
    if fmt == "onnx":
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            got = pool.apply(model, (texts,))
        assert got["labels"] == want["labels"] and np.abs(got["probs"] - want["probs"]).max() < 1e-6


def test_a_pickled_model_whose_file_moved_or_changed_fails_the_call_and_a_pool_returns_the_error(formats, tmp_path):
    """Was: the model was rebuilt while the worker unpickled the task, where a process pool loses errors (it hung,
    or its workers died); a file overwritten by another run was read without a word; and each task loaded again."""
    import multiprocessing
    import pickle
    import shutil

    from edgekit.errors import EdgekitError

    shutil.copytree(formats["onnx"].parent, tmp_path / "m")
    model = runtime.load(tmp_path / "m" / "model.onnx")
    blob = pickle.dumps(model)
    first, second = pickle.loads(blob), pickle.loads(blob)
    assert first.model() is second.model()  # loaded once per process
    (tmp_path / "m").rename(tmp_path / "moved")
    runtime.LOADED.clear()  # as in a process that has not loaded it yet
    gone = pickle.loads(blob)  # unpickling never loads: a pool gets the error from the call
    with pytest.raises(EdgekitError, match=r"model.onnx, which is not there in this process \(moved or deleted\)"):
        gone(["good movie"])
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        with pytest.raises(EdgekitError, match="which is not there in this process"):
            pool.apply_async(model, (["good movie"],)).get(timeout=300)
    shutil.copytree(tmp_path / "moved", tmp_path / "m")
    onnx_file = tmp_path / "m" / "model.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes()[:-8] + bytes(8))  # the same size, other bytes: another model
    runtime.LOADED.clear()
    with pytest.raises(EdgekitError, match=r"changed after this pickled edgekit model was loaded from it"):
        pickle.loads(blob)(["good movie"])


def test_a_tflite_model_shared_by_threads_answers_each_call_as_alone(formats):
    """One LiteRT interpreter ran the threads' invocations unlocked: 600 of 4500 calls got another text's answer."""
    if "tflite" not in formats:
        pytest.skip("needs litert_torch")
    model = runtime.load(formats["tflite"])
    texts = {"a": "good movie " * 8, "b": "bad plot the cast " * 4, "c": "dull " * 20}  # one bucket: 18 to 22 tokens
    assert {model.bucket_for(model.encode([t])["input_ids"].shape[1]) for t in texts.values()} == {32}
    assert from_threads(model, {k: (t, None) for k, t in texts.items()}) == []


class Yielding:
    """A tokenizers.Tokenizer that lets the other threads run right after each truncation change, where a thread
    sharing it may set its own: a race there shows within a few calls, not once in a hundred."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def enable_truncation(self, *args, **kwargs):
        import time

        self.tokenizer.enable_truncation(*args, **kwargs)
        time.sleep(0.002)


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "tflite", "hf"])
def test_a_call_max_length_in_one_thread_never_truncates_another_threads_texts(formats, fmt):
    """encode set truncation on the one shared tokenizer, then encoded: another thread's texts were cut too."""
    if fmt not in formats:
        pytest.skip("needs litert_torch")
    model = runtime.load(formats[fmt], max_length=32)
    if fmt == "hf":  # a transformers fast tokenizer sets truncation on its `tokenizers` backend at each call
        model.tokenizer._tokenizer = Yielding(model.tokenizer._tokenizer)
    else:
        model.sidecar.tokenizer = Yielding(model.sidecar.tokenizer)
    long = ["good film " * 5 + "bad " * 20] * 2
    assert from_threads(model, {"long": (long, None), "cut": (long, 4)}, times=50) == []


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "tflite", "hf"])
def test_load_max_length_is_every_calls_default_for_every_format(formats, fmt):
    """load(file, max_length=8) was taken and ignored by .onnx, .pt and .tflite files."""
    if fmt not in formats:
        pytest.skip("needs litert_torch")
    long, limit = ["bad " * 3 + "good " * 200], 128 if fmt == "hf" else 32  # the position table, model.json's
    model, cut = runtime.load(formats[fmt], max_length=8), runtime.load(formats[fmt])
    assert model.encode(long)["input_ids"].shape[1] == 8 and cut.encode(long)["input_ids"].shape[1] == limit
    assert np.array_equal(model(long)["probs"], cut(long, max_length=8)["probs"])
    assert model.encode(long, 16)["input_ids"].shape[1] == 16  # a call's own max_length wins
    assert np.array_equal(model(long, max_length=16)["probs"], cut(long, max_length=16)["probs"])
    assert runtime.load(formats[fmt], max_length=np.int64(500)).encode(long)["input_ids"].shape[1] == limit
    assert cut.encode(long, 500)["input_ids"].shape[1] == limit  # a call's longer one is cut to what the file takes
    assert cut(long, max_length=500)["probs"].shape == (1, 2)  # (was: "the input has 500 tokens")


@pytest.mark.parametrize("value", [1, 2, True, -1, 2.5, "32", np.float64(8)])
def test_a_call_max_length_that_cannot_work_is_one_line(formats, value):
    """1 and True turned truncation off (the limit was below the 2 special tokens), -1 was an OverflowError,
    2.5 and "32" bare TypeErrors."""
    from edgekit.errors import UsageError

    model = runtime.load(formats["onnx"])
    with pytest.raises(UsageError, match=f"max_length={re.escape(repr(value))}: give a whole number >= 3, or 0 for "):
        model("good " * 100, max_length=value)
    assert model.encode(["good " * 100], 3)["input_ids"].shape[1] == 3  # [CLS] good [SEP]
    assert model("good " * 100, max_length=np.int64(3))["probs"].shape == (1, 2)


@pytest.mark.parametrize("texts, message", [
    (None, "a model takes a string or a list of strings, got NoneType None; give str(...) or a list"),
    (5, "got int 5; give str"),
    (float("nan"), "got float nan; give str"),
    (np.array("a film"), "got ndarray array('a film', dtype='<U6'); give str"),
    (b"good movie", "got bytes b'good movie'; decode the bytes first: .decode('utf-8')"),
    ([b"x" * 5000], "got bytes b'xxxxxxxx"),
    ({"good movie": 1, "bad film": 0}, ("got dict {'good movie': 1, 'bad film': 0}; give a list of the texts, in the "
                                        "order you want the predictions")),
    ({"good movie", "bad film"}, "got set {'"),
], ids=["none", "int", "float", "0-d-array", "bytes", "huge-bytes-item", "dict", "set"])
def test_a_call_on_something_that_is_not_texts_is_one_line(formats, texts, message):
    """None, numbers and 0-d arrays were bare TypeErrors, bytes 'got int 103', a dict classified its keys, a set
    came back in its own order, a huge item was echoed whole."""
    with pytest.raises(EdgekitError, match=re.escape(message)) as e:
        runtime.load(formats["onnx"])(texts)
    assert len(str(e.value)) < 200


def test_a_stage_folder_of_a_run_names_the_models_inside(tmp_path):
    stage = tmp_path / "03-export"
    for name in ("onnx/model.onnx", "tflite/model.tflite", "torchscript/model.pt"):
        (stage / name).parent.mkdir(parents=True)
        (stage / name).write_bytes(b"0")
    with pytest.raises(EdgekitError, match=re.escape(f"{stage} is not a model but holds 3: onnx, tflite, torchscript; "
                                                     f"give one of them, e.g. {stage / 'onnx'}")):
        runtime.load(stage)


def side(folder, **setting):
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps(dict(json.loads(config.read_text()), **setting)))


def test_a_tokenizer_cutting_on_the_left_is_exported_and_read_cutting_on_the_left(model_dir, csv_file, tmp_path):
    """`truncation_side: left` keeps a long text's end in training; the exported tokenizer.json kept its start, so
    the files (edgekit.load, device_bench) read other tokens than the model was trained on."""
    import shutil

    from edgekit import data, devices, families
    from edgekit.artifact import Artifact
    from edgekit.pipeline import Context
    from edgekit.stages import export

    folder = tmp_path / "left"
    shutil.copytree(model_dir, folder)
    side(folder, truncation_side="left")
    ctx = Context(data.load(str(csv_file)), Artifact(folder, "hf"), 0, 32, False)
    onnx = export.run(Artifact(folder, "hf"), tmp_path / "onnx", ctx, check_sentences=8).path
    long = "good " * 50 + "awful plot"
    trained = families.load_tokenizer(folder)(long, truncation=True, max_length=32)["input_ids"]
    assert trained[-3:-1] == families.load_tokenizer(folder).convert_tokens_to_ids(["awful", "plot"])
    assert runtime.load(onnx).encode([long])["input_ids"][0].tolist() == trained
    assert runtime.load(onnx).encode([long], max_length=16)["input_ids"][0].tolist() == \
        families.load_tokenizer(folder)(long, truncation=True, max_length=16)["input_ids"]
    meta = json.loads((onnx.parent / "model.json").read_text())
    device = devices.runner_module().Tokenizer(onnx.parent / meta["tokenizer"], meta)
    assert device.encode([long])[0][0].tolist() == trained


def test_a_folder_padding_on_the_left_pads_on_the_right_as_training_and_the_files_do(model_dir, tmp_path):
    import shutil

    folder = tmp_path / "padleft"
    shutil.copytree(model_dir, folder)
    side(folder, padding_side="left")
    model = runtime.load(folder)
    batch = model.encode(["good", "the movie was awful"])
    assert batch["attention_mask"][0].tolist()[:3] == [1, 1, 1] and batch["attention_mask"][0][-1] == 0
    texts = ["good", "the movie was awful and the plot was dull"]
    assert abs(model(texts)["probs"] - np.stack([model([t])["probs"][0] for t in texts])).max() < 1e-5


def test_loading_a_transformers_folder_leaves_the_hosts_logging_bars_and_warning_filters_as_they_were(model_dir):
    """edgekit.load of a transformers folder set transformers' logging to ERROR, turned its and huggingface_hub's
    progress bars off and added process-wide warning filters, for good."""
    import warnings

    import huggingface_hub.utils as hub
    import transformers

    def state():
        return (transformers.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled(),
                hub.are_progress_bars_disabled(), list(warnings.filters))

    transformers.logging.set_verbosity_info()
    try:
        before = state()
        runtime.load(model_dir)(["good movie"])
        assert state() == before and before[0] == transformers.logging.INFO and before[1]
    finally:
        transformers.logging.set_verbosity_warning()


def test_a_long_list_of_texts_runs_in_chunks_with_the_results_of_one_text_at_a_time(exported, monkeypatch):
    """One call took every text in one padded batch: memory grew with the list (3.1 GB more for 1,000 texts)."""
    model = runtime.load(exported.path)
    texts = [f"the movie was {'good ' * (i % 7)}awful" for i in range(150)]
    alone = np.concatenate([model([t])["probs"] for t in texts])
    sizes, encode = [], model.encode
    monkeypatch.setattr(model, "encode", lambda batch, *a: sizes.append(len(batch)) or encode(batch, *a))
    out = model(texts)
    assert sizes == [64, 64, 22] and out["probs"].shape == (150, 2) and len(out["labels"]) == 150
    assert abs(out["probs"] - alone).max() < 1e-5


def test_compress_leaves_the_callers_random_stream_where_it_was(model_dir, csv_file, tmp_path):
    import torch

    from edgekit import pipeline, recipe, testing

    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(model_dir, csv_file, ("finetune", "evaluate")))
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    pipeline.run(recipe.load(str(tmp_path / "r.yaml")), tmp_path / "run", progress=False)
    assert torch.equal(torch.rand(4), expected)  # was: reseeded to the recipe's seed, 0


def test_what_load_raises_for_bad_input_is_catchable_from_the_package(tmp_path):
    import edgekit

    with pytest.raises(edgekit.EdgekitError, match="nothing.onnx"):
        edgekit.load(tmp_path / "nothing.onnx")
    assert edgekit.EdgekitError is EdgekitError and issubclass(edgekit.UsageError, edgekit.EdgekitError)


def test_an_onnx_file_loads_and_runs_without_importing_onnx_or_torch(exported):
    """The onnx checker ran on every load (importing onnx: 0.66 s of a 0.75 s cold start); now only on a file
    onnxruntime refuses, for its reason."""
    code = (f"import sys, edgekit; edgekit.load({str(exported.path)!r})(['good movie']); "
            "print(sorted(m for m in ('onnx', 'torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_latency_percentiles_are_exact_and_a_seq_len_past_the_model_is_refused(exported):
    """p90 equal to p50 passed the suite; --seq-len 64 on a 32-token file timed 32 tokens and reported 64."""
    from edgekit import latency

    assert latency.percentiles(list(range(1, 101))) == {"p50": 50.5, "p90": 90.1, "p99": 99.01}
    limit = json.loads((exported.path.parent / "model.json").read_text())["max_length"]
    with pytest.raises(SystemExit, match=f"the model accepts at most {limit} tokens; lower --seq-len"):
        latency.main([str(exported.path), "--seq-len", str(limit + 1), "--runs", "1", "--warmup", "0"])



@pytest.mark.parametrize("change, where", [
    ({"max_length": 1}, "max_length"),  # one token is only [CLS]
    ({"labels": ["only"]}, "labels"),  # a classifier has two classes or more
])
def test_model_json_bounds_are_checked(change, where):
    """model.json's minimum length and two labels at least."""
    from edgekit import schemas

    good = {"format": "onnx", "inputs": [{"name": "ids", "dtype": "int64", "shape": [1, "n"]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, 2]}], "labels": ["neg", "pos"],
            "max_length": 2, "tokenizer": "tokenizer.json", "pad_id": 0}
    schemas.validate(good, schemas.MODEL_JSON, "model.json")
    with pytest.raises(EdgekitError, match=f"model.json is invalid at {where}"):
        schemas.validate({**good, **change}, schemas.MODEL_JSON, "model.json")


def test_a_manifest_file_hash_must_be_exactly_64_hex_digits():
    """The stage files' sha256 pattern is anchored: 64 hex digits and a tail are refused."""
    from edgekit import schemas

    stage = {"name": "export", "key": "k", "input": {}, "output": {"path": "01-export", "kind": "onnx"},
             "seconds": 1.0, "metrics": {}, "files": {"01-export/model.onnx": "0" * 64 + "z"}}
    manifest = {"schema": 1, "edgekit_version": "x", "status": "complete", "recipe": {}, "stages": [stage],
                "final": {}, "budgets": []}
    with pytest.raises(EdgekitError, match="invalid at stages/0/files/01-export/model.onnx"):
        schemas.validate(manifest, schemas.MANIFEST, "manifest.json")

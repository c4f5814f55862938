import json
import re
import subprocess
import sys

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
    with pytest.raises(EdgekitError, match="is not a valid ONNX model"):
        runtime.load(bad / "model.onnx")


def test_unknown_path_names_what_loads(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"0")
    with pytest.raises(EdgekitError, match="cannot load .*weights.bin: give a transformers folder"):
        runtime.load(tmp_path / "weights.bin")
    with pytest.raises(EdgekitError, match="nothing.onnx does not exist"):
        runtime.load(tmp_path / "nothing.onnx")


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
], ids=["config-types", "custom-code", "tokenizer-cut", "other-family"])
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
    with pytest.raises(EdgekitError, match="the TFLite interpreter cannot load"):
        runtime.load(folder / "model.tflite")


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


@pytest.mark.parametrize("kwargs", [{"threads": -3}, {"threads": 1.5}, {"max_length": -1}, {"threads": "2"}])
def test_load_refuses_thread_and_length_values_it_cannot_use(model_dir, kwargs):
    import edgekit
    from edgekit.errors import UsageError

    with pytest.raises(UsageError, match=f"{next(iter(kwargs))}=.*: give a whole number >= 1, or 0 for the default"):
        edgekit.load(model_dir, **kwargs)  # threads=-3 was taken silently

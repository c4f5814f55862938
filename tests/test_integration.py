"""The shipped recipe on the real packaged assets (downloads ~90 MB once, ~520 MB for mpnet-base), small budgets."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SMALL = ["data.max_train=300", "data.max_eval=200", "finetune.epochs=1", "distill.epochs=1", "bench.runs=20"]


def compress(out, *extra, recipe="distilbert-int8"):
    cmd = [sys.executable, "-m", "edgekit.cli", "compress", "--recipe", recipe, "--out", str(out),
           "--quiet", *SMALL, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))


def test_distilbert_int8_on_real_assets(tmp_path):
    done = compress(tmp_path / "run")
    assert done.returncode in (0, 3), done.stderr[-2000:]
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert m["data"]["labels"] == ["fresh", "rotten"] and m["data"]["sizes"]["train"] == 300
    final = m["final"]["metrics"]
    assert m["stages"][1]["metrics"]["student_layers"] == [1, 3, 5]
    assert final["size_mb"] < 25 and final["params"] < 18e6
    assert 0.5 < final["teacher_accuracy"] <= 1 and 0 < final["accuracy"] <= 1
    assert final["latency_ms_p50"] > 0 and final["label_agreement"] >= 0.8
    assert "| finetune |" in done.stdout and "budget size_mb <= 100" in done.stdout
    assert done.returncode == (0 if all(b["ok"] for b in m["budgets"]) else 3)
    again = compress(tmp_path / "run")
    assert "| finetune | " in again.stdout and "(reused)" in again.stdout


def test_same_recipe_with_the_mpnet_teacher(tmp_path):
    done = compress(tmp_path / "run", "teacher=mpnet-base", "data.max_train=200", "data.max_eval=100")
    assert done.returncode in (0, 3), done.stderr[-2000:]
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert m["stages"][1]["metrics"]["student_layers"] == [1, 3, 5, 7, 9, 11]
    assert m["final"]["kind"] == "onnx" and m["final"]["metrics"]["size_mb"] < 110


def test_edge_small_chains_every_stage_on_real_assets(tmp_path):
    done = compress(tmp_path / "run", "prune.recover_epochs=0.5", recipe="edge-small")
    assert done.returncode in (0, 3), done.stderr[-2000:]
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    prune = next(s for s in m["stages"] if s["name"] == "prune")["metrics"]
    assert prune["heads_kept"] == [3, 3, 3] and prune["ffn_kept"] == [256] * 3 and prune["embedding_rank"] == 128
    assert set(m["final"]["outputs"]) == {"x86-onnx", "x86-tflite", "arm64-onnx", "arm64-tflite"}
    exported = tmp_path / "run" / "04-export"
    rewrites = ["first_token_last_layer", "fused_qkv", "additive_mask"]
    onnx_rewrites = rewrites + ["no_token_types", "fixed_reshapes"]
    assert json.loads((exported / "onnx" / "model.json").read_text())["graph_rewrites"] == onnx_rewrites
    assert json.loads((exported / "tflite" / "model.json").read_text())["graph_rewrites"] == rewrites
    for out in m["final"]["outputs"].values():  # a 300-sentence vocabulary: far under the 6 MB budget
        assert out["metrics"]["size_mb"] < 6 and 0 < out["metrics"]["accuracy"] <= 1
    assert m["devices"]["local"]["complete"] is True  # device_bench ran at the end of compress
    assert "target local: " in done.stdout  # the summary; was "target local (local)"


def test_a_multi_label_run_on_real_text(tmp_path):
    """Real weights (minilm-l6) on real text with a varying number of labels: rt-polarity's movie snippets tagged
    positive or negative, vader-amazon's product snippets tagged the same and `product` too."""
    from edgekit import data

    rows = []
    for source, extra in (("rt-polarity", []), ("vader-amazon", ["product"])):
        splits = data.load(source)
        for text, y in splits.train + splits.validation + splits.test:
            tone = "positive" if splits.labels[y] in ("fresh", "positive") else "negative"
            rows.append(json.dumps({"text": text, "label": [tone] + extra}))
    (tmp_path / "tags.jsonl").write_text("\n".join(rows) + "\n")
    done = compress(tmp_path / "run", f"data.source={tmp_path / 'tags.jsonl'}", "data.max_train=600",
                    "finetune.epochs=2")
    assert done.returncode in (0, 3), done.stderr[-2000:]
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert m["data"]["labels"] == ["negative", "positive", "product"]
    final, path = m["final"]["metrics"], tmp_path / "run" / m["final"]["path"]
    assert json.loads((path.parent / "model.json").read_text())["multi_label"] is True
    # 600 rows: the teacher learns the product tag (0.875 of its recall measured) before the tone; always answering
    # `positive` alone scores micro-F1 0.52 here, no `product` at all 0
    assert final["teacher_f1_micro"] > 0.6 and final["per_class"]["product"]["teacher_recall"] > 0.6
    assert final["f1_micro"] >= 0.9 * final["teacher_f1_micro"] and final["label_agreement"] >= 0.8
    assert 0 < final["label_f1_retained"] <= final["per_class"]["product"]["f1"] / final["per_class"]["product"][
        "teacher_f1"] + 1e-12
    from edgekit import devices

    device = devices.bench(tmp_path / "run", "local", progress=False)["metrics"]  # the test split on device_bench
    assert device["f1_micro"] == pytest.approx(final["f1_micro"], abs=0.01)
    assert device["f1_micro_retained"] == pytest.approx(final["f1_micro_retained"], abs=0.01)
    said = subprocess.run([sys.executable, "-m", "edgekit.cli", "predict", str(tmp_path / "run"), "--out",
                           "/dev/stdout", "--format", "jsonl", "this blender broke after a week"],
                          capture_output=True, text=True)
    assert said.returncode == 0 and isinstance(json.loads(said.stdout.splitlines()[0])["label"], list)

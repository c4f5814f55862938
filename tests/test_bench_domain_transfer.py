"""bench/domain_transfer.py on the tiny model: half the deployment domain's text goes to distill and prune without
labels, the other half is held out and scored; the transfer run starts from the base run's teacher."""
import json
import sys
from pathlib import Path

import pytest

from edgekit import pipeline, testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import domain_transfer  # noqa: E402  (bench/ scripts import each other by name)

STAGES = ("finetune", "distill", "prune", "export", "quantize", "evaluate")


@pytest.fixture
def base(tmp_path, model_dir, csv_file):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, STAGES))
    pipeline.compress(str(recipe), out=tmp_path / "base", progress=False)
    return tmp_path / "base"


def test_halves_are_disjoint_seeded_and_cover_every_row():
    rows = [(f"text {i}", i % 2) for i in range(11)]
    a, b = domain_transfer.halves(rows)
    assert len(a) == 5 and len(b) == 6 and sorted(a + b) == sorted(rows)
    assert (a, b) == domain_transfer.halves(rows) and (a, b) != domain_transfer.halves(rows, seed=1)


def test_transfer_run_uses_half_a_unlabelled_and_scores_half_b(base, tmp_path):
    shop = testing.make_csv(tmp_path / "shop.csv", n=60, seed=7, labels=("negative", "positive"))
    out = tmp_path / "dt.json"
    domain_transfer.main([str(base), "--source", str(shop), "--out", str(out)])
    transfer = tmp_path / "transfer" / "shop-A.txt"
    a_texts = transfer.read_text().splitlines()
    assert len(a_texts) == 30
    run = tmp_path / "base-transfer"
    manifest = json.loads((run / "manifest.json").read_text())
    stages = {s["name"]: s for s in manifest["stages"]}
    assert stages["finetune"]["reused"] and not stages["distill"]["reused"]  # the same teacher, a new student
    for stage in ("distill", "prune"):
        assert manifest["recipe"][stage]["transfer"] == str(transfer)
        assert manifest["recipe"][stage]["transfer_examples"] == 30
    assert stages["distill"]["output"]["metrics"]["transfer_examples"] > 0
    result = json.loads(out.read_text())
    assert result["a_examples"] == 30 and result["b_examples"] == 30
    rows = {r["model"]: r for r in result["rows"]}
    assert rows["teacher FP32"]["B_kept"] == 1.0 and rows["teacher FP32"]["test_kept"] == 1.0
    names = set(rows)
    assert {"base: distilled student FP32", "transfer: pruned student FP32"} <= names
    assert {"base: onnx", "transfer: onnx"} <= names  # each run's final file
    for r in result["rows"]:
        assert len(r["B_correct"]) == 30 and len(r["test_correct"]) == result["test_examples"]
        assert r["B_accuracy"] == round(r["B_correct"].count("1") / 30, 4)
        low, high = r["B_kept_ci"]
        assert low <= r["B_kept"] <= high
    docs = out.with_suffix(".md").read_text()
    assert docs.count("\n| ") == len(result["rows"]) + 1 and out.with_suffix(".png").stat().st_size > 0
    out.with_suffix(".md").unlink()
    domain_transfer.main(["--render", "--out", str(out)])  # the docs again from the JSON alone
    assert out.with_suffix(".md").read_text() == docs
    domain_transfer.main([str(base), "--source", str(shop), "--out", str(out)])  # again: every stage reused
    again = json.loads((run / "manifest.json").read_text())
    assert all(s["reused"] for s in again["stages"])


def test_a_run_without_prune_is_refused_in_one_line(tmp_path, model_dir, csv_file):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, ("finetune", "distill", "export")))
    pipeline.compress(str(recipe), out=tmp_path / "run", progress=False)
    with pytest.raises(SystemExit) as e:
        domain_transfer.main([str(tmp_path / "run"), "--source", "x.csv"])
    assert "give a run that starts with finetune and has distill and prune" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "transfer").exists()

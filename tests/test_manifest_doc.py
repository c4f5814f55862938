"""docs/manifest.md against a real manifest: a tiny recipe run and a local `edgekit bench` of it. Every key the run
writes (top level, model, data, stage entries, artifacts, metrics, budget rows, device entries and results, the
model.json sidecars) must have a row in the doc, and every row the run does not show must say why it is optional."""
import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from edgekit import devices, gate, pipeline, recipe, schemas, testing

DOC = Path(__file__).resolve().parent.parent / "docs" / "manifest.md"
STAGES = ("distill", "export", "quantize", "evaluate", "bench")  # finetune and prune: half a minute more, keys the
# Metrics table lists anyway; every other kind of key appears


tables = testing.doc_tables  # {'## ' heading: {key: [type, present, meaning]}}


DOC_TEXT = DOC.read_text(encoding="utf-8")
DOC_TABLES = tables(DOC_TEXT)


def missing(where: str, obj: dict, section: str, doc: dict) -> list:
    return [f"{where}: {key}" for key in obj if key not in doc.get(section, {})]


def undocumented(manifest: dict, sidecars: list = (), doc: dict = DOC_TABLES) -> list:
    """'where: key' for every key of the manifest (and of the model.json dicts) that the doc has no row for."""
    found = missing("top level", manifest, "Top level", doc)
    found += missing("model", manifest["model"], "model", doc) + missing("data", manifest["data"], "data", doc)
    artifacts = [("final", manifest["final"])]
    artifacts += [(f"final.outputs.{n}", o) for n, o in (manifest["final"].get("outputs") or {}).items()]
    for i, stage in enumerate(manifest["stages"]):
        found += missing(f"stages[{i}]", stage, "Stage entries", doc)
        found += missing(f"stages[{i}].metrics", stage["metrics"], "Metrics", doc)
        artifacts += [(f"stages[{i}].input", stage["input"]), (f"stages[{i}].output", stage["output"])]
    for where, artifact in artifacts:
        found += missing(where, artifact, "Artifacts", doc)
        found += missing(f"{where}.metrics", artifact["metrics"], "Metrics", doc)
        found += missing(f"{where}.metrics.quantization", artifact["metrics"].get("quantization") or {},
                         "quantization", doc)
    for name, entry in (manifest.get("devices") or {}).items():
        found += missing(f"devices.{name}", entry, "Device entries", doc)
        found += missing(f"devices.{name}.metrics", entry.get("metrics", {}), "Metrics", doc)
        found += missing(f"devices.{name}.result", entry.get("result", {}), "Device result", doc)
        for row in entry.get("budgets", []):
            found += missing(f"devices.{name}.budgets", row, "Budget rows", doc)
    for row in manifest["budgets"]:
        found += missing("budgets", row, "Budget rows", doc)
    for meta in sidecars:
        found += missing("model.json", meta, "model.json", doc)
        found += missing("model.json quantization", meta.get("quantization") or {}, "quantization", doc)
    return sorted(set(found))


def unexplained(manifest: dict, doc: dict = DOC_TABLES) -> list:
    """Rows of the top-level and stage-entry tables whose key the real manifest lacks and that do not say
    'optional: <why>'."""
    seen = {"Top level": set(manifest), "Stage entries": {k for s in manifest["stages"] for k in s}}
    return [f"{section}: {key}" for section, keys in seen.items() for key, cells in doc[section].items()
            if key not in keys and not re.match(r"optional: \S", cells[1])]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The tiny model and data through distill to bench, an accuracy budget (its row has an interval), then a local bench
    with a budget of its own."""
    tmp = tmp_path_factory.mktemp("manifest-doc")
    text = testing.tiny_recipe(testing.make_model_dir(tmp / "tiny"), testing.make_csv(tmp / "reviews.csv"), STAGES)
    (tmp / "tiny.yaml").write_text(text.replace('budgets: {size_mb: "<= 100"}',
                                                'budgets: {size_mb: "<= 100", accuracy_retained: ">= 0.1"}'))
    pipeline.run(recipe.load(str(tmp / "tiny.yaml")), tmp / "run", progress=False)
    (tmp / "targets.yaml").write_text(yaml.safe_dump({"devices": {"local": {
        "kind": "local", "runs": 5, "warmup": 1, "budgets": {"latency_ms_p90": "<= 100000"}}}}))
    devices.bench(tmp / "run", "local", targets_file=tmp / "targets.yaml", progress=False)
    return tmp / "run"


@pytest.fixture(scope="module")
def manifest(run):
    return json.loads((run / "manifest.json").read_text())


def sidecars(run: Path, manifest: dict) -> list:
    return [json.loads((run / rel).read_text()) for s in manifest["stages"] for rel in s["files"]
            if rel.endswith("model.json")]


def test_every_key_of_a_real_manifest_and_model_json_is_documented(run, manifest):
    assert manifest["devices"]["local"]["complete"] and manifest["devices"]["local"]["budgets"]
    assert any("interval" in row for row in manifest["budgets"])  # the optional keys the run can show, shown
    assert undocumented(manifest, sidecars(run, manifest)) == []


def test_every_documented_top_level_and_stage_key_is_written_or_says_why_not(manifest):
    assert unexplained(manifest) == []


def test_a_key_the_pipeline_starts_writing_without_a_row_fails(run, manifest):
    changed = copy.deepcopy(manifest)
    changed["compressed_at"] = 0
    changed["stages"][0]["host"] = "ci-7"
    changed["final"]["metrics"]["energy_mj"] = 1.0
    changed["devices"]["local"]["result"]["gpu"] = "none"
    meta = dict(sidecars(run, manifest)[-1], opset_imports=[17])
    assert undocumented(changed, [meta]) == ["devices.local.result: gpu", "final.metrics: energy_mj",
                                             "model.json: opset_imports", "stages[0]: host",
                                             "top level: compressed_at"]
    gone = copy.deepcopy(DOC_TABLES)  # and a row the code no longer backs, not marked optional, is reported
    gone["Top level"]["signature"] = ["string", "always", "made up"]
    assert unexplained(manifest, gone) == ["Top level: signature"]


def test_doc_tables_are_well_formed_and_cover_the_json_schemas():
    assert all(len(cells) == 3 for rows in DOC_TABLES.values() for cells in rows.values())
    top, stage, sidecar = DOC_TABLES["Top level"], DOC_TABLES["Stage entries"], DOC_TABLES["model.json"]
    assert [k for k in schemas.MANIFEST["required"] if top.get(k, [""] * 3)[1] != "always"] == []
    assert [k for k in schemas.STAGE["required"] if stage.get(k, [""] * 3)[1] != "always"] == []
    assert [k for k in schemas.MODEL_JSON["required"] if sidecar.get(k, [""] * 3)[1] != "always"] == []
    assert [k for k in schemas.MODEL_JSON["properties"] if k not in sidecar] == []
    assert [s for s in schemas.MANIFEST["properties"]["status"]["enum"] if f"- `{s}`:" not in DOC_TEXT] == []


def test_doc_states_the_schema_number_gate_reads():
    assert gate.SCHEMA == pipeline.SCHEMA == schemas.MANIFEST["properties"]["schema"]["const"]
    assert f'writes and reads `"schema": {gate.SCHEMA}`' in DOC_TEXT

"""Generated bad input: every case ends in success or a one-line EdgekitError, never a traceback."""
import csv
import io
import json
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from edgekit import data, recipe, runtime
from edgekit.errors import EdgekitError

MANY = settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
LONG = st.one_of(TEXT, st.builds(lambda t, n: t * n, TEXT, st.integers(1, 300)))
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True), TEXT)
JSONISH = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
KEYS = st.sampled_from(["teacher", "data", "data.source", "data.max_train", "distill.epochs", "distill.layers",
                        "distill.temperature", "budgets.size_mb", "stages", "seed", "max_length", "quantize.mode",
                        "export.format", "bench.runs", "finetune", "prune.heads_keep", "evaluate.split", "bench",
                        "bench.seq_len", "devices", "devices.pi", "devices.pi.budgets", "devices.pi.runs"])


def one_line(e: Exception) -> bool:
    return isinstance(e, EdgekitError) and "\n" not in str(e) and len(str(e)) > 10


@MANY
@given(st.lists(st.one_of(st.builds(lambda k, v: f"{k}={v}", KEYS, TEXT), TEXT), max_size=4))
def test_overrides(overrides):
    try:
        r = recipe.load("distilbert-int8", overrides)
        assert isinstance(r["stages"], list) and r["teacher"]
    except EdgekitError as e:
        assert one_line(e), str(e)


@MANY
@given(st.dictionaries(st.one_of(KEYS, TEXT), JSONISH, max_size=8))
def test_recipe_documents(doc):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.yaml"
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
        try:
            recipe.load(str(path))
        except EdgekitError as e:
            assert one_line(e), str(e)


ROW = st.fixed_dictionaries({"text": st.one_of(st.none(), LONG), "label": st.one_of(st.none(), st.integers(-3, 3), TEXT,
                                                                                      st.sampled_from(["pos", "neg"]))})


@MANY
@given(st.lists(ROW, max_size=30).flatmap(lambda rows: st.just(rows + rows[: len(rows) // 3])),  # with duplicates
       st.sampled_from([".csv", ".tsv", ".jsonl"]))
def test_datasets(rows, suffix):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"data{suffix}"
        if suffix == ".jsonl":
            path.write_text("\n".join(json.dumps(r) for r in rows))
        else:
            buf = io.StringIO()
            w = csv.writer(buf, delimiter="\t" if suffix == ".tsv" else ",")
            w.writerow(["text", "label"])
            w.writerows([["" if r["text"] is None else r["text"], "" if r["label"] is None else r["label"]] for r in rows])
            path.write_text(buf.getvalue())
        try:
            s = data.load(str(path))
            assert len(s.labels) >= 2 and s.test
            assert all(0 <= y < len(s.labels) for _, y in s.train + s.validation + s.test)
        except EdgekitError as e:
            assert one_line(e), str(e)


@MANY
@given(st.one_of(JSONISH, st.fixed_dictionaries(
    {"format": st.sampled_from(["onnx", "x"]), "inputs": JSONISH, "outputs": JSONISH,
     "labels": st.lists(TEXT, max_size=3), "max_length": SCALAR, "tokenizer": TEXT, "pad_id": SCALAR})))
def test_model_json(meta):
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "model.json").write_text(json.dumps(meta))
        (Path(d) / "tokenizer.json").write_text("{}")
        try:
            runtime.read_sidecar(Path(d) / "model.onnx")
        except EdgekitError as e:
            assert one_line(e), str(e)

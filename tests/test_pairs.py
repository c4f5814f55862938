"""Text-pair classification (NLI, paraphrase, question-answer): data.text_pair_column through every stage, token
types derived from the separator in torch and in every exported graph."""
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edgekit import data, families, testing
from edgekit.errors import EdgekitError, UsageError

SEGMENT_FAMILIES = ("bert", "albert", "electra", "ernie")
PAIRS = [("good movie", "bad actor here and there"), ("x", "y"), ("one two three four", "five")]


@pytest.mark.parametrize("family", SEGMENT_FAMILIES + ("distilbert", "mpnet", "modernbert"))
def test_derived_segments_are_the_tokenizers_token_types(tmp_path, family):
    testing.make_model_dir(tmp_path, family=family)
    tok = families.load_tokenizer(tmp_path)
    enc = tok(PAIRS, padding=True, return_tensors="pt")
    model = families.load_model(tmp_path)
    with torch.no_grad():
        typed = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                      **({"token_type_ids": enc["token_type_ids"]} if family in SEGMENT_FAMILIES else {})).logits
        zeros = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        derived = families.load_model(tmp_path, pairs=True)(input_ids=enc["input_ids"],
                                                            attention_mask=enc["attention_mask"]).logits
    assert torch.allclose(derived, typed, atol=1e-6)
    if family in SEGMENT_FAMILIES:
        assert (typed - zeros).abs().max() > 1e-5  # the types matter, so the match above says something
        assert torch.equal(families.segments(enc["input_ids"], tok.sep_token_id) * enc["attention_mask"],
                           enc["token_type_ids"])
    else:
        assert not families.uses_segments(model)


def test_derived_segments_survive_save_and_load(tmp_path):
    testing.make_model_dir(tmp_path / "m", family="bert")
    tok = families.load_tokenizer(tmp_path / "m")
    model = families.load_model(tmp_path / "m", pairs=True)
    families.save_model(model, tok, tmp_path / "saved", 32)
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["edgekit_sep_id"] == tok.sep_token_id
    enc = tok(PAIRS, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                     token_type_ids=torch.zeros_like(enc["input_ids"])).logits  # the hook types them anyway
        got = families.load_model(tmp_path / "saved")(input_ids=enc["input_ids"],
                                                      attention_mask=enc["attention_mask"]).logits
    assert torch.allclose(got, want, atol=1e-6)


def test_pair_file_reads_as_pairs(tmp_path):
    path = tmp_path / "p.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["premise", "hypothesis", "label", "split"])
        w.writerows([["a cat sits", "an animal sits", "yes", s] for s in ("train", "test")] +
                    [["a dog runs", "", "no", "train"]] + [["rain", "sun", "no", s] for s in ("train", "test")])
    splits = data.load(str(path), text_column="premise", text_pair_column="hypothesis", split_column="split")
    rows = splits.train + splits.validation + splits.test
    assert splits.pairs and len(rows) == 4  # a row with an empty second text carries no example
    assert {t for t, _ in rows} == {("a cat sits", "an animal sits"), ("rain", "sun")}
    assert not data.load(str(path), text_column="premise", split_column="split").pairs
    with pytest.raises(UsageError, match="text_pair_column name the same column 'premise'"):
        data.load(str(path), text_column="premise", text_pair_column="premise")
    with pytest.raises(UsageError, match="no column 'second'"):
        data.load(str(path), text_column="premise", text_pair_column="second")
    with pytest.raises(UsageError, match="one text per row"):
        data.load("rt-polarity", text_pair_column="hypothesis")


def test_recipe_refuses_a_pair_column_on_a_named_dataset(tmp_path):
    from edgekit import recipe

    testing.make_model_dir(tmp_path / "t")
    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(tmp_path / "t", "rt-polarity", stages=("evaluate",)).replace(
        "data: {source: ", "data: {text_pair_column: hypothesis, source: "))
    with pytest.raises(EdgekitError, match="rt-polarity has one text per row"):  # before any stage, --dry-run too
        recipe.load(str(tmp_path / "r.yaml"))


@pytest.mark.parametrize("stage", ["distill", "prune"])
def test_recipe_refuses_single_text_transfer_sets_with_pairs(tmp_path, stage):
    from edgekit import recipe

    testing.make_model_dir(tmp_path / "t")
    testing.make_pair_csv(tmp_path / "p.csv")
    text = testing.tiny_recipe(tmp_path / "t", tmp_path / "p.csv", stages=(stage,)).replace(
        "data: {source: ", "data: {text_column: premise, text_pair_column: hypothesis, source: ").replace(
        f"{stage}: {{", f"{stage}: {{transfer: tweets-3class, ")
    (tmp_path / "r.yaml").write_text(text)
    with pytest.raises(EdgekitError, match=f"{stage}.transfer adds single texts"):
        recipe.load(str(tmp_path / "r.yaml"))


@pytest.mark.parametrize("mlm", [False, True])
def test_pairs_are_augmented_in_both_texts_and_cached_as_pairs(tmp_path, monkeypatch, mlm):
    """Was refused (distill.augment made single texts). Embedding neighbours, or a masked-LM reading the pair's
    other text with each masked word; a cached set comes back as the same pairs."""
    from transformers import BertForMaskedLM

    from edgekit import augment

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    folder = testing.make_model_dir(tmp_path / "m")
    if mlm:
        torch.manual_seed(0)
        BertForMaskedLM(testing.tiny_config("bert")).save_pretrained(folder)
    tok = families.load_tokenizer(folder)
    testing.make_pair_csv(tmp_path / "p.csv")
    examples = data.load(str(tmp_path / "p.csv"), text_column="premise", text_pair_column="hypothesis").train[:20]
    extra, source = augment.augment(folder, tok, examples, 3, 0.5, 3, 0, progress=False)
    assert source == ("mlm" if mlm else "embedding") and len(extra) > 20
    assert all(isinstance(t, tuple) and len(t) == 2 and all(isinstance(x, str) and x for x in t) for t, _ in extra)
    originals = dict(examples)
    assert all(t not in originals for t, _ in extra)
    assert {y for _, y in extra} == {y for _, y in examples}
    for side in (0, 1):  # each of the two texts has words replaced in some copies
        assert any(t[side] not in {o[side] for o in originals} for t, _ in extra)
    assert augment.augment(folder, tok, examples, 3, 0.5, 3, 0, progress=False) == (extra, source)


def test_pair_recipe_end_to_end(tmp_path, monkeypatch):
    """finetune, distill (on augmented pairs too), prune (vocabulary too), ONNX and TFLite for x86 and arm64, INT8,
    evaluate, bench and a local device on pairs labelled by the second text alone: the exported graphs read the
    pair as torch does, and predict / device_bench take pairs."""
    import edgekit
    from edgekit import cli, runtime

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))  # the augmented pairs

    testing.make_model_dir(tmp_path / "teacher", family="bert")
    testing.make_pair_csv(tmp_path / "pairs.csv")
    text = testing.tiny_recipe(tmp_path / "teacher", tmp_path / "pairs.csv",
                               stages=("finetune", "distill", "prune", "export", "quantize", "evaluate", "bench"))
    text = text.replace("data: {source: ", "data: {text_column: premise, text_pair_column: hypothesis, source: ")
    text = text.replace("finetune: {epochs: 4,", "finetune: {epochs: 8,").replace("prune: {", "prune: {vocab: true, ")
    text = text.replace("distill: {", "distill: {augment: 1, ")
    text += "targets: [x86, arm64]\ndevices:\n  here: {kind: local, runs: 3, warmup: 1, after_compress: true}\n"
    (tmp_path / "r.yaml").write_text(text)
    assert cli.main(["compress", "--recipe", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    final = manifest["final"]["metrics"]
    assert final["teacher_accuracy"] >= 0.9 and final["accuracy"] >= 0.9  # chance is about 0.5 on this data
    assert next(s for s in manifest["stages"] if s["name"] == "distill")["metrics"]["augmented_examples"] > 0
    device = manifest["devices"]["here"]  # edgekit bench: the test pairs staged as text, text_pair, label
    assert device["complete"] and device["metrics"]["accuracy"] == pytest.approx(final["accuracy"], abs=1e-4)
    splits = data.load(str(tmp_path / "pairs.csv"), text_column="premise", text_pair_column="hypothesis")
    pairs = [t for t, _ in splits.test]
    torch_model = runtime.load(tmp_path / "run" / "03-prune" / "model")
    want = torch_model.logits(torch_model.encode(pairs))
    for fmt, file in (("onnx", "model.onnx"), ("tflite", "model.tflite")):
        exported = runtime.load(tmp_path / "run" / "04-export" / fmt / file)
        assert exported.meta["text_pair"] is True
        got = np.concatenate([exported.logits(exported.encode([p])) for p in pairs])
        np.testing.assert_allclose(got, want, atol=1e-4)
    final_file = tmp_path / "run" / "05-quantize" / "x86-onnx" / "model.onnx"
    model = edgekit.load(final_file)
    said = model(pairs)["labels"]
    assert sum(s == splits.labels[y] for s, (_, y) in zip(said, splits.test)) / len(pairs) == final["accuracy"]
    with pytest.raises(EdgekitError, match="reads text pairs"):
        model(["a single text"])
    with pytest.raises(EdgekitError, match="all as strings"):
        model([pairs[0], "a single text"])
    csv_file = tmp_path / "test.csv"
    with open(csv_file, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["premise", "hypothesis", "label"])
        w.writerows((a, b, splits.labels[y]) for (a, b), y in splits.test)
    out = tmp_path / "device.json"
    done = subprocess.run([sys.executable, "-m", "device_bench", str(final_file), "--data", str(csv_file),
                           "--text-column", "premise", "--text-pair-column", "hypothesis", "--out", str(out),
                           "--runs", "3", "--warmup", "1"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1] / "device_bench")  # the package, as on a device
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["predictions"] == [splits.labels.index(s) for s in said]
    # the fine-tuned teacher as a hub model would be (no edgekit_sep_id), exported as it is: the export's check
    # against torch reads the pairs with their token types too
    shutil.copytree(tmp_path / "run" / "01-finetune" / "model", tmp_path / "hub")
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    del config["edgekit_sep_id"]
    (tmp_path / "hub" / "config.json").write_text(json.dumps(config))
    text = testing.tiny_recipe(tmp_path / "hub", tmp_path / "pairs.csv", stages=("export", "evaluate"))
    (tmp_path / "hub.yaml").write_text(text.replace(
        "data: {source: ", "data: {text_column: premise, text_pair_column: hypothesis, source: "))
    assert cli.main(["compress", "--recipe", str(tmp_path / "hub.yaml"), "--out", str(tmp_path / "hub-run"),
                     "--quiet"]) == 0
    hub_run = json.loads((tmp_path / "hub-run" / "manifest.json").read_text())
    stages = {s["name"]: s["metrics"] for s in hub_run["stages"]}
    assert stages["export"]["label_agreement"] == 1.0 and stages["export"]["max_abs_diff"] < 1e-4
    assert stages["evaluate"]["teacher_accuracy"] == stages["evaluate"]["accuracy"] >= 0.9


def test_a_tokenizer_without_pair_types_gets_no_derived_types(tmp_path):
    """RoBERTa's family types every token 0 whatever its table holds (the tiny fixture's has 2 rows): no types
    are derived, and the folder reads a pair as transformers does with the tokenizer's own (zero) types."""
    from edgekit import runtime

    testing.make_model_dir(tmp_path, family="xlm-roberta")
    tok = families.load_tokenizer(tmp_path)
    assert families.pair_separator(tok) is None and families.uses_segments(families.load_model(tmp_path))
    model = families.load_model(tmp_path, pairs=True)
    assert getattr(model.config, "edgekit_sep_id", None) is None
    enc = tok(PAIRS, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = model(**{k: enc[k] for k in ("input_ids", "attention_mask")},
                     token_type_ids=torch.zeros_like(enc["input_ids"])).logits
    got = runtime.HFModel(tmp_path).logits(runtime.HFModel(tmp_path).encode(PAIRS))
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)


def test_a_pair_call_leaves_a_single_text_folder_reading_single_texts_as_before(tmp_path):
    """A folder no pair run saved reads a pair with the tokenizer's types for that call only: it kept the types
    derived from ids after one pair call, so a single text holding "[SEP]" then read as a second text."""
    from edgekit import runtime

    testing.make_model_dir(tmp_path, seed=3)
    model = runtime.HFModel(tmp_path)
    texts = ["good movie bad", "bad [SEP] good movie good"]
    before = model(texts)["probs"]
    tok = families.load_tokenizer(tmp_path)
    enc = tok(PAIRS, padding=True, return_tensors="pt")
    with torch.no_grad():  # transformers' own reading of the pairs, token types from the tokenizer
        want = families.load_model(tmp_path)(**enc).logits
    np.testing.assert_allclose(model.logits(model.encode(PAIRS)), want.numpy(), atol=1e-5)
    np.testing.assert_allclose(model(texts)["probs"], before, atol=1e-6)
    assert families.uses_segments(model.model) and "[SEP]" in tok.sep_token  # the fixture can show the fault


def test_malformed_pairs_are_one_clear_error(tmp_path):
    from edgekit import runtime

    for bad in ([("a", "b", "c")], [()], [("a", None)], [("a", 3)], [(b"a", b"b")]):
        with pytest.raises(EdgekitError, match="a text pair is two strings"):
            runtime.as_texts(bad)
    assert runtime.as_texts(np.array([["a", "b"], ["c", "d"]])) == [("a", "b"), ("c", "d")]  # df[[p, h]].values
    assert all(type(x) is str for x in runtime.as_texts(np.array([["a", "b"]]))[0])


def test_separator_text_inside_a_pair_is_warned_of(tmp_path, capsys):
    from edgekit import pipeline
    from edgekit.artifact import Artifact

    testing.make_model_dir(tmp_path / "m")
    splits = data.Splits([(("a [SEP] b", "c"), 0), (("good", "bad"), 1)], [], [], ["neg", "pos"], "x")
    pipeline.tell_length(splits, Artifact(tmp_path / "m", "hf"), 32, False)
    err = capsys.readouterr().err
    assert "1 training pairs hold the separator's own text ([SEP])" in err

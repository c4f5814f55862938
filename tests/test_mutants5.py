"""Mutation audit 5 (pipeline, export stage, cli, augment, native): behaviour no earlier test pinned down."""
import os
import sys

import pytest

from edgekit import cli, native


def test_hidden_output_runs_where_python_has_no_stdout_or_stderr(monkeypatch):
    """sys.stdout / sys.stderr are None where Python started with the descriptor closed (`>&-`): nothing to flush."""
    monkeypatch.setattr(sys, "stdout", None)
    monkeypatch.setattr(sys, "stderr", None)
    with native.hidden_output():
        os.write(1, b"native banner\n")
    assert sys.stdout is None and sys.stderr is None


def test_hidden_output_shows_the_last_characters_of_a_long_failure_log(capfd):
    """The reason a native library gives is its last line: the tail of a long log is shown, not its start."""
    with pytest.raises(RuntimeError), native.hidden_output():
        os.write(2, b"banner line\n" * 1000 + b"F0000 converter.cc:12] the reason\n")
        raise RuntimeError("the conversion failed")
    err = capfd.readouterr().err
    assert "the reason" in err and len(err) <= native.TAIL + 1


def test_augment_p_is_the_chance_each_word_is_replaced(model_dir, csv_file, tmp_path, monkeypatch):
    """p 0 replaces nothing (no copy differs from its sentence, so none is kept); p 1 replaces every whole word, right
    to left, so a copy keeps its sentence's word count and reads as whole vocabulary words."""
    from edgekit import augment, data, families

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    tok, examples = families.load_tokenizer(model_dir), data.load(str(csv_file)).train[:10]
    assert augment.augment(model_dir, tok, examples, 2, 0.0, 3, 0, progress=False) == ([], "embedding")
    extra, source = augment.augment(model_dir, tok, examples, 1, 1.0, 3, 0, progress=False)
    assert source == "embedding" and len(extra) == len(examples)
    vocab = tok.get_vocab()
    for (text, label), (copy, copy_label) in zip(examples, extra):
        words, new = text.split(), copy.split()
        assert copy_label == label and len(new) == len(words) and all(w in vocab for w in new), (text, copy)
        assert all(a != b for a, b in zip(words, new)), (text, copy)  # every word has neighbours other than itself


def test_masked_lm_candidates_leave_out_the_masked_word_in_another_case():
    """A cased vocabulary's 'Good' is the word 'good' itself, not a replacement for it."""
    import torch
    from transformers import BertTokenizer

    from edgekit import augment, testing

    vocab = dict(testing.tiny_vocab())
    vocab["Good"] = len(vocab)
    tok = BertTokenizer(vocab=vocab, do_lower_case=False)
    ranked = [tok.convert_tokens_to_ids(t) for t in ("Good", "great", "fine")]

    class Ranked(torch.nn.Module):  # at every position: Good, then great, then fine
        config = testing.tiny_config("bert")

        def forward(self, input_ids, **kw):
            logits = torch.zeros((*input_ids.shape, len(tok)))
            for score, i in zip((3.0, 2.0, 1.0), ranked):
                logits[:, :, i] = score
            return type("Out", (), {"logits": logits})

    assert augment.mlm_candidates(Ranked(), tok, "good film", [(0, (0, 4))], k=1) == [["great"]]


def _evaluate_run(model_dir, csv_file, tmp_path):
    """A recipe of the evaluate stage alone (seconds) and its run folder."""
    from edgekit import recipe, testing

    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(model_dir, csv_file, stages=("evaluate",)))
    return recipe.load(str(tmp_path / "r.yaml")), tmp_path / "run"


def test_numbers_key_alike_only_where_they_are_the_same_number(csv_file):
    from edgekit import data, pipeline

    assert pipeline.canonical({"t": 2.0, "p": [0.5, 3.0], "n": 4, "s": "x"}) == {"t": 2, "p": [0.5, 3], "n": 4, "s": "x"}
    splits = data.load(str(csv_file))
    recipe = {"seed": 0, "max_length": 32, "targets": ["x86"]}

    def key(name, settings, **changes):
        return pipeline.stage_key(name, settings, "in", "teacher", splits, {**recipe, **changes})

    assert key("distill", {"temperature": 2}) == key("distill", {"temperature": 2.0})
    assert key("distill", {"temperature": 2.5}) != key("distill", {"temperature": 2})
    # what export and quantize write depends on the deployment targets (formats, kernels); evaluate's does not
    for name in ("export", "quantize"):
        assert key(name, {}) != key(name, {}, targets=["arm64"]), name
    assert key("evaluate", {}) == key("evaluate", {}, targets=["arm64"])


def test_max_length_may_be_the_whole_position_table(model_dir):
    from transformers import AutoConfig

    from edgekit import families, pipeline
    from edgekit.errors import UsageError

    config = AutoConfig.from_pretrained(model_dir)
    most = families.max_tokens(config)
    pipeline.check_length(most, config, "the teacher")
    with pytest.raises(UsageError, match=f"max_length {most + 1} is longer than the teacher takes"):
        pipeline.check_length(most + 1, config, "the teacher")


def _export(model_dir, csv_file, out, **settings):
    from edgekit import data
    from edgekit.artifact import Artifact
    from edgekit.pipeline import Context
    from edgekit.stages import export

    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)
    return export.run(Artifact(model_dir, "hf"), out, ctx, format="onnx", check_sentences=16, **settings)


def test_an_export_that_agrees_on_every_sentence_meets_a_min_label_agreement_of_1(model_dir, csv_file, tmp_path):
    import json

    done = _export(model_dir, csv_file, tmp_path / "run" / "01-export", min_label_agreement=1.0)
    assert done.metrics["label_agreement"] == 1.0 and done.outputs == {}  # one format: no outputs by name
    meta = json.loads((tmp_path / "run" / "01-export" / "model.json").read_text())
    assert meta["source"] == str(model_dir.resolve())  # outside the run folder: absolute
    assert "fixed_reshapes" in meta["graph_rewrites"]


def test_rewrites_false_exports_the_graph_as_transformers_runs_it(model_dir, csv_file, tmp_path):
    import json

    _export(model_dir, csv_file, tmp_path / "e", rewrites=False)
    assert json.loads((tmp_path / "e" / "model.json").read_text())["graph_rewrites"] == []


def test_the_exported_source_is_relative_only_inside_the_run(tmp_path):
    from edgekit.stages.export import in_run

    run = tmp_path / "run"
    assert in_run(run / "02-distill", run / "03-export", run) == os.path.join("..", "02-distill")
    assert in_run(tmp_path / "teacher", run / "03-export", run) == str((tmp_path / "teacher").resolve())


def test_the_saved_tokenizer_truncates_on_the_side_the_model_was_trained_with_and_pads_not(model_dir, tmp_path):
    from tokenizers import Tokenizer

    from edgekit import families
    from edgekit.stages.export import save_tokenizer

    tok = families.load_tokenizer(model_dir)
    tok.truncation_side = "left"
    tok.backend_tokenizer.enable_padding(pad_id=tok.pad_token_id, pad_token=tok.pad_token, length=16)  # as some hub
    save_tokenizer(tok, tmp_path / "tokenizer.json", 6)
    saved = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    long = "good film " * 10 + "awful plot"
    ids = saved.encode(long).ids
    assert len(ids) == 6 and saved.padding is None  # tokenizer.json files hold: the model.json says how to pad
    assert ids[-3:-1] == tok("awful plot", add_special_tokens=False)["input_ids"]  # its end is kept


def test_max_abs_diff_is_the_largest_difference_either_way():
    import numpy as np

    from edgekit.stages.export import compare

    class Fixed:
        def __init__(self, logits):
            self.rows = np.array(logits, dtype=np.float32)

        def encode(self, texts):
            return texts

        def logits(self, batch):
            return self.rows[:len(batch)]

    got = compare(Fixed([[1.0, 0.0], [0.0, 1.0]]), Fixed([[3.0, 0.0], [0.0, 0.5]]), [("a", 0), ("b", 1)])
    assert got == {"max_abs_diff": 2.0, "label_agreement": 1.0}


def test_the_summary_marks_reused_stages_and_says_which_budgets_were_not_measured():
    manifest = {"stages": [{"name": "export", "seconds": 3.2, "reused": True, "metrics": {"size_mb": 1.5}},
                           {"name": "evaluate", "seconds": 1.0, "reused": False, "metrics": {"accuracy": 0.9}}],
                "final": {"path": "01-export/model.onnx", "kind": "onnx", "metrics": {}},
                "budgets": [{"metric": "latency_ms_p90", "op": "<=", "target": 5.0, "actual": None, "ok": False},
                            {"metric": "size_mb", "op": "<=", "target": 1.0, "actual": 1.5, "ok": False}]}
    lines = cli.summary(manifest).splitlines()
    assert lines[2].startswith("| export | 3 (reused) |") and lines[3].startswith("| evaluate | 1 |")
    assert lines[-2].startswith("budget latency_ms_p90 <= 5: actual - NOT MEASURED")
    assert lines[-1].startswith("budget size_mb <= 1: actual 1.5 OVER BUDGET")


def test_the_cache_size_counts_a_hard_linked_file_once(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 1000)
    os.link(tmp_path / "a", tmp_path / "b")  # a sweep's shared stages are hard links
    assert cli.folder_mb(tmp_path) == pytest.approx(0.001)


def test_a_stopped_stages_partial_folder_is_the_runs_own_even_without_a_manifest_but_a_link_never_is(
        model_dir, csv_file, tmp_path):
    """A `.partial` holding the `.key` a run writes is a stopped stage of this folder (its manifest lost, or written
    by no run yet): the run takes it over. A symbolic link named like one is someone's, whatever it points to."""
    from edgekit import pipeline
    from edgekit.errors import UsageError

    r, out = _evaluate_run(model_dir, csv_file, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".key").write_text("a key")
    out.mkdir()
    (out / "01-evaluate.partial").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="holds 01-evaluate.partial, named like a stage"):
        pipeline.run(r, out, progress=False)
    assert (elsewhere / ".key").read_text() == "a key"
    (out / "01-evaluate.partial").unlink()
    (out / "01-evaluate.partial").mkdir()
    (out / "01-evaluate.partial" / ".key").write_text("a key of other settings")
    manifest = pipeline.run(r, out, progress=False)
    assert manifest["status"] == "complete" and not (out / "01-evaluate.partial").exists()


def test_without_a_finetune_stage_only_a_sequence_classifier_is_a_teacher(model_dir):
    from edgekit import pipeline
    from edgekit.errors import EdgekitError

    pipeline.check_head(model_dir, ["BertForSequenceClassification"], "t")
    for other in ("BertForTokenClassification", "BertForMaskedLM"):
        with pytest.raises(EdgekitError, match=f"teacher t is not a sequence classifier \\(it is a {other}\\)"):
            pipeline.check_head(model_dir, [other], "t")


def test_a_teacher_head_must_have_one_output_per_class_of_the_data(model_dir):
    from transformers import AutoConfig

    from edgekit import pipeline
    from edgekit.errors import EdgekitError

    config = AutoConfig.from_pretrained(model_dir)  # unnamed LABEL_0, LABEL_1: taken in the data's order
    pipeline.check_labels(config, ["neg", "pos"], "t")
    with pytest.raises(EdgekitError, match=r"teacher t predicts \[LABEL_0, LABEL_1\] but the data's labels are "
                                           r"\[neg, neutral, pos\]"):
        pipeline.check_labels(config, ["neg", "neutral", "pos"], "t")
    config.num_labels = 1  # one output and no problem_type: a regression head all the same
    with pytest.raises(EdgekitError, match=r"teacher t has a regression head \(problem_type None, 1 output\)"):
        pipeline.check_labels(config, ["neg", "pos"], "t")


def test_tflite_buckets_always_end_at_max_length(model_dir, csv_file, tmp_path, monkeypatch):
    """A shorter last bucket cut inputs that training and ONNX read whole: max_length is added to the buckets given
    (the buckets each TFLite file is converted with, caught before the conversion, which takes long)."""
    from edgekit import data
    from edgekit.artifact import Artifact
    from edgekit.pipeline import Context
    from edgekit.stages import export

    class Converting(Exception):
        pass

    def export_one(model, tokenizer, folder, format, target, exporter, opset, buckets, *args):
        raise Converting(format, buckets)

    monkeypatch.setattr(export, "export_one", export_one)
    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False, ["arm64"])
    with pytest.raises(Converting) as converting:
        export.run(Artifact(model_dir, "hf"), tmp_path / "e", ctx, format="tflite", buckets=[16], check_sentences=4)
    assert converting.value.args == ("tflite", [16, 32])


def test_stdout_still_reaches_the_reader_after_hidden_output_where_stderr_was_closed():
    """`edgekit compress ... 2>&-` (TFLite loads, converts and invokes run inside hidden_output): what is printed
    after the block must still reach stdout."""
    import subprocess

    code = ("import os\nfrom edgekit.native import hidden_output\nwith hidden_output():\n    os.write(1, b'hidden')\n"
            "print('after', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: os.close(2))
    assert (done.returncode, done.stdout) == (0, "after\n")

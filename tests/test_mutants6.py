"""Mutation audit 6 (report, sweep, recipe, latency, families): behaviour no earlier test pinned down."""
import json
import shutil

import numpy as np
import pytest

from edgekit import latency, recipe, report, sweep
from edgekit.errors import EdgekitError, UsageError


# report

def test_the_ffn_output_projection_of_an_onnx_graph_counts_as_ffn():
    """ONNX names the FFN's second matrix by its node path (/output/dense/), not by the dotted PyTorch name."""
    assert report.part_of("onnx::MatMul_321 /bert/encoder/layer.0/output/dense/MatMul") == "ffn"


def test_int8_tensors_of_a_folder_count_one_byte_each(tmp_path):
    """The size breakdown of a safetensors folder reads each dtype's width: an INT8 table is 1 byte a value."""
    from safetensors.numpy import save_file

    save_file({"bert.embeddings.word_embeddings.weight": np.zeros((1000, 10), np.int8),
               "classifier.weight": np.zeros((2, 500), np.float32)}, str(tmp_path / "model.safetensors"))
    assert report.breakdown(tmp_path) == {"embeddings": 0.01, "attention": 0.0, "ffn": 0.0, "other": 0.004}


def test_a_breakdown_whose_external_data_is_missing_has_no_negative_part(tmp_path):
    """Tensors counted beyond the files there (the external data left out of a copy) never make `other` negative."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "classifier.weight")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "classifier.weight"], ["y"], name="classifier")],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    (tmp_path / "model.onnx.data").unlink()
    sizes = report.breakdown(tmp_path / "model.onnx")
    assert sizes["other"] == pytest.approx(0.016, abs=0.001) and min(sizes.values()) >= 0


def _peers_run(tmp_path, peers: dict):
    run = tmp_path / "run"
    (run / "peers").mkdir(parents=True)
    (run / "peers" / "peers.json").write_text(json.dumps(peers))
    return run


def test_peers_json_without_seq_len_was_timed_at_128_tokens(tmp_path):
    """bench/peers.py's default length: a peers.json from before it recorded seq_len is 128 tokens."""
    rows = [{"model": "teacher FP32 (ONNX Runtime)", "path": "t.onnx", "accuracy": 0.8, "latency_ms_p50_128": 0.2,
             "size_mb": 0.25}]
    run = _peers_run(tmp_path, {"run": str(tmp_path / "run"), "rows": rows})
    manifest = {"final": {"path": "04-quantize/model.onnx", "metrics": {"accuracy": 0.8}}}
    assert report.points([(manifest, run)], ["run"]) == [("run: teacher FP32 (ONNX Runtime)", 0.8, 0.2, 0.25, "test",
                                                          128)]


def test_a_point_without_a_size_has_size_zero(tmp_path):
    """An artifact with accuracy and latency but no size_mb is a point of size 0, not of some other size."""
    manifest = {"final": {"path": "m.onnx", "metrics": {"accuracy": 0.9, "latency_ms_p50": 1.5}}}
    assert report.points([(manifest, tmp_path / "run")], ["run"]) == [("run: m.onnx", 0.9, 1.5, 0.0, "test", None)]


def test_zero_threads_read_as_plural():
    """Only one thread is singular: 0 threads, 1 thread, 2 threads."""
    assert [report.threads_text(n) for n in (0, 1, 2)] == ["0 threads", "1 thread", "2 threads"]


def test_a_unit_comes_from_the_metrics_suffix_not_a_word_holding_mb():
    """'mb' inside a word (embedding) does not make a latency a size."""
    assert [report.unit_of(k) for k in ("embedding_ms", "size_mb", "peak_rss_mb", "accuracy")] == ["ms", "MB", "MiB",
                                                                                                   ""]


def test_a_run_named_as_the_start_of_anothers_name_is_still_listed_unmeasured(finished, tmp_path):
    """Run `a` with no accuracy is named unmeasured beside a measured run `ab` (`ab: ...` starts with `a`)."""
    shutil.copytree(finished, tmp_path / "ab")
    manifest = json.loads((finished / "manifest.json").read_text())
    final = manifest["final"]
    for m in [final["metrics"]] + [o["metrics"] for o in (final.get("outputs") or {}).values()]:
        m.pop("accuracy", None)
    (finished / "manifest.json").write_text(json.dumps(manifest))
    shutil.move(finished, tmp_path / "a")
    md = report.build([tmp_path / "a", tmp_path / "ab"], tmp_path / "rep").read_text()
    assert "add evaluate and bench stages): a\n" in md


def _per_class_manifest(classes_b: dict) -> dict:
    a = {"neg": {"examples": 5, "teacher_recall": 0.8, "recall": 0.6}, "p|s": {"examples": 4, "teacher_recall": 1.0,
                                                                             "recall": 0.75}}
    return {"final": {"metrics": {"eval_split": "test"},
                      "outputs": {"x86-onnx": {"metrics": {"per_class": a}},
                                  "arm64-onnx": {"metrics": {"per_class": classes_b}}}}}


def test_a_class_an_artifact_did_not_score_is_an_empty_cell_and_a_pipe_in_its_name_is_escaped():
    """Per-class recall: a missing class is blank (not 0.0000); a class named `p|s` does not split the row."""
    rows = report.per_class_table(_per_class_manifest({"neg": {"examples": 5, "teacher_recall": 0.8, "recall": 0.4}}))
    assert "| neg | 5 | 0.8000 | 0.6000 | 0.4000 |" in rows
    assert "| p\\|s | 4 | 1.0000 | 0.7500 |  |" in rows


def test_a_separator_row_with_spaces_is_no_table_row():
    """`| --- | ---: |` is markdown's separator as much as `|---|---:|`: no row of dashes in the HTML."""
    page = report.to_html("| a | b |\n| --- | ---: |\n| 1 | 2 |\n", [])
    assert "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>" in page


# sweep

def test_commas_inside_braces_do_not_split_a_sweep_value():
    """A mapping value ({onnx: dynamic, tflite: int8}) is one value, as a list is."""
    assert sweep.split_top("{onnx: dynamic, tflite: int8},dynamic") == ["{onnx: dynamic, tflite: int8}", "dynamic"]


def test_a_point_without_settings_is_named_base():
    """A sweep with no settings has one point, and its folder needs a name."""
    assert sweep.slug([]) == "base"


def test_a_blank_ray_address_is_a_usage_error(tmp_path):
    """--ray '  ' is said to be empty, not tried as a cluster address."""
    with pytest.raises(UsageError, match="--ray is empty"):
        sweep.sweep("unused", ["seed=1"], tmp_path / "sw", ray_address="  ")


def test_a_setting_that_does_nothing_is_warned_of_once_for_the_whole_grid(tiny_recipe, tmp_path, capsys):
    """Every point sets quantize.calibration_size without a static mode: one warning, not one per point."""
    with pytest.raises(EdgekitError, match="cannot reach a Ray cluster"):  # stops once every point is checked
        sweep.sweep(str(tiny_recipe), ["seed=1,2,3", "quantize.calibration_size=17"], tmp_path / "sw",
                    ray_address="127.0.0.1:1", progress=False)
    assert capsys.readouterr().err.count("quantize.calibration_size is set but does nothing") == 1


def test_only_names_shaped_as_point_folders_are_earlier_points(tmp_path):
    """NN-name: a folder named 007 or 2024results in OUT is never taken for a point a sweep made."""
    (tmp_path / sweep.POINTS).write_text(json.dumps(["00-a", "007", "2024results", "12-b"]))
    assert sweep.earlier_points(tmp_path) == {"00-a", "12-b"}


def test_a_failed_points_unmeasured_cells_read_as_a_dash(tmp_path):
    """sweep.md shows - where a point measured nothing, so its columns stay in place."""
    failed = {"status": "failed", "error": "boom", "final": {"metrics": {}}, "stages": []}
    result = sweep.summarize([["seed=1"]], [tmp_path / "00-seed=1"], [failed], tmp_path)
    assert "| 00-seed=1 | - | seed=1 | failed: boom | - | - | - | 0 |  |" in result["table"]


# recipe

def test_a_strict_greater_than_budget_parses():
    """'> 0.5' is one of the four operators."""
    assert recipe.parse_bound("> 0.5") == (">", 0.5)
    assert recipe.budget_row("accuracy", ">", 0.5, 0.5)["ok"] is False


def test_label_agreement_is_a_fraction():
    """label_agreement 97 is read as a percentage given as a fraction's place: refused with the fraction to give."""
    assert "is not a fraction" in recipe.bound_problem("label_agreement", 97)


def test_a_class_recall_measured_on_every_class_has_no_note():
    """The note is only for a recall measured on some classes: 3 of 3 needs none."""
    row = {"metric": "class_recall_retained", "op": ">=", "target": 0.9, "actual": 0.95, "ok": True}
    assert recipe.with_note(row, {"class_recall_measured": [3, 3]}) == row
    assert "2 of 3 classes measured" in recipe.with_note(row, {"class_recall_measured": [2, 3]})["note"]


def test_a_mapping_value_left_null_passes_the_word_check():
    """quantize.mode {onnx: dynamic, tflite: null}: only the words are checked against the allowed ones."""
    assert recipe.outside({"onnx": "dynamic", "tflite": None}, ("dynamic", "static")) == ""
    assert recipe.outside({"onnx": "dynamc"}, ("dynamic", "static")) == "one of dynamic, static"


def test_an_override_without_a_key_says_what_an_override_looks_like():
    """'=1' has no key: the message shows key=value, not an unknown key ''."""
    with pytest.raises(UsageError, match="must look like key=value"):
        recipe.apply_override({}, "=1")


# latency

class _FakeModel:
    """runtime.load's model without a model: ids of the asked length, every encoded text recorded."""

    def __init__(self):
        self.encoded, self.calls = [], 0

    def encode(self, texts, max_length=None):
        self.encoded.append(texts)
        return {"input_ids": np.zeros((len(texts), max_length or 4), np.int64)}

    def logits(self, feed):
        self.calls += 1
        return np.zeros((feed["input_ids"].shape[0], 2))


def _main(monkeypatch, capsys, argv):
    from edgekit import runtime

    model = _FakeModel()
    monkeypatch.setattr(runtime, "load", lambda path, threads=1: model)
    latency.main(argv)
    return json.loads(capsys.readouterr().out), model


def test_latency_times_runs_calls_after_warmup_and_at_most_runs_sentences(monkeypatch, capsys, tmp_path):
    """--runs 3 --warmup 2: 5 fixed calls, 3 timed; 3 of the 5 sentences; and the result says runs 3."""
    (tmp_path / "t.txt").write_text("a\nb\nc\nd\ne")
    result, model = _main(monkeypatch, capsys, ["m", "--seq-len", "4", "--runs", "3", "--warmup", "2",
                                                 "--texts", str(tmp_path / "t.txt")])
    assert model.calls == 5 + 3 and model.encoded[1:] == [["a"], ["b"], ["c"]]
    assert result["runs"] == 3 and set(result["sentences"]) == {"p50", "p90", "p99"}


def test_latency_pairs_are_always_two_texts(monkeypatch, capsys, tmp_path):
    """--pairs 1: a line without a tab is the pair (line, ''), as the model's encoder takes pairs."""
    (tmp_path / "t.txt").write_text("first\tsecond\nalone")
    _, model = _main(monkeypatch, capsys, ["m", "--seq-len", "4", "--runs", "2", "--warmup", "0", "--pairs", "1",
                                           "--texts", str(tmp_path / "t.txt")])
    assert model.encoded[1:] == [[("first", "second")], [("alone", "")]]


def test_memory_is_read_in_mib_from_proc_status(monkeypatch, tmp_path):
    """VmRSS 2048 kB is 2.0 MiB."""
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t    4096 kB\nVmRSS:\t    2048 kB\n")
    monkeypatch.setattr(latency, "Path", lambda p: status)
    assert (latency.memory_mb("VmRSS"), latency.memory_mb("VmHWM")) == (2.0, 4.0)


def test_synthetic_ids_leave_out_the_special_tokens():
    """Random ids start at 5: no [PAD]/[CLS]/[SEP]/[MASK] (ids 0-4 in a BERT vocabulary) in a timed input."""
    model = object.__new__(latency.Synthetic)
    model.vocab = 7
    feed = model.fixed(64, 128)
    assert feed["input_ids"].min() == 5 and feed["input_ids"].max() == 6 and feed["attention_mask"].all()



# families

def test_mpnet_positions_start_after_the_padding_id():
    """MPNet's 514-row position table takes 512 tokens, as RoBERTa's does; BERT's 512 rows take 512."""
    from transformers import BertConfig, MPNetConfig

    from edgekit import families

    assert families.max_tokens(MPNetConfig(max_position_embeddings=514)) == 512
    assert families.max_tokens(BertConfig(max_position_embeddings=512)) == 512


def test_segments_end_at_the_pairs_second_separator():
    """Types as BERT's tokenizer gives them: 1 from after the first [SEP] through the second, 0 for the pads after."""
    import torch

    from edgekit import families

    ids = torch.tensor([[101, 7, 102, 8, 9, 102, 0, 0]])
    assert families.segments(ids, 102).tolist() == [[0, 0, 0, 1, 1, 1, 0, 0]]

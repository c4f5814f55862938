"""Mutation audit 7 (compare, tflite_file, predict, gate): behaviour no earlier test pinned down."""
import argparse
import json
from pathlib import Path

import pytest

from edgekit import compare, gate, predict
from edgekit.errors import UsageError


# compare

def _fake_bench(calls):
    def measure(path, batch, **kw):
        calls.append(dict(kw, name=Path(path).name, batch=batch))
        return {"fixed": {"p50": 1.0}, "rss_after_load_mb": 50.0}
    return measure


def test_compare_times_every_model_at_the_given_length_and_threads(model_dir, tmp_path, monkeypatch):
    """Each latency compare reports is timed at --seq-len tokens on --threads threads, as the table's heading says."""
    from edgekit.stages import bench

    calls = []
    monkeypatch.setattr(bench, "measure", _fake_bench(calls))
    compare.measure(str(model_dir), tmp_path / "work", threads=3, seq_len=16)
    assert len(calls) == 3 and all((c["seq_len"], c["threads"]) == (16, 3) for c in calls)


def test_compare_takes_the_shortest_sequence_length_it_says_it_takes(tmp_path, monkeypatch):
    """--seq-len 2, the low end of the [2, 512] the error names, is accepted."""
    monkeypatch.setattr(compare, "check", lambda *a: None)
    monkeypatch.setattr(compare, "measure", lambda spec, *a, **k: {"model": spec})
    monkeypatch.setattr(compare, "write", lambda *a, **k: None)
    assert compare.run(["bert-base"], tmp_path / "c", seq_len=2, progress=False) == [{"model": "bert-base"}]


def test_compare_removes_every_earlier_output_before_it_measures(tmp_path, monkeypatch):
    """A call that stops leaves none of an earlier call's four files (table, CSV, JSON, chart) to pass for its own."""
    out = tmp_path / "c"
    out.mkdir()
    for name in compare.OUTPUTS:
        (out / name).write_text("an earlier call's")

    def fails(*a, **k):
        raise RuntimeError("stopped")

    monkeypatch.setattr(compare, "check", lambda *a: None)
    monkeypatch.setattr(compare, "measure", fails)
    with pytest.raises(RuntimeError):
        compare.run(["bert-base"], out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == []


def test_compare_chart_is_drawn_at_the_length_and_threads_of_the_run(tmp_path, monkeypatch):
    """The chart written by run() says the --seq-len and --threads the models were timed at, not the defaults."""
    seen = []
    monkeypatch.setattr(compare, "check", lambda *a: None)
    monkeypatch.setattr(compare, "measure", lambda spec, *a, **k: dict.fromkeys(compare.COLUMNS, 1.0) | {"model": spec})
    monkeypatch.setattr(compare, "chart", lambda rows, path, seq_len=128, threads=1: seen.append((seq_len, threads)))
    compare.run(["bert-base"], tmp_path / "c", threads=2, seq_len=16, progress=False)
    assert seen == [(16, 2)]


def test_transformers_refusal_is_said_in_one_line_with_its_words_whole():
    """A multi-line reason from transformers is one line of its own words; only a very long one is cut."""
    said = str(compare.unbuildable("odd.json", ValueError("The hidden size (8) is not\n   a multiple of the "
                                                          "number of attention heads (3)")))
    assert "(ValueError: The hidden size (8) is not a multiple of the number of attention heads (3))" in said
    long = str(compare.unbuildable("odd.json", ValueError("word " * 1000)))
    assert "\n" not in long and len(long) < 400


def test_a_config_json_that_is_not_there_is_a_typo_not_a_bad_config(tmp_path):
    """A .json spec that does not exist is 'no such folder' (exit 2), not 'is not a transformers config'."""
    with pytest.raises(UsageError, match="no such folder"):
        compare.source(str(tmp_path / "typo" / "config.json"))


def test_compare_measures_a_folders_own_weights(tmp_path):
    """A model folder is measured with the weights it holds, not a random model of its config."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from edgekit import testing

    folder = testing.make_model_dir(tmp_path / "m", seed=1)
    model, source = compare.build(str(folder))
    saved = AutoModelForSequenceClassification.from_pretrained(folder)
    assert Path(source).resolve() == folder.resolve()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), saved.state_dict().values()))


def test_a_model_folder_that_also_holds_a_model_subfolder_is_still_a_model(model_dir, tmp_path):
    """Only a folder without its own config.json is refused as a run's stage folder; a model folder is measured."""
    import shutil

    folder = tmp_path / "mine"
    shutil.copytree(model_dir, folder)
    shutil.copytree(model_dir, folder / "model")
    config, source = compare.source(str(folder))
    assert config.model_type == "bert" and Path(source).resolve() == folder.resolve()


def test_compare_markdown_rule_row_has_one_cell_per_column():
    """The table's rule row has as many cells as its header (an extra one breaks some markdown renderers)."""
    row = dict.fromkeys(compare.COLUMNS, 1.0) | {"model": "m"}
    header, rule, body = compare.markdown([row]).splitlines()[:3]
    assert rule.count("|") == header.count("|") == body.count("|") == len(compare.COLUMNS) + 1


def test_a_model_name_holding_a_bar_stays_in_its_cell():
    """compare.md escapes | and \\ in a model's name, as predict's table does: a | would add a column."""
    row = dict.fromkeys(compare.COLUMNS, 1.0) | {"model": "runs/a|b\\c"}
    body = compare.markdown([row]).splitlines()[2]
    assert body.startswith("| runs/a\\|b\\\\c |") and body.replace("\\|", "").count("|") == len(compare.COLUMNS) + 1


def test_compare_markdown_shows_parameters_in_millions_to_two_places():
    """params_m is millions of parameters: 2 places (109.48), not an accuracy's 4 (109.4820)."""
    row = dict.fromkeys(compare.COLUMNS) | {"model": "m", "params_m": 109.482}
    cells = [c.strip() for c in compare.markdown([row]).splitlines()[2].strip("|").split("|")]
    assert cells[:2] == ["m", "109.48"]


def test_a_model_name_of_exactly_the_limit_is_kept_whole_on_the_chart():
    """short_name keeps a name of `most` characters (the limit is inclusive); one more is shortened."""
    name = "/a/" + "b" * 26 + "/cc"  # 32 characters
    assert len(name) == 32 and compare.short_name(name) == name
    assert compare.short_name(name + "c") == "…/" + "b" * 26 + "/ccc"


def test_a_long_name_of_one_folder_with_a_trailing_slash_is_not_shortened():
    """A single long folder name ('name/') has no parent part to drop: it is kept as given."""
    name = "x" * 40 + "/"
    assert compare.short_name(name) == name


def test_compare_chart_puts_each_measurement_in_its_own_bar(tmp_path, monkeypatch):
    """Size bars are FP32 then INT8 size, latency bars FP32 then INT8 batch-1 latency, each from its own column."""
    from edgekit import report

    plt = report.pyplot()
    bars = []
    real = plt.Axes.barh
    monkeypatch.setattr(plt.Axes, "barh", lambda ax, y, width, *a, label=None, **k: bars.append((label, list(width)))
                        or real(ax, y, width, *a, label=label, **k))
    row = {"model": "m", "size_fp32_mb": 4.0, "size_int8_mb": 1.0, "latency_ms_b1_fp32": 9.0,
           "latency_ms_b1_int8": 3.0}
    compare.chart([row], tmp_path / "c.png")
    assert bars == [("FP32", [4.0]), ("INT8", [1.0]), ("FP32", [9.0]), ("INT8", [3.0])]


# tflite_file

def _tflite(path, quantizations, inline=(), blobs=()):
    """A hand-built .tflite FlatBuffer (no converter): one subgraph of INT8 tensors with these (dim, scales, zero
    points), buffers holding `inline` data in the FlatBuffer and `blobs` after it (as the converter stores weights)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT()
    model.version = 3
    model.buffers = [schema.BufferT()]
    for data in inline:
        model.buffers.append(schema.BufferT())
        model.buffers[-1].data = list(data)
    outside = []
    for blob in blobs:
        model.buffers.append(schema.BufferT())
        outside.append((model.buffers[-1], blob))
    graph = schema.SubGraphT()
    graph.tensors = []
    for i, (dim, scales, zero_points) in enumerate(quantizations):
        tensor = schema.TensorT()
        tensor.name, tensor.shape, tensor.type, tensor.buffer = f"t{i}", [2, 2], schema.TensorType.INT8, 0
        tensor.quantization = schema.QuantizationParametersT()
        tensor.quantization.scale = list(scales)
        tensor.quantization.zeroPoint = None if zero_points is None else list(zero_points)
        tensor.quantization.quantizedDimension = dim
        graph.tensors.append(tensor)
    graph.inputs, graph.outputs = [0], [len(quantizations) - 1]
    model.subgraphs = [graph]

    def packed():
        builder = flatbuffers.Builder(0)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())

    position = 1 << 40  # as wide as the real offsets: the FlatBuffer's length does not change with them
    for buffer, blob in outside:
        buffer.offset, buffer.size = position, len(blob)
    position = len(packed())
    for buffer, blob in outside:
        buffer.offset = position
        position += len(blob)
    path.write_bytes(packed() + b"".join(blob for _, blob in outside))
    return path


def _read(path):
    from ai_edge_litert import schema_py_generated as schema

    return schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)


def test_compacting_keeps_each_tensors_own_quantized_dimension_and_zero_points(tmp_path):
    """Only tensors with the same scales, zero points AND quantized dimension share one parameter table."""
    from edgekit import tflite_file

    scales = [0.5, 0.25]
    given = [(0, scales, [0, 0]), (1, scales, [0, 0]), (0, scales, [1, 2]), (0, scales, [0, 0])]
    tflite_file.compact(path := _tflite(tmp_path / "m.tflite", given))
    got = [(t.quantization.quantizedDimension, [float(s) for s in t.quantization.scale],
            [int(z) for z in t.quantization.zeroPoint]) for t in _read(path).subgraphs[0].tensors]
    assert got == given


def test_compacting_takes_per_channel_scales_without_zero_points(tmp_path):
    """The schema leaves zeroPoint optional: a per-channel table without one is shared by its scales alone."""
    from edgekit import tflite_file

    given = [(0, [0.5, 0.25], None), (0, [0.5, 0.25], None), (0, [0.5, 0.125], None)]
    tflite_file.compact(path := _tflite(tmp_path / "m.tflite", given))
    got = [[float(s) for s in t.quantization.scale] for t in _read(path).subgraphs[0].tensors]
    assert got == [[0.5, 0.25], [0.5, 0.25], [0.5, 0.125]]


def test_compacting_lays_weights_after_the_flatbuffer_on_64_byte_boundaries(tmp_path):
    """Each weight stored after the FlatBuffer starts on a 64-byte boundary and keeps its bytes."""
    from edgekit import tflite_file

    blobs = [bytes(range(100)), bytes(range(37)), b"\x07" * 5]
    tflite_file.compact(path := _tflite(tmp_path / "m.tflite", [(0, [0.5, 0.25], [0, 0])], blobs=blobs))
    raw = path.read_bytes()
    stored = [b for b in _read(path).buffers if b.offset > 1]
    assert [raw[b.offset:b.offset + b.size] for b in stored] == blobs
    assert all(b.offset % 64 == 0 for b in stored)
    assert [b.offset - stored[0].offset for b in stored] == [0, 128, 192]  # 100 bytes take two 64-byte blocks


def test_compacting_keeps_inline_data_16_byte_aligned(tmp_path):
    """Small weights kept inside the FlatBuffer stay whole and start 16-byte aligned (the schema's force_align)."""
    from edgekit import tflite_file

    inline = [b"FIRST-PAYLOAD-25-BYTES-ab", b"SECOND7", b"THIRD-PAYLOAD-OF-33-BYTES-ABCDEFG"]
    tflite_file.compact(path := _tflite(tmp_path / "m.tflite", [(0, [0.5, 0.25], [0, 0])], inline=inline))
    raw = path.read_bytes()
    assert [bytes(b.data) for b in _read(path).buffers[1:]] == inline
    assert [raw.find(data) % 16 for data in inline] == [0, 0, 0]


def test_compacting_leaves_the_tflite_schema_classes_as_it_found_them(tmp_path):
    """compact patches the schema's Pack methods only while it writes: later packing is the library's own again."""
    from ai_edge_litert import schema_py_generated as schema

    from edgekit import tflite_file

    before = (schema.QuantizationParametersT.Pack, schema.BufferT.Pack)
    tflite_file.compact(_tflite(tmp_path / "m.tflite", [(0, [0.5, 0.25], [0, 0])], blobs=[b"x" * 70]))
    assert (schema.QuantizationParametersT.Pack, schema.BufferT.Pack) == before


# predict

def _args(**kw):
    base = dict(texts=[], data=None, text_column=None, label_column=None, text_pair_column=None,
                label_separator=None, label_columns=None, out=None, format=None)
    return argparse.Namespace(**(base | kw))


def test_an_uppercase_out_suffix_picks_its_format():
    """--out P.JSONL is a JSON-lines file: the suffix is read without regard to case."""
    assert predict.out_format(_args(out="P.JSONL")) == "jsonl"
    assert predict.out_format(_args(out="p.Csv")) == "csv"


def test_texts_given_as_arguments_are_numbered_from_one():
    """The row column of --out numbers argument texts 1, 2, ... as it numbers a file's rows."""
    assert predict.texts_of(_args(texts=["a", "b"])) == [("a", None, 1), ("b", None, 2)]


def test_max_length_of_the_minimum_is_accepted(model_dir, capsys):
    """--max-length 3 (runtime.MIN_LENGTH) is accepted: the bound the error names is inclusive."""
    from edgekit import cli, runtime

    assert cli.main(["predict", str(model_dir), "a good film", "--max-length", str(runtime.MIN_LENGTH)]) == 0


def _row(text, label="pos", gold=None, n=1):
    return {"row": n, "text": text, "label": label, "prob": 0.75, "probs": {"neg": 0.25, "pos": 0.75}, "gold": gold}


def test_jsonl_and_csv_of_unlabelled_texts_have_no_gold():
    """A text without a given label has no gold key in JSON lines and the CSV has no gold column."""
    rows = [_row("a"), _row("b", n=2)]
    assert ["gold" not in json.loads(line) for line in predict.jsonl(rows).splitlines()] == [True, True]
    assert predict.table_csv(rows, ["neg", "pos"]).splitlines()[0] == "row,text,label,prob,prob_neg,prob_pos"


def test_a_multi_label_row_with_no_label_shows_none_in_the_table():
    """An empty label set reads 'none' in the printed table, not an empty cell."""
    assert "| none | 0.7500 |" in predict.markdown([_row("a", label=[])])


def test_a_text_of_exactly_the_shown_length_is_not_cut_and_a_longer_one_is_cut_to_it():
    """The table shows 100 characters whole; a longer text is cut to 100 characters, the last one '…'."""
    whole = "x" * predict.SHOWN
    assert f"| {whole} |" in predict.markdown([_row(whole)])
    cut = predict.markdown([_row("y" * 150)]).splitlines()[-1].split(" | ")[-1].rstrip(" |")
    assert cut == "y" * (predict.SHOWN - 1) + "…"


def test_a_text_with_newlines_is_one_table_row():
    """Newlines and tabs in a text are spaces in the table: one line per text."""
    table = predict.markdown([_row("one\ntwo\tthree")])
    assert table.splitlines()[-1].endswith("| one two three |") and len(table.splitlines()) == 3


def test_a_wrong_prediction_is_marked_wrong_in_the_table():
    """The gold column marks a label that differs from the prediction '(wrong)', and only that one."""
    lines = predict.markdown([_row("a", gold="neg"), _row("b", gold="pos", n=2)]).splitlines()
    assert "neg (wrong)" in lines[2] and "(wrong)" not in lines[3]


def test_a_pair_is_shown_with_sep_between_its_texts():
    """A text pair reads 'first [SEP] second' in the table."""
    assert "| premise [SEP] hypothesis |" in predict.markdown([_row(("premise", "hypothesis"))])


# gate

def test_a_model_file_without_budgets_is_a_usage_error_not_an_empty_pass(tmp_path):
    """Gating plain model files with no budget checks nothing: refused, never an empty (passing) list of rows."""
    (tmp_path / "model.onnx").write_bytes(b"\0" * 1000)
    with pytest.raises(UsageError, match="only --max-size-mb can be checked"):
        gate.check(tmp_path / "model.onnx", [])


def test_a_folder_of_tflite_files_is_sized_file_by_file(tmp_path):
    """Each .tflite export in a folder is its own row, as .onnx and .pt ones are (not one row of their sum)."""
    for name, size in (("a.tflite", 2000), ("b.tflite", 3000)):
        (tmp_path / name).write_bytes(b"\0" * size)
    rows = gate.check(tmp_path, [("size_mb", "<=", 0.0025)])
    assert [(r["artifact"], r["actual"], r["ok"]) for r in rows] == [("a.tflite", 0.002, True),
                                                                     ("b.tflite", 0.003, False)]


def test_a_folder_holding_an_edgekit_lock_is_a_run_not_model_files(tmp_path):
    """A run folder whose compress has only taken its lock is never sized as plain model files (and passed)."""
    from edgekit.errors import EdgekitError

    (tmp_path / ".lock").write_text("")
    (tmp_path / "model.onnx").write_bytes(b"\0" * 1000)
    with pytest.raises(EdgekitError, match="cannot read"):
        gate.check(tmp_path, [("size_mb", "<=", 5.0)])


def test_a_budget_both_the_recipe_and_the_target_hold_is_one_row(finished):
    """The recipe's size budget repeated among the target's own budgets is checked once, not twice."""
    from edgekit import recipe

    manifest = json.loads((finished / "manifest.json").read_text())
    op, bound = recipe.parse_bound(manifest["recipe"]["budgets"]["size_mb"])
    manifest["devices"] = {"pi4": {"kind": "ssh", "complete": True, "metrics": {},
                                   "budgets": [{"metric": "size_mb", "op": op, "target": bound}]}}
    (finished / "manifest.json").write_text(json.dumps(manifest))
    assert [(r["metric"], r["op"], r["target"]) for r in gate.check(finished, [], target="pi4")] == [
        ("size_mb", op, bound)]


def test_characters_beyond_the_basic_plane_stay_in_reports():
    """XML 1.0 allows emoji and other astral characters: they are kept, not escaped."""
    assert gate.printable("run 😀 ok\x01") == "run 😀 ok\\x01"


def test_a_teacher_score_that_rounds_to_no_right_answer_leaves_the_numbers_as_they_are():
    """A teacher accuracy that is no whole right answer over the examples is not divided by (no count to use)."""
    numbers = {"eval_examples": 10, "accuracy": 0.0, "teacher_accuracy": 0.04, "accuracy_retained": 0.0}
    assert gate.from_counts(numbers) == numbers


def test_strict_budgets_parse():
    """--budget takes the strict operators < and > as well as <= and >=."""
    assert gate.parse_budget("latency_ms_p90<5") == ("latency_ms_p90", "<", 5.0)
    assert gate.parse_budget("accuracy > 0.5") == ("accuracy", ">", 0.5)

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from edgekit import cli, compare, sweep
from edgekit.errors import EdgekitError, UsageError


def test_grid_expands_comma_values_and_keeps_lists_whole():
    assert sweep.grid(["a=1,2", "b=x"]) == [["a=1", "b=x"], ["a=2", "b=x"]]
    assert sweep.grid(["distill.layers=[1, 3]", "c=true,false"]) == [["distill.layers=[1, 3]", "c=true"],
                                                                       ["distill.layers=[1, 3]", "c=false"]]
    with pytest.raises(UsageError, match="empty value"):
        sweep.grid(["a=1,"])
    for bad in (["a=1,2", "a=3"], ["a=1,1"]):  # a=3 ran twice under the labels a=1 and a=2
        with pytest.raises(UsageError, match="repeats a key or a value"):
            sweep.grid(bad)


def test_local_sweep_shares_stages_and_marks_the_pareto_front(tiny_recipe, tmp_path, capsys):
    code = cli.main(["sweep", "--recipe", str(tiny_recipe), "--out", str(tmp_path / "sw"), "--quiet",
                     "distill.temperature=1,4", "quantize.per_channel=true,false"])
    assert code == 0
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert len(rows) == 4 and all(r["status"] == "complete" for r in rows)
    assert [r["reused_stages"] for r in rows] == [0, 3, 1, 3]  # finetune always shared; distill and export per T
    assert any(r["pareto"] for r in rows)
    assert (tmp_path / "sw" / "report" / "tradeoff.png").is_file()
    assert "| Pareto |" in capsys.readouterr().out


def test_a_failing_point_is_reported_and_the_others_still_run(model_dir, csv_file, tmp_path, capsys, monkeypatch):
    from edgekit import testing

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id: only its run can tell it is not there
    path = tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export", "evaluate")))
    assert cli.main(["sweep", "--recipe", str(path), "--out", str(tmp_path / "sw"), "--quiet",
                     f"teacher={model_dir},/nonexist"]) == 2  # a path that is not there: refused before any point
    assert "model '/nonexist': no such folder" in capsys.readouterr().err and not (tmp_path / "sw").exists()
    code = cli.main(["sweep", "--recipe", str(path), "--out", str(tmp_path / "sw"), "--quiet",
                     "budgets.size_mb=<= 100,<= 0.001", f"teacher={model_dir},someone/nonexist"])
    out, err = capsys.readouterr()
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [r["status"] for r in rows] == ["complete", "failed", "over_budget", "failed"]
    assert "someone/nonexist" in rows[1]["error"] and "| over_budget " in out
    assert "| failed: model 'someone/nonexist'" in out
    assert code == 1 and "sweep point 01-" in err and "sweep point 03-" in err  # the sweep used to stop there
    assert "| failed: model 'someone/nonexist'" in (tmp_path / "sw" / "sweep.md").read_text()
    assert cli.main(["sweep", "--recipe", str(path), "--out", str(tmp_path / "sw"), "--quiet",
                     "budgets.size_mb=<= 100,<= 0.001", f"teacher={model_dir}"]) == 3
    points = sorted(p.name for p in (tmp_path / "sw").iterdir() if p.name[:2].isdigit())
    assert len(points) == 2 and all("nonexist" not in p for p in points)  # the earlier grid's folders are gone
    base = ["sweep", "--recipe", str(path), "--quiet", "seed=1,2"]
    assert cli.main(base + ["--out", str(tmp_path / "sw"), "--ray", ""]) == 2  # ran locally without a word
    assert cli.main(base + ["--out", str(tmp_path / "sw" / points[0])]) == 2  # a compress run's folder
    assert "holds a compress run" in capsys.readouterr().err


def test_a_bad_grid_point_fails_before_anything_runs(tiny_recipe, tmp_path):
    with pytest.raises(UsageError, match="distill.temperature must be float"):
        sweep.sweep(str(tiny_recipe), ["distill.temperature=1,hot"], tmp_path / "sw")
    with pytest.raises(UsageError, match=r"layer_map \[0, 3\] does not fit: the student has 4 layers"):  # was: the
        sweep.sweep(str(tiny_recipe), ["distill.layers=every_other,all", "distill.layer_map=[0, 3]"],  # point failed
                    tmp_path / "sw")  # after the first one had run
    assert not (tmp_path / "sw").exists()


def test_unreachable_ray_is_one_line(tiny_recipe, tmp_path):
    with pytest.raises(EdgekitError, match="cannot reach a Ray cluster at 127.0.0.1:1"):
        sweep.sweep(str(tiny_recipe), ["distill.temperature=1,4"], tmp_path / "sw", ray_address="127.0.0.1:1")


@pytest.fixture
def ray_head():
    if not shutil.which("ray"):
        pytest.skip("ray is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(["ray", "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, capture_output=True)
    yield f"127.0.0.1:{port}"
    subprocess.run(["ray", "stop", "--force"], capture_output=True)


@pytest.mark.slow
def test_sweep_on_a_local_ray_cluster_matches_the_local_sweep(tiny_recipe, tmp_path, ray_head):
    import ray

    remote = sweep.sweep(str(tiny_recipe), ["distill.temperature=1,4"], tmp_path / "ray", ray_address=ray_head)
    assert not ray.is_initialized()  # disconnected: an attached driver exits pytest (code 1) once the cluster stops
    local = sweep.sweep(str(tiny_recipe), ["distill.temperature=1,4"], tmp_path / "local", progress=False)
    assert [r["accuracy"] for r in remote["rows"]] == [r["accuracy"] for r in local["rows"]]
    assert [r["size_mb"] for r in remote["rows"]] == [r["size_mb"] for r in local["rows"]]
    assert remote["rows"][1]["reused_stages"] >= 1


def test_compare_table_for_a_folder_and_a_config(model_dir, tmp_path, capsys):
    config = model_dir / "config.json"
    code = cli.main(["compare", str(model_dir), str(config), "--out", str(tmp_path / "cmp")])
    assert code == 0
    rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [r["model"] for r in rows] == [str(model_dir), str(config)]
    for r in rows:
        assert r["size_int8_mb"] <= r["size_fp32_mb"] and r["latency_ms_b1_int8"] > 0 and r["latency_ms_b32_int8"] > 0
        assert r["rss_after_load_mb_int8"] > 10 and "accuracy" not in r
    assert rows[0]["params_m"] == rows[1]["params_m"]
    assert (tmp_path / "cmp" / "compare.csv").read_text().startswith("model,params_m,size_fp32_mb")
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["compare.csv", "compare.json", "compare.md",
                                                                     "compare.png"]  # was models/: 335 MB per base model


def test_family_configs_have_their_published_sizes():
    import torch

    expected = {"bert-base": 109.5, "roberta-base": 124.6, "xlm-roberta-base": 278.0, "albert-base": 11.7, "distilbert-base": 67.0,
                "electra-base": 109.5, "deberta-v3-base": 184.4, "modernbert-base": 149.0}  # ModernBERT's paper: 149M
    with torch.device("meta"):  # shapes only: no memory, no time
        for name, params in expected.items():
            model, _ = compare.build(name)
            assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(params, rel=0.01), name
    assert set(compare.FAMILIES) == set(expected) - {"xlm-roberta-base", "deberta-v3-base", "modernbert-base"}
    assert set(expected) == set(compare.FAMILY_CONFIGS)


def test_compare_needs_models(tmp_path):
    with pytest.raises(EdgekitError, match="compare needs models"):
        compare.run([], tmp_path)


def test_compare_cuts_accuracy_inputs_where_it_measures_latency(tmp_path, monkeypatch):
    from transformers import AutoConfig

    from edgekit import runtime, testing

    folder = testing.make_model_dir(tmp_path / "task")
    config = AutoConfig.from_pretrained(folder)
    config.id2label, config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    config.save_pretrained(folder)
    seen = []

    class Recording(runtime.HFModel):
        def __init__(self, path, threads=0, max_length=0):
            super().__init__(path, threads, max_length)
            seen.append(self.max_length)

    monkeypatch.setattr(runtime, "HFModel", Recording)
    from edgekit import data
    from edgekit.stages import evaluate
    scored, predictions = [], evaluate.predictions
    monkeypatch.setattr(evaluate, "predictions", lambda model, examples, *a: scored.append(len(examples)) or
                        predictions(model, examples, *a))
    csv_file = testing.make_csv(tmp_path / "d.csv", n=6000)
    rows = compare.run([str(folder)], tmp_path / "cmp", str(csv_file), seq_len=16)
    assert seen == [16] and 0 <= rows[0]["accuracy"] <= 1  # the model's own limit is 512
    assert scored == [len(data.load(str(csv_file)).test)] and scored[0] > 500  # the whole split (it took 500)
    with pytest.raises(EdgekitError, match="--seq-len 1: give a sequence length in \\[2, 512\\]"):
        compare.run([str(folder)], tmp_path / "cmp", seq_len=1)


def test_compare_checks_every_model_first_and_says_what_it_measured(model_dir, csv_file, tmp_path, capsys,
                                                                    monkeypatch):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.md").write_text("an earlier call's table")
    measured = []
    monkeypatch.setattr(compare, "measure", lambda spec, *a, **k: measured.append(spec))
    for specs, seq_len, error, message in (
            ([str(model_dir), str(tmp_path / "typo")], 128, UsageError, "no such folder"),
            ([str(model_dir)], 200, UsageError, "--seq-len 200 is longer than .* takes \\(128 tokens\\)")):
        with pytest.raises(error, match=message):
            compare.run(specs, out, seq_len=seq_len)
    assert measured == [] and (out / "compare.md").read_text() == "an earlier call's table"  # nothing ran
    monkeypatch.undo()
    assert cli.main(["compare", str(model_dir), "--data", str(csv_file), "--seq-len", "16", "--out", str(out)]) == 0
    assert "warning: no accuracy for " in capsys.readouterr().err  # LABEL_0/LABEL_1 against neg/pos: said, once
    row = json.loads((out / "compare.json").read_text())[0]
    assert row["params_m"] > 0 and 0 < row["size_int8_mb"] < row["size_fp32_mb"] < 0.5  # a 0.3 MB model: not 0.0
    assert "0.0 |" not in (out / "compare.md").read_text().split("\n")[2]
    out.joinpath("compare.png").unlink()
    compare.run([str(model_dir)], out, seq_len=16)  # a call that stops would leave no earlier table behind
    assert (out / "compare.png").is_file()


def test_compare_quiet_draws_no_progress_bar(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(compare, "measure", lambda spec, *a, **k: {"model": spec})
    monkeypatch.setattr(compare, "write", lambda *a, **k: None)
    assert cli.main(["compare", str(model_dir), "--out", str(tmp_path / "cmp")]) == 0
    assert "compare: 100%" in capsys.readouterr().err  # the bar, without --quiet
    assert cli.main(["compare", str(model_dir), "--out", str(tmp_path / "cmp"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_compare_says_what_it_takes_for_a_file_or_folder_it_cannot_build(model_dir, tmp_path, capsys):
    from edgekit.pipeline import model_assets

    onnx = tmp_path / "run" / "04-quantize" / "model.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"an exported model")
    for spec, what in ((onnx, "is a file"), (onnx.parent, "is a folder without config.json")):
        assert cli.main(["compare", str(model_dir), str(spec), "--out", str(tmp_path / "cmp")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{spec} {what}, not a model compare can build; compare takes model assets " \
            f"({', '.join(model_assets())}), transformers model folders (with config.json), config.json files, base " \
            f"shapes ({', '.join(compare.FAMILY_CONFIGS)}) or hub ids" in err, err
    assert not (tmp_path / "cmp").exists()  # found before anything was measured


def test_compare_reads_a_files_own_columns_names_a_runs_models_and_every_file_it_wrote(model_dir, tmp_path, capsys,
                                                                                      monkeypatch):
    """Its column error said `set data.text_column`, an option compare did not have; a run folder was 'a folder
    without config.json'; `written:` left out compare.json."""
    from edgekit import testing

    theirs = tmp_path / "mine.csv"
    rows = testing.make_csv(tmp_path / "d.csv").read_text().replace("text,label", "tweet,sentiment", 1)
    theirs.write_text(rows)
    with pytest.raises(UsageError, match="has no column 'text'; columns: 'tweet', 'sentiment'; set --text-column "):
        compare.run([str(model_dir)], tmp_path / "cmp", str(theirs))
    monkeypatch.setattr(compare, "measure", lambda spec, out, data, *a: {"model": spec, "examples": len(data.test)})
    monkeypatch.setattr(compare, "write", lambda *a, **k: None)
    assert cli.main(["compare", str(model_dir), "--data", str(theirs), "--text-column", "tweet", "--label-column",
                     "sentiment", "--out", str(tmp_path / "cmp"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"written: {tmp_path / 'cmp' / 'compare.md'}, compare.csv, compare.json, compare.png" in out
    run = tmp_path / "run"
    shutil.copytree(model_dir, run / "02-prune" / "model")
    (run / "manifest.json").write_text("{}")
    assert cli.main(["compare", str(run), "--out", str(tmp_path / "cmp")]) == 2
    assert f"{run} is an edgekit run, not a model; compare measures transformers folders as they are: give one of " \
        f"its stages' models ({run / '02-prune' / 'model'}); the run's exported files are measured by edgekit bench " \
        f"{run} --model FILE" in capsys.readouterr().err
    assert cli.main(["compare", str(run / "02-prune"), "--out", str(tmp_path / "cmp")]) == 2
    assert f"{run / '02-prune'} is a run's stage folder, not a model; give the model it holds: " \
        f"{run / '02-prune' / 'model'}" in capsys.readouterr().err


def test_compare_chart_says_the_sequence_length_and_threads(tmp_path, monkeypatch):
    from edgekit import report

    labels = []
    plt = report.pyplot()
    monkeypatch.setattr(plt.Axes, "set_xlabel", lambda ax, text, *a, **k: labels.append(text))
    row = dict.fromkeys(compare.COLUMNS, 1.0) | {"model": "m"}
    compare.chart([row], tmp_path / "c.png", seq_len=16, threads=2)
    assert "latency p50, batch 1, 16 tokens, 2 threads (ms)" in labels
    ticks = []
    monkeypatch.setattr(plt.Axes, "set_yticks", lambda ax, where, names=None, **k: ticks.append(names))
    long = "/home/someone/projects/classifiers/artifacts/run-2026-12-07/01-finetune/model"
    compare.chart([row, dict(row, model=long)], tmp_path / "c.png")
    assert ticks[0] == ["m", "…/01-finetune/model"]  # the whole path shrank both panels to slivers


def test_a_sweep_says_what_looks_wrong_in_its_data_once(model_dir, csv_file, tmp_path, capsys):
    from edgekit import testing

    rare = tmp_path / "rare.csv"  # one row of a third class: a typo, most likely
    rare.write_text(csv_file.read_text() + "an odd one out,neh\n")
    path = tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(model_dir, rare, stages=("finetune", "export", "evaluate")))
    assert cli.main(["sweep", "--recipe", str(path), "--out", str(tmp_path / "sw"), "--quiet",
                     "budgets.size_mb=<= 100,<= 90,<= 80"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: class 'neh' has 1 row") == 1, err


def test_a_sweep_removes_only_the_point_folders_sweeps_made(model_dir, csv_file, tmp_path, monkeypatch):
    from edgekit import pipeline, testing

    path = tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("finetune", "export", "evaluate")))
    out = tmp_path / "sw"
    (out / "01-baseline").mkdir(parents=True)  # the user's own folders, named like points
    (out / "02-notes").mkdir()
    (out / "02-notes" / "todo.txt").write_text("important")
    real = pipeline.run

    def flaky(recipe, folder, *args, **kwargs):  # a library's own error in one point, not an EdgekitError
        if recipe["seed"] == 2:
            raise RuntimeError("boom")
        return real(recipe, folder, *args, **kwargs)

    monkeypatch.setattr(pipeline, "run", flaky)
    result = sweep.sweep(str(path), ["seed=1,2,3"], out, progress=False)
    assert [r["status"] for r in result["rows"]] == ["complete", "failed", "complete"]  # the third still ran
    assert result["rows"][1]["error"] == "unexpected RuntimeError: boom"
    sweep.sweep(str(path), ["seed=4"], out, progress=False)  # another grid: the first one's points go
    names = sorted(p.name for p in out.iterdir() if p.name[:2].isdigit())
    assert names == ["00-seed=4", "01-baseline", "02-notes"], names
    assert (out / "02-notes" / "todo.txt").read_text() == "important"
    last = json.loads((out / "00-seed=4" / "manifest.json").read_text())  # shared/ keeps what the grid uses (it
    assert sorted(p.name for p in (out / "shared").iterdir()) == sorted(s["key"] for s in last["stages"])  # only grew)


def test_a_sweep_has_a_row_per_artifact_and_sweeps_lists(model_dir, csv_file, tmp_path):
    from edgekit import report, testing

    path = tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("finetune", "export", "evaluate", "bench")))
    result = sweep.sweep(str(path), ["export.format=[onnx],[onnx, torchscript]"], tmp_path / "sw", progress=False)
    rows = result["rows"]
    assert [(r["run"][:2], r["artifact"].split("/")[1]) for r in rows] == [
        ("00", "model.onnx"), ("01", "onnx"), ("01", "torchscript")]
    pts = [(i, r["accuracy"], r["latency_ms_p50"]) for i, r in enumerate(rows)]
    assert [r["pareto"] for r in rows] == [i in {p[0] for p in report.pareto(pts)} for i in range(3)]
    assert "| 01-export.format=-onnx--torchscript- | 02-export/torchscript/model.pt |" in result["table"]


def test_an_unreachable_ray_cluster_writes_nothing(tiny_recipe, tmp_path):
    with pytest.raises(EdgekitError, match="cannot reach a Ray cluster"):
        sweep.sweep(str(tiny_recipe), ["seed=1,2"], tmp_path / "sw", ray_address="127.0.0.1:1", progress=False)
    assert not (tmp_path / "sw").exists()


def test_a_local_sweep_shows_each_points_stages(model_dir, csv_file, tmp_path, capsys):
    """Was: one 'sweep i/N' bar that moved once per point, and nothing inside a point (minutes each on a real recipe)."""
    from edgekit import testing

    path = tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export", "evaluate")))
    sweep.sweep(str(path), ["seed=1,2"], tmp_path / "sw", progress=True)
    err = capsys.readouterr().err
    assert "sweep point 1/2: 00-seed=1" in err and "sweep point 2/2: 01-seed=2" in err
    assert err.count("[1/2] export") == 2 and err.count("[2/2] evaluate") == 2


def test_compare_refuses_an_unsupported_family_first_and_a_config_transformers_cannot_build_in_one_line(
        model_dir, tmp_path, capsys):
    """Both ended in an 85-line traceback: a GPT-2 config.json inside the ONNX export, a BERT config of hidden size 8
    over 3 heads inside transformers' model constructor."""
    (tmp_path / "gpt2.json").write_text('{"model_type": "gpt2", "n_layer": 1}')
    (tmp_path / "odd.json").write_text('{"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 8, '
                                       '"num_attention_heads": 3}')
    assert cli.main(["compare", str(model_dir), str(tmp_path / "gpt2.json"), "--out", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"edgekit: error: {tmp_path / 'gpt2.json'}: model type 'gpt2' is not supported")
    assert err.count("\n") == 1 and not (tmp_path / "c").exists()  # before the first model was measured
    assert cli.main(["compare", str(model_dir), str(tmp_path / "odd.json"), "--out", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err  # said before the first model was measured (it was after it)
    assert not (tmp_path / "c").exists()
    assert err.startswith(f"edgekit: error: {tmp_path / 'odd.json'}: transformers cannot build this model "
                          f"(ValueError: ") and err.endswith("); fix its config.json or give another model\n")
    assert err.count("\n") == 1 and "(8)" in err  # transformers' own words, whatever they are


def test_earlier_points_are_only_point_folder_names_never_other_paths(tmp_path):
    """The names listed are removed with rmtree: an edited or foreign list must not name report/, shared/ or a path
    outside OUT."""
    (tmp_path / sweep.POINTS).write_text(json.dumps(["01-seed=1", "report", "../elsewhere", "shared", "02-a/b"]))
    assert sweep.earlier_points(tmp_path) == {"01-seed=1"}
    (tmp_path / sweep.POINTS).unlink()
    (tmp_path / "sweep.json").write_text(json.dumps([{"run": "00-x"}, {"run": ".."}, {"run": "03-..\\x"}]))
    assert sweep.earlier_points(tmp_path) == {"00-x"}  # a sweep from before the list was kept


def test_the_sweep_report_leaves_failed_points_out(tmp_path, monkeypatch):
    from edgekit import report

    built = []
    monkeypatch.setattr(report, "build", lambda dirs, out: built.append(dirs))
    ok = {"status": "complete", "stages": [], "final": {"metrics": {"accuracy": 0.8, "latency_ms_p50": 2.0,
                                                                     "size_mb": 1.0}}}
    failed = {"status": "failed", "error": "boom", "stages": [], "final": {"metrics": {}}}
    result = sweep.summarize([{"seed": 1}, {"seed": 2}], [tmp_path / "00-seed=1", tmp_path / "01-seed=2"],
                             [ok, failed], tmp_path)
    assert built == [[str(tmp_path / "00-seed=1")]] and [r["pareto"] for r in result["rows"]] == [True, False]
    assert "| 01-seed=2 |" in result["table"] and "failed: boom" in result["table"]


def test_compare_puts_each_measurement_in_its_own_column(model_dir, tmp_path, monkeypatch):
    """The FP32 column showing INT8's latency passed the suite (it checked only that numbers were there)."""
    from edgekit.stages import bench

    def measure(path, batch, **kw):
        p50 = {("fp32.onnx", 1): 10.0, ("int8.onnx", 1): 5.0, ("int8.onnx", 32): 7.0}[(Path(path).name, batch)]
        return {"fixed": {"p50": p50}, "rss_after_load_mb": 100.0 if Path(path).name == "int8.onnx" else 300.0}

    monkeypatch.setattr(bench, "measure", measure)
    row = compare.measure(str(model_dir), tmp_path / "work", seq_len=16)
    assert (row["latency_ms_b1_fp32"], row["latency_ms_b1_int8"], row["latency_ms_b32_int8"],
            row["rss_after_load_mb_int8"]) == (10.0, 5.0, 7.0, 100.0)


def test_compare_takes_every_sequence_length_it_says_it_takes(model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "check", lambda *a: None)
    monkeypatch.setattr(compare, "measure", lambda spec, *a, **k: {"model": spec})
    monkeypatch.setattr(compare, "write", lambda *a, **k: None)
    assert compare.run(["bert-base"], tmp_path / "c", seq_len=512, progress=False) == [{"model": "bert-base"}]
    with pytest.raises(UsageError, match="--seq-len 513: give a sequence length in \\[2, 512\\]"):
        compare.run(["bert-base"], tmp_path / "c", seq_len=513, progress=False)

import json
import shutil
import socket
import subprocess

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


def test_a_failing_point_is_reported_and_the_others_still_run(model_dir, csv_file, tmp_path, capsys):
    from edgekit import testing

    path = tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file, stages=("export", "evaluate")))
    code = cli.main(["sweep", "--recipe", str(path), "--out", str(tmp_path / "sw"), "--quiet",
                     "budgets.size_mb=<= 100,<= 0.001", f"teacher={model_dir},/nonexist"])
    out, err = capsys.readouterr()
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [r["status"] for r in rows] == ["complete", "failed", "over_budget", "failed"]
    assert "/nonexist" in rows[1]["error"] and "| over_budget |" in out and "| failed: model '/nonexist'" in out
    assert code == 1 and "sweep point 01-" in err and "sweep point 03-" in err  # the sweep used to stop there
    assert "| failed: model '/nonexist'" in (tmp_path / "sw" / "sweep.md").read_text()
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


def test_family_configs_have_their_published_sizes():
    import torch

    expected = {"bert-base": 109.5, "roberta-base": 124.6, "albert-base": 11.7, "distilbert-base": 67.0,
                "electra-base": 109.5}
    with torch.device("meta"):  # shapes only: no memory, no time
        for name, params in expected.items():
            model, _ = compare.build(name)
            assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(params, rel=0.01), name


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
    rows = compare.run([str(folder)], tmp_path / "cmp", str(testing.make_csv(tmp_path / "d.csv")), seq_len=16)
    assert seen == [16] and 0 <= rows[0]["accuracy"] <= 1  # the model's own limit is 512
    with pytest.raises(EdgekitError, match="--seq-len 1: give a sequence length in \\[2, 512\\]"):
        compare.run([str(folder)], tmp_path / "cmp", seq_len=1)


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

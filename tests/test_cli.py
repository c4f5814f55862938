import subprocess
import sys

from edgekit import cli


def edgekit(*args):
    return subprocess.run([sys.executable, "-m", "edgekit.cli", *args], capture_output=True, text=True)


def test_recipes_list_and_show():
    listed = edgekit("recipes")
    assert listed.returncode == 0 and listed.stdout.startswith("distilbert-int8")
    shown = edgekit("recipes", "show", "distilbert-int8")
    assert shown.returncode == 0 and "stages: [finetune, distill" in shown.stdout


def test_dry_run_prints_the_resolved_recipe():
    done = edgekit("compress", "--dry-run", "distill.epochs=1", "--teacher", "mpnet-base")
    assert done.returncode == 0
    assert "teacher: mpnet-base" in done.stdout and "epochs: 1" in done.stdout


def test_usage_errors_exit_2_with_one_line():
    for args in (["compress", "--recipe", "nope"], ["compress", "--dry-run", "distill.epoch=3"], ["frobnicate"]):
        done = edgekit(*args)
        assert done.returncode == 2, args
        assert len(done.stderr.strip().splitlines()) <= 3 and "Traceback" not in done.stderr


def test_errors_of_ranks_after_the_first_say_which_rank(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, prefix in (("1", "edgekit: error (rank 1): "), ("0", "edgekit: error: ")):
        monkeypatch.setenv("RANK", rank)
        assert cli.main(["compress", "--recipe", "nope"]) == 2
        assert capsys.readouterr().err.startswith(prefix)


def test_runtime_errors_exit_1_and_verbose_shows_the_traceback(tmp_path):
    args = ["compress", "--data", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o")]
    done = edgekit(*args)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "missing.csv not found" in done.stderr
    assert not (tmp_path / "o").exists()
    verbose = edgekit("-v", *args)
    assert "Traceback" in verbose.stderr


def test_over_budget_exits_3(tiny_recipe, tmp_path, capsys):
    code = cli.main(["compress", "--recipe", str(tiny_recipe), "--out", str(tmp_path / "r"), "--quiet",
                     "budgets.size_mb=<= 0.0001"])
    out = capsys.readouterr().out
    assert code == 3 and "OVER BUDGET" in out and "| quantize |" in out


def test_assets_list():
    done = edgekit("assets")
    assert done.returncode == 0
    assert all(name in done.stdout for name in ("minilm-l6", "mpnet-base", "rt-polarity"))

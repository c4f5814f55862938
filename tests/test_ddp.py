"""finetune and distill under `torchrun --nproc_per_node 2` (gloo, CPU) end where a single process with the same
total batch ends. Dropout is off, so the only differences are the order of float sums and, for token-averaged
losses, that each rank averages over its own tokens. Run as a script, this file is the torchrun worker."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit import data, families, testing
from edgekit.artifact import Artifact
from edgekit.pipeline import Context

SETTINGS = {"finetune": dict(epochs=2, lr=3e-3, batch_size=16, checkpoint_every=5),
            "distill": dict(epochs=2, lr=3e-3, batch_size=16, checkpoint_every=5, hidden=1.0)}


def stage(name: str, model_dir: Path, csv_file: Path, out: Path):
    from edgekit import stages

    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)
    return stages.entry(name)(Artifact(model_dir, "hf"), out, ctx, **SETTINGS[name])


def no_dropout_model(path: Path) -> Path:
    testing.make_model_dir(path)
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("name, tolerance", [("finetune", 1e-4), ("distill", 1e-3)])
def test_two_cpu_processes_match_one(tmp_path, name, tolerance):
    model_dir, csv_file = no_dropout_model(tmp_path / "m"), testing.make_csv(tmp_path / "r.csv")
    single = stage(name, model_dir, csv_file, tmp_path / "single")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
           name, str(model_dir), str(csv_file), str(tmp_path / "ddp")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    a = families.load_model(single.path).state_dict()
    b = families.load_model(tmp_path / "ddp" / "model").state_dict()
    moved = max((a[k] - families.load_model(model_dir).state_dict()[k]).abs().max().item() for k in a
                if k in families.load_model(model_dir).state_dict() and a[k].shape ==
                families.load_model(model_dir).state_dict()[k].shape)
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff < tolerance < moved, (diff, moved)  # training moved the weights far more than the runs differ
    assert json.loads((tmp_path / "ddp" / "loss.json").read_text())["rank0_only"]


def test_compress_under_torchrun_trains_on_every_rank_and_reports_once(tmp_path):
    """The whole pipeline under torchrun: rank 0 owns the folder and the report, the training stages run on both
    ranks and end where one process ends; a second run reuses every stage (the other rank is released at once)."""
    from edgekit import cli

    model_dir, csv_file = no_dropout_model(tmp_path / "m"), testing.make_csv(tmp_path / "r.csv")
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(testing.tiny_recipe(model_dir, csv_file, ("finetune", "distill", "prune", "export", "evaluate")))
    assert cli.main(["compress", "--recipe", str(recipe), "--out", str(tmp_path / "single"), "--quiet"]) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "edgekit.cli", "compress", "--recipe", str(recipe), "--out", str(tmp_path / "ddp"), "--quiet"]
    for attempt in ("first", "again"):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.count("manifest:") == 1, done.stdout  # one report, from rank 0
        manifest = json.loads((tmp_path / "ddp" / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert [s["reused"] for s in manifest["stages"]] == [attempt == "again"] * 5
        assert [s["metrics"].get("processes") for s in manifest["stages"]] == [2, 2, 2, None, None]
    assert not list((tmp_path / "ddp").glob("*.partial"))
    single, ddp = (families.load_model(tmp_path / run / "02-distill" / "model") for run in ("single", "ddp"))
    a, b = single.state_dict(), ddp.state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-3
    pruned = families.load_model(tmp_path / "ddp" / "03-prune" / "model")
    assert pruned.num_parameters() < ddp.num_parameters()
    (tmp_path / "a-file").write_text("")
    done = subprocess.run(cmd[:-2] + [str(tmp_path / "a-file"), "--quiet"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "edgekit: error: --out" in done.stderr  # rank 0's one line; no rank left waiting


if __name__ == "__main__":
    import torch.distributed as dist

    from edgekit import training

    name, model_dir, csv_file, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    result = stage(name, model_dir, csv_file, out)
    rank, world = training.distributed()
    assert world == 2
    if rank == 0:
        (out / "loss.json").write_text(json.dumps({"rank0_only": (out / "model").is_dir(), **result.metrics}))
    dist.destroy_process_group()

import shutil

import pytest
import torch
import torch.nn.functional as F

from edgekit import data, families, training
from edgekit.errors import EdgekitError


class Stop(Exception):
    pass


def setup(model_dir, csv_file):
    model = families.load_model(model_dir, labels=["neg", "pos"])
    tok = families.load_tokenizer(model_dir)
    encoded = data.encode(tok, data.load(str(csv_file)).train, 32)
    return model, encoded


def loss(model, batch):
    return F.cross_entropy(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                           batch["labels"])


def fit(model, encoded, out, loss_fn=loss, every=4, epochs=4, extra_params=()):
    return training.train(model, encoded, loss_fn, out_dir=out, epochs=epochs, lr=3e-3, batch_size=16, warmup=0.1,
                          weight_decay=0.01, checkpoint_every=every, seed=3, pad_id=0, desc="t", progress=False,
                          extra_params=extra_params)


def counting(calls: dict):
    def counted(m, b):
        calls["n"] = calls.get("n", 0) + 1
        return loss(m, b)
    return counted


@pytest.mark.parametrize("dies_at", [10, 30])  # 12 steps an epoch: 30 resumes in the third, with its own shuffle
def test_a_killed_run_resumes_from_its_checkpoint_and_ends_where_an_uninterrupted_one_ends(model_dir, csv_file, tmp_path,
                                                                                            dies_at):
    straight, encoded = setup(model_dir, csv_file)
    fit(straight, encoded, tmp_path / "a")

    resumed, _ = setup(model_dir, csv_file)
    calls = {"n": 0}

    def dies(model, batch):
        calls["n"] += 1
        if calls["n"] == dies_at:
            raise Stop
        return loss(model, batch)

    with pytest.raises(Stop):
        fit(resumed, encoded, tmp_path / "b", dies)
    assert (tmp_path / "b" / "checkpoint" / "model.safetensors").is_file()
    fresh, _ = setup(model_dir, csv_file)  # a new process would start from the original weights
    fit(fresh, encoded, tmp_path / "b")
    a, b = straight.state_dict(), fresh.state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_training_reduces_the_loss(model_dir, csv_file, tmp_path):
    model, encoded = setup(model_dir, csv_file)
    batch = next(data.batches(encoded, 64, 0))
    before = loss(model, batch).item()
    fit(model, encoded, tmp_path / "a")
    with torch.no_grad():
        assert loss(model, batch).item() < before


@pytest.mark.parametrize("batch_size, rows", [(-3, None), (0, None), (16, 0)])
def test_no_batches_is_an_error_not_an_endless_loop(model_dir, csv_file, tmp_path, batch_size, rows):
    model, encoded = setup(model_dir, csv_file)  # batch_size -3 used to spin at 100% CPU forever
    with pytest.raises(EdgekitError, match="t: nothing to train on"):
        training.train(model, encoded[:rows], loss, out_dir=tmp_path, epochs=1, lr=1e-3, batch_size=batch_size,
                       warmup=0.1, weight_decay=0.0, checkpoint_every=0, seed=0, pad_id=0, desc="t", progress=False)


def test_a_corrupt_checkpoint_is_a_clear_error(model_dir, csv_file, tmp_path):
    model, encoded = setup(model_dir, csv_file)
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(EdgekitError, match="checkpoint .* is unreadable"):
        fit(model, encoded, tmp_path)


def test_the_end_checkpoint_makes_a_rerun_a_no_op_with_the_same_loss(model_dir, csv_file, tmp_path):
    model, encoded = setup(model_dir, csv_file)
    first = fit(model, encoded, tmp_path)
    assert (tmp_path / "checkpoint" / "state.pt").is_file()
    again, _ = setup(model_dir, csv_file)
    calls = {"n": 0}

    def counted(m, b):
        calls["n"] += 1
        return loss(m, b)

    assert fit(again, encoded, tmp_path, counted) == first and calls["n"] == 0
    a, b = model.state_dict(), again.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_of_another_architecture_is_a_clear_error(model_dir, csv_file, tmp_path):
    from edgekit import testing

    model, encoded = setup(model_dir, csv_file)
    fit(model, encoded, tmp_path)
    deeper = families.load_model(testing.make_model_dir(tmp_path / "deep", layers=5), labels=["neg", "pos"])
    with pytest.raises(EdgekitError, match="from another architecture .*it has no bert.encoder.layer.4"):
        fit(deeper, encoded, tmp_path)


@pytest.mark.parametrize("where", ["state_dict", "save_file", "torch.save", "between the renames"])
def test_a_stop_anywhere_in_a_checkpoint_save_keeps_the_last_whole_one_and_no_temp(model_dir, csv_file, tmp_path,
                                                                                    monkeypatch, where):
    model, _ = setup(model_dir, csv_file)  # a SIGTERM comes between any two lines; CI once caught checkpoint.tmp left
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    ckpt = tmp_path / "run" / "checkpoint"
    training._save(ckpt, model, optimizer, scheduler, 4, ())

    def stop(*a, **k):
        raise KeyboardInterrupt

    if where == "state_dict":
        monkeypatch.setattr(model, "state_dict", stop)
    elif where == "save_file":
        monkeypatch.setattr(training, "save_file", stop)
    elif where == "torch.save":
        monkeypatch.setattr(training.torch, "save", stop)
    else:
        replace, calls = training.os.replace, []

        def second_rename_stops(src, dst):
            calls.append(src)
            if len(calls) == 2:
                raise KeyboardInterrupt
            replace(src, dst)
        monkeypatch.setattr(training.os, "replace", second_rename_stops)
    with pytest.raises(KeyboardInterrupt):
        training._save(ckpt, model, optimizer, scheduler, 8, ())
    monkeypatch.undo()
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["checkpoint"]
    assert training._resume(ckpt, model, optimizer, scheduler, ())[0] == 4


def test_a_kill_between_the_renames_resumes_from_the_old_checkpoint(model_dir, csv_file, tmp_path):
    model, encoded = setup(model_dir, csv_file)
    fit(model, encoded, tmp_path / "run")  # SIGKILL leaves checkpoint.old and no checkpoint: the next run finds it
    (tmp_path / "run" / "checkpoint").rename(tmp_path / "run" / "checkpoint.old")
    fresh, _ = setup(model_dir, csv_file)
    steps = []
    fit(fresh, encoded, tmp_path / "run", lambda m, b: steps.append(1) or loss(m, b))
    assert not steps  # the end checkpoint, found: nothing re-trained (it started over before)
    a, b = model.state_dict(), fresh.state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    assert not (tmp_path / "run" / "checkpoint.old").exists()


def test_one_epoch_trains_on_every_example_once(model_dir, csv_file, tmp_path):
    model, encoded = setup(model_dir, csv_file)
    seen = []
    fit(model, encoded, tmp_path, lambda m, b: seen.extend(b["index"]) or loss(m, b), every=0, epochs=1)
    assert sorted(seen) == list(range(len(encoded)))  # a fresh run skipped nothing as "done before the resume"


def test_the_end_checkpoint_is_written_when_the_interval_does_not_divide_the_steps(model_dir, csv_file, tmp_path):
    model, encoded = setup(model_dir, csv_file)
    fit(model, encoded, tmp_path, every=5)  # 48 steps: the last interval checkpoint is at 45
    calls = {}
    fit(setup(model_dir, csv_file)[0], encoded, tmp_path, counting(calls), every=5)
    assert calls.get("n", 0) == 0


def test_a_stop_while_the_old_checkpoint_is_deleted_resumes_from_the_new_one(model_dir, csv_file, tmp_path):
    model, encoded = setup(model_dir, csv_file)
    run = tmp_path / "run"
    fit(model, encoded, run)
    shutil.copytree(run / "checkpoint", run / "checkpoint.old")  # the swap's delete, stopped halfway
    calls = {}
    fit(setup(model_dir, csv_file)[0], encoded, run, counting(calls))
    assert calls.get("n", 0) == 0 and not (run / "checkpoint.old").exists()
    fit(model, encoded, run, epochs=5)  # and the next save swaps again
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint"]


def test_a_temp_folder_a_kill_left_does_not_stop_the_next_run(model_dir, csv_file, tmp_path):
    model, encoded = setup(model_dir, csv_file)
    run = tmp_path / "run"
    (run / "checkpoint.tmp").mkdir(parents=True)
    (run / "checkpoint.tmp" / "model.safetensors").write_text("half written")  # SIGKILL during a save
    fit(model, encoded, run, epochs=1)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint"]


def test_a_checkpoint_with_other_loss_projections_is_a_clear_error(model_dir, csv_file, tmp_path):
    model, encoded = setup(model_dir, csv_file)
    fit(model, encoded, tmp_path, epochs=1, extra_params=[torch.nn.Parameter(torch.zeros(4, 8))])
    with pytest.raises(EdgekitError, match="holds other loss projections than this stage's settings make"):
        fit(model, encoded, tmp_path, epochs=2, extra_params=[torch.nn.Parameter(torch.zeros(4, 16))])

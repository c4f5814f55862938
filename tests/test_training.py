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


def fit(model, encoded, out, loss_fn=loss):
    return training.train(model, encoded, loss_fn, out_dir=out, epochs=4, lr=3e-3, batch_size=16, warmup=0.1,
                          weight_decay=0.01, checkpoint_every=4, seed=3, pad_id=0, desc="t", progress=False)


def test_a_killed_run_resumes_from_its_checkpoint_and_ends_where_an_uninterrupted_one_ends(model_dir, csv_file, tmp_path):
    straight, encoded = setup(model_dir, csv_file)
    fit(straight, encoded, tmp_path / "a")

    resumed, _ = setup(model_dir, csv_file)
    calls = {"n": 0}

    def dies_at_step_10(model, batch):
        calls["n"] += 1
        if calls["n"] == 10:
            raise Stop
        return loss(model, batch)

    with pytest.raises(Stop):
        fit(resumed, encoded, tmp_path / "b", dies_at_step_10)
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

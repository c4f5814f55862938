"""Unlabelled transfer sets in distillation and prune recovery: KD on general text, no cross-entropy on it."""
import csv
import math

import pytest
import torch
import torch.nn.functional as F

from edgekit import assets, data, families, training
from edgekit.artifact import Artifact
from edgekit.errors import EdgekitError
from edgekit.pipeline import Context
from edgekit.stages import distill, prune


@pytest.fixture
def ctx(model_dir, csv_file):
    return Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "general.txt"
    path.write_text("\n".join(f"general sentence number {i} about nothing" for i in range(50)) + "\n\n  \n")
    return path


def test_unlabelled_texts_are_sampled_deduplicated_and_never_eval_sentences(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("A good film\n a  GOOD film \n\nheld out\nthird one\nfourth one\nfifth one\n")
    rows = data.unlabelled(str(path), 10, seed=0, exclude=["Held  Out"])
    assert sorted(t for t, _ in rows) == ["A good film", "fifth one", "fourth one", "third one"]
    assert all(y == data.UNLABELLED for _, y in rows)
    assert data.unlabelled(str(path), 10, seed=0, exclude=["held out"]) == rows  # seeded
    assert len(data.unlabelled(str(path), 2, seed=0)) == 2
    orders = {tuple(data.unlabelled(str(path), 10, seed=s)) for s in range(6)}
    assert len(orders) > 1  # the seed picks the sample


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing.txt", "is not tweets-3class nor a local .txt file"),
    (lambda p: (p / "a.csv").write_text("text\nhello\n") and p / "a.csv", "nor a local .txt file"),
    (lambda p: (p / "b.txt").write_bytes(b"\xff\xfe bad") and p / "b.txt", "is not UTF-8 text"),
    (lambda p: (p / "c.txt").write_text("same\n") and p / "c.txt", "has no text that is not already in the run"),
])
def test_bad_transfer_sources_are_one_line(tmp_path, make, message):
    with pytest.raises(EdgekitError, match=message):
        data.unlabelled(str(make(tmp_path)), 10, exclude=["same"])


def test_tweets_asset_is_a_three_class_dataset_and_a_transfer_source(tmp_path, monkeypatch):
    path = tmp_path / "tweets.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sentiment", "confidence", "text"])
        for i in range(60):
            w.writerow([("negative", "neutral", "positive")[i % 3], "0.9", f"tweet {i} @someone"])
        w.writerow(["neutral", "0.5", "  "])
    monkeypatch.setattr(assets, "path", lambda name, progress=True: path)
    splits = data.load("tweets-3class")
    assert splits.labels == ["negative", "neutral", "positive"]
    assert len(splits.train + splits.validation + splits.test) == 60
    rows = data.unlabelled("tweets-3class", 100, exclude=["tweet 7 @someone"])
    assert len(rows) == 59 and "tweet 7 @someone" not in {t for t, _ in rows}
    assert "tweets-3class" in assets.ASSETS and assets.ASSETS["tweets-3class"]["kind"] == "dataset"


def test_labelled_ce_skips_unlabelled_rows_and_keeps_the_usual_mean():
    logits = torch.randn(4, 2, requires_grad=True)
    labels = torch.tensor([0, 1, 1, 0])
    assert torch.allclose(training.labelled_ce(logits, labels), F.cross_entropy(logits, labels))
    mixed = torch.tensor([0, data.UNLABELLED, 1, data.UNLABELLED])
    loss = training.labelled_ce(logits, mixed)
    assert torch.allclose(loss, F.cross_entropy(logits[[0, 2]], mixed[[0, 2]]) / 2)
    loss.backward()
    assert logits.grad[[1, 3]].abs().max() == 0 and logits.grad[[0, 2]].abs().max() > 0
    none = training.labelled_ce(logits, torch.full((4,), data.UNLABELLED))
    assert none.item() == 0 and not math.isnan(none.item())


def test_distill_trains_on_the_transfer_texts_without_their_labels(model_dir, ctx, tmp_path, texts, monkeypatch):
    seen = {}
    real = training.train

    def spy(model, encoded, loss_fn, **kw):
        seen.setdefault(kw["desc"], [y for _, y in encoded])
        return real(model, encoded, loss_fn, **kw)

    monkeypatch.setattr(training, "train", spy)
    out = distill.run(Artifact(model_dir, "hf"), tmp_path / "d", ctx, epochs=1, batch_size=16, cosine=1.0,
                      student_finetune=0.5, transfer=str(texts), transfer_examples=20)
    assert out.metrics["transfer_examples"] == 20 and math.isfinite(out.metrics["train_loss"])
    labels = seen["distill"]
    assert labels.count(data.UNLABELLED) == 20 and len(labels) == len(ctx.splits.train) + 20
    assert data.UNLABELLED not in seen["distill (student fine-tune)"]  # hard labels only there
    plain = distill.run(Artifact(model_dir, "hf"), tmp_path / "p", ctx, epochs=1, batch_size=16, cosine=1.0)
    assert "transfer_examples" not in plain.metrics
    a, b = (families.load_model(o.path).state_dict() for o in (out, plain))
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 1e-4


def test_prune_recovery_and_vocabulary_take_the_transfer_texts_but_head_scores_do_not(model_dir, ctx, tmp_path,
                                                                                       texts, monkeypatch):
    sets = []
    monkeypatch.setattr(prune, "recover", lambda model, teacher, encoded, *a: sets.append(encoded))
    kw = dict(heads_keep=0.5, importance="gradient", recover_epochs=1.0, vocab=True, batch_size=16)
    with_t = prune.run(Artifact(model_dir, "hf"), tmp_path / "a", ctx, transfer=str(texts), transfer_examples=30, **kw)
    without = prune.run(Artifact(model_dir, "hf"), tmp_path / "b", ctx, **kw)
    assert [y for _, y in sets[0]].count(data.UNLABELLED) == 30 and len(sets[0]) == len(sets[1]) + 30
    assert data.UNLABELLED not in [y for _, y in sets[1]]
    special = set(families.load_tokenizer(model_dir).all_special_ids)
    pieces = [{i for ids, _ in rows for i in ids} | special for rows in sets]
    assert pieces[0] > pieces[1]  # the transfer texts use word pieces the training set does not
    assert (with_t.metrics["vocab_kept"], without.metrics["vocab_kept"]) == (len(pieces[0]), len(pieces[1]))
    assert with_t.metrics["heads_kept"] == without.metrics["heads_kept"]

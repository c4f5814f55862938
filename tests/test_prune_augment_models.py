"""Augmentation (distill.augment) on teachers the other stages make: a pruned model; its cache."""
import pytest
import torch

from edgekit import augment, data, families
from edgekit.artifact import Artifact
from edgekit.pipeline import Context
from edgekit.stages import prune


def test_augmentation_with_a_pruned_teacher_takes_neighbours_among_the_kept_pieces(model_dir, csv_file, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)
    teacher = prune.run(Artifact(model_dir, "hf"), tmp_path / "p", ctx, heads_keep=0.5, vocab=True,
                        importance="magnitude").path  # no MLM head, and shapes a plain masked-LM cannot load
    tok = families.load_tokenizer(teacher)
    extra, source = augment.augment(teacher, tok, ctx.splits.train[:20], 3, 0.5, 3, 0, progress=False)
    assert source == "embedding" and extra
    # the neighbours the unpruned table gives among the pieces the pruned model keeps (the training text's)
    vocab, seen = tok.get_vocab(), {i for ids, _ in data.encode(tok, ctx.splits.train, 32) for i in ids}
    kept = [t for t, i in vocab.items() if t.isalpha() and i in seen and i not in tok.all_special_ids]
    table = torch.nn.functional.normalize(families.load_model(model_dir).get_input_embeddings().weight.detach(), dim=-1)
    words = {"good", "movie", "q"}  # "q" is not in the training text: the pruned model reads it as [UNK]
    assert vocab["q"] not in seen and len(kept) > 4
    expected = {w: sorted((t for t in kept if t != w), key=lambda t: -float(table[vocab[w]] @ table[vocab[t]]))[:3]
                for w in words - {"q"}}
    assert augment.embedding_neighbours(teacher, tok, words, 3) == expected


@pytest.mark.parametrize("damage", [
    lambda text: text[:50],  # cut short: was a JSONDecodeError traceback on every later run
    lambda text: "[]",
    lambda text: '{"source": "mlm", "examples": [["a sentence", 7]]}',  # a label these sentences do not have
    lambda text: '{"source": "mlm", "examples": "ab"}',
    lambda text: "\udcff",  # not UTF-8
], ids=["cut-short", "a-list", "foreign-label", "examples-not-a-list", "not-utf8"])
def test_a_damaged_augmentation_cache_entry_is_made_again(model_dir, csv_file, tmp_path, monkeypatch, damage):
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    tok, examples = families.load_tokenizer(model_dir), data.load(str(csv_file)).train[:20]
    first = augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False)
    [entry] = (tmp_path / "cache" / "augment").glob("*.json")
    good = entry.read_text()
    entry.write_bytes(damage(good).encode("utf-8", "surrogateescape"))
    assert augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False) == first
    assert entry.read_text() == good  # overwritten with the set made again


def test_an_unwritable_augmentation_cache_is_skipped_with_one_line(model_dir, csv_file, tmp_path, monkeypatch,
                                                                   capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EDGEKIT_CACHE", str(blocker / "cache"))  # cannot be made: was an error ending the stage
    tok, examples = families.load_tokenizer(model_dir), data.load(str(csv_file)).train[:20]
    extra, source = augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False)
    assert source == "embedding" and extra
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot write the augmentation cache {blocker / 'cache' / 'augment'}" in err[0]
    assert "EDGEKIT_CACHE" in err[0]


def test_a_failed_augmentation_cache_write_leaves_no_temp_file(model_dir, csv_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    tok, examples = families.load_tokenizer(model_dir), data.load(str(csv_file)).train[:20]

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(augment.os, "replace", full)
    assert augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False)[0]
    assert list((tmp_path / "cache" / "augment").iterdir()) == []
    assert "No space left on device" in capsys.readouterr().err

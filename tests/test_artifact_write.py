"""artifact.write_json / write_text: the file holds the new content, or, when writing fails, the old one whole and
no temp file beside it."""
import json
import os

import pytest

from edgekit import artifact


@pytest.mark.parametrize("write, new, read", [
    (artifact.write_text, "| a | b |\n", lambda p: p.read_text()),
    (artifact.write_json, {"a": [1, 2]}, lambda p: json.loads(p.read_text())),
])
def test_write_replaces_whole_and_leaves_no_temp(tmp_path, monkeypatch, write, new, read):
    path = tmp_path / "result"
    path.write_text("old\n")

    def fail(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        write(path, new)
    assert path.read_text() == "old\n"  # a failed write leaves the old file as it was, and no temp file
    assert [p.name for p in tmp_path.iterdir()] == ["result"]

    monkeypatch.undo()
    write(path, new)
    assert read(path) == new
    assert [p.name for p in tmp_path.iterdir()] == ["result"]


def test_a_folder_through_temp_replaces_a_full_one_or_leaves_it_and_no_temp(tmp_path):
    target = tmp_path / "model"  # prune's step folders, a stage taken from the shared cache
    target.mkdir()
    (target / "old.bin").write_text("old")
    with pytest.raises(KeyboardInterrupt), artifact.through_temp(target, tmp_path / "model.tmp") as tmp:
        tmp.mkdir()
        (tmp / "half.bin").write_text("half")
        raise KeyboardInterrupt  # Ctrl-C or SIGTERM while the folder is written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert [p.name for p in target.iterdir()] == ["old.bin"]

    with artifact.through_temp(target, tmp_path / "model.tmp") as tmp:
        tmp.mkdir()
        (tmp / "new.bin").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert [p.name for p in target.iterdir()] == ["new.bin"]


def test_an_interrupted_prune_step_save_leaves_no_temp_folder(tmp_path, monkeypatch):
    from edgekit import families
    from edgekit.stages import prune

    def half_then_stop(model, tokenizer, path, max_length):
        path.mkdir()
        (path / "config.json").write_text("{}")  # a resumed run trusts a step folder with a config.json
        raise KeyboardInterrupt
    monkeypatch.setattr(families, "save_model", half_then_stop)
    with pytest.raises(KeyboardInterrupt):
        prune.save(None, None, tmp_path / "step-1", 32)
    assert list(tmp_path.iterdir()) == []



def test_a_new_text_file_whose_write_fails_is_not_left_half_written(tmp_path):
    """A path that does not exist yet is written through a temp file too: a failed write leaves nothing."""
    path = tmp_path / "summary.md"
    with pytest.raises(UnicodeEncodeError):
        artifact.write_text(path, "ok \ud800")  # a lone surrogate: UTF-8 cannot encode it
    assert not path.exists() and os.listdir(tmp_path) == []


def test_a_folder_through_temp_onto_a_new_path(tmp_path):
    """A folder renamed into place where nothing was before (nothing to remove first)."""
    with artifact.through_temp(tmp_path / "steps") as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text("a")
    assert (tmp_path / "steps" / "a.txt").read_text() == "a"


def test_a_temp_folder_a_killed_writer_left_is_removed_first(tmp_path):
    """The same temp name left behind (a SIGKILL) does not stop the next writer nor end up in its result."""
    stale = tmp_path / ".steps.tmp"
    stale.mkdir()
    (stale / "old.txt").write_text("old")
    with artifact.through_temp(tmp_path / "steps", stale) as tmp:
        tmp.mkdir()
        (tmp / "new.txt").write_text("new")
    assert sorted(os.listdir(tmp_path / "steps")) == ["new.txt"] and not stale.exists()

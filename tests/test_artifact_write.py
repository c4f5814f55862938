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

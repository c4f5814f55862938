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

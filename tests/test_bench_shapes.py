"""bench/shapes.py: a run folder without its finished stages is refused in one line; the table names each width
and the hidden width."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import shapes  # noqa: E402  (bench/ scripts import each other by name)


def row(run, heads, ffn, p50, hidden=384):
    return {"run": run, "heads": heads, "ffn": ffn, "hidden": hidden, "gemm_gflop_128": 0.2, "int8_test": 0.8,
            "kept_test": 0.975,
            "fp32": {"validation": 0.81, "test": 0.8, "vader_amazon": 0.72}, "p50_ms_by_round": p50,
            "p50_ms": sorted(p50)[len(p50) // 2], "ratio_to_first": 1.0}


def test_markdown_names_uniform_and_per_layer_widths():
    result = {"measured": "now", "cpu": "cpu", "int8_isa": "AVX2", "rounds": 3, "runs_per_round": 10,
              "json": "x.json", "rows": [row("artifacts/a", [3, 3, 3], [256] * 3, [3.0, 2.9, 3.1]),
                                         row("artifacts/b", [3, 2, 3], [256] * 3, [2.0, 2.1, 2.2], 320)]}
    text = shapes.markdown(result)
    assert "| a | 3 x 256 | 384 |" in text and "| b | [3, 2, 3] x [256, 256, 256] | 320 |" in text
    assert "3.00 (2.90-3.10)" in text and "0.8000 (97.5%)" in text


def test_unfinished_run_is_refused_in_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit) as e:
        shapes.main([str(tmp_path / "run"), str(tmp_path / "run")])
    assert "no 03-prune/model/config.json" in str(e.value) and "\n" not in str(e.value)

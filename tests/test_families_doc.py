"""docs/families.md against the code: a row for every family and none for a family the code lacks, the families
hidden-width pruning takes, and the graph rewrites the export stage keeps for each family's tiny model."""
import copy
from pathlib import Path

import pytest

from edgekit import families, testing
from edgekit.stages.export import REWRITES, rewrite

DOC = Path(__file__).resolve().parent.parent / "docs" / "families.md"
ROWS = testing.doc_tables(DOC.read_text())["Families"]  # model_type: [models, pair types, hidden_keep, onnx, tflite, notes]


def names(cell: str) -> list:
    return [n.strip() for n in cell.split(",") if n.strip()]


def test_every_family_has_a_row_and_every_row_a_family():
    assert set(ROWS) == set(families.FAMILIES)


def test_hidden_width_pruning_is_where_the_table_says():
    assert {f for f, cells in ROWS.items() if cells[2] == "yes"} == set(families.HIDDEN_FAMILIES)
    assert all(cells[2] in ("yes", "no") for cells in ROWS.values())


@pytest.mark.parametrize("family", sorted(families.FAMILIES))
def test_the_rewrites_are_those_export_keeps(tmp_path, family):
    model = families.load_model(testing.make_model_dir(tmp_path / family, family))
    for column, fmt in ((3, "onnx"), (4, "tflite")):
        _, applied = rewrite(copy.deepcopy(model), names=REWRITES[fmt], int32=fmt == "tflite")
        assert names(ROWS[family][column]) == applied, (family, fmt)

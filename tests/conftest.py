"""Fixtures: tiny models and data from edgekit.testing (no downloads, seconds per test)."""
import pytest

from edgekit import testing


@pytest.fixture
def model_dir(tmp_path):
    return testing.make_model_dir(tmp_path / "tiny-bert")


@pytest.fixture
def csv_file(tmp_path):
    return testing.make_csv(tmp_path / "reviews.csv")


@pytest.fixture
def tiny_recipe(tmp_path, model_dir, csv_file):
    """A recipe file running every stage on the tiny model and data, in seconds."""
    path = tmp_path / "tiny.yaml"
    path.write_text(testing.tiny_recipe(model_dir, csv_file))
    return path

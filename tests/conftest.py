"""Fixtures: tiny models and data from edgekit.testing (no downloads, seconds per test)."""
import shutil

import pytest
from hypothesis import settings

from edgekit import testing

# property tests draw the same examples every run, so a CI run fails only on a change; explore new ones with
# `pytest tests/test_properties.py --hypothesis-profile=explore`
settings.register_profile("pinned", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("pinned")


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


@pytest.fixture(scope="session")
def one_run(tmp_path_factory):
    """One finished run of the tiny recipe (every stage), made once for the tests that only read or copy it."""
    from edgekit import pipeline, recipe

    root = tmp_path_factory.mktemp("gate")
    text = testing.tiny_recipe(testing.make_model_dir(root / "m"), testing.make_csv(root / "d.csv"))
    (root / "r.yaml").write_text(text)
    pipeline.run(recipe.load(str(root / "r.yaml")), root / "run", progress=False)
    return root / "run"


@pytest.fixture
def finished(one_run, tmp_path):
    """A private copy of one finished run, free to damage."""
    shutil.copytree(one_run, tmp_path / "run")
    return tmp_path / "run"

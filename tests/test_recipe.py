import pytest

from edgekit import recipe
from edgekit.errors import UsageError


def test_shipped_recipe_validates_and_lists():
    assert "distilbert-int8" in recipe.names()
    r = recipe.load("distilbert-int8")
    assert r["stages"][0] == "finetune" and r["teacher"] == "minilm-l6"
    assert r["budgets"]["size_mb"] == "<= 100"


def test_overrides_set_nested_values_with_yaml_types():
    r = recipe.load("distilbert-int8", ["distill.epochs=1", "data.max_train=2000", "teacher=mpnet-base",
                                        "distill.layers=[0, 2]", "quantize.per_channel=false"])
    assert r["distill"]["epochs"] == 1 and r["data"]["max_train"] == 2000 and r["teacher"] == "mpnet-base"
    assert r["distill"]["layers"] == [0, 2] and r["quantize"]["per_channel"] is False


def test_data_shorthand_override(tmp_path):
    r = recipe.load("distilbert-int8", [f"data={tmp_path / 'x.csv'}"])
    assert r["data"]["source"] == str(tmp_path / "x.csv")


@pytest.mark.parametrize("override, message", [
    ("distill.epoch=1", "unknown key 'epoch'; accepted: student, layers"),
    ("distill.lr=fast", "distill.lr must be float"),
    ("bogus=1", "unknown key 'bogus'; accepted: name"),
    ("stages=[export, finetune]", "finetune must be the first stage"),
    ("stages=[finetune, quantize, export]", "put export before quantize"),
    ("stages=[finetune, export, distill]", "distill cannot follow export"),
    ("stages=[finetune, squash]", "unknown stage 'squash'"),
    ("budgets.speed=<= 3", "unknown metric 'speed'"),
    ("budgets.size_mb=100", "must be an operator and a number"),
    ("max_length=4096", "max_length must be an integer in [8, 512]"),
    ("data.text_col=x", "data: unknown key 'text_col'; accepted: source, text_column"),
    ("distill.epochs", "must look like key=value"),
])
def test_bad_recipes_get_one_line_naming_what_is_accepted(override, message):
    with pytest.raises(UsageError) as e:
        recipe.load("distilbert-int8", [override])
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_all_errors_are_collected_at_once():
    with pytest.raises(UsageError) as e:
        recipe.load("distilbert-int8", ["distill.epoch=1", "finetune.lr=x", "budgets.speed=<= 1"])
    text = str(e.value)
    assert "epoch" in text and "finetune.lr" in text and "speed" in text


def test_unknown_recipe_names_the_shipped_ones():
    with pytest.raises(UsageError, match="shipped recipes: .*distilbert-int8"):
        recipe.load("no-such-recipe")


def test_recipe_file_path_and_bad_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [finetune\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        recipe.load(str(bad))
    with pytest.raises(UsageError, match="not found"):
        recipe.load(str(tmp_path / "missing.yaml"))


def test_parse_bound():
    assert recipe.parse_bound("<= 25") == ("<=", 25.0)
    assert recipe.parse_bound(">=0.97") == (">=", 0.97)
    assert recipe.parse_bound("== 3") is None and recipe.parse_bound("<= x") is None


def test_targets_and_devices_are_recipe_keys_with_one_line_errors():
    r = recipe.load("distilbert-int8", ["targets=[x86, arm64]", "devices={pi: {kind: ssh, host: pi.local}}"])
    assert r["targets"] == ["x86", "arm64"] and r["devices"]["pi"]["host"] == "pi.local"
    assert recipe.load("distilbert-int8")["targets"] == ["x86"]
    with pytest.raises(UsageError, match="devices must map device names to settings") as e:
        recipe.load("distilbert-int8", ["devices=[pi]"])
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="export.format 'coreml'"):
        recipe.load("distilbert-int8", ["export.format=coreml"])

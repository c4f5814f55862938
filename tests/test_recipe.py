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


def test_exponents_without_a_dot_are_floats(tmp_path):
    r = recipe.load("distilbert-int8", ["distill.lr=5e-5", "finetune.lr=+2E-5"])  # was "must be float, got '5e-5'"
    assert r["distill"]["lr"] == 5e-5 and r["finetune"]["lr"] == 2e-5
    path = tmp_path / "r.yaml"
    path.write_text(recipe.find("distilbert-int8").read_text().replace("lr: 1.0e-4", "lr: 1e-4"))
    assert "lr: 1e-4" in path.read_text() and recipe.load(str(path))["distill"]["lr"] == 1e-4
    assert recipe.load("distilbert-int8", ["description=1e5x"])["description"] == "1e5x"  # a string stays one


def test_data_shorthand_override(tmp_path):
    r = recipe.load("distilbert-int8", [f"data={tmp_path / 'x.csv'}"])
    assert r["data"]["source"] == str(tmp_path / "x.csv")


@pytest.mark.parametrize("override, message", [
    ("distill.epoch=1", "unknown key 'epoch' (did you mean epochs?); accepted: student, layers"),
    ("distill.lr=fast", "distill.lr must be float"),
    ("bogus=1", "unknown key 'bogus'; accepted: name"),
    ("stages=[export, finetune]", "finetune must be the first stage"),
    ("stages=[finetune, quantize, export]", "put export before quantize"),
    ("stages=[finetune, export, distill]", "distill cannot follow export"),
    ("stages=[finetune, squash]", "unknown stage 'squash'"),
    ("budgets.speed=<= 3", "unknown metric 'speed'"),
    ("budgets.size_mb=100", "must be an operator and a number"),
    ("max_length=4096", "max_length must be an integer in [8, 512]"),
    ("data.text_col=x", "data: unknown key 'text_col' (did you mean text_column?); accepted: source, "
                        "text_column"),
    ("mx_length=64", "unknown key 'mx_length' (did you mean max_length?); accepted: name"),
    ("distill.epochs", "must look like key=value"),
])
def test_bad_recipes_get_one_line_naming_what_is_accepted(override, message):
    with pytest.raises(UsageError) as e:
        recipe.load("distilbert-int8", [override])
    assert message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("override, message", [  # each failed only when its stage ran, or not at all
    ("finetune.batch_size=-3", "finetune.batch_size must be >= 1, got -3"),  # hung the training loop
    ("distill.batch_size=0", "distill.batch_size must be >= 1"),
    ("evaluate.batch_size=0", "evaluate.batch_size must be >= 1"),
    ("finetune.epochs=0", "finetune.epochs must be > 0"),
    ("finetune.warmup=5", "finetune.warmup must be in [0, 1)"),
    ("finetune.lr=-1", "finetune.lr must be > 0"),
    ("finetune.weight_decay=-1", "finetune.weight_decay must be >= 0"),
    ("distill.epochs=-1", "distill.epochs must be > 0"),
    ("distill.alpha=2", "distill.alpha must be in [0, 1], got 2"),
    ("distill.temperature=0", "distill.temperature must be > 0"),
    ("distill.student_finetune=-1", "distill.student_finetune must be >= 0"),
    ("distill.layers=half", "distill.layers must be one of every_other, all, got 'half'"),
    ("distill.transfer_examples=0", "distill.transfer_examples must be >= 1"),
    ("data.max_train=-5", "data.max_train must be >= 0"),
    ("data.max_eval=-20", "data.max_eval must be >= 0"),
    ("export.opset=3", "export.opset must be in [10, 23]"),
    ("export.min_label_agreement=5", "export.min_label_agreement must be in [0, 1]"),
    ("export.check_sentences=-1", "export.check_sentences must be >= 1"),
    ("export.exporter=onnxscript", "export.exporter must be one of torchscript, dynamo"),
    ("quantize.mode=foo", "quantize.mode must be one of dynamic, static, fp16, got 'foo'"),
    ("quantize.mode={onnx: int4}", "quantize.mode must be one of dynamic, static, fp16"),
    ("quantize.check_sentences=0", "quantize.check_sentences must be >= 1"),
    ("quantize.calibration_size=0", "quantize.calibration_size must be >= 1"),
    ("quantize.weights=u4", "quantize.weights must be one of int8, uint8"),
    ("evaluate.split=train", "evaluate.split must be one of validation, test, got 'train'"),
    ("bench.threads=0", "bench.threads must be >= 1"),
    ("bench.runs=0", "bench.runs must be >= 1"),
    ("bench.seq_len=0", "bench.seq_len must be in [2, 512]"),
    ("bench.seq_len=256", "bench.seq_len 256 is longer than max_length 128"),
])
def test_out_of_range_values_are_refused_before_anything_runs(override, message):
    with pytest.raises(UsageError) as e:
        recipe.load("distilbert-int8", [override])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("overrides, message", [
    (["targets=[arm64]", "export.format=auto", "export.buckets=[16, 300]"], "export.buckets [16, 300] must be sequence lengths in [2, max_length=128]"),
    (["targets=[arm64]", "export.format=auto", "export.buckets=[]"], "export.buckets [] must be sequence lengths"),
    (["quantize.weights=uint8", "quantize.mode=static"], "quantize.weights 'uint8' with ONNX mode static: give int8"),
    (["targets=[arm64]", "export.format=tflite", "quantize.weights=uint8"], "quantize.weights 'uint8' applies to "
     "ONNX only, and this run exports tflite; leave it out, or add an ONNX target"),
    (["export.format=torchscript", "quantize.mode=fp16"], "quantize.mode fp16 is not offered for torchscript"),
    (["targets=[arm64]", "export.format=auto", "quantize.mode={onnx: static}"], "quantize.mode has no mode for tflite"),
    (["quantize.mode={tflite: static}"], "; quantize.mode names tflite, which this run does not export (it exports "
                                         "onnx)"),  # was: only "has no mode for onnx", the tflite key not named
    (["distill.intermediate_epochs=1", "distill.cosine=0"], "distill.intermediate_epochs > 0 needs an intermediate loss"),
    (["distill.augment=1", "distill.augment=0", "distill.augment_model=mpnet-base"],
     "distill.augment_model is mpnet-base but distill.augment is 0, so no copies are made"),
])
def test_settings_right_alone_and_wrong_together_are_refused_before_anything_runs(overrides, message):
    with pytest.raises(UsageError) as e:  # each used to pass validation and fail when its stage began
        recipe.load("distilbert-int8", overrides)
    assert message in str(e.value)
    recipe.load("distilbert-int8", overrides[:-1])  # the same recipe without the last override is fine


@pytest.mark.parametrize("stages, override, message", [
    ("[finetune, prune, export]", "prune.heads_keep=1.5", "prune.heads_keep must be in (0, 1], got 1.5"),
    ("[finetune, prune, export]", "prune.heads_keep=0.0", "prune.heads_keep must be in (0, 1], got 0.0"),
    ("[finetune, prune, export]", "prune.hidden_keep=0", "prune.hidden_keep must be in (0, 1], got 0"),
    ("[finetune, prune, export]", "prune.ffn_keep=1.5", "prune.ffn_keep must be in (0, 1]"),
    ("[finetune, prune, export]", "prune.importance=taylor", "prune.importance must be one of gradient, magnitude"),
    ("[finetune, prune, export]", "prune.scope=model", "prune.scope must be one of layer, global"),
    ("[finetune, prune, export]", "prune.steps=0", "prune.steps must be >= 1"),
    ("[finetune, prune, export]", "prune.ffn_multiple=0", "prune.ffn_multiple must be >= 1"),
    ("[finetune, prune, export]", "prune.recover_from=student", "prune.recover_from must be one of input, teacher"),
    ("[finetune, prune, export]", "prune.recover_epochs=-1", "prune.recover_epochs must be >= 0"),
    ("[finetune, prune, export]", "prune.batch_size=0", "prune.batch_size must be >= 1"),
    ("[finetune, prune, export]", "prune.transfer_examples=1.5", "prune.transfer_examples must be int"),
])
def test_prune_ranges_are_checked_up_front(stages, override, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("[", r"\[")):
        recipe.load("distilbert-int8", [f"stages={stages}", override])


def test_limits_allow_the_edges_and_every_shipped_recipe():
    r = recipe.load("distilbert-int8", ["finetune.warmup=0", "distill.alpha=1", "data.max_train=0", "bench.runs=1",
                                        "quantize.mode={onnx: static}", "bench.seq_len=128", "bench.warmup=0"])
    assert r["distill"]["alpha"] == 1 and r["quantize"]["mode"] == {"onnx": "static"}
    for name in recipe.names():
        recipe.load(name)
    assert recipe.outside(0.5, "(0, 1]") == "" and recipe.outside(0, "(0, 1]") == "in (0, 1]"
    assert recipe.outside(1, "[0, 1)") == "in [0, 1)" and recipe.outside(3, "[1, inf)") == ""
    assert recipe.outside([1, 2], "[1, inf)") == "" and recipe.outside(None, "[0, 1)") == ""


@pytest.mark.parametrize("text, message", [
    ("teacher: minilm-l6\nseed: 1\nseed: 2\n", "key 'seed' appears twice at line 3, column 1"),
    ("teacher: minilm-l6\ndistill: {epochs: 1, epochs: 2}\n", "key 'epochs' appears twice at line 2"),
    ("teacher: minilm-l6\nstages: [finetune\n", "at line 3, column 1"),
])
def test_yaml_mistakes_say_where(tmp_path, text, message):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match="not valid YAML") as e:
        recipe.load(str(path))
    assert message in str(e.value)


def test_a_recipe_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("description: caf\xe9\n".encode("latin-1"))
    with pytest.raises(UsageError, match=r"latin1.yaml is not UTF-8 text \(byte 16\); save it as UTF-8"):
        recipe.load(str(path))


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


@pytest.mark.parametrize("override, message", [
    ("devices={pi: {kind: local, runs: 0}}", "target pi: runs must be >= 1, got 0"),
    ("devices={pi: {kind: local, budgets: [1]}}", "target pi: budgets must be dict"),  # was an AttributeError
    ("devices={pi: {kind: local, budgets: {accuracy_retained: '>= 97'}}}", "accuracy_retained 97 is not a fraction"),
    ("budgets.size_mb=<= nan", "budget size_mb nan: give a finite number >= 0"),
    ("budgets.latency_ms_p90=<= -1", "budget latency_ms_p90 -1: give a finite number >= 0"),
    ("budgets.size_mb=<= 1e400", "budget size_mb inf: give a finite number >= 0"),  # said "a number": inf is one
    ("distill.lr=1e400", "distill.lr must be a finite number > 0, got inf"),
])
def test_device_settings_and_budget_numbers_are_checked_with_the_recipe(override, message):
    with pytest.raises(UsageError, match=message):
        recipe.load("distilbert-int8", [override])


def test_overrides_given_as_one_string_are_refused():  # was "override 'd' must look like key=value"
    with pytest.raises(UsageError, match=r"overrides must be a list .*\['distill.epochs=1'\]"):
        recipe.load("distilbert-int8", "distill.epochs=1")


def test_a_budget_no_stage_measures_is_refused_and_null_drops_a_budget(tmp_path):
    """Was: the whole run, then 'NOT MEASURED' and exit 3 (over budget), where gate said exit 1 for the same run."""
    from edgekit import testing

    path = tmp_path / "r.yaml"
    path.write_text(testing.tiny_recipe(tmp_path / "m", tmp_path / "d.csv", stages=("finetune", "prune")))
    for metric, stage in (("latency_ms_p90", "add bench to stages"), ("accuracy_retained", "add evaluate to stages"),
                          ("max_abs_diff", "add export or quantize to stages")):
        with pytest.raises(UsageError, match=f"budget {metric}: no stage of this recipe measures it; {stage}, or drop "
                                             rf"the budget \(budgets.{metric}=null\)"):
            recipe.load(str(path), [f"budgets.{metric}=<= 1"])
    assert recipe.load(str(path), ["budgets.params=<= 1e9", "budgets.size_mb=null"])["budgets"] == {"params": "<= 1e9"}
    with pytest.raises(UsageError) as e:  # a misspelt stage is the one error, not its knock-on ones
        recipe.load("distilbert-int8", ["stages=[finetune, bogus]"])
    assert str(e.value) == "unknown stage 'bogus'; stages: finetune, distill, prune, export, quantize, evaluate, bench"


@pytest.mark.parametrize("mode, warned", [("static", True), ("{onnx: static, tflite: dynamic}", True),
                                          ("dynamic", False), ("fp16", False), ("{onnx: dynamic}", False)])
def test_fuse_without_an_onnx_mode_it_steers_is_warned_of(mode, warned):
    """fuse steers ONNX dynamic and fp16 only; with static it was dropped from the sidecar, silently."""
    said = recipe.ineffective(recipe.load("distilbert-int8", [f"quantize.mode={mode}", "quantize.fuse=true"]))
    assert ("quantize.fuse is set but does nothing without an ONNX quantize.mode of dynamic or fp16" in said) == warned


def test_column_settings_for_a_named_dataset_are_warned_of(tmp_path):
    """data=tweets-3class with a local file's text_column kept: the setting was dropped without a word."""
    said = recipe.ineffective(recipe.load("distilbert-int8", ["data.source=tweets-3class", "data.text_column=tweet"]))
    assert said == ["data.text_column is set but does nothing for the named dataset tweets-3class, whose columns are "
                    "fixed; it applies to a local file"]
    assert recipe.ineffective(recipe.load("distilbert-int8", ["data.text_column=text"])) == []  # the default
    local = tmp_path / "mine.csv"
    local.write_text("tweet,label\na,b\n")
    assert recipe.ineffective(recipe.load("distilbert-int8", [f"data.source={local}", "data.text_column=tweet"])) == []


def test_a_stage_listed_twice_is_refused():
    with pytest.raises(UsageError, match="each stage may appear once"):
        recipe.load("distilbert-int8", ["stages=[finetune, distill, distill, export, quantize, evaluate, bench]"])


def test_data_file_shorthand_keeps_the_other_data_settings():
    """data=FILE sets the source only: it replaced the whole mapping, dropping max_train and the columns."""
    loaded = recipe.load("distilbert-int8", ["data.max_train=50", "data=x.csv"])
    assert loaded["data"]["source"] == "x.csv" and loaded["data"]["max_train"] == 50


def test_bench_seq_len_one_past_max_length_is_refused():
    with pytest.raises(UsageError, match="bench.seq_len 129 is longer than max_length 128"):
        recipe.load("distilbert-int8", ["bench.seq_len=129"])
    assert recipe.load("distilbert-int8", ["bench.seq_len=128"])["bench"]["seq_len"] == 128


@pytest.mark.parametrize("bound, refused", [(1.5, False), (1.51, True), (1.8, True), (97, True)])
def test_a_fraction_bound_over_1_5_is_refused_up_front(bound, refused):
    assert bool(recipe.bound_problem("accuracy_retained", bound)) == refused


def test_each_unknown_key_gets_its_own_suggestion():
    with pytest.raises(UsageError) as e:  # the hint followed the list, or was missing when the misspelt key came last
        recipe.validate({"foo": 1, "mx_length": 2, "teacher": "minilm-l6", "data": "rt-polarity", "stages": ["finetune"]})
    assert "unknown key foo, mx_length (did you mean max_length?); accepted: name" in str(e.value)



def test_targets_one_name_empty_or_twice_and_formats_twice():
    """`targets: x86` is one target; no targets, a target named twice and a format named twice are refused."""
    from edgekit import targets
    from edgekit.errors import EdgekitError

    assert targets.check("x86") == ["x86"]
    for bad, said in (([], "must be a list of target names"), (["x86", "x86"], "names a target twice")):
        with pytest.raises(EdgekitError, match=said):
            targets.check(bad)
    with pytest.raises(EdgekitError, match="a list of distinct formats"):
        targets.formats_for(["x86"], ["onnx", "onnx"])

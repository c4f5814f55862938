import pytest
import torch

from edgekit import data, families
from edgekit.artifact import Artifact
from edgekit.errors import EdgekitError
from edgekit.pipeline import Context
from edgekit.stages import distill


def test_cached_teacher_outputs_equal_a_live_teacher(model_dir, csv_file):
    teacher = families.load_model(model_dir)
    tok = families.load_tokenizer(model_dir)
    encoded = data.encode(tok, data.load(str(csv_file)).train[:40], 32)
    logits, states = distill.teacher_outputs(teacher, encoded, 0, True, False)
    batch = next(data.batches(encoded, 8, 0, shuffle=True, seed=5))
    with torch.no_grad():
        live = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    assert torch.allclose(torch.stack([logits[i] for i in batch["index"]]), live.logits, atol=1e-5)
    real = batch["attention_mask"].bool()
    cached = torch.cat([states[i] for i in batch["index"]]).float()
    assert torch.allclose(cached, live.hidden_states[-1][real], atol=1e-2)  # fp16 storage


@pytest.mark.parametrize("cache", [True, False])
def test_distill_stage_makes_a_half_depth_student(model_dir, csv_file, tmp_path, cache):
    splits = data.load(str(csv_file))
    ctx = Context(splits, Artifact(model_dir, "hf"), 0, 32, False)
    out = distill.run(Artifact(model_dir, "hf"), tmp_path, ctx, epochs=1, batch_size=16, cache_teacher=cache)
    student = families.load_model(out.path)
    assert student.config.num_hidden_layers == 2 and out.metrics["student_layers"] == [1, 3]
    assert out.metrics["params"] < sum(p.numel() for p in families.load_model(model_dir).parameters())


@pytest.mark.parametrize("settings, message", [
    ({"layers": [0, 9]}, "teacher layer indices 0..3"),
    ({"layers": "half"}, "give every_other or a list"),
    ({"temperature": 0}, "temperature > 0"),
])
def test_bad_distill_settings(model_dir, csv_file, tmp_path, settings, message):
    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)
    with pytest.raises(EdgekitError, match=message):
        distill.run(Artifact(model_dir, "hf"), tmp_path, ctx, epochs=1, **settings)

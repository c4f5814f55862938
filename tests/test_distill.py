import json

import pytest
import torch

from edgekit import augment, data, distill_losses, families, testing
from edgekit.artifact import Artifact
from edgekit.errors import EdgekitError
from edgekit.pipeline import Context
from edgekit.stages import distill

NARROW = {"hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32, "num_hidden_layers": 2}


class Stop(Exception):
    pass


def context(csv_file, model_dir):
    return Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)


@pytest.mark.parametrize("pruned", [False, True])
def test_cached_teacher_outputs_equal_a_live_teacher(model_dir, csv_file, pruned):
    teacher = families.load_model(model_dir)
    teacher.set_attn_implementation("eager")
    if pruned:  # a pruned teacher: layer 1 keeps 2 of its 4 heads, the cache reads each layer's own
        families.apply_shapes(teacher, {"heads": [4, 2, 4, 4], "ffn": [64] * 4})
    tok = families.load_tokenizer(model_dir)
    encoded = data.encode(tok, data.load(str(csv_file)).train[:40], 32)
    cache = distill.teacher_outputs(teacher, encoded, 0, hidden=[0, 4], attention=[1], progress=False)
    batch = next(data.batches(encoded, 8, 0, shuffle=True, seed=5))
    with torch.no_grad():
        live = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True,
                       output_attentions=True)
    cached = distill.gather(cache, batch["index"])
    assert torch.allclose(cached["logits"], live.logits, atol=1e-5)
    lengths = [len(ids) for ids, _ in encoded]  # one buffer per kind, of the size cache_mb counts (not one per
    assert cache["logits"].shape == (40, 2) and cache["hidden"][4].buffer.numel() == sum(lengths) * 32  # example)
    assert cache["attention"][1].buffer.numel() == sum(n * n for n in lengths) * (2 if pruned else 4)
    real = batch["attention_mask"].bool()
    for k in (0, 4):  # fp16 storage
        assert torch.allclose(cached["hidden"][k][real], live.hidden_states[k][real], atol=1e-2)
    pairs = real[:, None, :, None] & real[:, None, None, :]
    assert torch.allclose(cached["attention"][1][pairs.expand_as(live.attentions[1])],
                          live.attentions[1][pairs.expand_as(live.attentions[1])], atol=1e-3)


@pytest.mark.parametrize("cache", [True, False])
def test_distill_stage_makes_a_half_depth_student(model_dir, csv_file, tmp_path, cache):
    ctx = context(csv_file, model_dir)
    out = distill.run(Artifact(model_dir, "hf"), tmp_path, ctx, epochs=1, batch_size=16, cache_teacher=cache)
    student = families.load_model(out.path)
    assert student.config.num_hidden_layers == 2 and out.metrics["student_layers"] == [1, 3]
    assert (out.metrics["teacher_cache_mb"] > 0) is cache
    part = distill.run(Artifact(model_dir, "hf"), tmp_path / "part", ctx, epochs=0.5, batch_size=16)
    assert part.metrics["teacher_cache_mb"] == 0  # half an epoch: the teacher ran on the batches read, not on all
    assert out.metrics["params"] < sum(p.numel() for p in families.load_model(model_dir).parameters())


def test_layer_maps():
    assert distill_losses.layer_map("uniform", 3, 6) == [1, 3, 5]
    assert distill_losses.layer_map("uniform", 4, 12) == [2, 5, 8, 11]
    assert distill_losses.layer_map("last", 2, 6) == [4, 5]
    assert distill_losses.layer_map([0, 5], 2, 6) == [0, 5]
    for bad in ([0, 6], [1], "middle", [0, True]):
        with pytest.raises(EdgekitError, match="layer_map"):
            distill_losses.layer_map(bad, 2, 6)


@pytest.mark.parametrize("term", ["kd", "ce", "cosine", "embedding", "attention", "hidden", "pkd"])
def test_each_loss_term_trains_a_narrower_student(model_dir, csv_file, term):
    """Each term alone gives a finite loss whose gradient reaches the student and, where widths differ, the
    projection; all other weights are zero."""
    teacher = families.load_model(model_dir)
    student, _ = families.student_from_config(teacher, NARROW, [1, 3])
    for m in (teacher, student):
        m.set_attn_implementation("eager")
    tok = families.load_tokenizer(model_dir)
    encoded = data.encode(tok, data.load(str(csv_file)).train[:32], 32)
    w = {k: 0.0 for k in ("kd", "ce", *distill.INTERMEDIATE)}
    w[term] = 1.0
    view = distill.TeacherView(teacher, encoded, 0, distill.needs(w, [1, 3], 4), True, 1024, False)
    proj_emb = distill_losses.projection(16, 32, True, "embedding")
    proj_hid = distill_losses.projection(16, 32, True, "hidden")
    loss = distill.loss_fn(w, [1, 3], 4, 2.0, proj_emb, proj_hid, view)(student.train(), next(data.batches(encoded, 16, 0)))
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0
    assert student.get_input_embeddings().weight.grad.abs().sum() > 0 or term in ("kd", "ce")
    if term in ("hidden", "pkd", "cosine"):
        assert proj_hid.weight.grad.abs().sum() > 0
    if term == "embedding":
        assert proj_emb.weight.grad.abs().sum() > 0


def test_a_student_from_teacher_layers_follows_its_own_attention_setting(model_dir):
    student = families.student_from_teacher(families.load_model(model_dir), [1, 3])
    student.set_attn_implementation("eager")
    ids = torch.tensor([[2, 5, 6, 3]])
    out = student(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (1, 4, 4, 4)


def test_a_narrow_student_is_initialised_from_the_teacher_where_shapes_allow(model_dir):
    teacher = families.load_model(model_dir)
    student, share = families.student_from_config(teacher, NARROW, [1, 3])
    assert share == 1.0 and student.config.hidden_size == 16
    t, s = teacher.state_dict(), student.state_dict()
    assert torch.equal(s["bert.encoder.layer.1.attention.self.query.weight"],
                       t["bert.encoder.layer.3.attention.self.query.weight"][:16, :16])
    with pytest.raises(EdgekitError, match="not a multiple"):
        families.student_from_config(teacher, {"hidden_size": 30}, [1, 3])


def test_two_phases_with_projections_and_widths_that_differ(model_dir, csv_file, tmp_path):
    ctx = context(csv_file, model_dir)
    out = distill.run(Artifact(model_dir, "hf"), tmp_path, ctx, epochs=1, intermediate_epochs=1, batch_size=16,
                      student_config=NARROW, embedding=1.0, attention=1.0, hidden=1.0, pkd=1.0)
    assert out.metrics["intermediate_loss"] > 0 and out.metrics["layer_map"] == [1, 3]
    assert families.load_model(out.path).config.hidden_size == 16
    assert not (tmp_path / "intermediate").exists()


def test_a_killed_two_phase_run_resumes_to_the_same_student(model_dir, csv_file, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    ctx = context(csv_file, model_dir)
    settings = dict(epochs=1, intermediate_epochs=1, batch_size=16, hidden=1.0, checkpoint_every=3, augment=1,
                    student_finetune=0.5)  # the kills land after the student fine-tune, which resumes finished
    straight = distill.run(Artifact(model_dir, "hf"), tmp_path / "a", ctx, **settings)
    original = distill.loss_fn
    for dies_at in (5, 17):  # in the intermediate phase, then in the prediction phase
        calls = {"n": 0}

        def dying(*args):
            compute = original(*args)

            def step(model, batch):
                calls["n"] += 1
                if calls["n"] == dies_at:
                    raise Stop
                return compute(model, batch)
            return step

        monkeypatch.setattr(distill, "loss_fn", dying)
        with pytest.raises(Stop):
            distill.run(Artifact(model_dir, "hf"), tmp_path / "b", ctx, **settings)
    monkeypatch.setattr(distill, "loss_fn", original)
    resumed = distill.run(Artifact(model_dir, "hf"), tmp_path / "b", ctx, **settings)
    a, b = families.load_model(straight.path).state_dict(), families.load_model(resumed.path).state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert straight.metrics["train_loss"] == resumed.metrics["train_loss"]


def test_a_run_that_finds_the_augmented_set_cached_ends_where_the_first_ended(model_dir, csv_file, tmp_path,
                                                                             monkeypatch):
    """Loading the embedding neighbours must not shift what is drawn afterwards (the projections' start)."""
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    ctx = context(csv_file, model_dir)
    settings = dict(epochs=1, batch_size=16, student_config=NARROW, hidden=1.0, augment=1)
    runs = []
    for name in ("computed", "cached"):
        torch.manual_seed(0)  # as the pipeline does before every stage
        runs.append(families.load_model(distill.run(Artifact(model_dir, "hf"), tmp_path / name, ctx, **settings).path))
    a, b = runs[0].state_dict(), runs[1].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_init_from_chains_a_later_run_from_an_earlier_checkpoint(model_dir, csv_file, tmp_path):
    ctx = context(csv_file, model_dir)
    first = distill.run(Artifact(model_dir, "hf"), tmp_path / "a", ctx, epochs=1, batch_size=16)
    chained = distill.run(Artifact(model_dir, "hf"), tmp_path / "b", ctx, epochs=0.01, lr=1e-9, batch_size=16,
                          init_from=str(first.path))
    a, b = families.load_model(first.path).state_dict(), families.load_model(chained.path).state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4  # started from the first run's weights


@pytest.mark.parametrize("make, message", [
    (lambda p, m: m, "from another architecture"),  # the 4-layer teacher is not a 2-layer student
    (lambda p, m: (p / "bad.safetensors").write_bytes(b"garbage") and p / "bad.safetensors", "unreadable"),
    (lambda p, m: p, "has no model.safetensors"),
])
def test_bad_init_from_is_one_line_and_writes_nothing(model_dir, csv_file, tmp_path, make, message):
    ctx = context(csv_file, model_dir)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(EdgekitError, match=message) as e:
        distill.run(Artifact(model_dir, "hf"), out, ctx, epochs=1, init_from=str(make(tmp_path, model_dir)))
    assert "\n" not in str(e.value) and list(out.iterdir()) == []


@pytest.mark.parametrize("settings, message", [
    ({"layers": [0, 9]}, "teacher layer indices 0..3"),
    ({"layers": "half"}, "give every_other, all, or a list"),
    ({"layers": [1, 1]}, "give each layer once, in increasing order"),  # ran: one layer copied twice
    ({"layers": [3, 1]}, "in increasing order .* for example \\[1, 3\\]"),  # ran: the stack turned round
    ({"layer_map": [0, 4]}, "layer_map .* does not fit"),
    ({"student_config": NARROW, "hidden": 1.0, "projection": False}, "projection is false"),
    ({"intermediate_epochs": 1, "cosine": 0.0}, "needs an intermediate loss"),
    ({"student_config": {"vocab_size": 10}}, "student_config key 'vocab_size'"),
])
def test_bad_distill_settings(model_dir, csv_file, tmp_path, settings, message):
    ctx = context(csv_file, model_dir)
    with pytest.raises(EdgekitError, match=message):
        distill.run(Artifact(model_dir, "hf"), tmp_path, ctx, epochs=1, **settings)
    assert not (tmp_path / "model").exists() and not (tmp_path / "checkpoint").exists()


def test_student_finetune_trains_a_pretrained_student_on_labels_before_distilling(model_dir, csv_file, tmp_path):
    ctx = context(csv_file, model_dir)
    student = testing.make_model_dir(tmp_path / "student", layers=2, seed=1)
    runs = {}
    for finetune in (0, 1):
        torch.manual_seed(0)  # the new classifier head starts the same in both runs
        runs[finetune] = distill.run(Artifact(model_dir, "hf"), tmp_path / str(finetune), ctx, student=str(student),
                                     layers="all", epochs=0.1, lr=1e-3, batch_size=16, student_finetune=finetune)
    assert "student_finetune_loss" not in runs[0].metrics and runs[1].metrics["student_finetune_loss"] > 0
    assert not (tmp_path / "1" / "student-finetune").exists()
    a, b = (families.load_model(runs[k].path).state_dict() for k in (0, 1))
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 1e-3


def test_a_pretrained_student_with_other_pieces_falls_back_to_logit_kd(model_dir, csv_file, tmp_path):
    """Same pieces (another tiny BERT with the teacher's vocabulary): token-level losses on. A tokenizer whose
    pieces differ (no whole words, letters only): logit KD, CE and PKD only."""
    from transformers import BertTokenizer

    ctx = context(csv_file, model_dir)
    same = testing.make_model_dir(tmp_path / "same", layers=2, seed=1)
    out = distill.run(Artifact(model_dir, "hf"), tmp_path / "a", ctx, student=str(same), layers="all", epochs=1,
                      batch_size=16, hidden=1.0)
    assert out.metrics["token_losses"] == "on" and out.metrics["student_layers"] == [0, 1]
    other = testing.make_model_dir(tmp_path / "other", layers=2, seed=1)
    vocab = {(t if t not in testing.WORDS or len(t) == 1 else f"[unused{i}]"): i
             for t, i in testing.tiny_vocab().items()}  # whole words gone: they split into letters
    BertTokenizer(vocab=vocab).save_pretrained(other)
    out = distill.run(Artifact(model_dir, "hf"), tmp_path / "b", ctx, student=str(other), layers="all", epochs=1,
                      batch_size=16, hidden=1.0, pkd=1.0)
    assert out.metrics["token_losses"].startswith("off")


def test_augmentation_replaces_words_with_embedding_neighbours_and_is_cached(model_dir, csv_file, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    tok = families.load_tokenizer(model_dir)
    examples = data.load(str(csv_file)).train[:20]
    extra, source = augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False)
    assert source == "embedding" and 20 < len(extra) <= 60
    originals = {t for t, _ in examples}
    assert all(t not in originals for t, _ in extra)
    assert {y for _, y in extra} == {y for _, y in examples}
    monkeypatch.setattr(augment, "embedding_neighbours", lambda *a: pytest.fail("the cached set was not used"))
    assert augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False) == (extra, source)


def test_masked_lm_candidates_are_read_at_each_inserted_mask_and_fit_the_position_table():
    """A text holding the mask string itself ("[MASK]") had every word's candidates read at that literal mask; a
    RoBERTa-style table of 126 positions failed with an IndexError on a long text (the cut was 128 tokens)."""
    from transformers import BertTokenizer, RobertaForMaskedLM

    tok = BertTokenizer(vocab=testing.tiny_vocab())
    words = [i for i, _ in augment._whole_words(tok, "")]

    class ByPosition(torch.nn.Module):  # the top candidate at token position t is whole word t (mod their count)
        config = testing.tiny_config("bert")

        def forward(self, input_ids, **kw):
            logits = torch.full((*input_ids.shape, len(tok)), -1.0)
            for t in range(input_ids.shape[1]):
                logits[:, t, words[t % len(words)]] = 1.0
            return type("Out", (), {"logits": logits})

    pair = ("the film [MASK] good", "the cast was awful")
    spans = [(1, (4, 8)), (1, (9, 12)), (1, (13, 18))]  # cast, was, awful
    got = augment.mlm_candidates(ByPosition(), tok, pair, spans, k=1)
    assert len({tuple(c) for c in got}) == 3  # was: one list for all three (the literal mask's position)
    text = "the [MASK] cast was awful"  # the literal mask earlier in the same text, not in the other of a pair
    got = augment.mlm_candidates(ByPosition(), tok, text, [(0, (11, 15)), (0, (16, 19)), (0, (20, 25))], k=1)
    assert len({tuple(c) for c in got}) == 3
    torch.manual_seed(0)
    long = " ".join(["good"] * 200)
    assert augment.mlm_candidates(RobertaForMaskedLM(testing.tiny_config("roberta")).eval(), tok, long,
                                  [(0, (0, 4))], k=3)[0]


def test_augmentation_uses_a_masked_lm_head_when_the_folder_has_one(csv_file, tmp_path, monkeypatch):
    from transformers import BertForMaskedLM, BertTokenizer

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    BertForMaskedLM(testing.tiny_config("bert")).save_pretrained(tmp_path / "mlm")
    BertTokenizer(vocab=testing.tiny_vocab()).save_pretrained(tmp_path / "mlm")
    tok = families.load_tokenizer(tmp_path / "mlm")
    extra, source = augment.augment(tmp_path / "mlm", tok, data.load(str(csv_file)).train[:10], 2, 0.5, 3, 0, False)
    assert source == "mlm" and extra
    cached = list((tmp_path / "cache" / "augment").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["source"] == "mlm"


def test_augment_model_gives_masked_lm_words_when_a_finetune_stage_wrote_the_teacher(tmp_path, monkeypatch):
    """The finetune stage's classifier has no MLM head (augmentation fell back to embedding neighbours);
    augment_model names a masked-LM of another family and vocabulary, whose candidates replace whole words."""
    from transformers import AutoModelForMaskedLM

    from edgekit import pipeline, recipe

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    mlm = tmp_path / "mlm"
    AutoModelForMaskedLM.from_config(testing.tiny_config("modernbert")).save_pretrained(mlm)  # byte-level BPE
    testing.tiny_bpe().save_pretrained(mlm)
    text = testing.tiny_recipe(testing.make_model_dir(tmp_path / "t"), testing.make_csv(tmp_path / "d.csv"),
                               ("finetune", "distill"))
    (tmp_path / "r.yaml").write_text(text)
    sources = {}
    for name, extra in (("own", []), ("mlm", [f"distill.augment_model={mlm}"])):  # the second reuses finetune
        r = recipe.load(str(tmp_path / "r.yaml"), ["distill.augment=2", "distill.augment_p=0.5", "distill.epochs=1",
                                                   *extra])
        manifest = pipeline.run(r, tmp_path / "run", progress=False)
        metrics = {s["name"]: s for s in manifest["stages"]}["distill"]["output"]["metrics"]
        sources[name] = metrics["augment_source"]
        assert metrics["augmented_examples"] > 50
    assert sources == {"own": "embedding", "mlm": "mlm"}


def test_an_augment_model_folder_that_is_not_there_is_refused_before_any_stage(tmp_path):
    from edgekit import pipeline, recipe

    (tmp_path / "r.yaml").write_text(testing.tiny_recipe(testing.make_model_dir(tmp_path / "t"),
                                                         testing.make_csv(tmp_path / "d.csv"), ("finetune", "distill")))
    r = recipe.load(str(tmp_path / "r.yaml"), ["distill.augment=1", f"distill.augment_model={tmp_path / 'gone'}"])
    with pytest.raises(EdgekitError, match="gone"):
        pipeline.run(r, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "finetune").exists()


# Mutation audit 3c: the loss formulas and their weights. The tests above checked each term was finite, positive and
# had a gradient, so a cosine that pushed the student away (1 + cos), MSE read as L1, attention scaled by the head
# count or padded keys counted, PKD on lengths, KD without T², alpha's complement and TinyBERT's two phases mixed all
# passed.
def test_layer_map_takes_its_own_depth_and_refuses_a_longer_list():
    assert distill_losses.layer_map("last", 4, 4) == [0, 1, 2, 3]
    with pytest.raises(EdgekitError, match="layer_map"):
        distill_losses.layer_map([0, 1, 5], 2, 6)


def test_loss_terms_are_the_formulas_the_docs_state():
    from edgekit import training

    torch.manual_seed(0)
    x, real = torch.randn(2, 3, 8), torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    assert distill_losses.hidden_cosine(x, x, real).item() == pytest.approx(0, abs=1e-6)
    assert distill_losses.hidden_cosine(x, -x, real).item() == pytest.approx(2, abs=1e-6)
    s, t = torch.zeros(1, 3, 4), torch.full((1, 3, 4), 2.0)
    t[0, 2] = 100.0  # a padded token does not count
    assert distill_losses.hidden_mse(s, t, torch.tensor([[1, 1, 0]]).bool()).item() == pytest.approx(4.0)
    probs, real = torch.softmax(torch.randn(1, 4, 3, 3), -1), torch.tensor([[1, 1, 0]]).bool()
    off = probs.clone()
    off[..., 2] += 5.0  # only the padded key column differs
    assert distill_losses.attention_mse(off, probs, real).item() == pytest.approx(0.0)
    assert distill_losses.attention_mse(probs + 1.0, probs, real).item() == pytest.approx(1.0)  # 4 heads, each off by 1
    cls = torch.randn(3, 8)
    assert distill_losses.pkd_cls(5 * cls, cls).item() == pytest.approx(0.0, abs=1e-6)  # directions, not lengths
    assert distill_losses.pkd_cls(-cls, cls).item() == pytest.approx(4.0, abs=1e-5)
    s, t, temperature = torch.tensor([[1.0, -1.0, 0.5]]), torch.tensor([[0.2, 0.3, -2.0]]), 4.0
    kl = (torch.softmax(t / temperature, -1) * (torch.log_softmax(t / temperature, -1)
                                                - torch.log_softmax(s / temperature, -1))).sum()
    assert training.soft_label_kd(s, t, temperature).item() == pytest.approx((kl * temperature ** 2).item(), rel=1e-5)


def recorded_weights(monkeypatch) -> list:
    seen, real = [], distill.loss_fn
    monkeypatch.setattr(distill, "loss_fn", lambda w, *a, **k: seen.append(dict(w)) or real(w, *a, **k))
    return seen


def test_alpha_weighs_kd_and_its_complement_ce(model_dir, csv_file, tmp_path, monkeypatch):
    seen = recorded_weights(monkeypatch)  # every other test ran alpha 0.5, where both mixes agree
    distill.run(Artifact(model_dir, "hf"), tmp_path, context(csv_file, model_dir), epochs=0.2, batch_size=16,
                alpha=0.8)
    assert seen[-1]["kd"] == pytest.approx(0.8) and seen[-1]["ce"] == pytest.approx(0.2)


def test_two_phases_keep_layer_terms_and_prediction_terms_apart(model_dir, csv_file, tmp_path, monkeypatch):
    seen = recorded_weights(monkeypatch)
    distill.run(Artifact(model_dir, "hf"), tmp_path, context(csv_file, model_dir), epochs=0.2,
                intermediate_epochs=0.2, batch_size=16, hidden=1.0)
    first, second = seen
    assert first["kd"] == first["ce"] == 0 and first["hidden"] == 1 and first["cosine"] == 1
    assert second["hidden"] == second["cosine"] == 0 and second["kd"] == second["ce"] == 0.5


def layer_loss(model_dir, csv_file, weights: dict, student=None):
    import copy

    teacher = families.load_model(model_dir)
    teacher.set_attn_implementation("eager")
    student = student or copy.deepcopy(teacher)
    enc = data.encode(families.load_tokenizer(model_dir), data.load(str(csv_file)).train[:16], 32)
    w = {**dict.fromkeys(("kd", "ce", *distill.INTERMEDIATE), 0.0), **weights}
    pairs = [0, 1, 2, 3]
    view = distill.TeacherView(teacher, enc, 0, distill.needs(w, pairs, 4), False, 1024, False)
    return distill.loss_fn(w, pairs, 4, 2.0, None, None, view)(student.eval(), next(data.batches(enc, 16, 0)))


@pytest.mark.parametrize("term", ["hidden", "attention", "cosine", "pkd"])
def test_each_student_layer_is_matched_to_its_teacher_layer(model_dir, csv_file, term):
    """A copy of the teacher loses nothing: a term read one layer off (hidden_states[j] for j + 1, the last
    attention map for each, the second last hidden state for the last) did not."""
    assert layer_loss(model_dir, csv_file, {term: 1.0}).item() == pytest.approx(0.0, abs=1e-6)


def test_per_layer_terms_are_averaged_over_the_layers(model_dir, csv_file, monkeypatch):
    monkeypatch.setattr(distill_losses, "hidden_mse", lambda *a, **k: torch.tensor(1.0))
    assert layer_loss(model_dir, csv_file, {"hidden": 2.0}).item() == pytest.approx(2.0)  # 4 layers: was 8


def test_tokens_align_only_when_every_sentence_tokenizes_the_same(model_dir):
    tok = families.load_tokenizer(model_dir)
    a, b, c = (tok(t)["input_ids"] for t in ("a fine film", "a bad film", "a fine film ok"))
    assert distill.tokens_align(tok, tok, [(a, 0), (b, 0)], [(a, 0), (b, 0)])
    assert not distill.tokens_align(tok, tok, [(a, 0), (b, 0)], [(a, 0), (c, 0)])

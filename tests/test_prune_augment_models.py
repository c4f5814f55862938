"""Augmentation (distill.augment) on teachers the other stages make: a pruned model; its cache."""
import pytest
import torch

from edgekit import augment, data, families
from edgekit.artifact import Artifact
from edgekit.pipeline import Context
from edgekit.stages import prune


def test_augmentation_with_a_pruned_teacher_takes_neighbours_among_the_kept_pieces(model_dir, csv_file, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    ctx = Context(data.load(str(csv_file)), Artifact(model_dir, "hf"), 0, 32, False)
    teacher = prune.run(Artifact(model_dir, "hf"), tmp_path / "p", ctx, heads_keep=0.5, vocab=True,
                        importance="magnitude").path  # no MLM head, and shapes a plain masked-LM cannot load
    tok = families.load_tokenizer(teacher)
    extra, source = augment.augment(teacher, tok, ctx.splits.train[:20], 3, 0.5, 3, 0, progress=False)
    assert source == "embedding" and extra
    # the neighbours the unpruned table gives among the pieces the pruned model keeps (the training text's)
    vocab, seen = tok.get_vocab(), {i for ids, _ in data.encode(tok, ctx.splits.train, 32) for i in ids}
    kept = [t for t, i in vocab.items() if t.isalpha() and i in seen and i not in tok.all_special_ids]
    table = torch.nn.functional.normalize(families.load_model(model_dir).get_input_embeddings().weight.detach(), dim=-1)
    words = {"good", "movie", "q"}  # "q" is not in the training text: the pruned model reads it as [UNK]
    assert vocab["q"] not in seen and len(kept) > 4
    expected = {w: sorted((t for t in kept if t != w), key=lambda t: -float(table[vocab[w]] @ table[vocab[t]]))[:3]
                for w in words - {"q"}}
    assert augment.embedding_neighbours(teacher, tok, words, 3) == expected


@pytest.mark.parametrize("damage", [
    lambda text: text[:50],  # cut short: was a JSONDecodeError traceback on every later run
    lambda text: "[]",
    lambda text: '{"source": "mlm", "examples": [["a sentence", 7]]}',  # a label these sentences do not have
    lambda text: '{"source": "mlm", "examples": "ab"}',
    lambda text: "\udcff",  # not UTF-8
], ids=["cut-short", "a-list", "foreign-label", "examples-not-a-list", "not-utf8"])
def test_a_damaged_augmentation_cache_entry_is_made_again(model_dir, csv_file, tmp_path, monkeypatch, damage):
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    tok, examples = families.load_tokenizer(model_dir), data.load(str(csv_file)).train[:20]
    first = augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False)
    [entry] = (tmp_path / "cache" / "augment").glob("*.json")
    good = entry.read_text()
    entry.write_bytes(damage(good).encode("utf-8", "surrogateescape"))
    assert augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False) == first
    assert entry.read_text() == good  # overwritten with the set made again


def test_an_unwritable_augmentation_cache_is_skipped_with_one_line(model_dir, csv_file, tmp_path, monkeypatch,
                                                                   capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EDGEKIT_CACHE", str(blocker / "cache"))  # cannot be made: was an error ending the stage
    tok, examples = families.load_tokenizer(model_dir), data.load(str(csv_file)).train[:20]
    extra, source = augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False)
    assert source == "embedding" and extra
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot write the augmentation cache {blocker / 'cache' / 'augment'}" in err[0]
    assert "EDGEKIT_CACHE" in err[0]


def test_a_failed_augmentation_cache_write_leaves_no_temp_file(model_dir, csv_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    tok, examples = families.load_tokenizer(model_dir), data.load(str(csv_file)).train[:20]

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(augment.os, "replace", full)
    assert augment.augment(model_dir, tok, examples, 3, 0.5, 3, 0, progress=False)[0]
    assert list((tmp_path / "cache" / "augment").iterdir()) == []
    assert "No space left on device" in capsys.readouterr().err


def byte_level_model(folder, texts):
    """A tiny RoBERTa with a byte-level BPE tokenizer (as roberta-base's: Ġ starts a word, no unknown token)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import AutoModelForSequenceClassification, RobertaTokenizerFast

    from edgekit.testing import tiny_config

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=300, min_frequency=1, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                     pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    config = tiny_config("roberta")
    config.vocab_size, config.pad_token_id, config.bos_token_id, config.eos_token_id = 300, 1, 0, 2
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("vocabulary", ["sentencepiece", "byte-level"])
def test_augmentation_replaces_whole_words_of_sentencepiece_and_byte_level_vocabularies(csv_file, tmp_path,
                                                                                         monkeypatch, vocabulary):
    """Was: SentencePiece (ALBERT, XLM-R: ▁word) gave no word to replace, so no copy at all; byte-level BPE
    (RoBERTa: Ġword) took only each sentence's first word and wrote the token with its marker into the text."""
    from edgekit.testing import WORDS, make_model_dir

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    examples = data.load(str(csv_file)).train[:30]
    folder = make_model_dir(tmp_path / "m", "xlm-roberta") if vocabulary == "sentencepiece" else \
        byte_level_model(tmp_path / "m", [t for t, _ in data.load(str(csv_file)).train])
    tok = families.load_tokenizer(folder)
    extra, source = augment.augment(folder, tok, examples, 3, 0.5, 3, 0, progress=False)
    assert source == "embedding" and len(extra) >= len(examples)
    originals = {t: t.split() for t, _ in examples}
    replaced = 0
    for text, _ in extra:
        assert "\u2581" not in text and "\u0120" not in text
        words = text.split()
        near = [w for w in originals.values() if len(w) == len(words)]  # the same words, some replaced
        assert near and all(w.isalpha() for w in words)
        replaced += sum(a != b for a, b in zip(words, min(near, key=lambda o: sum(a != b for a, b in zip(o, words)))))
        if vocabulary == "sentencepiece":  # its whole-word tokens are the tiny vocabulary's words
            assert set(words) <= set(WORDS)
    assert replaced > len(extra)  # more than the first word of each copy

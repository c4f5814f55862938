import json

import pytest

from edgekit import data
from edgekit.errors import EdgekitError


def test_csv_with_string_labels_splits_deterministically(csv_file):
    a = data.load(str(csv_file), seed=0)
    b = data.load(str(csv_file), seed=0)
    assert a.labels == ["neg", "pos"]
    assert a.test == b.test and a.train == b.train and a.fingerprint() == b.fingerprint()
    assert len(a.train) > len(a.test) > 0
    assert not {t for t, _ in a.train} & {t for t, _ in a.test}


def test_a_csv_saved_by_excel_with_a_byte_order_mark_loads(csv_file, tmp_path):
    bom = tmp_path / "excel.csv"  # was: "no column 'text'; columns: \ufefftext, label"
    bom.write_bytes(b"\xef\xbb\xbf" + csv_file.read_bytes())
    assert data.load(str(bom)).train == data.load(str(csv_file)).train


def test_tsv_and_jsonl_with_integer_labels_and_many_classes(tmp_path):
    rows = [{"sentence": f"text number {i} " + "word " * (i % 5), "y": i % 3} for i in range(90)]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    splits = data.load(str(jsonl), text_column="sentence", label_column="y")
    assert splits.labels == ["0", "1", "2"]
    tsv = tmp_path / "d.tsv"
    tsv.write_text("sentence\ty\n" + "\n".join(f"{r['sentence']}\t{r['y']}" for r in rows))
    assert data.load(str(tsv), text_column="sentence", label_column="y").labels == ["0", "1", "2"]


def test_integer_labels_sort_numerically(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("text,label\n" + "\n".join(f"sentence {i},{[2, 10, 1][i % 3]}" for i in range(60)))
    assert data.load(str(f)).labels == ["1", "2", "10"]


def test_split_column_and_max_sizes(tmp_path):
    f = tmp_path / "d.csv"
    lines = [f"s{i} text,{'ab'[i % 2]},{'train' if i < 40 else 'dev' if i < 50 else 'test'}" for i in range(60)]
    f.write_text("text,label,part\n" + "\n".join(lines))
    s = data.load(str(f), split_column="part", max_train=10, max_eval=5)
    assert (len(s.train), len(s.validation), len(s.test)) == (10, 5, 5)


def test_missing_values_are_skipped(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("text,label\n" + "\n".join(f"s{i},{'ab'[i % 2]}" for i in range(60)) + "\n,a\nno label,\n")
    assert sum(len(x) for x in (data.load(str(f)).train, data.load(str(f)).validation, data.load(str(f)).test)) == 60


@pytest.mark.parametrize("content, kwargs, message", [
    ("text,label\n", {}, "is empty"),
    ("words,label\nhello,a\n", {}, "has no column 'text'; columns: words, label"),
    ("text,label\n" + "\n".join(f"s{i},a" for i in range(40)), {}, "has one class (a)"),
])
def test_bad_datasets_get_one_clear_line(tmp_path, content, kwargs, message):
    f = tmp_path / "d.csv"
    f.write_text(content)
    with pytest.raises(EdgekitError) as e:
        data.load(str(f), **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_unseen_test_label_is_an_error(tmp_path):
    f = tmp_path / "d.csv"
    lines = [f"s{i},{'ab'[i % 2]},train" for i in range(20)] + ["x,c,test", "y,a,test"]
    f.write_text("text,label,split\n" + "\n".join(lines))
    with pytest.raises(EdgekitError, match="test labels never seen in training: c"):
        data.load(str(f), split_column="split")


def test_missing_file_and_wrong_suffix(tmp_path):
    with pytest.raises(EdgekitError, match="not found"):
        data.load(str(tmp_path / "nope.csv"))
    (tmp_path / "d.xlsx").write_text("x")
    with pytest.raises(EdgekitError, match="supported: .csv"):
        data.load(str(tmp_path / "d.xlsx"))


def test_batches_pad_dynamically_and_cover_every_example():
    encoded = [([2] + [5] * n + [3], n % 2) for n in range(1, 30)]
    seen = []
    for b in data.batches(encoded, 8, pad_id=0, shuffle=True, seed=1):
        assert b["input_ids"].shape == b["attention_mask"].shape
        assert b["input_ids"].shape[1] == b["attention_mask"].sum(1).max()
        seen += b["index"]
    assert sorted(seen) == list(range(len(encoded)))
    order = [b["index"] for b in data.batches(encoded, 8, pad_id=0, shuffle=True, seed=1)]
    assert order == [b["index"] for b in data.batches(encoded, 8, pad_id=0, shuffle=True, seed=1)]

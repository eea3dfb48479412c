"""The task table (`train/finetune/tasks.py`): one row per name of `constants.FINETUNE_TASKS`, and
the library runs every task of it from one FinetuneConfig, the retrieval and SPLADE tasks
included (each on a tiny model and a few rows: plumbing, not learning)."""

from __future__ import annotations

import json
import random

import pytest

from bertkit.constants import FINETUNE_CONFIG, FINETUNE_TASKS, LABELLED_TASKS
from bertkit.encoder import tasks as heads
from bertkit.train import finetune as ft
from bertkit.train import retrieval, sparse

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import WORDS, sentences, tiny_mlm

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_task_has_one_row_and_a_head():
    assert tuple(ft.TASK_ROWS) == FINETUNE_TASKS
    for name, row in ft.TASK_ROWS.items():
        assert row.name == name and row.head.kind in heads.HEADS
        assert (row.task_class is not None) == (name in LABELLED_TASKS)
    assert set(ft.TASK_CLASSES) == set(LABELLED_TASKS)


def test_the_options_make_each_trainers_own_settings(tmp_path):
    common = {"model": "m", "train": "t", "out_dir": str(tmp_path / "o"), "device": "cpu"}
    assert type(ft.finetune_settings({"task": "ner", **common})) is ft.FinetuneConfig
    embed = ft.finetune_settings({"task": "embed", **common, "scale": 10.0})
    assert type(embed) is retrieval.RetrievalTrainConfig and embed.scale == 10.0
    assert type(ft.finetune_settings({"task": "sparse", **common})) is sparse.SparseTrainConfig
    with pytest.raises(ValueError, match="--scale applies to --task embed / rerank only, not qa"):
        ft.finetune_settings({"task": "qa", **common, "scale": 10.0})
    with pytest.raises(ValueError, match="--flops-doc-weight applies to --task sparse only, not rerank"):
        ft.finetune_settings({"task": "rerank", **common, "flops_doc_weight": 0.1})
    with pytest.raises(ValueError, match="unknown task 'tag'; choose one of classify, pair"):
        ft.finetune_settings({"task": "tag", **common})


def _words(rng: random.Random, n: int) -> list[str]:
    return rng.choices(WORDS, k=n)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _labelled(path, rng):
    return _jsonl(path, [{"text": " ".join(_words(rng, 5)), "label": rng.choice(["a", "b"])} for _ in range(12)])


def _pairs(path, rng):
    return _jsonl(path, [{"text": " ".join(_words(rng, 4)), "text_pair": " ".join(_words(rng, 4)),
                          "label": rng.choice(["same", "other"])} for _ in range(12)])


def _tagged(path, rng):
    rows = []
    for _ in range(12):
        tokens = _words(rng, 5)
        rows.append({"tokens": tokens, "tags": ["B-X" if t == "cat" else "O" for t in tokens]})
    return _jsonl(path, rows)


def _squad(path, rng):
    paragraphs = []
    for i in range(12):
        context = " ".join(_words(rng, 6)) + " the city ."
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": "the city ?", "answers": [
            {"text": "city", "answer_start": context.index(" city") + 1}]}]})
    path = path.with_suffix(".json")
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "x", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    return path


def _retrieval_pairs(path, rng):
    return _jsonl(path, [{"query": " ".join(t.split()[:2]), "positive": t} for t in sentences(12, seed=3)])


DATA = {"classify": _labelled, "pair": _pairs, "ner": _tagged, "qa": _squad, "embed": _retrieval_pairs,
        "rerank": _retrieval_pairs, "sparse": _retrieval_pairs, "colbert": _retrieval_pairs}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny masked-LM: an encoder every task can start from (SPLADE needs its MLM head)."""
    return tiny_mlm(tmp_path_factory.mktemp("base") / "mlm")


@pytest.mark.parametrize("task", FINETUNE_TASKS)
def test_the_library_runs_every_task_of_its_table(tmp_path, base, task):
    train = DATA[task](tmp_path / "train.jsonl", random.Random(0))
    out = tmp_path / "out"
    config = ft.FinetuneConfig(task=task, model=str(base), train=str(train), out_dir=str(out), eval=str(train),
                               epochs=1, batch_size=4, lr=1e-3, max_length=24, doc_stride=8, progress=False,
                               device="cpu", precision="fp32")
    summary = ft.run_finetune(config)
    assert summary["status"] == "done" and summary["task"] == task
    assert summary["eval"], summary
    assert json.loads((out / "eval.json").read_text(encoding="utf-8"))["task"] == task
    assert json.loads((out / FINETUNE_CONFIG).read_text(encoding="utf-8"))["task"] == task
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()

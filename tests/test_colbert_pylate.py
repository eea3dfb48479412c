"""bertkit's ColBERT vectors and MaxSim scores equal PyLate's (≤ 1e-5), on a tiny random model
that PyLate made and saved, in each query setting (attend_to_expansion_tokens false as PyLate's
default, true, and no query expansion); and PyLate reads the directory bertkit's
`finetune --task colbert` saves as bertkit does.

The fixture (tests/fixtures/colbert_pylate/) is PyLate's own output; regenerate it with PyLate in
its own virtual environment, as tests/oracles/colbert_pylate.py's docstring says:

    /work/venv-pylate/bin/python tests/oracles/colbert_pylate.py
    PYTHONPATH=src .venv/bin/python tests/oracles/colbert_pylate.py --make-trained
    /work/venv-pylate/bin/python tests/oracles/colbert_pylate.py --trained
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bertkit
from bertkit.inference.colbert import Colbert
from bertkit.inference.multivector import maxsim_scores
from oracles.colbert_pylate import DOCUMENTS, QUERIES, SETTINGS

from pretrain_fixtures import one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURE = Path(__file__).parent / "fixtures" / "colbert_pylate"


def _split(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(lengths)[:-1])


def _with_settings(tmp_path: Path, settings: dict) -> Path:
    """The fixture model with PyLate's constructor overrides written into its config."""
    model = tmp_path / "model"
    shutil.copytree(FIXTURE / "model", model)
    file = model / "config_sentence_transformers.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **settings}))
    return model


def _compare(colbert: Colbert, expected: dict[str, np.ndarray], prefix: str = "") -> None:
    queries = colbert.encode_query(QUERIES)
    documents = colbert.encode_document(DOCUMENTS)
    sides = ((queries, "queries", "query_lengths"), (documents, "documents", "document_lengths"))
    for ours, flat, lengths in sides:
        theirs = _split(expected[prefix + flat], expected[prefix + lengths])
        assert [len(v) for v in ours] == [len(v) for v in theirs]
        for mine, pylate in zip(ours, theirs):
            assert np.abs(mine.numpy() - pylate).max() <= 1e-5
    scores = torch.stack([maxsim_scores(q, documents) for q in queries]).numpy()
    assert np.abs(scores - expected[prefix + "scores"]).max() <= 1e-5


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_vectors_and_scores_equal_pylates(setting, tmp_path):
    expected = np.load(FIXTURE / "expected.npz")
    _compare(Colbert.load(_with_settings(tmp_path, SETTINGS[setting])), expected, f"{setting}/")


def test_the_front_door_gives_the_same_vectors():
    expected = np.load(FIXTURE / "expected.npz")
    model = bertkit.load(FIXTURE / "model", device="cpu")
    first = _split(expected["default/queries"], expected["default/query_lengths"])[0]
    assert np.abs(model.encode_query(QUERIES[0]) - first).max() <= 1e-5
    ranked = model.rerank(QUERIES[1], DOCUMENTS)
    order = np.argsort(-expected["default/scores"][1], kind="stable")
    assert [r["index"] for r in ranked] == order.tolist()


def test_pylate_reads_what_bertkit_trains():
    """trained/ was saved by `finetune --task colbert` from a plain BERT (the prefixes added, a
    projection made); PyLate's vectors of it (trained.npz) are bertkit's."""
    _compare(Colbert.load(FIXTURE / "trained"), np.load(FIXTURE / "trained.npz"))


def test_a_dense_layer_saved_as_pytorch_model_bin_reads_the_same(tmp_path):
    """Older PyLate and sentence-transformers saves: the Dense weights in pytorch_model.bin (read
    with weights_only, so no code in it runs)."""
    from safetensors.torch import load_file

    model = _with_settings(tmp_path, {})
    dense = model / "1_Dense"
    torch.save(load_file(dense / "model.safetensors"), dense / "pytorch_model.bin")
    (dense / "model.safetensors").unlink()
    _compare(Colbert.load(model), np.load(FIXTURE / "expected.npz"), "default/")

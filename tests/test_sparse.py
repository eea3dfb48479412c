"""Sparse (SPLADE) embeddings: equal to sentence-transformers' SparseEncoder, and the CLI, the
Python front door and the file job over them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.encoder.sentence_transformers import SpladePooling
from bertkit.inference.sparse import decode, embed_sparse, sparse_engine, to_sparse_tensor

from retrieval_fixtures import VOCAB, sentences, tiny_encoder, tiny_mlm

TEXTS = sentences(9, seed=3) + ["red ball", "the big green tree over the river city news game team wins " * 3]


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    return tiny_mlm(tmp_path_factory.mktemp("mlm"))


@pytest.fixture(scope="module")
def sparse_encoder(mlm_dir, tmp_path_factory):
    """The same weights as sentence-transformers' SparseEncoder, saved as its directory."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sparse_encoder.modules import MLMTransformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling as STPooling

    model = st.SparseEncoder(modules=[MLMTransformer(str(mlm_dir)), STPooling("max")], device="cpu")
    out = tmp_path_factory.mktemp("st")
    model.save(str(out))
    return model, out


def dense(rows) -> torch.Tensor:
    return to_sparse_tensor(rows, len(VOCAB)).to_dense()


@pytest.mark.parametrize("top_k", [None, 4])
def test_equal_to_sentence_transformers_sparse_encoder(sparse_encoder, mlm_dir, top_k):
    model, st_dir = sparse_encoder
    expected = model.encode(TEXTS, convert_to_sparse_tensor=True, max_active_dims=top_k).to_dense()
    for directory in (mlm_dir, st_dir):  # a plain masked-LM dir and the SparseEncoder dir it became
        # A small token budget: several batches, and groups of projection rows inside each.
        ours = dense(embed_sparse(directory, TEXTS, top_k=top_k, max_batch_tokens=37))
        assert ours.shape == expected.shape and (ours - expected).abs().max() <= 1e-5
        assert torch.equal(ours > 0, expected > 0)
    assert (expected > 0).sum(1).min() > (4 if top_k is None else 0)  # dense enough to prune


def test_sum_pooling_and_log1p_relu_follow_the_saved_settings(mlm_dir, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.sparse_encoder.modules import MLMTransformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling as STPooling

    model = st.SparseEncoder(modules=[MLMTransformer(str(mlm_dir)), STPooling("sum", "log1p_relu")], device="cpu")
    model.save(str(tmp_path))
    assert SpladePooling.read(tmp_path) == SpladePooling("sum", "log1p_relu")
    assert SpladePooling.read(tmp_path).declared and not SpladePooling.read(mlm_dir).declared
    from bertkit.serve.models import load_model  # /info says "splade", as TEI does for a SPLADE model

    assert load_model("s", tmp_path).describe()["model_type"] == {"embedding": {
        "pooling": "splade", "splade": {"pooling_strategy": "sum", "activation_function": "log1p_relu"}}}
    expected = model.encode(TEXTS[:4], convert_to_sparse_tensor=True).to_dense()
    assert (dense(embed_sparse(tmp_path, TEXTS[:4])) - expected).abs().max() <= 1e-5


def test_a_text_alone_equals_it_in_a_batch_and_decode_orders_terms(mlm_dir):
    engine = sparse_engine(mlm_dir, max_batch_tokens=20)
    together = embed_sparse(engine, TEXTS)
    for i in (0, len(TEXTS) - 1):
        (alone,) = embed_sparse(engine, TEXTS[i])
        assert torch.equal(alone[0], together[i][0]) and torch.allclose(alone[1], together[i][1], atol=1e-6)
    pairs = decode(engine.tokenizer, *together[0], top_k=3)
    assert len(pairs) == 3 and pairs[0][1] >= pairs[1][1] >= pairs[2][1] and all(t in VOCAB for t, _ in pairs)


def test_api_encode_sparse_matches_sentence_transformers_shapes(sparse_encoder):
    import bertkit

    model, st_dir = sparse_encoder
    ours = bertkit.load(st_dir, device="cpu")
    embeddings = ours.encode_sparse(TEXTS[:3], max_active_dims=5)
    expected = model.encode(TEXTS[:3], convert_to_sparse_tensor=True, max_active_dims=5)
    assert embeddings.is_sparse and embeddings.shape == expected.shape
    assert (embeddings.to_dense() - expected.to_dense()).abs().max() <= 1e-5
    ours_decoded, theirs = ours.decode(embeddings, top_k=2), model.decode(expected, top_k=2)
    assert [[t for t, _ in row] for row in ours_decoded] == [[t for t, _ in row] for row in theirs]
    one = ours.encode_sparse(TEXTS[0])
    assert one.shape == (len(VOCAB),)
    tei = ours.encode_sparse(TEXTS[0], convert_to_sparse_tensor=False)
    assert {p["index"] for p in tei} == set(one.coalesce().indices()[0].tolist())


def test_without_an_mlm_head_one_line_names_what_it_needs(tmp_path, capsys):
    from bertkit.cli import main

    encoder = tiny_encoder(tmp_path / "enc")
    with pytest.raises(ValueError, match="bare encoder.*sparse embeddings \\(SPLADE\\) need a masked-LM head"):
        embed_sparse(encoder, ["a text"])
    assert main(["embed", str(encoder), "--sparse", "a cat"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "masked-LM head" in err
    import bertkit

    with pytest.raises(ValueError, match="encode_sparse needs a masked-LM head"):
        bertkit.load(encoder, device="cpu").encode_sparse("a cat")


def test_cli_prints_top_terms_and_json(mlm_dir, capsys):
    from bertkit.cli import main

    assert main(["embed", str(mlm_dir), "--sparse", "the cat sees a dog", "--top-k", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "the cat sees a dog" and out[1].startswith("  3 terms; top 3: ")
    assert main(["embed", str(mlm_dir), "--sparse", "red ball", "the dog", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = embed_sparse(mlm_dir, ["red ball", "the dog"])
    for row, (ix, values) in zip(rows, expected):
        assert row["embedding"] == {VOCAB[i]: pytest.approx(float(v)) for i, v in zip(ix.tolist(), values)}
    assert main(["embed", str(mlm_dir), "--sparse", "x", "--truncate-dim", "4"]) == 2
    assert "--truncate-dim is for dense embeddings" in capsys.readouterr().err
    assert main(["embed", str(mlm_dir), "a", "--top-k", "4"]) == 2
    assert "--top-k goes with --sparse" in capsys.readouterr().err


def test_cli_takes_int8_static_with_its_calibration_file(mlm_dir, tmp_path, capsys):
    from bertkit.cli import main

    source = tmp_path / "calibration.txt"
    source.write_text("\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    assert main(["embed", str(mlm_dir), "--sparse", "red ball", "--json", "--precision", "int8-static",
                 "--calibration", str(source)]) == 0
    assert json.loads(capsys.readouterr().out)["embedding"]


def test_file_job_writes_index_value_rows_and_refuses_npy(mlm_dir, tmp_path, capsys):
    from bertkit.cli import main

    src = tmp_path / "texts.txt"
    src.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert main(["embed", str(mlm_dir), "--sparse", "--input", str(src), "--out", str(tmp_path / "x.npy")]) == 2
    assert ".jsonl" in capsys.readouterr().err
    out = tmp_path / "sparse.jsonl"
    assert main(["embed", str(mlm_dir), "--sparse", "--top-k", "6", "--input", str(src), "--out", str(out),
                 "--no-progress"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = embed_sparse(mlm_dir, TEXTS, top_k=6)
    assert [r["line"] for r in rows] == list(range(1, len(TEXTS) + 1))
    for row, (ix, values) in zip(rows, expected):
        assert row["indices"] == ix.tolist() and np.allclose(row["values"], values.numpy(), atol=1e-6)
    capsys.readouterr()
    # The same job resumed over a complete output does nothing and keeps it.
    assert main(["embed", str(mlm_dir), "--sparse", "--top-k", "6", "--input", str(src), "--out", str(out),
                 "--resume", "--no-progress"]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows

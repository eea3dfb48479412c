"""ColBERT models: their settings read, queries and documents read as PyLate reads them, the key
mask of query expansion, `Model.encode_query` / `rerank`, `bertkit rerank --late-interaction` and
`finetune --task colbert` (contrastive, distillation, exact resume). PyLate's own numbers are
tests/test_colbert_pylate.py's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import bertkit
from bertkit.encoder.sentence_transformers import ColbertSettings
from bertkit.inference.colbert import Colbert, encode_with_key_mask
from bertkit.inference.multivector import maxsim, maxsim_scores
from bertkit.train import colbert as train_colbert

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import VOCAB, sentences, tiny_cross_encoder, tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")


def settings(data, out, **extra):
    root, train, base = data
    return {"model": str(base), "train": str(train), "out_dir": str(out), "epochs": 2, "batch_size": 4, "lr": 1e-3,
            "max_length": 16, "query_length": 8, "embedding_size": 12, "save_every": 2, "progress": False,
            "mine": "none", **extra}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("colbert")
    docs = sentences(12, seed=5)
    rows = [{"query": " ".join(d.split()[:2]), "positive": d, "negatives": [docs[(i + 3) % 12]]}
            for i, d in enumerate(docs)]
    train = root / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root, train, tiny_encoder(root / "base")


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """A ColBERT made from a plain encoder by one short run."""
    out = tmp_path_factory.mktemp("trained") / "colbert"
    train_colbert.finetune_colbert(**settings(data, out, epochs=1))
    return out


def test_a_run_writes_pylates_layout(trained):
    found = ColbertSettings.read(trained)
    assert (found.query_length, found.document_length, found.dimension) == (8, 16, 12)
    assert not found.attend_to_expansion_tokens and found.do_query_expansion and found.query_prefix == "[Q] "
    modules = json.loads((trained / "modules.json").read_text())
    assert [m["type"] for m in modules] == ["sentence_transformers.models.Transformer", "pylate.models.Dense.Dense"]
    assert json.loads((trained / "config.json").read_text())["vocab_size"] == len(VOCAB) + 2  # [Q] and [D] added
    assert json.loads((trained / "config_sentence_transformers.json").read_text())["model_type"] == "ColBERT"


def test_settings_of_other_directories(data, tmp_path, trained):
    assert ColbertSettings.read(data[2]) is None  # a plain encoder
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    dense = broken / "1_Dense" / "config.json"
    dense.write_text(json.dumps({**json.loads(dense.read_text()), "activation_function": "torch.nn.Tanh"}))
    with pytest.raises(ValueError, match="activation 'torch.nn.Tanh' is not supported"):
        ColbertSettings.read(broken)
    dense.write_text(json.dumps({**json.loads(dense.read_text()), "activation_function": None,
                                 "out_features": 13}))
    with pytest.raises(ValueError, match=r"linear.weight should be \(13, 32\)"):
        Colbert.load(broken)


def test_queries_are_expanded_and_documents_skip_their_skiplist(trained):
    colbert = Colbert.load(trained)
    tokenizer = colbert.engine.tokenizer
    ids, real = colbert.token_ids(["cat dog", " ".join(["cat"] * 20)], is_query=True)
    q, mask = colbert.query_prefix_id, tokenizer.mask_token_id
    cat, dog = tokenizer.convert_tokens_to_ids(["cat", "dog"])
    assert ids[0] == [tokenizer.cls_token_id, q, cat, dog, tokenizer.sep_token_id, mask, mask, mask] and real[0] == 5
    assert ids[1] == [tokenizer.cls_token_id, q] + [cat] * 5 + [tokenizer.sep_token_id] and real[1] == 8
    # Punctuation is not in this vocabulary: the skiplist words map to [UNK], skipped as PyLate does.
    vectors = colbert.encode_document(["cat zzz dog", "cat dog"])
    assert [len(v) for v in vectors] == [5, 5]  # [CLS] [D] cat dog [SEP]
    assert torch.allclose(vectors[0].norm(dim=1), torch.ones(5), atol=1e-6)
    queries = colbert.encode_query(["cat dog", "dog"])
    assert [tuple(v.shape) for v in queries] == [(8, 12), (8, 12)]


def test_a_text_alone_gets_the_vectors_it_gets_in_a_batch(trained):
    colbert = Colbert.load(trained, max_batch_tokens=20)  # several batches
    texts = sentences(7, seed=11)
    for is_query in (True, False):
        together = colbert.encode(texts, is_query=is_query)
        for text, vectors in zip(texts, together):
            assert torch.allclose(colbert.encode([text], is_query=is_query)[0], vectors, atol=1e-5)


def test_the_key_mask_hides_expansion_tokens_from_every_token(trained):
    """Real tokens see only each other (their states equal the real sequence's alone); the [MASK]
    positions get states of their own, which differ once they may be attended."""
    colbert = Colbert.load(trained)
    encoder = colbert.engine.model
    ids, real = colbert.token_ids(["cat sees the dog"], is_query=True)
    input_ids = torch.tensor(ids)  # (1, 8)
    keys = torch.arange(8)[None] < real[0]
    with torch.inference_mode():
        masked = encode_with_key_mask(encoder, input_ids, torch.zeros_like(input_ids), keys)[0]
        alone = encoder(input_ids[:, :real[0]]).last_hidden_state[0]
        attended = encoder(input_ids).last_hidden_state[0]
    assert torch.allclose(masked[:real[0]], alone, atol=1e-5)
    assert not torch.allclose(masked[real[0]:], attended[real[0]:], atol=1e-3)


def test_model_api_and_rerank(trained, data):
    model = bertkit.load(trained)
    query = model.encode_query("cat dog")
    assert isinstance(query, np.ndarray) and query.shape == (8, 12)
    documents = sentences(5, seed=2)
    vectors = model.encode_document(documents, convert_to_tensor=True)
    chunked = model.encode_document(documents, convert_to_tensor=True, batch_size=2)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(vectors, chunked))
    expected = maxsim_scores(torch.from_numpy(query), vectors)
    ranked = model.rerank("cat dog", documents, return_documents=True)
    assert [r["index"] for r in ranked] == sorted(range(5), key=lambda i: -float(expected[i]))
    assert ranked[0]["score"] == pytest.approx(maxsim(torch.from_numpy(query), vectors[ranked[0]["index"]]), abs=1e-5)
    assert ranked[0]["text"] == documents[ranked[0]["index"]]
    dense = bertkit.load(data[2])
    assert np.allclose(dense.encode_query(["cat"]), dense.encode(["cat"]))  # no "query" prompt: encode
    with pytest.raises(ValueError, match="is not a ColBERT model; late interaction needs a ColBERT model"):
        dense.require_late_interaction()


def test_cli_rerank_late_interaction(trained, data, capsys):
    from bertkit import cli

    assert cli.main(["rerank", str(trained), "--query", "cat dog", "the cat", "a red car", "--late-interaction",
                     "--json", "--threads", "1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    scores = Colbert.load(trained).rerank("cat dog", ["the cat", "a red car"])
    assert [(r["index"], round(r["score"], 4)) for r in rows] == [(s["index"], round(s["score"], 4)) for s in scores]
    assert cli.main(["rerank", str(data[2]), "--query", "cat", "the cat", "--late-interaction", "--threads", "1"]) == 2
    assert "is not a ColBERT model; late interaction needs" in capsys.readouterr().err


def test_losses_against_their_definitions():
    torch.manual_seed(0)
    q, d = torch.randn(2, 4, 6), torch.randn(3, 5, 6)
    full = train_colbert.maxsim_matrix(q, None, d, torch.ones(3, 5, dtype=torch.bool))
    assert full[1, 2] == pytest.approx(maxsim(q[1], d[2]), abs=1e-5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[0, 1:] = False  # PyLate: a masked token scores 0, so the maximum is at least 0
    assert train_colbert.maxsim_matrix(q, None, d, mask)[0, 0] == pytest.approx(
        float((q[0] @ d[0, 0]).clamp(min=0).sum()), abs=1e-5)
    student = torch.tensor([0.0, 0.5, 1.0])  # min-max normalised already
    assert float(train_colbert.distillation_loss(student, student)) == pytest.approx(0.0, abs=1e-7)
    assert float(train_colbert.distillation_loss(student, student.flip(0))) > 0.1


def test_a_killed_run_resumes_with_the_same_losses(data, tmp_path, monkeypatch):
    whole = train_colbert.finetune_colbert(**settings(data, tmp_path / "whole"))
    real, calls = train_colbert.batch_loss, []

    def dies_at_step_4(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_colbert, "batch_loss", dies_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        train_colbert.finetune_colbert(**settings(data, tmp_path / "cut"))
    monkeypatch.setattr(train_colbert, "batch_loss", real)
    assert (tmp_path / "cut" / "checkpoints" / "step-2").is_dir()
    with pytest.raises(FileExistsError, match="--resume"):
        train_colbert.finetune_colbert(**settings(data, tmp_path / "cut"))
    resumed = train_colbert.finetune_colbert(**settings(data, tmp_path / "cut", resume=True))
    losses = [[json.loads(line)["loss"] for line in (tmp_path / d / "steps.jsonl").read_text().splitlines()]
              for d in ("whole", "cut")]
    assert resumed["steps"] == whole["steps"] == 6 and losses[1] == pytest.approx(losses[0], rel=1e-5)
    first, second = Colbert.load(tmp_path / "whole"), Colbert.load(tmp_path / "cut")
    assert torch.allclose(first.encode_query(["cat"])[0], second.encode_query(["cat"])[0], atol=1e-5)


def test_distillation_from_a_cross_encoder(data, tmp_path):
    teacher = tiny_cross_encoder(tmp_path / "teacher")
    summary = train_colbert.finetune_colbert(**settings(data, tmp_path / "out", epochs=1, hard_negatives=1,
                                                        distill_from=str(teacher), eval=str(data[1])))
    assert summary["loss"] == "distillation" and summary["steps"] == 3 and "mrr@10" in summary["eval"]
    with pytest.raises(ValueError, match="is not a cross-encoder"):
        train_colbert.finetune_colbert(**settings(data, tmp_path / "bad", distill_from=str(data[2])))


def test_cli_options(data, tmp_path, capsys):
    from bertkit import cli

    root, train, base = data
    common = ["--model", str(base), "--train", str(train), "--no-progress", "--threads", "1"]
    assert cli.main(["finetune", "--task", "colbert", *common, "--out", str(tmp_path / "m"), "--epochs", "1",
                     "--batch-size", "4", "--query-length", "6", "--max-length", "12", "--embedding-size", "10"]) == 0
    assert "model saved in" in capsys.readouterr().out
    assert Colbert.load(tmp_path / "m").encode_query(["cat"])[0].shape == (6, 10)
    assert cli.main(["finetune", "--task", "colbert", *common, "--out", str(tmp_path / "x"),
                     "--query-length", "64"]) == 2
    assert "--query-length 64 exceeds the model's limit of 41 tokens" in capsys.readouterr().err
    assert cli.main(["finetune", "--task", "embed", *common, "--out", str(tmp_path / "y"),
                     "--distill-from", str(base)]) == 2
    assert "--distill-from applies to --task colbert only" in capsys.readouterr().err
    assert cli.main(["finetune", "--task", "colbert", *common, "--out", str(tmp_path / "z"),
                     "--flops-doc-weight", "1"]) == 2
    assert "--flops-doc-weight does not apply to --task colbert" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_the_key_mask_matches_transformers_attention_mask(family, tmp_path):
    """transformers computes every position of a padded batch with the padding keys hidden, and
    PyLate's queries read the [MASK] positions of that output: `encode_with_key_mask` gives it."""
    transformers = pytest.importorskip("transformers")
    from bertkit.encoder.model import BertModel

    from modern_fixtures import make_modernbert

    if family == "bert":
        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=50, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                         intermediate_size=37, max_position_embeddings=32)
        transformers.BertModel(config).eval().save_pretrained(tmp_path)
        reference = transformers.BertModel.from_pretrained(tmp_path).eval()
    else:
        make_modernbert(tmp_path, kind="Model")
        reference = transformers.ModernBertModel.from_pretrained(tmp_path).eval()
    ours = BertModel.from_pretrained(tmp_path).eval()
    torch.manual_seed(1)
    input_ids = torch.randint(5, 50, (3, 20))
    keys = torch.arange(20)[None] < torch.tensor([20, 9, 4])[:, None]  # (3, 20): real tokens first
    with torch.no_grad():
        theirs = reference(input_ids=input_ids, attention_mask=keys.long()).last_hidden_state
        mine = encode_with_key_mask(ours, input_ids, torch.zeros_like(input_ids), keys)
    assert torch.allclose(mine, theirs, atol=1e-5), float((mine - theirs).abs().max())

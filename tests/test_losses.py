"""The bi-encoder's loss table: each loss equal to sentence-transformers' on the same embeddings,
Matryoshka over any of them, GradCache's gradients equal to the uncached loss's, the teacher's
scores cached and reused, and runs of each loss from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.train import retrieval as rt
from bertkit.train.retrieval import biencoder, losses

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_cross_encoder, tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")

B, K, H = 7, 2, 10  # batch, negatives per row, embedding size: distinct, H even and odd below


def _settings(loss: str, **extra) -> rt.RetrievalTrainConfig:
    teacher = "t" if loss in ("margin-mse", "kl") else None
    return rt.RetrievalTrainConfig(task="embed", model="m", train="t", out_dir="o", loss=loss, teacher=teacher,
                                   hard_negatives=K, **extra)


def _embeddings(seed: int, dim: int = H):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, dim, generator=g, dtype=torch.float64)
    pos = torch.randn(B, dim, generator=g, dtype=torch.float64)
    negs = [torch.randn(B, dim, generator=g, dtype=torch.float64) for _ in range(K)]
    # ours: the positives, then each row's K negatives row by row
    candidates = torch.cat([pos, torch.stack(negs, dim=1).reshape(B * K, dim)])
    scores = torch.rand(B, generator=g, dtype=torch.float64).round(decimals=1)  # ties on purpose
    teacher = 5 * torch.randn(B, 1 + K, generator=g, dtype=torch.float64)
    return q, pos, negs, candidates, scores, teacher


def _st_loss(name: str, scale: float, temperature: float = 1.0):
    """sentence-transformers' loss of the same name, as our table configures it."""
    from sentence_transformers.sentence_transformer import losses as st
    from sentence_transformers.util import pairwise_cos_sim

    def scaled_cos(a, b):
        return scale * pairwise_cos_sim(a, b)

    return {"mnrl": lambda: st.MultipleNegativesRankingLoss(None, scale=scale),
            "cosent": lambda: st.CoSENTLoss(None, scale=scale),
            "angle": lambda: st.AnglELoss(None, scale=scale),
            "margin-mse": lambda: st.MarginMSELoss(None, similarity_fct=scaled_cos),
            "kl": lambda: st.DistillKLDivLoss(None, similarity_fct=scaled_cos, temperature=temperature)}[name]()


def _st_value(name, q, pos, negs, scores, teacher, scale, temperature=1.0):
    loss = _st_loss(name, scale, temperature)
    if name in ("cosent", "angle"):
        return loss.compute_loss_from_embeddings([q, pos], scores)
    return loss.compute_loss_from_embeddings([q, pos, *negs], teacher)


def _ours(name, q, pos, candidates, scores, teacher, settings):
    if name in ("cosent", "angle"):
        return losses.embed_loss(q, pos, scores, settings)
    return losses.embed_loss(q, candidates, teacher if name in ("margin-mse", "kl") else None, settings)


@pytest.mark.parametrize("name", ["mnrl", "cosent", "angle", "margin-mse", "kl"])
@pytest.mark.parametrize("dim", [H, H - 1])  # AnglE pads an odd size
def test_each_loss_equals_sentence_transformers(name, dim):
    q, pos, negs, candidates, scores, teacher = _embeddings(3, dim)
    for scale, temperature in ((20.0, 1.0), (7.0, 0.3)):
        settings = _settings(name, scale=scale, temperature=temperature)
        ours = _ours(name, q, pos, candidates, scores, teacher, settings)
        theirs = _st_value(name, q, pos, negs, scores, teacher, scale, temperature)
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-9, abs=1e-12), (name, scale)
        assert ours.item() > 0


@pytest.mark.parametrize("name", ["mnrl", "cosent", "angle", "margin-mse", "kl"])
def test_matryoshka_is_the_sum_over_renormalised_prefixes(name):
    from sentence_transformers.sentence_transformer.losses.matryoshka import shrink

    q, pos, negs, candidates, scores, teacher = _embeddings(5)
    settings = _settings(name, matryoshka_dims="10,6,3")
    assert settings.matryoshka_dims == [10, 6, 3]
    ours = _ours(name, q, pos, candidates, scores, teacher, settings)
    theirs = sum(_st_value(name, shrink(q, d), shrink(pos, d), [shrink(n, d) for n in negs], scores, teacher, 20.0)
                 for d in (10, 6, 3))
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-9)


def test_in_batch_loss_by_chunks_is_cross_entropy_over_the_whole_matrix(monkeypatch):
    """mnrl computed a few query rows at a time (forward and backward) has the value and the
    gradients of cross-entropy over the whole (B, C) logits, for a backward of any scale."""
    q, _, _, candidates, _, _ = _embeddings(6)
    monkeypatch.setattr(losses, "CHUNK_LOGITS", 3 * len(candidates))  # chunks of 3, 3 and 1 of the 7 rows
    for scale, upstream in ((20.0, 1.0), (7.0, -2.5)):
        ours_in = [q.clone().requires_grad_(), candidates.clone().requires_grad_()]
        whole_in = [q.clone().requires_grad_(), candidates.clone().requires_grad_()]
        ours = losses.multiple_negatives_ranking_loss(*ours_in, scale)
        normed = [torch.nn.functional.normalize(x, dim=-1) for x in whole_in]
        whole = torch.nn.functional.cross_entropy(scale * normed[0] @ normed[1].T, torch.arange(B))
        (upstream * ours).backward()
        (upstream * whole).backward()
        assert ours.item() == pytest.approx(whole.item(), rel=1e-12)
        for mine, theirs in zip(ours_in, whole_in):
            assert torch.allclose(mine.grad, theirs.grad, rtol=0, atol=1e-12)
            assert theirs.grad.abs().max() > 1e-3  # the comparison is not of zeros


def test_in_batch_loss_of_16_bit_embeddings_takes_its_softmax_in_float32():
    q, _, _, candidates, _, _ = _embeddings(8)
    half = [q.bfloat16().requires_grad_(), candidates.bfloat16().requires_grad_()]
    loss = losses.multiple_negatives_ranking_loss(*half)
    loss.backward()
    wide = losses.multiple_negatives_ranking_loss(half[0].detach().double(), half[1].detach().double())
    assert loss.dtype == torch.bfloat16 and half[0].grad.dtype == torch.bfloat16
    assert loss.item() == pytest.approx(wide.item(), rel=5e-2)


def test_cosent_by_hand():
    """Two pairs out of order cost log(1 + e^{scale·gap}); equal scores are never compared."""
    sims = torch.tensor([0.9, 0.2, 0.5])
    scores = torch.tensor([0.0, 1.0, 1.0])  # pairs 1 and 2 are scored above pair 0, tied with each other
    expected = torch.log(1 + torch.exp(torch.tensor(20 * (0.9 - 0.2))) + torch.exp(torch.tensor(20 * (0.9 - 0.5))))
    assert losses.ranked_pairs_loss(sims, scores, 20.0).item() == pytest.approx(expected.item(), rel=1e-5)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="pass --teacher"):
        rt.RetrievalTrainConfig(task="embed", model="m", train="t", out_dir="o", loss="kl")
    with pytest.raises(ValueError, match="'x' is not a positive integer"):
        rt.RetrievalTrainConfig(task="embed", model="m", train="t", out_dir="o", matryoshka_dims="32,x")
    with pytest.raises(ValueError, match="loss must be one of listwise, bce for task rerank"):
        rt.RetrievalTrainConfig(task="rerank", model="m", train="t", out_dir="o", loss="mnrl")
    assert rt.RetrievalTrainConfig(task="rerank", model="m", train="t", out_dir="o").loss == "listwise"
    assert rt.RetrievalTrainConfig(task="embed", model="m", train="t", out_dir="o").loss == "mnrl"
    with pytest.raises(ValueError, match="exceeds the model's embedding size 32"):
        losses.check_dims([64, 16], 32)


# ---------------------------------------------------------------------------------------------
# GradCache
# ---------------------------------------------------------------------------------------------
def _rows(n: int = 9):
    texts = sentences(3 * n, seed=4)
    return [rt.Pair(" ".join(t.split()[:2]), t, [texts[n + i]], f"f:{i}") for i, t in enumerate(texts[:n])]


def _grads(model, rows, settings) -> tuple[float, dict[str, torch.Tensor]]:
    from bertkit.data.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(settings.model)
    model.zero_grad(set_to_none=True)
    loss = biencoder.loss(model, tokenizer, rows, settings, torch.device("cpu"))
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_cached_mnrl_gradients_equal_the_uncached_loss(tmp_path):
    base = tiny_encoder(tmp_path / "base")
    model = biencoder.build(rt.RetrievalTrainConfig(task="embed", model=str(base), train="t", out_dir="o")).eval()
    rows = _rows()
    plain = rt.RetrievalTrainConfig(task="embed", model=str(base), train="t", out_dir="o", max_length=24)
    cached = rt.RetrievalTrainConfig(task="embed", model=str(base), train="t", out_dir="o", max_length=24,
                                     loss="cached-mnrl", mini_batch_size=4)
    loss_a, grads_a = _grads(model, rows, plain)
    loss_b, grads_b = _grads(model, rows, cached)
    assert loss_b == pytest.approx(loss_a, rel=1e-6)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 10
    worst = max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a)
    assert worst <= 1e-5, worst
    assert max(g.abs().max().item() for g in grads_a.values()) > 1e-3  # the comparison is not of zeros


def test_cached_loss_refuses_a_scaled_backward_and_needs_no_graph_to_evaluate(tmp_path):
    """Every mini-batch but the last is back-propagated when the loss is computed: a backward
    that scales the loss would leave those unscaled, so it is refused. Without grad the loss is
    the uncached loss's value."""
    from bertkit.data.tokenizer import BertTokenizer

    base = tiny_encoder(tmp_path / "base")
    tokenizer = BertTokenizer.from_pretrained(base)
    settings = {"task": "embed", "model": str(base), "train": "t", "out_dir": "o", "max_length": 24}
    cached = rt.RetrievalTrainConfig(**settings, loss="cached-mnrl", mini_batch_size=4)
    model = biencoder.build(cached).eval()
    rows = _rows()
    with torch.no_grad():
        plain = biencoder.loss(model, tokenizer, rows, rt.RetrievalTrainConfig(**settings), "cpu")
        assert biencoder.loss(model, tokenizer, rows, cached, "cpu").item() == pytest.approx(plain.item(), rel=1e-6)
    loss = biencoder.loss(model, tokenizer, rows, cached, "cpu")
    with pytest.raises(RuntimeError, match=r"back-propagated with gradient 2.0, not 1: .*call backward on the loss"):
        (2 * loss).backward()


def test_cached_replay_draws_the_same_dropout(tmp_path):
    """In training mode each mini-batch's replay draws the dropout its first pass drew: the
    gradients equal those of the same mini-batches embedded with a graph from the same seed."""
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.train.retrieval.common import encode
    from bertkit.train.retrieval.gradcache import _rows as cut

    base = tiny_encoder(tmp_path / "base")
    settings = rt.RetrievalTrainConfig(task="embed", model=str(base), train="t", out_dir="o", max_length=24,
                                       loss="cached-mnrl", mini_batch_size=3)
    model = biencoder.build(settings).train()
    rows = _rows()
    torch.manual_seed(7)
    loss_a, grads_a = _grads(model, rows, settings)

    tokenizer = BertTokenizer.from_pretrained(base)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    parts = []
    for texts in ([r.query for r in rows], [r.positive for r in rows] + [r.negatives[0] for r in rows]):
        batch = encode(tokenizer, texts, None, 24, "cpu")
        parts.append(torch.cat([biencoder.pool_padded(model(**c).last_hidden_state, c["attention_mask"], "mean")
                                for c in (cut(batch, s, min(s + 3, len(texts))) for s in range(0, len(texts), 3))]))
    reference = rt.multiple_negatives_ranking_loss(*parts, 20.0)
    reference.backward()
    assert loss_a == pytest.approx(reference.item(), rel=1e-6)
    reference_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert reference_grads.keys() == grads_a.keys()
    assert max((grads_a[n] - g).abs().max().item() for n, g in reference_grads.items()) <= 1e-5
    # and not by chance: another seed draws other dropout, so other gradients
    _, grads_c = _grads(model, rows, settings)
    assert max((grads_a[n] - g).abs().max().item() for n, g in grads_c.items()) > 1e-4


def test_cached_first_pass_runs_the_replays_ops(tmp_path, monkeypatch):
    """GradCache's pass without a graph takes the encoder's training path, as its replays do: no
    fused oneDNN linear (which caches a primitive per token count), though a pass without a graph
    outside GradCache takes it where oneDNN is present."""
    from bertkit.encoder import fused

    taken = []
    usable = fused.usable
    monkeypatch.setattr(fused, "usable", lambda module, x: taken.append(usable(module, x)) or taken[-1])
    base = tiny_encoder(tmp_path / "base")
    settings = rt.RetrievalTrainConfig(task="embed", model=str(base), train="t", out_dir="o", max_length=24,
                                       loss="cached-mnrl", mini_batch_size=4)
    model = biencoder.build(settings).eval()
    _grads(model, _rows(), settings)
    assert taken and not any(taken)
    with torch.no_grad():
        model(input_ids=torch.tensor([[2, 5, 6, 3]]), token_type_ids=torch.zeros(1, 4, dtype=torch.long),
              attention_mask=torch.ones(1, 4, dtype=torch.long))
    assert any(taken) == fused._available(torch.float32)


def test_cached_mnrl_matches_sentence_transformers_cached_loss(tmp_path):
    """The loss value of sentence-transformers' CachedMultipleNegativesRankingLoss on the model
    our run saved, for the same texts (its embeddings equal ours to 1e-5)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    base = tiny_encoder(tmp_path / "base")
    biencoder.write_sentence_transformers_files(base, 32, "mean", 24)
    rows = _rows()
    st_model = SentenceTransformer(str(base), device="cpu").eval()
    st_loss = CachedMultipleNegativesRankingLoss(st_model, mini_batch_size=4)
    columns = ([r.query for r in rows], [r.positive for r in rows], [r.negatives[0] for r in rows])
    features = [st_model.tokenize(list(texts)) for texts in columns]
    theirs = st_loss(features, None)
    settings = rt.RetrievalTrainConfig(task="embed", model=str(base), train="t", out_dir="o", max_length=24,
                                       loss="cached-mnrl", mini_batch_size=4)
    ours, _ = _grads(biencoder.build(settings).eval(), rows, settings)
    assert ours == pytest.approx(theirs.item(), rel=1e-5)


# ---------------------------------------------------------------------------------------------
# runs: scored pairs, the teacher, Matryoshka, the command line
# ---------------------------------------------------------------------------------------------
def _scored_file(path: Path, n: int = 16) -> Path:
    texts = sentences(2 * n, seed=9)
    rows = [{"sentence1": texts[i], "sentence2": texts[i + n] if i % 2 else texts[i], "score": float(i % 2 == 0)}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"sentence1": "x", "sentence2": "y"}\n',
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("loss", ["cosent", "angle"])
def test_scored_pair_losses_train_and_report_spearman_at_each_dim(tmp_path, loss):
    data = _scored_file(tmp_path / "sts.jsonl")
    out = tmp_path / "out"
    summary = rt.finetune_retrieval(task="embed", model=str(tiny_encoder(tmp_path / "base")), train=str(data),
                                    eval=str(data), out_dir=str(out), loss=loss, epochs=8, batch_size=8, lr=1e-3,
                                    max_length=24, progress=False, matryoshka_dims=[32, 8])
    assert summary["train_examples"] == 16  # the row without a score is left out
    assert set(summary["eval"]) == {"spearman", "pearson", "dims"} and set(summary["eval"]["dims"]) == {"32", "8"}
    assert summary["eval"]["dims"]["32"]["spearman"] == summary["eval"]["spearman"]
    # Identical pairs (cosine 1) are scored 1, different ones 0: the order is right from the start,
    # and the loss falls as the different pairs' cosines move away from 1.
    assert summary["eval"]["spearman"] > 0.5
    steps = [json.loads(line)["loss"] for line in (out / "steps.jsonl").read_text().splitlines()]
    assert np.mean(steps[-4:]) < 0.5 * np.mean(steps[:4]), steps


def _negatives_file(path: Path, n: int = 12) -> Path:
    texts = sentences(3 * n, seed=21)
    path.write_text("".join(json.dumps({"query": " ".join(t.split()[:2]), "positive": t,
                                        "negatives": [texts[n + 2 * i], texts[n + 2 * i + 1]]}) + "\n"
                            for i, t in enumerate(texts[:n])), encoding="utf-8")
    return path


@pytest.mark.parametrize("loss", ["margin-mse", "kl"])
def test_teacher_scores_are_computed_once_and_reused(tmp_path, loss, caplog):
    from bertkit.inference import rerank

    data = _negatives_file(tmp_path / "p.jsonl")
    teacher = tiny_cross_encoder(tmp_path / "ce")
    base = tiny_encoder(tmp_path / "base")
    out = tmp_path / "out"
    settings = dict(task="embed", model=str(base), train=str(data), out_dir=str(out), loss=loss, teacher=str(teacher),
                    hard_negatives=2, batch_size=4, max_length=24, progress=False, matryoshka_dims="32,16",
                    eval=str(data))
    summary = rt.finetune_retrieval(**settings)
    assert summary["steps"] == 3 and set(summary["eval"]["dims"]) == {"32", "16"}
    cache = json.loads((out / "teacher_scores.json").read_text())
    first = json.loads(data.read_text().splitlines()[0])
    direct = rerank(teacher, first["query"], [first["positive"], *first["negatives"]], raw_scores=True)
    np.testing.assert_allclose([s["score"] for s in sorted(direct, key=lambda s: s["index"])], cache["scores"][0],
                               atol=1e-5)
    caplog.clear()
    with caplog.at_level("INFO"):
        rt.finetune_retrieval(**settings, overwrite=True)
    assert "teacher scores of 12 pairs read from" in caplog.text
    with pytest.raises(ValueError, match="is not a cross-encoder"):
        rt.finetune_retrieval(**{**settings, "teacher": str(base)}, overwrite=True)


def test_finetune_cli_losses(tmp_path, capsys):
    from bertkit import cli

    base = tiny_encoder(tmp_path / "base")
    data = _negatives_file(tmp_path / "p.jsonl")
    common = ["finetune", "--task", "embed", "--model", str(base), "--train", str(data), "--batch-size", "6",
              "--max-length", "24", "--no-progress"]
    status = cli.main([*common, "--out", str(tmp_path / "a"), "--loss", "cached-mnrl", "--mini-batch-size", "4",
                       "--matryoshka-dims", "32,16", "--eval", str(data)])
    assert status == 0, capsys.readouterr().err
    saved = json.loads((tmp_path / "a" / "finetune_config.json").read_text())
    assert saved["loss"] == "cached-mnrl" and saved["mini_batch_size"] == 4 and saved["matryoshka_dims"] == [32, 16]
    assert set(json.loads((tmp_path / "a" / "eval.json").read_text())["eval"]["dims"]) == {"32", "16"}
    for extra, says in ((["--matryoshka-dims", "64"], "exceeds the model's embedding size 32"),
                        (["--loss", "kl", "--teacher", str(base)], "is not a cross-encoder"),
                        (["--loss", "margin-mse"], "pass --teacher"),
                        (["--loss", "cosent"], "needs pairs with a number 'score'")):
        capsys.readouterr()
        status = cli.main([*common, "--out", str(tmp_path / "b"), *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and err[-1].startswith("bertkit finetune: error: ") and says in err[-1], err
        assert not (tmp_path / "b" / "finetune_config.json").exists()

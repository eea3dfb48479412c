"""`bertkit finetune --task sparse`: SPLADE training from a masked-LM directory — the loss terms,
exact resume, and a SparseEncoder directory that sentence-transformers reads as we do."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bertkit.inference.sparse import embed_sparse
from bertkit.train import sparse as train_sparse

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import WORDS, save_tokenizer, sentences, tiny_encoder, tiny_mlm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse-train")
    docs = sentences(24, seed=7)
    rows = [{"query": " ".join(d.split()[:2]), "positive": d} for d in docs]
    rows[0]["negatives"] = [docs[5]]
    train = root / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n", encoding="utf-8")
    return root, train, tiny_mlm(root / "mlm")


def settings(data, out, **more):
    root, train, mlm = data
    return dict(model=mlm, train=train, out_dir=out, eval=train, epochs=2, batch_size=6, lr=1e-3,
                max_length=16, progress=False, save_every=3, **more)


def test_flops_and_its_quadratic_warmup():
    w = torch.tensor([[0.0, 2.0, 1.0], [4.0, 0.0, 1.0]])
    assert float(train_sparse.flops(w)) == pytest.approx(2.0 ** 2 + 1.0 ** 2 + 1.0 ** 2)
    assert [train_sparse.flops_weight(s, 30, 1 / 3) for s in (0, 5, 10, 20)] == [0.0, 0.25, 1.0, 1.0]
    assert train_sparse.flops_weight(0, 30, 0.0) == 1.0


def test_training_writes_a_sparse_encoder_that_sentence_transformers_reads_as_we_do(data, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    summary = train_sparse.finetune_sparse(**settings(data, tmp_path / "out"))
    assert summary["steps"] == 2 * math.ceil(24 / 6) and summary["train"]["n_skipped"] == 1
    assert {"mrr@10", "ndcg@10", "query_terms", "document_terms"} <= set(summary["eval"])
    steps = [json.loads(line) for line in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    assert steps[0]["flops_share"] == 0.0 and steps[-1]["flops_share"] == 1.0
    assert steps[-1]["loss"] == pytest.approx(steps[-1]["ranking_loss"] + 3e-4 * steps[-1]["flops_query"]
                                              + 1e-4 * steps[-1]["flops_doc"], rel=1e-5)
    assert not (tmp_path / "out" / "checkpoints").exists()
    texts = sentences(5, seed=11) + [" ".join(WORDS)]
    theirs = st.SparseEncoder(str(tmp_path / "out"), device="cpu").encode(texts, convert_to_sparse_tensor=True)
    ours = embed_sparse(tmp_path / "out", texts)
    dense = torch.zeros(theirs.shape)
    for i, (ix, v) in enumerate(ours):
        dense[i, ix] = v
    assert (dense - theirs.to_dense()).abs().max() <= 1e-5  # the last text is cut at max_seq_length 16, as theirs
    from bertkit.inference import Engine

    assert Engine.load(tmp_path / "out", use="fill-mask").max_length == 16  # one length whatever the use


def test_a_killed_run_resumes_with_the_same_losses(data, tmp_path, monkeypatch):
    whole = train_sparse.finetune_sparse(**settings(data, tmp_path / "whole", mine="none"))
    real, calls = train_sparse._losses, []

    def dies_at_step_5(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(train_sparse, "_losses", dies_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train_sparse.finetune_sparse(**settings(data, tmp_path / "cut", mine="none"))
    monkeypatch.setattr(train_sparse, "_losses", real)
    assert (tmp_path / "cut" / "checkpoints" / "step-3").is_dir()
    with pytest.raises(FileExistsError, match="--resume"):
        train_sparse.finetune_sparse(**settings(data, tmp_path / "cut", mine="none"))
    with pytest.raises(ValueError, match="lr: 0.001 → 0.002"):
        train_sparse.finetune_sparse(**{**settings(data, tmp_path / "cut", mine="none"), "lr": 2e-3, "resume": True})
    resumed = train_sparse.finetune_sparse(**settings(data, tmp_path / "cut", mine="none", resume=True))
    losses = [[json.loads(line)["loss"] for line in (tmp_path / d / "steps.jsonl").read_text().splitlines()]
              for d in ("whole", "cut")]
    assert resumed["steps"] == whole["steps"] and losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_cli_trains_and_refuses_a_model_without_an_mlm_head(data, tmp_path, capsys):
    from bertkit import cli

    root, train, mlm = data
    assert cli.main(["finetune", "--task", "sparse", "--model", str(mlm), "--train", str(train), "--out",
                     str(tmp_path / "m"), "--epochs", "1", "--batch-size", "8", "--max-length", "16",
                     "--flops-query-weight", "0.01", "--hard-negatives", "0", "--no-progress"]) == 0
    assert json.loads((tmp_path / "m" / "finetune_config.json").read_text())["flops_query_weight"] == 0.01
    assert "model saved in" in capsys.readouterr().out
    encoder = tiny_encoder(tmp_path / "enc")
    assert cli.main(["finetune", "--task", "sparse", "--model", str(encoder), "--train", str(train), "--out",
                     str(tmp_path / "x"), "--no-progress"]) == 2
    assert "has no masked-LM head" in capsys.readouterr().err
    assert cli.main(["finetune", "--task", "sparse", "--model", str(mlm), "--train", str(train), "--out",
                     str(tmp_path / "y"), "--lora", "r=4"]) == 2
    assert "--lora does not apply to --task sparse" in capsys.readouterr().err
    assert cli.main(["finetune", "--task", "classify", "--model", str(mlm), "--train", str(train), "--out",
                     str(tmp_path / "z"), "--flops-doc-weight", "1"]) == 2
    assert "--flops-doc-weight applies to --task sparse only" in capsys.readouterr().err


def test_a_transformers_made_checkpoint_trains(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    root, train, mlm = data
    config = transformers.BertConfig(vocab_size=38, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=37, max_position_embeddings=41)
    torch.manual_seed(1)
    transformers.BertForMaskedLM(config).save_pretrained(tmp_path / "hf")
    save_tokenizer(tmp_path / "hf")
    summary = train_sparse.finetune_sparse(**{**settings(data, tmp_path / "out"), "model": tmp_path / "hf",
                                              "epochs": 1, "eval": None})
    assert summary["steps"] == 4 and "eval" not in summary
    assert len(embed_sparse(tmp_path / "out", ["red ball"])[0][0]) > 0

"""Pre-training objectives: mlm | mlm+nsp | mlm+sop, ALBERT's SOP pairs, and the family recipes
(an ALBERT trained with SOP, a RoBERTa-style MLM-only run) end to end."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from bertkit.data.corpus import Corpus
from bertkit.data.instances import IN_ORDER, SWAPPED, create_sop_instances
from bertkit.data.prepare import prepare
from bertkit.data.shards import PretrainingData
from bertkit.data.vocab import train_tokenizer
from bertkit.train.pretrain import PretrainConfig, pretrain
from test_instances import CLS, FIRST_ID, SEP, document_of, traceable_docs

from pretrain_fixtures import TINY_MODEL, one_thread, synthetic_documents  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sop_pairs_are_consecutive_and_swapped_half_the_time():
    rng = random.Random(5)
    sizes = [[rng.randint(3, 30) for _ in range(rng.randint(1, 10))] for _ in range(80)]
    docs = traceable_docs(sizes)
    labels = []
    for inst in create_sop_instances(docs, max_seq_len=64, short_seq_prob=0.1, rng=rng, cls_id=CLS, sep_id=SEP):
        a = inst.input_ids[1:inst.segment_b_start - 1]
        b = inst.input_ids[inst.segment_b_start:-1]
        assert len(a) and len(b) and len(inst.input_ids) <= 64
        assert (np.diff(a) == 1).all() and (np.diff(b) == 1).all()  # contiguous text
        assert len(set(document_of(docs, a)) | set(document_of(docs, b))) == 1  # one document
        if inst.nsp_label == IN_ORDER:
            assert b[0] > a[-1]
        else:
            assert inst.nsp_label == SWAPPED and a[0] > b[-1]
        expected = (inst.input_ids - FIRST_ID) % 3 == 0  # word starts travel with their tokens
        expected[inst.input_ids < FIRST_ID] = False
        assert (inst.word_starts == expected).all()
        labels.append(inst.nsp_label)
    assert len(labels) > 100 and 0.4 < np.mean(labels) < 0.6


def test_a_one_sentence_document_is_cut_in_two():
    docs = traceable_docs([[9], [1]])
    out = list(create_sop_instances(docs, max_seq_len=64, short_seq_prob=0.0, rng=random.Random(0),
                                    cls_id=CLS, sep_id=SEP))
    assert len(out) == 1  # the one-token document gives no pair
    assert sorted(out[0].input_ids[out[0].input_ids >= FIRST_ID].tolist()) == list(range(FIRST_ID, FIRST_ID + 9))


@pytest.fixture(scope="module")
def corpus_and_tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("objectives")
    corpus = Corpus.from_documents(synthetic_documents(200, 0), name="synthetic")
    train_tokenizer(corpus, 120, root / "tokenizer")
    return root, corpus


def _data(root, corpus, objective):
    out = root / f"data-{objective}"
    if not out.exists():
        prepare(corpus, root / "tokenizer", out, max_seq_len=32, objective=objective, eval_fraction=0.1,
                seed=1, progress=False)
    return out


def _settings(data, out, model, **kw):
    return PretrainConfig(**{**dict(data=str(data), out=str(out), model=str(model), batch_size=16, lr=3e-3,
                                    max_steps=4, log_every=2, eval_every=4, eval_batches=1, save_every=10,
                                    progress=False, num_workers=0, seed=3), **kw})


def test_prepare_records_the_objective(corpus_and_tokenizer):
    root, corpus = corpus_and_tokenizer
    data = PretrainingData(_data(root, corpus, "mlm+sop"), "train")
    assert data.objective == "mlm+sop" and data.nsp
    assert PretrainingData(_data(root, corpus, "mlm"), "train").objective == "mlm"
    with pytest.raises(ValueError, match="--no-nsp .* contradicts objective mlm\\+sop"):
        prepare(corpus, root / "tokenizer", root / "x", objective="mlm+sop", nsp=False, progress=False)


def test_albert_pretrains_with_sop_and_loads_in_transformers(corpus_and_tokenizer, tmp_path):
    transformers = pytest.importorskip("transformers")
    root, corpus = corpus_and_tokenizer
    model = tmp_path / "albert.json"
    model.write_text(json.dumps({**TINY_MODEL, "model_type": "albert", "embedding_size": 16,
                                 "num_hidden_layers": 4, "num_hidden_groups": 2}))
    summary = pretrain(_settings(_data(root, corpus, "mlm+sop"), tmp_path / "run", model, objective="mlm+sop"))
    assert summary["train"]["nsp_loss"] is not None  # the SOP loss, in the sentence head's slot
    saved = tmp_path / "run" / "model"
    assert json.loads((saved / "config.json").read_text())["architectures"] == ["AlbertForPreTraining"]
    theirs, info = transformers.AlbertForPreTraining.from_pretrained(saved, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    from bertkit.encoder.model import BertForPreTraining

    ours = BertForPreTraining.from_pretrained(saved)
    ids = torch.randint(5, 99, (2, 11))
    with torch.no_grad():
        assert torch.allclose(ours(ids).nsp_logits, theirs.eval()(ids).sop_logits, atol=1e-5)


def test_roberta_style_recipe_trains_mlm_only(corpus_and_tokenizer, tmp_path):
    root, corpus = corpus_and_tokenizer
    model = tmp_path / "roberta.json"
    # pad_token_id 0 is bertkit's [PAD]: positions start at 1 and 49 rows hold 48 tokens.
    model.write_text(json.dumps({**TINY_MODEL, "model_type": "roberta", "type_vocab_size": 1,
                                 "max_position_embeddings": 49, "layer_norm_eps": 1e-5}))
    summary = pretrain(_settings(_data(root, corpus, "mlm"), tmp_path / "run", model, batch_size=32))
    assert summary["train"]["nsp_loss"] is None and summary["train"]["mlm_loss"] > 0
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["architectures"] == ["RobertaForMaskedLM"] and config["model_type"] == "roberta"
    with pytest.raises(ValueError, match="needs a sentence-pair head, which model_type 'roberta'"):
        pretrain(_settings(_data(root, corpus, "mlm+nsp"), tmp_path / "run2", model))


def test_objective_must_match_the_data(corpus_and_tokenizer, tmp_path):
    root, corpus = corpus_and_tokenizer
    model = tmp_path / "bert.json"
    model.write_text(json.dumps(TINY_MODEL))
    with pytest.raises(ValueError, match="--objective mlm\\+sop needs data prepared for it; .* prepare "
                                         "--objective mlm\\+sop"):
        pretrain(_settings(_data(root, corpus, "mlm+nsp"), tmp_path / "run", model, objective="mlm+sop"))
    # mlm on pair data: the pair labels are there but not trained
    summary = pretrain(_settings(_data(root, corpus, "mlm+nsp"), tmp_path / "run2", model, objective="mlm"))
    assert summary["train"]["nsp_loss"] is None and summary["eval"]["nsp_loss"] is None

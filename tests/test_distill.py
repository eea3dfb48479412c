"""Distillation: the student's initial layers are exact copies, each loss term equals its hand
computation, a few steps lower the loss (general and task), and a stopped run resumed repeats the
uninterrupted run's logged losses."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import BertForSequenceClassification, BertForTokenClassification
from bertkit.encoder.model import BertForMaskedLM, BertForPreTraining
from bertkit.train import distill as ds
from bertkit.train import state

from finetune_fixtures import sentiment_rows, write_jsonl
from pretrain_fixtures import TINY_MODEL, make_data, one_thread  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")


def test_spread_layers():
    assert ds.spread_layers(12, 6) == [0, 2, 4, 7, 9, 11]  # DistilBERT's
    assert ds.spread_layers(6, 3) == [0, 2, 5]
    assert ds.spread_layers(4, 4) == [0, 1, 2, 3]
    assert ds.spread_layers(5, 1) == [0]
    with pytest.raises(ValueError, match="student_layers 7 must be between 1 and the teacher's 6"):
        ds.spread_layers(6, 7)


def test_student_copies_the_chosen_layers_exactly():
    torch.manual_seed(0)
    teacher = BertForMaskedLM(BertConfig.from_dict({**TINY_MODEL, "num_hidden_layers": 5}))
    student = ds.student_from_teacher(teacher, [0, 2, 4])
    assert student.config.num_hidden_layers == 3 and len(student.bert.layers) == 3
    t, s = teacher.state_dict(), student.state_dict()
    for i, j in enumerate([0, 2, 4]):
        for name, tensor in t.items():
            if name.startswith(f"bert.layers.{j}."):
                assert torch.equal(s[name.replace(f"layers.{j}.", f"layers.{i}.", 1)], tensor), name
    for name in ("bert.embeddings.word_embeddings.weight", "mlm.transform.weight", "mlm.bias"):
        assert torch.equal(s[name], t[name])
    # a copy, not a view: training the student leaves the teacher alone
    with torch.no_grad():
        student.bert.layers[1].qkv.weight.add_(1.0)
    assert torch.equal(teacher.bert.layers[2].qkv.weight, t["bert.layers.2.qkv.weight"])
    with pytest.raises(ValueError, match="increasing teacher layer numbers in 0..4"):
        ds.student_from_teacher(teacher, [0, 5])


def test_loss_terms_equal_hand_computations():
    gen = torch.Generator().manual_seed(0)
    s, t = torch.randn(5, 7, generator=gen), torch.randn(5, 7, generator=gen)
    T = 2.0
    p_t, p_s = (t / T).softmax(-1), (s / T).softmax(-1)
    by_hand = (p_t * (p_t.log() - p_s.log())).sum(-1).mean() * T * T
    assert torch.allclose(ds.soft_cross_entropy(s, t, T), by_hand, atol=1e-6)
    assert float(ds.soft_cross_entropy(t, t, T)) == pytest.approx(0.0, abs=1e-6)
    h1, h2 = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen)
    cos = (h1 * h2).sum(-1) / (h1.norm(dim=-1) * h2.norm(dim=-1))
    assert torch.allclose(ds.cosine_loss(h1, h2), (1 - cos).mean(), atol=1e-6)

    # the general step: KL at the masked positions, the student's MLM loss, cosine over real tokens
    torch.manual_seed(1)
    teacher = BertForMaskedLM(BertConfig.from_dict({**TINY_MODEL, "num_hidden_layers": 3})).eval()
    student = ds.student_from_teacher(teacher, [0, 2]).eval()
    ids = torch.randint(5, 99, (2, 6), generator=gen)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 1], labels[1, 3] = 7, 8, 9
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask, "mlm_labels": labels}
    config = ds.DistillConfig(teacher="t", out_dir="o", data="d", alpha_ce=5.0, alpha_hard=2.0, alpha_cos=1.0)
    losses = ds.general_losses(config, student, teacher, batch)
    with torch.no_grad():
        s_out = student(ids, None, mask).logits[labels != -100]  # dense (B, T, V) → (3, V)
        t_out = teacher(ids, None, mask).logits[labels != -100]
        s_h = student.bert(ids, None, mask).last_hidden_state[mask.bool()]
        t_h = teacher.bert(ids, None, mask).last_hidden_state[mask.bool()]
    ce = ds.soft_cross_entropy(s_out, t_out, 2.0)
    mlm = F.cross_entropy(s_out, labels[labels != -100])
    cos = ds.cosine_loss(s_h, t_h)
    assert torch.allclose(losses.ce, ce, atol=1e-5) and torch.allclose(losses.hard, mlm, atol=1e-5)
    assert torch.allclose(losses.cos, cos, atol=1e-6)
    assert torch.allclose(losses.total, 5 * ce + 2 * mlm + cos, atol=1e-5)


# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def classify_inputs(tmp_path_factory, minilm_dir):
    """A 4-layer classifier teacher (random weights: its soft labels are what the student must
    match) and sentiment data, labelled and not."""
    root = tmp_path_factory.mktemp("distill")
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=30522, num_hidden_layers=4, id2label={0: "neg", 1: "pos"})
    teacher = root / "teacher"
    BertForSequenceClassification(config).save_pretrained(teacher)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(teacher)
    return (teacher, write_jsonl(root / "train.jsonl", sentiment_rows(48, 1)),
            write_jsonl(root / "unlabeled.jsonl", sentiment_rows(32, 3, labelled=False)),
            write_jsonl(root / "dev.jsonl", sentiment_rows(24, 2)))


def train_lines(out):
    return [r for r in state.read_metrics(out) if r["split"] == "train"]


TASK = dict(student_layers=2, batch_size=16, max_length=16, lr=2e-3, warmup_ratio=0.0, log_every=1,
            progress=False, precision="fp32", seed=0)


def test_task_distillation_lowers_the_loss_and_resumes_exactly(tmp_path, classify_inputs, monkeypatch):
    teacher, train, unlabeled, dev = classify_inputs
    settings = dict(teacher=str(teacher), task="classify", train=str(train), unlabeled=str(unlabeled),
                    eval=str(dev), test=str(dev), epochs=3, save_every=4, alpha_hard=0.5, **TASK)
    whole = tmp_path / "whole"
    summary = ds.distill(ds.DistillConfig(out_dir=str(whole), **settings))
    lines = train_lines(whole)
    assert len(lines) == summary["steps"] == 15  # (48 + 32) / 16 = 5 steps an epoch
    assert summary["layers"] == [0, 3] and summary["test"]["n"] == 24
    first, last = sum(r["ce"] for r in lines[:3]), sum(r["ce"] for r in lines[-3:])
    assert last < 0.5 * first  # the student learns the teacher's soft labels
    student = BertForSequenceClassification.from_pretrained(whole / "model")
    assert student.config.num_hidden_layers == 2 and student.config.id2label == {0: "neg", 1: "pos"}
    evals = [r for r in state.read_metrics(whole) if r["split"] == "eval"]
    assert [r["epoch"] for r in evals] == [1, 2, 3]

    real = state.save_checkpoint
    calls = []

    def stop_after_second(run_dir, step, *args, **kwargs):
        real(run_dir, step, *args, **kwargs)
        calls.append(step)
        if len(calls) == 2:
            raise RuntimeError("stopped on purpose")

    cut = tmp_path / "cut"
    monkeypatch.setattr(state, "save_checkpoint", stop_after_second)
    with pytest.raises(RuntimeError, match="on purpose"):
        ds.distill(ds.DistillConfig(out_dir=str(cut), **settings))
    monkeypatch.setattr(state, "save_checkpoint", real)
    assert calls == [4, 8]
    resumed = ds.distill(ds.DistillConfig(out_dir=str(cut), resume=True, **settings))
    assert [r["loss"] for r in train_lines(cut)] == [r["loss"] for r in lines]
    assert resumed["test"] == summary["test"]
    with pytest.raises(ValueError, match="cannot resume .*lr: 0.002 → 0.001"):
        ds.distill(ds.DistillConfig(out_dir=str(cut), resume=True, **{**settings, "lr": 1e-3}))


def test_ner_task_distillation_with_unlabeled_text(tmp_path, minilm_dir):
    torch.manual_seed(0)
    names = ["O", "B-PER", "I-PER"]
    config = BertConfig.preset("tiny", vocab_size=30522, num_hidden_layers=3, id2label=dict(enumerate(names)))
    teacher = tmp_path / "teacher"
    model = BertForTokenClassification(config)
    with torch.no_grad():  # a random head is near uniform; a sharp one gives the student something to learn
        model.classifier.weight.mul_(8)
        model.bert.layers[1].ffn_out.weight.mul_(30)  # the layer the student leaves out matters
    model.save_pretrained(teacher)
    BertTokenizer.from_pretrained(minilm_dir).save_pretrained(teacher)
    rows = [{"tokens": ["john", "smith", "was", "here"], "tags": ["B-PER", "I-PER", "O", "O"]},
            {"tokens": ["the", "film", "was", "good"], "tags": ["O", "O", "O", "O"]}] * 8
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    text = tmp_path / "more.txt"
    text.write_text("mary jones came home\nthe plot was very long\n" * 4, encoding="utf-8")
    summary = ds.distill(ds.DistillConfig(teacher=str(teacher), out_dir=str(tmp_path / "out"), task="ner",
                                          train=str(train), unlabeled=str(text), epochs=6, alpha_hard=0.0,
                                          **TASK))
    lines = train_lines(tmp_path / "out")
    assert summary["data"]["features"] == 24 and len(lines) == 12
    assert all(r["hard"] > 0 for r in lines)  # logged (the labelled words' cross-entropy), weighted 0 here

    # the soft loss over all 24 features (dropout off), before and after: batches differ in their
    # mix of labelled and unlabeled rows, so single steps are not comparable
    from bertkit.data.formats.common import pad_batch
    from bertkit.train import finetune as ft

    teacher_model = BertForTokenClassification.from_pretrained(teacher)
    runner = ft.TASK_CLASSES["ner"](ft.FinetuneConfig(task="ner", model=str(teacher), train=str(train),
                                                      out_dir=str(tmp_path / "x"), max_length=16),
                                    BertTokenizer.from_pretrained(teacher))
    runner.load_labels(teacher_model.config)
    config = ds.DistillConfig(teacher=str(teacher), out_dir=str(tmp_path / "x"), task="ner", train=str(train),
                              unlabeled=str(text), **TASK)
    features = ds._TaskData(config, runner).features
    assert sum(ds.UNLABELED_WORD in f["labels"] for f in features) == 8  # the 8 lines of raw text
    batch = pad_batch(features, runner.pieces.pad_id)
    before = ds.student_from_teacher(teacher_model, [0, 2]).eval()
    after = BertForTokenClassification.from_pretrained(tmp_path / "out" / "model")
    with torch.no_grad():
        start = ds.task_losses(config, before, teacher_model, batch).ce
        end = ds.task_losses(config, after, teacher_model, batch).ce
    assert start > 0.05 and end < 0.5 * start


def test_general_distillation_on_prepared_data(tmp_path):
    data = make_data(tmp_path, nsp=False, n_docs=120)
    vocab = json.loads((data / "meta.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    teacher = tmp_path / "teacher"
    BertForPreTraining(BertConfig.from_dict({**TINY_MODEL, "vocab_size": vocab, "num_hidden_layers": 4})
                       ).save_pretrained(teacher)
    out = tmp_path / "student"
    summary = ds.distill(ds.DistillConfig(teacher=str(teacher), out_dir=str(out), data=str(data),
                                          student_layers=2, batch_size=16, max_steps=30, lr=3e-3,
                                          log_every=5, save_every=10, progress=False, precision="fp32"))
    lines = train_lines(out)
    assert summary["steps"] == 30 and summary["layers"] == [0, 3] and len(lines) == 6
    assert lines[-1]["loss"] < lines[0]["loss"]
    assert {"ce", "hard", "cos"} <= set(lines[0])
    student = BertForMaskedLM.from_pretrained(out / "model")
    assert student.config.num_hidden_layers == 2 and (out / "model" / "vocab.txt").is_file()

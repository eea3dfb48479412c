"""AdamW parameter groups and the warmup/decay schedule."""

from __future__ import annotations

import math

import pytest
import torch

from bertkit.encoder.model import BertForPreTraining
from bertkit.train.optim import build_optimizer, lr_lambda, lr_schedule, param_groups


def test_no_decay_on_biases_and_layernorm(tiny_config):
    model = BertForPreTraining(tiny_config)
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decay_names = {names[id(p)] for p in decay["params"]}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert decay_names.isdisjoint(no_decay_names)
    # Every parameter once (the tied decoder is the word embedding, counted once).
    assert len(decay_names) + len(no_decay_names) == len(list(model.named_parameters()))
    for name in no_decay_names:
        assert name.endswith("bias") or "norm" in name, name
    for name in decay_names:
        assert name.endswith("weight") and "norm" not in name, name
    assert "bert.embeddings.word_embeddings.weight" in decay_names
    assert "bert.embeddings.norm.weight" in no_decay_names
    assert "mlm.bias" in no_decay_names


def test_frozen_parameters_left_out(tiny_config):
    model = BertForPreTraining(tiny_config)
    model.nsp.weight.requires_grad_(False)
    groups = param_groups(model, 0.01)
    assert all(p is not model.nsp.weight for g in groups for p in g["params"])


def test_weight_decay_is_applied_only_to_decayed_group(tiny_config):
    # With zero gradients AdamW's update is pure decoupled decay: w ← w (1 - lr · wd).
    model = BertForPreTraining(tiny_config)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with torch.no_grad():
        model.bert.embeddings.norm.weight.fill_(2.0)
    before_w = model.bert.layers[0].qkv.weight.detach().clone()
    before_ln = model.bert.embeddings.norm.weight.detach().clone()
    opt = build_optimizer(model, lr=0.1, weight_decay=0.5)
    opt.step()
    torch.testing.assert_close(model.bert.layers[0].qkv.weight, before_w * (1 - 0.1 * 0.5))
    torch.testing.assert_close(model.bert.embeddings.norm.weight, before_ln)


def test_optimizer_settings_follow_bert(tiny_config):
    opt = build_optimizer(BertForPreTraining(tiny_config), lr=1e-4)
    for group in opt.param_groups:
        assert group["betas"] == (0.9, 0.999) and group["eps"] == 1e-6
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]


def test_linear_warmup_then_linear_decay():
    f = lr_lambda(warmup_steps=4, total_steps=12, kind="linear")
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0
    assert f(8) == pytest.approx(0.5)
    assert f(12) == 0.0 and f(20) == 0.0  # stays at 0 after the end


def test_cosine_and_constant():
    f = lr_lambda(2, 10, "cosine")
    assert f(2) == 1.0
    assert f(6) == pytest.approx(0.5)
    assert f(10) == pytest.approx(0.0)
    assert 0.5 < f(4) < 1.0 and 0.0 < f(8) < 0.5
    g = lr_lambda(2, 10, "constant")
    assert [g(s) for s in (0, 1, 2, 9, 10)] == [0.5, 1.0, 1.0, 1.0, 1.0]


def test_schedule_drives_the_optimizer_and_its_state_is_plain(tiny_config):
    model = BertForPreTraining(tiny_config)
    opt = build_optimizer(model, lr=1e-3)
    sched = lr_schedule(opt, warmup_steps=2, total_steps=6)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [1e-3 * m for m in (0.5, 1.0, 1.0, 0.75, 0.5, 0.25)]
    assert seen == pytest.approx(expected)
    state = sched.state_dict()
    # Plain numbers only: loads with weights_only=True.
    buffer = __import__("io").BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=True)
    sched2 = lr_schedule(build_optimizer(model, lr=1e-3), 2, 6)
    sched2.load_state_dict(restored)
    assert sched2.get_last_lr() == sched.get_last_lr()


@pytest.mark.parametrize("args, message", [
    ((0, 0, "linear"), "total_steps"),
    ((5, 3, "linear"), "warmup_steps 5"),
    ((1, 3, "step"), "unknown schedule 'step'"),
])
def test_bad_schedule_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        lr_lambda(*args)


def test_bad_optimizer_arguments(tiny_config):
    model = BertForPreTraining(tiny_config)
    with pytest.raises(ValueError, match="learning rate"):
        build_optimizer(model, lr=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        param_groups(model, -1.0)
    assert math.isfinite(lr_lambda(0, 1)(0))

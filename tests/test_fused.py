"""bertkit.encoder.fused: the oneDNN linear + bias + activation / residual path equals the unfused one,
and is taken only where it is sound (no autograd, plain nn.Linear, CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.encoder import fused


@pytest.fixture
def layer():
    torch.manual_seed(0)
    return nn.Linear(48, 80)


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_fused_activation_equals_unfused(layer, act):
    x = torch.randn(37, 48)
    expected = {"gelu": F.gelu, "gelu_new": lambda y: F.gelu(y, approximate="tanh"), "relu": F.relu}[act](layer(x))
    with torch.inference_mode():
        got = fused.linear(layer, x, post=fused.post_op(act))
        assert fused.usable(layer, x) == fused._available(torch.float32)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_fused_residual_and_plain_equal_unfused(layer):
    x, r = torch.randn(37, 48), torch.randn(37, 80)
    with torch.no_grad():
        torch.testing.assert_close(fused.linear(layer, x, residual=r), r + layer(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused.linear(layer, x), layer(x), atol=1e-5, rtol=1e-5)
        # a non-contiguous residual takes the unfused addition, same values
        wide = torch.randn(37, 160)
        torch.testing.assert_close(fused.linear(layer, x, residual=wide[:, ::2]), wide[:, ::2] + layer(x),
                                   atol=1e-5, rtol=1e-5)


def test_autograd_and_wrapped_modules_keep_their_own_forward(layer):
    x = torch.randn(5, 48, requires_grad=True)
    assert not fused.usable(layer, x)  # grad enabled: the op has no backward
    y = fused.linear(layer, x, post=fused.post_op("gelu"))
    y.sum().backward()  # the unfused path, differentiable
    assert x.grad is not None and layer.weight.grad is not None

    class Wrapped(nn.Linear):  # LoRA and int8 layers are subclasses or other modules
        def forward(self, inputs):
            return super().forward(inputs) * 2

    wrapped = Wrapped(48, 80)
    with torch.inference_mode():
        assert not fused.usable(wrapped, x.detach())
        torch.testing.assert_close(fused.linear(wrapped, x.detach()), wrapped(x.detach()))
    with pytest.raises(ValueError, match="not both"):
        fused.linear(layer, x, post=fused.post_op("gelu"), residual=x)


def test_switched_off_by_environment(layer, monkeypatch):
    monkeypatch.setattr(fused, "_PROBED", {})
    monkeypatch.setenv("BERTKIT_ONEDNN", "0")
    with torch.inference_mode():
        assert not fused.usable(layer, torch.randn(3, 48))


def test_unfused_holds_the_fused_path_off_without_autograd(layer):
    x = torch.randn(37, 48)
    with torch.no_grad():
        with fused.unfused():
            assert not fused.usable(layer, x)
            torch.testing.assert_close(fused.linear(layer, x), layer(x), rtol=0, atol=0)
        assert fused.usable(layer, x) == fused._available(torch.float32)

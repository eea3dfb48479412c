"""The training kernels of bertkit.encoder.ops against PyTorch's own."""

import pytest
import torch
import torch.nn.functional as F

from bertkit.encoder import ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_cross_entropy_matches_torch_value_and_gradient(dtype):
    torch.manual_seed(0)
    logits = (torch.randn(37, 1000) * 4).to(dtype)
    targets = torch.randint(0, 1000, (37,))
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours, predictions = ops.sparse_cross_entropy(ours_in, targets)
    ref = F.cross_entropy(ref_in.float(), targets)
    assert torch.equal(predictions, logits.argmax(-1))
    (ours * 3).backward()
    (ref * 3).backward()
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    assert ours_in.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ours_in.grad.float(), ref_in.grad.float(), rtol=tol, atol=tol * 1e-2)


def test_sparse_cross_entropy_chunks_agree_with_one_chunk():
    torch.manual_seed(1)
    logits = torch.randn(300, 5000, requires_grad=True)  # 5000 columns → 209 rows per chunk
    targets = torch.randint(0, 5000, (300,))
    ops.sparse_cross_entropy(logits, targets)[0].backward()
    grad, logits.grad = logits.grad, None
    F.cross_entropy(logits, targets).backward()
    torch.testing.assert_close(grad, logits.grad, rtol=1e-5, atol=1e-8)


def test_sparse_cross_entropy_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\(M, V\) logits"):
        ops.sparse_cross_entropy(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long))


def test_dropout_rate_scale_and_gradient_use_one_mask():
    torch.manual_seed(0)
    x = torch.ones(1000, 1000, requires_grad=True)
    y = ops.dropout(x, 0.1, training=True)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.002  # 1M draws: the standard error is 0.0003
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - 3277 / 32768)))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # gradient = the same mask × the same scale


def test_dropout_is_identity_in_eval_and_follows_the_seed():
    x = torch.randn(64, 64)
    assert ops.dropout(x, 0.5, training=False) is x
    torch.manual_seed(3)
    a = ops.dropout(x, 0.5, training=True)
    torch.manual_seed(3)
    b = ops.dropout(x, 0.5, training=True)
    assert torch.equal(a, b)
    assert torch.equal(ops.dropout(x, 1.0, training=True), torch.zeros_like(x))
    with pytest.raises(ValueError, match="dropout probability"):
        ops.Dropout(1.5)


def test_attention_with_dropout_matches_sdpa_where_nothing_is_dropped():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    key_mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    key_mask[1, ..., 5:] = False
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
    # p so small that the rounded probability is 0: the explicit path with nothing dropped
    ours = ops.attention(q, k, v, key_mask, dropout_p=1e-9, training=True)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ops.attention(q, k, v, key_mask, 0.1, training=False), ref)

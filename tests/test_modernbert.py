"""ModernBERT: parity with transformers' ModernBert* classes, checkpoints both ways, both config formats,
the packed local–global attention.

Tiny random transformers models with odd, distinct sizes (hidden 32, 2 heads, GeGLU 37, vocab 99,
4 layers: global, local, local, global) and an 8-token window (4 each side), so every test batch
(lengths 13, 9, 6, 11) runs past the window; one test runs a 2,048-token input. fp32, within 1e-5.
"""

from __future__ import annotations

import json

import pytest
import torch

from bertkit.encoder.checkpoint import to_hf_state_dict
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertkit.encoder.model import BertForMaskedLM, BertModel
from bertkit.encoder.modern import local_attention
from bertkit.encoder.packing import Packed

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB, LENGTH, BATCH = 99, 13, 4
OURS = {"Model": BertModel, "ForMaskedLM": BertForMaskedLM,
        "ForSequenceClassification": BertForSequenceClassification,
        "ForTokenClassification": BertForTokenClassification, "ForQuestionAnswering": BertForQuestionAnswering}


def hf_config(**extra):
    values = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                  intermediate_size=37, local_attention=8, max_position_embeddings=4096,
                  initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                  sep_token_id=2)
    values.update(extra)
    return transformers.ModernBertConfig(**values)


def both(kind: str, tmp_path, **config_extra):
    """(theirs, ours): a random transformers ModernBert<kind> saved and loaded by bertkit."""
    torch.manual_seed(0)
    theirs = getattr(transformers, "ModernBert" + kind)(hf_config(**config_extra)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = OURS[kind].from_pretrained(tmp_path / "hf")
    assert ours.config.model_type == "modernbert"
    assert not ours.load_report.missing and not ours.load_report.unexpected, ours.load_report
    return theirs, ours


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded, lengths 13, 9, 6, 11 (all but one past the 8-token window)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (BATCH, LENGTH), generator=g)
    mask = torch.zeros(BATCH, LENGTH, dtype=torch.long)
    for row, n in enumerate((13, 9, 6, 11)):
        mask[row, :n] = 1
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = float((a.float() - b.float()).abs().max())
    assert diff <= TOL, diff
    return diff


def packed_inputs(b):
    real = b["attention_mask"].bool()
    ids = b["input_ids"][real]
    return ids, torch.zeros_like(ids), Packed.from_lengths(b["attention_mask"].sum(1).tolist())


def round_trip(theirs, ours, tmp_path, b) -> None:
    """ours → save_pretrained → transformers: every tensor matched, outputs equal."""
    ours.save_pretrained(tmp_path / "ours")
    again, info = type(theirs).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == [type(theirs).__name__]
    with torch.no_grad():
        first, second = theirs(**b), again.eval()(**b)
    for key in first.keys():
        if isinstance(first[key], torch.Tensor):
            assert torch.equal(first[key], second[key]), key


def test_base_model_matches_and_round_trips(tmp_path):
    theirs, ours = both("Model", tmp_path)
    b = batch()
    real = b["attention_mask"].bool()
    with torch.no_grad():
        ref = theirs(**b).last_hidden_state
        out = ours(**b).last_hidden_state
        flat = ours.forward_packed(*packed_inputs(b)).hidden
    close(out[real], ref[real])
    close(flat, ref[real])
    assert ours.forward_packed(*packed_inputs(b)).pooler_output is None
    round_trip(theirs, ours, tmp_path, b)


def test_every_switch_on_matches(tmp_path):
    """Biases everywhere, another window, pattern and rotary bases, tanh GELU, mean pooling."""
    extra = dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True, decoder_bias=False,
                 hidden_activation="gelu_pytorch_tanh", classifier_activation="silu", local_attention=6,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
                 rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500.0},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}},
                 classifier_pooling="mean", num_labels=3)
    theirs, ours = both("ForSequenceClassification", tmp_path, **extra)
    b = batch(1)
    labels = torch.tensor([0, 2, 1, 2])
    with torch.no_grad():
        ref = theirs(**b, labels=labels)
        out = ours(**b, labels=labels)
        flat = ours.forward_packed(*packed_inputs(b))
    close(out.logits, ref.logits)
    close(out.loss, ref.loss)
    close(flat.logits, ref.logits)
    round_trip(theirs, ours, tmp_path, b)


def test_masked_lm_matches(tmp_path):
    theirs, ours = both("ForMaskedLM", tmp_path)
    b = batch()
    real = b["attention_mask"].bool()
    labels = b["input_ids"].clone()
    labels[torch.rand(labels.shape, generator=torch.Generator().manual_seed(1)) > 0.3] = -100
    labels[~real] = -100
    with torch.no_grad():
        ref = theirs(**b, labels=labels)
        dense = ours(**b)
        sparse = ours(**b, labels=labels)
        rows = (b["input_ids"][real] % 5 == 0).nonzero().squeeze(1)
        packed = ours.forward_packed(*packed_inputs(b), rows)
    close(dense.logits[real], ref.logits[real])
    close(sparse.logits, ref.logits[labels != -100])
    close(sparse.loss, ref.loss)
    close(packed.logits, ref.logits[real][rows])
    round_trip(theirs, ours, tmp_path, b)


@pytest.mark.parametrize("num_labels", [3, 1])
def test_sequence_classification_matches(num_labels, tmp_path):
    theirs, ours = both("ForSequenceClassification", tmp_path, num_labels=num_labels)
    b = batch()
    labels = torch.tensor([0, 2, 1, 2]) if num_labels == 3 else torch.tensor([0.5, -1.0, 2.0, 0.0])
    with torch.no_grad():
        ref = theirs(**b, labels=labels)
        out = ours(**b, labels=labels)
        packed = ours.forward_packed(*packed_inputs(b))
    close(out.logits, ref.logits)
    close(out.loss, ref.loss)
    close(packed.logits, ref.logits)
    round_trip(theirs, ours, tmp_path, b)


def test_token_classification_matches(tmp_path):
    theirs, ours = both("ForTokenClassification", tmp_path, num_labels=5)
    b = batch()
    real = b["attention_mask"].bool()
    labels = (b["input_ids"] % 5).masked_fill(~real, -100)
    with torch.no_grad():
        ref = theirs(**b, labels=labels)
        out = ours(**b, labels=labels)
        packed = ours.forward_packed(*packed_inputs(b))
    close(out.logits[real], ref.logits[real])
    close(out.loss, ref.loss)
    close(packed.logits, ref.logits[real])
    round_trip(theirs, ours, tmp_path, b)


def test_question_answering_matches(tmp_path):
    theirs, ours = both("ForQuestionAnswering", tmp_path)
    b = {k: v[:1] for k, v in batch().items()}  # no padding: the span loss reads every position
    start, end = torch.tensor([1]), torch.tensor([3])
    with torch.no_grad():
        ref = theirs(**b, start_positions=start, end_positions=end)
        out = ours(**b, start_positions=start, end_positions=end)
        packed = ours.forward_packed(*packed_inputs(b))
    close(out.start_logits, ref.start_logits)
    close(out.end_logits, ref.end_logits)
    close(packed.start_logits, ref.start_logits[0])
    close(out.loss, ref.loss)
    round_trip(theirs, ours, tmp_path, b)


def test_one_checkpoint_loads_under_every_head(tmp_path):
    """A ForMaskedLM directory's `head.*` is the MLM transform, and a task head's own head."""
    theirs, _ = both("ForMaskedLM", tmp_path)
    classifier = BertForSequenceClassification.from_pretrained(tmp_path / "hf", num_labels=2)
    assert classifier.load_report.missing == ["classifier.bias", "classifier.weight"]
    assert classifier.load_report.unexpected == ["decoder.bias"]
    assert torch.equal(classifier.head.dense.weight, theirs.head.dense.weight)


def test_two_thousand_tokens_match(tmp_path):
    """A 2,048-token input: hidden states and the packed path against transformers (sdpa)."""
    theirs, ours = both("Model", tmp_path)
    ids = torch.randint(3, VOCAB, (1, 2048), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = theirs(input_ids=ids).last_hidden_state[0]
        out = ours(ids).last_hidden_state[0]
        flat = ours.forward_packed(ids[0], torch.zeros_like(ids[0]), Packed.from_lengths([2048])).hidden
    close(out, ref)
    close(flat, ref)


def test_a_text_alone_equals_it_in_any_batch(tmp_path):
    """Packed local attention: each sequence's rows equal its own run alone, whatever its neighbours."""
    _, ours = both("Model", tmp_path)
    g = torch.Generator().manual_seed(3)
    lengths = [150, 3, 70, 70, 9, 200, 1, 65]
    texts = [torch.randint(3, VOCAB, (n,), generator=g) for n in lengths]
    with torch.no_grad():
        alone = [ours.forward_packed(t, torch.zeros_like(t), Packed.from_lengths([len(t)])).hidden for t in texts]
        for order in (range(len(texts)), reversed(range(len(texts)))):
            order = list(order)
            ids = torch.cat([texts[i] for i in order])
            flat = ours.forward_packed(ids, torch.zeros_like(ids), Packed.from_lengths([lengths[i] for i in order]))
            for i, rows in zip(order, flat.hidden.split([lengths[i] for i in order])):
                close(rows, alone[i])


@pytest.mark.parametrize("block", [1, 5, 16, 64])
def test_local_attention_kernel_equals_a_band_mask(block):
    g = torch.Generator().manual_seed(4)
    lengths, half = [37, 1, 12, 90], 6
    q, k, v = (torch.randn(sum(lengths), 3, 8, generator=g) for _ in range(3))
    sequence_index = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    out = local_attention(q, k, v, sequence_index, half, block)
    rows = torch.arange(sum(lengths))
    allowed = (sequence_index[:, None] == sequence_index[None, :]) & ((rows[:, None] - rows[None, :]).abs() <= half)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                           attn_mask=allowed)  # (nh, N, hs)
    close(out, ref.transpose(0, 1).reshape(sum(lengths), -1))


def test_fine_tuning_gradients_match(tmp_path):
    theirs, ours = both("ForSequenceClassification", tmp_path, num_labels=3)
    b = batch()
    labels = torch.tensor([0, 2, 1, 2])
    theirs.train()
    ours.train()
    theirs(**b, labels=labels).loss.backward()
    ours(**b, labels=labels).loss.backward()
    grads = to_hf_state_dict({n: p.grad for n, p in ours.named_parameters()}, ours.config)
    reference = {n: p.grad for n, p in theirs.named_parameters()}
    assert set(grads) == set(reference)
    worst = max(float((grads[n] - reference[n]).abs().max()) for n in grads)
    assert worst <= 1e-5, worst


# ------------------------------------------------------------------------------ configuration
LEGACY = {"model_type": "modernbert", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 5,
          "num_attention_heads": 2, "intermediate_size": 37, "global_attn_every_n_layers": 2,
          "global_rope_theta": 5000.0, "local_rope_theta": 100.0, "local_attention": 16, "norm_eps": 1e-6,
          "layer_norm_eps": 1e-5, "position_embedding_type": "absolute", "pad_token_id": 0}


def test_both_config_formats_read_and_the_new_one_is_written(tmp_path):
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "config.json").write_text(json.dumps(LEGACY))
    ours = BertConfig.from_json(tmp_path / "legacy")
    assert ours.layer_types == ["full_attention", "sliding_attention"] * 2 + ["full_attention"]
    assert ours.rope_theta("full_attention") == 5000.0 and ours.rope_theta("sliding_attention") == 100.0
    assert ours.layer_norm_eps == 1e-6 and not ours.has_segments and not ours.has_pooler
    theirs = transformers.ModernBertConfig.from_pretrained(tmp_path / "legacy")
    ours.save(tmp_path / "written")
    written = json.loads((tmp_path / "written" / "config.json").read_text())
    for legacy in ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta", "hidden_act",
                   "type_vocab_size", "hidden_dropout_prob"):
        assert legacy not in written, legacy
    again = transformers.ModernBertConfig.from_pretrained(tmp_path / "written")
    for key in ("layer_types", "rope_parameters", "local_attention", "norm_eps", "hidden_activation",
                "intermediate_size", "mlp_dropout", "attention_dropout"):
        assert getattr(again, key) == getattr(theirs, key), key
    # the transformers-written file reads to the same config
    theirs.save_pretrained(tmp_path / "theirs")
    assert BertConfig.from_json(tmp_path / "theirs").layer_types == ours.layer_types


@pytest.mark.parametrize("key, value", [
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}),
    ("layer_types", ["full_attention", "chunked_attention", "full_attention", "full_attention", "full_attention"]),
    ("sparse_pred_ignore_index", 0),
    ("tie_word_embeddings", False),
    ("classifier_pooling", "max"),
    ("rope_parameters", {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 4.0}}),
])
def test_unimplemented_options_are_refused_by_name(key, value):
    with pytest.raises(ValueError, match=key):
        BertConfig.from_dict({**LEGACY, key: value})


def test_modernbert_fields_outside_modernbert_are_refused():
    with pytest.raises(ValueError, match="layer_types .* is ModernBERT's"):
        BertConfig.from_dict({"layer_types": ["full_attention"] * 12})

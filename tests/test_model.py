"""Parity of the encoder and every head with `transformers` (the oracle), on padded pair batches."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers

from bertkit.encoder import heads
from bertkit.encoder.checkpoint import to_hf_state_dict
from bertkit.encoder.model import BertForMaskedLM, BertForPreTraining, BertModel

TOL = 1e-5


def _hf_twin(ours, hf_class, tmp_path, **kwargs):
    """Save ours, load it with transformers: no missing/unexpected keys allowed."""
    ours.save_pretrained(tmp_path)
    hf, info = hf_class.from_pretrained(tmp_path, output_loading_info=True, attn_implementation="sdpa", **kwargs)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return hf.eval()


def _real(x, mask):
    """Positions holding real tokens: our hidden states are zero at padding by design."""
    return x[mask.bool()]


def test_encoder_matches_reference(tiny_config, padded_batch, tmp_path):
    torch.manual_seed(1)
    ours = BertModel(tiny_config).eval()
    hf = _hf_twin(ours, transformers.BertModel, tmp_path)
    with torch.no_grad():
        a = ours(**padded_batch)
        b = hf(**padded_batch)
    mask = padded_batch["attention_mask"]
    assert (_real(a.last_hidden_state, mask) - _real(b.last_hidden_state, mask)).abs().max() <= TOL
    assert (a.pooler_output - b.pooler_output).abs().max() <= TOL
    assert (a.last_hidden_state[~mask.bool()] == 0).all()


def test_unpadded_batch_equals_padded_rows(tiny_config, padded_batch):
    """Padding removal must not change any real token's state: compare each row alone."""
    torch.manual_seed(2)
    model = BertModel(tiny_config).eval()
    with torch.no_grad():
        full = model(**padded_batch).last_hidden_state
        for row in (1, 4, 7):
            n = int(padded_batch["attention_mask"][row].sum())
            alone = model(padded_batch["input_ids"][row:row + 1, :n],
                          padded_batch["token_type_ids"][row:row + 1, :n]).last_hidden_state
            assert (full[row, :n] - alone[0]).abs().max() <= TOL


def test_pretraining_heads_and_losses_match(tiny_config, padded_batch, tmp_path):
    torch.manual_seed(3)
    ours = BertForPreTraining(tiny_config).eval()
    hf = _hf_twin(ours, transformers.BertForPreTraining, tmp_path)
    g = torch.Generator().manual_seed(4)
    mlm_labels = torch.where((torch.rand(13, 7, generator=g) < 0.3) & padded_batch["attention_mask"].bool(),
                             padded_batch["input_ids"], torch.tensor(-100))
    nsp_labels = torch.randint(0, 2, (13,), generator=g)
    with torch.no_grad():
        dense = ours(**padded_batch)
        sparse = ours(**padded_batch, mlm_labels=mlm_labels, nsp_labels=nsp_labels)
        ref = hf(**padded_batch, labels=mlm_labels, next_sentence_label=nsp_labels)
    mask = padded_batch["attention_mask"]
    assert (_real(dense.mlm_logits, mask) - _real(ref.prediction_logits, mask)).abs().max() <= TOL
    assert (dense.nsp_logits - ref.seq_relationship_logits).abs().max() <= TOL
    # Sparse path: logits only at labelled positions, equal to the dense ones there.
    selected = mlm_labels != -100
    assert sparse.mlm_logits.shape == (int(selected.sum()), tiny_config.vocab_size)
    assert (sparse.mlm_logits - dense.mlm_logits[selected]).abs().max() <= TOL
    assert abs(float(sparse.loss) - float(ref.loss)) <= TOL
    assert abs(float(sparse.mlm_loss + sparse.nsp_loss) - float(sparse.loss)) <= TOL


def test_pretraining_gradients_match(tiny_config, padded_batch, tmp_path):
    """Every parameter's gradient equals transformers' (dropout off), the tied word embeddings
    included: ours adds the lookup's sparse rows into the decoder's dense gradient."""
    torch.manual_seed(6)
    ours = BertForPreTraining(tiny_config).eval()
    hf = _hf_twin(ours, transformers.BertForPreTraining, tmp_path)
    mlm_labels = padded_batch["input_ids"].masked_fill(padded_batch["attention_mask"] == 0, -100)
    nsp_labels = torch.randint(0, 2, (13,), generator=torch.Generator().manual_seed(7))
    ours(**padded_batch, mlm_labels=mlm_labels, nsp_labels=nsp_labels).loss.backward()
    hf(**padded_batch, labels=mlm_labels, next_sentence_label=nsp_labels).loss.backward()
    word_grad = ours.bert.embeddings.word_embeddings.weight.grad
    assert word_grad.layout == torch.strided  # dense, as AdamW and clipping need
    grads = to_hf_state_dict({name: p.grad for name, p in ours.named_parameters()})
    reference = {name: p.grad for name, p in hf.named_parameters()}
    assert "bert.embeddings.word_embeddings.weight" in reference
    compared = sorted(set(grads) & set(reference))
    assert len(compared) == len(reference), set(reference) - set(grads)
    for name in compared:
        assert (grads[name] - reference[name]).abs().max() <= TOL, name


def test_encoder_alone_keeps_a_dense_word_gradient(tiny_config, padded_batch):
    """Only a forward that scores MLM labels (a dense decoder use beside it) asks for sparse rows;
    the encoder called alone afterwards still gives AdamW a dense gradient."""
    model = BertForPreTraining(tiny_config).train()
    labels = padded_batch["input_ids"].masked_fill(padded_batch["attention_mask"] == 0, -100)
    model(**padded_batch, mlm_labels=labels).loss.backward()
    model.zero_grad()
    model.bert(**padded_batch).last_hidden_state.sum().backward()
    assert model.bert.embeddings.word_embeddings.weight.grad.layout == torch.strided


def test_pretraining_without_nsp_labels(tiny_config, padded_batch):
    model = BertForPreTraining(tiny_config).eval()
    labels = padded_batch["input_ids"].masked_fill(padded_batch["attention_mask"] == 0, -100)
    out = model(**padded_batch, mlm_labels=labels)
    assert out.nsp_loss is None and torch.equal(out.loss, out.mlm_loss)
    out = model(**padded_batch, mlm_labels=labels, nsp_labels=torch.full((13,), -100))
    assert out.nsp_loss is None


def test_masked_lm_matches(tiny_config, padded_batch, tmp_path):
    torch.manual_seed(5)
    ours = BertForMaskedLM(tiny_config).eval()
    hf = _hf_twin(ours, transformers.BertForMaskedLM, tmp_path)
    labels = padded_batch["input_ids"].masked_fill(padded_batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        a = ours(**padded_batch, labels=labels)
        b = hf(**padded_batch, labels=labels)
    assert (a.logits - b.logits[labels != -100]).abs().max() <= TOL
    assert abs(float(a.loss) - float(b.loss)) <= TOL


@pytest.mark.parametrize("num_labels,label_kind", [(3, "class"), (1, "regression"), (4, "multi")])
def test_sequence_classification_matches(tiny_config, padded_batch, tmp_path, num_labels, label_kind):
    torch.manual_seed(6)
    config = tiny_config.replace(num_labels=num_labels)
    ours = heads.BertForSequenceClassification(config).eval()
    hf = _hf_twin(ours, transformers.BertForSequenceClassification, tmp_path)
    g = torch.Generator().manual_seed(7)
    labels = {"class": lambda: torch.randint(0, 3, (13,), generator=g),
              "regression": lambda: torch.rand(13, generator=g),
              "multi": lambda: (torch.rand(13, 4, generator=g) > 0.5).float()}[label_kind]()
    with torch.no_grad():
        a = ours(**padded_batch, labels=labels)
        b = hf(**padded_batch, labels=labels)
    assert (a.logits - b.logits).abs().max() <= TOL
    assert abs(float(a.loss) - float(b.loss)) <= TOL


def test_token_classification_matches(tiny_config, padded_batch, tmp_path):
    torch.manual_seed(8)
    ours = heads.BertForTokenClassification(tiny_config.replace(num_labels=5)).eval()
    hf = _hf_twin(ours, transformers.BertForTokenClassification, tmp_path)
    labels = torch.randint(0, 5, (13, 7), generator=torch.Generator().manual_seed(9))
    labels = labels.masked_fill(padded_batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        a = ours(**padded_batch, labels=labels)
        b = hf(**padded_batch, labels=labels)
    mask = padded_batch["attention_mask"]
    assert (_real(a.logits, mask) - _real(b.logits, mask)).abs().max() <= TOL
    assert abs(float(a.loss) - float(b.loss)) <= TOL


def test_question_answering_matches(tiny_config, padded_batch, tmp_path):
    torch.manual_seed(10)
    ours = heads.BertForQuestionAnswering(tiny_config).eval()
    hf = _hf_twin(ours, transformers.BertForQuestionAnswering, tmp_path)
    start = torch.tensor([0, 1, 2, 3, 0, 5, 1, 6, 2, 3, 40, 1, 4])  # 40: outside, ignored as the reference does
    end = start.clamp(max=6)
    with torch.no_grad():
        a = ours(**padded_batch, start_positions=start, end_positions=end)
        b = hf(**padded_batch, start_positions=start, end_positions=end)
    mask = padded_batch["attention_mask"].bool()
    # Padding positions: both heads see a hidden state that means nothing there; compare real tokens.
    assert (a.start_logits[mask] - b.start_logits[mask]).abs().max() <= TOL
    assert (a.end_logits[mask] - b.end_logits[mask]).abs().max() <= TOL


def test_multiple_choice_matches(tiny_config, padded_batch, tmp_path):
    torch.manual_seed(11)
    ours = heads.BertForMultipleChoice(tiny_config).eval()
    hf = _hf_twin(ours, transformers.BertForMultipleChoice, tmp_path)
    inputs = {k: v[:12].view(4, 3, 7) for k, v in padded_batch.items()}  # 4 questions × 3 choices
    labels = torch.tensor([0, 2, 1, 2])
    with torch.no_grad():
        a = ours(**inputs, labels=labels)
        b = hf(**inputs, labels=labels)
    assert (a.logits - b.logits).abs().max() <= TOL
    assert abs(float(a.loss) - float(b.loss)) <= TOL


def test_training_mode_uses_dropout(tiny_config, padded_batch):
    config = tiny_config.replace(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)
    model = BertModel(config).train()
    a = model(**padded_batch).last_hidden_state
    b = model(**padded_batch).last_hidden_state
    assert not torch.equal(a, b)


@pytest.mark.parametrize("change,message", [
    (lambda b: {**b, "input_ids": torch.full((2, 41), 5)} | {"token_type_ids": None, "attention_mask": None},
     "exceeds max_position_embeddings 40"),
    (lambda b: {**b, "input_ids": b["input_ids"].clone().fill_(99)}, "token id 99 is outside the vocabulary"),
    (lambda b: {**b, "token_type_ids": b["token_type_ids"] * 3}, "type_vocab_size 3"),
    (lambda b: {"input_ids": torch.zeros(0, 7, dtype=torch.long)}, "empty batch"),
    (lambda b: {**b, "attention_mask": b["attention_mask"] * 0}, "has no tokens"),
])
def test_bad_inputs_are_named(tiny_config, padded_batch, change, message):
    model = BertModel(tiny_config).eval()
    with pytest.raises(ValueError, match=message):
        model(**change(padded_batch))


def test_packed_forward_equals_each_sequence_alone(tiny_config):
    """forward_packed (the inference engine's layout: no padding anywhere) = forward per sequence."""
    from bertkit.encoder.packing import Packed

    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    lengths = [7, 7, 5, 3, 3, 3, 9, 1]  # runs of equal lengths, and singletons
    seqs = [torch.randint(0, tiny_config.vocab_size, (n,)) for n in lengths]
    types = [torch.randint(0, tiny_config.type_vocab_size, (n,)) for n in lengths]
    packed = Packed.from_lengths(lengths)
    assert packed.runs == [(0, 2, 7), (14, 1, 5), (19, 3, 3), (28, 1, 9), (37, 1, 1)]
    with torch.no_grad():
        out = model.forward_packed(torch.cat(seqs), torch.cat(types), packed)
        for i, (ids, tt) in enumerate(zip(seqs, types)):
            alone = model(ids[None], tt[None])
            start = int(packed.starts[i])
            assert (out.hidden[start:start + lengths[i]] - alone.last_hidden_state[0]).abs().max() <= 1e-5
            assert (out.pooler_output[i] - alone.pooler_output[0]).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        long = tiny_config.max_position_embeddings + 1
        model.forward_packed(torch.zeros(long, dtype=torch.long), torch.zeros(long, dtype=torch.long),
                             Packed.from_lengths([long]))


def test_key_windows_equal_attention_over_each_sequence_alone(tiny_config):
    """Packed attention through overlapping key windows (lengths 1–13 short of a multiple of 16)
    equals SDPA over each sequence alone, windows at the end of the rows included, and a
    sequence's output is bit-identical whatever its neighbours are."""
    from bertkit.encoder.model import EncoderLayer
    from bertkit.encoder.packing import Packed, key_windows

    torch.manual_seed(0)
    layer = EncoderLayer(tiny_config).eval()
    nh, hs = layer.num_heads, layer.head_dim
    lengths = [30, 30, 30, 23, 16, 17, 9, 9, 9, 9, 8, 5]  # windows of 32, 32, 16 and 16 keys
    qkv = torch.randn(sum(lengths), 3 * nh * hs)
    packed = Packed.from_lengths(lengths)
    with torch.no_grad():
        windowed = [key_windows(layer, qkv, n) for n in (30, 23, 16, 17, 9, 8, 5)]
        assert windowed == [True, True, False, False, True, True, False]
        out = packed.attend(layer, qkv)
        for i, n in enumerate(lengths):
            rows = slice(int(packed.starts[i]), int(packed.starts[i]) + n)
            q, k, v = qkv[rows].view(1, n, 3, nh, hs).permute(2, 0, 3, 1, 4).unbind(0)
            alone = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, nh * hs)
            assert (out[rows] - alone).abs().max() <= 1e-6
        # the same 30-token sequence first, with other neighbours after it, and last
        first = qkv[:30]
        for neighbours in ([30, 7], [30, 30], [30]):
            rows = torch.cat([first, torch.randn(sum(neighbours) - 30, qkv.shape[1]) * 100])
            again = Packed.from_lengths(neighbours).attend(layer, rows)[:30]
            assert torch.equal(again, out[:30])


@pytest.mark.parametrize("padded", [True, False])
def test_first_only_equals_the_full_last_layer(tiny_config, padded_batch, padded):
    """first_only (what a [CLS] head reads) = the full encoder's first token: states and gradients."""
    torch.manual_seed(12)
    model = BertModel(tiny_config).train()  # training mode: the path fine-tuning takes
    batch = padded_batch if padded else {"input_ids": padded_batch["input_ids"][:, :5].clamp(min=1),
                                         "token_type_ids": padded_batch["token_type_ids"][:, :5]}

    def run(first_only):
        model.zero_grad()
        out = model(**batch, first_only=first_only)
        first = out.last_hidden_state[:, 0]  # (B, H)
        (first.square().sum() + out.pooler_output.sum()).backward()
        return first.detach(), out.pooler_output.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    full, cut = run(False), run(True)
    assert model(**batch, first_only=True).last_hidden_state.shape == (13, 1, tiny_config.hidden_size)
    assert (full[0] - cut[0]).abs().max() <= 1e-5 and (full[1] - cut[1]).abs().max() <= 1e-5
    # relative too: a LayerNorm weight's gradient reaches ~135, where one float32 step is 1.5e-5
    # and the two paths' summation orders may differ by it
    for name, grad in full[2].items():
        torch.testing.assert_close(cut[2][name], grad, rtol=1e-5, atol=1e-5, msg=name)


def test_packed_first_only_equals_the_packed_first_rows(tiny_config):
    from bertkit.encoder.packing import Packed

    torch.manual_seed(13)
    model = heads.BertForSequenceClassification(tiny_config.replace(num_labels=3)).eval()
    lengths = [7, 7, 5, 3, 3, 3, 9, 1]
    ids = torch.randint(1, tiny_config.vocab_size, (sum(lengths),))
    types = torch.zeros_like(ids)
    packed = Packed.from_lengths(lengths)
    with torch.no_grad():
        full = model.bert.forward_packed(ids, types, packed)
        cut = model.bert.forward_packed(ids, types, packed, first_only=True)
        assert cut.hidden.shape == (len(lengths), tiny_config.hidden_size)
        assert (cut.hidden - full.hidden[packed.starts]).abs().max() <= 1e-5
        assert (cut.pooler_output - full.pooler_output).abs().max() <= 1e-5
        logits = model.forward_packed(ids, types, packed).logits  # (B, K), through first_only
        for i, n in enumerate(lengths):
            start = int(packed.starts[i])
            alone = model(ids[None, start:start + n], types[None, start:start + n]).logits
            assert (logits[i] - alone[0]).abs().max() <= 1e-5

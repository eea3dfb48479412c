"""RoBERTa, XLM-RoBERTa, CamemBERT, ALBERT, DistilBERT, ERNIE, ELECTRA and MPNet: parity with transformers,
checkpoints both ways, packed path.

Each family is a tiny random transformers model with odd, distinct sizes (nothing downloads),
saved with save_pretrained and loaded by bertkit; every head's outputs and losses are compared on
a right-padded batch (sentence pairs where the family has segments), fp32, within 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import model_class
from bertkit.encoder.packing import Packed
from bertkit.encoder.tasks import kind_of

from family_fixtures import FAIRSEQ, PREFIX

transformers = pytest.importorskip("transformers")


TOL = 1e-5
VOCAB, LENGTH, BATCH = 97, 13, 4


def hf_config(family: str, **extra):
    common = {"vocab_size": VOCAB, "max_position_embeddings": 40, "initializer_range": 0.2, **extra}
    if family in FAIRSEQ:
        return getattr(transformers, PREFIX[family] + "Config")(
            hidden_size=30, num_hidden_layers=3, num_attention_heads=3, intermediate_size=37, type_vocab_size=1,
            pad_token_id=1, layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
    if family == "albert":
        return transformers.AlbertConfig(embedding_size=14, hidden_size=30, num_hidden_layers=4,
                                         num_hidden_groups=2, inner_group_num=2, num_attention_heads=3,
                                         intermediate_size=37, hidden_act="gelu_new",
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                         classifier_dropout_prob=0.0, **common)
    if family == "ernie":  # with ERNIE 3.0's task-type table
        return transformers.ErnieConfig(hidden_size=30, num_hidden_layers=3, num_attention_heads=3,
                                        intermediate_size=37, use_task_id=True, task_type_vocab_size=3,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
    if family == "mpnet":  # 32 buckets: 8 exact distances and 8 logarithmic ones up to 128 each way
        return transformers.MPNetConfig(hidden_size=30, num_hidden_layers=3, num_attention_heads=3,
                                        intermediate_size=37, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0, **common)
    if family == "electra":  # embeddings of width 14 projected to 30
        return transformers.ElectraConfig(**{"embedding_size": 14, **common}, hidden_size=30, num_hidden_layers=3,
                                          num_attention_heads=3, intermediate_size=37, hidden_dropout_prob=0.0,
                                          attention_probs_dropout_prob=0.0)
    return transformers.DistilBertConfig(dim=30, n_layers=3, n_heads=3, hidden_dim=37, dropout=0.0,
                                         attention_dropout=0.0, seq_classif_dropout=0.0, qa_dropout=0.0,
                                         **common)


FAMILIES = tuple(PREFIX)
# The families whose pairs carry segment ids 0 / 1.
PAIRED = ("albert", "ernie", "electra")
# The families without a pooler.
NO_POOLER = ("distilbert", "electra")
# The families whose padding id is 1 (fairseq's dictionary) and whose transformers classes take no segments.
PAD_ONE = (*FAIRSEQ, "mpnet")
NO_SEGMENTS = ("distilbert", "mpnet")


def batch(family: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """A right-padded batch of 4 rows, lengths 13, 9, 6, 11; pairs (segment 1 after the middle)
    where the family has segments. Ids avoid the padding id, as real text does."""
    g = torch.Generator().manual_seed(seed)
    pad = 1 if family in PAD_ONE else 0
    ids = torch.randint(3, VOCAB, (BATCH, LENGTH), generator=g)
    mask = torch.zeros(BATCH, LENGTH, dtype=torch.long)
    types = torch.zeros(BATCH, LENGTH, dtype=torch.long)
    for row, n in enumerate((13, 9, 6, 11)):
        mask[row, :n] = 1
        if family in PAIRED:
            types[row, n // 2:n] = 1
    ids = ids.masked_fill(mask == 0, pad)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def hf_inputs(family: str, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in b.items() if not (family in NO_SEGMENTS and k == "token_type_ids")}


def both(family: str, kind: str, tmp_path, **config_extra):
    """(theirs, ours): a random transformers model of `kind` saved and loaded by bertkit."""
    torch.manual_seed(0)
    theirs = getattr(transformers, PREFIX[family] + kind)(hf_config(family, **config_extra)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours_class = model_class(kind_of(PREFIX[family] + kind))  # ElectraForPreTraining: the discriminator
    ours = ours_class.from_pretrained(tmp_path / "hf")
    assert ours.config.model_type == family
    assert not ours.load_report.missing and not ours.load_report.unexpected, ours.load_report
    return theirs, ours


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = float((a.float() - b.float()).abs().max())
    assert diff <= TOL, diff
    return diff


def round_trip(theirs, ours, tmp_path, family: str, b) -> None:
    """ours → save_pretrained → transformers: every tensor matched, outputs equal."""
    ours.save_pretrained(tmp_path / "ours")
    again, info = type(theirs).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    again.eval()
    with torch.no_grad():
        first, second = theirs(**hf_inputs(family, b)), again(**hf_inputs(family, b))
    for key in first.keys():
        if isinstance(first[key], torch.Tensor):
            assert torch.equal(first[key], second[key]), key


@pytest.mark.parametrize("family", FAMILIES)
def test_base_model_matches_and_round_trips(family, tmp_path):
    theirs, ours = both(family, "Model", tmp_path)
    b = batch(family)
    with torch.no_grad():
        ref = theirs(**hf_inputs(family, b))
        out = ours(**b)
    real = b["attention_mask"].bool()
    close(out.last_hidden_state[real], ref.last_hidden_state[real])
    if family in NO_POOLER:
        assert out.pooler_output is None
    else:
        close(out.pooler_output, ref.pooler_output)
    round_trip(theirs, ours, tmp_path, family, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_path_matches_padded_forward(family, tmp_path):
    """forward_packed (the engine's path) equals forward row by row: RoBERTa's offset included."""
    _, ours = both(family, "Model", tmp_path)
    b = batch(family)
    lengths = b["attention_mask"].sum(1).tolist()
    real = b["attention_mask"].bool()
    packed = Packed.from_lengths(lengths)
    with torch.no_grad():
        padded = ours(**b)
        flat = ours.forward_packed(b["input_ids"][real], b["token_type_ids"][real], packed)
    close(flat.hidden, padded.last_hidden_state[real])
    if flat.pooler_output is not None:
        close(flat.pooler_output, padded.pooler_output)


@pytest.mark.parametrize("family", FAMILIES)
def test_masked_lm_matches(family, tmp_path):
    theirs, ours = both(family, "ForMaskedLM", tmp_path)
    b = batch(family)
    labels = b["input_ids"].clone()
    labels[torch.rand(labels.shape, generator=torch.Generator().manual_seed(1)) > 0.3] = -100
    labels[b["attention_mask"] == 0] = -100
    with torch.no_grad():
        ref = theirs(**hf_inputs(family, b), labels=labels)
        dense = ours(**b)
        sparse = ours(**b, labels=labels)
        rows = (b["input_ids"][b["attention_mask"].bool()] % 5 == 0).nonzero().squeeze(1)
        lengths = b["attention_mask"].sum(1).tolist()
        packed = ours.forward_packed(b["input_ids"][b["attention_mask"].bool()],
                                     b["token_type_ids"][b["attention_mask"].bool()],
                                     Packed.from_lengths(lengths), rows)
    real = b["attention_mask"].bool()
    close(dense.logits[real], ref.logits[real])
    close(sparse.logits, ref.logits[labels != -100])
    close(sparse.loss, ref.loss)
    close(packed.logits, ref.logits[real][rows])
    round_trip(theirs, ours, tmp_path, family, b)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_labels", [3, 1])
def test_sequence_classification_matches(family, num_labels, tmp_path):
    theirs, ours = both(family, "ForSequenceClassification", tmp_path, num_labels=num_labels)
    b = batch(family)
    labels = torch.tensor([0, 2, 1, 2]) if num_labels == 3 else torch.tensor([0.5, -1.0, 2.0, 0.0])
    with torch.no_grad():
        ref = theirs(**hf_inputs(family, b), labels=labels)
        out = ours(**b, labels=labels)
        real = b["attention_mask"].bool()
        packed = ours.forward_packed(b["input_ids"][real], b["token_type_ids"][real],
                                     Packed.from_lengths(b["attention_mask"].sum(1).tolist()))
    close(out.logits, ref.logits)
    close(out.loss, ref.loss)
    close(packed.logits, ref.logits)
    round_trip(theirs, ours, tmp_path, family, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_token_classification_matches(family, tmp_path):
    theirs, ours = both(family, "ForTokenClassification", tmp_path, num_labels=5)
    b = batch(family)
    labels = (b["input_ids"] % 5).masked_fill(b["attention_mask"] == 0, -100)
    with torch.no_grad():
        ref = theirs(**hf_inputs(family, b), labels=labels)
        out = ours(**b, labels=labels)
    real = b["attention_mask"].bool()
    close(out.logits[real], ref.logits[real])
    close(out.loss, ref.loss)
    round_trip(theirs, ours, tmp_path, family, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_question_answering_matches(family, tmp_path):
    theirs, ours = both(family, "ForQuestionAnswering", tmp_path)
    b = batch(family)
    start, end = torch.tensor([1, 2, 0, 4]), torch.tensor([3, 5, 0, 9])
    with torch.no_grad():
        ref = theirs(**hf_inputs(family, b), start_positions=start, end_positions=end)
        out = ours(**b, start_positions=start, end_positions=end)
    real = b["attention_mask"].bool()
    close(out.start_logits[real], ref.start_logits[real])
    close(out.end_logits[real], ref.end_logits[real])
    # The span loss is a softmax over every position, padding included, where transformers has
    # hidden states of its own and bertkit zeros: the losses are compared on rows without padding.
    full = {k: v[:1] for k, v in b.items()}
    with torch.no_grad():
        ref_loss = theirs(**hf_inputs(family, full), start_positions=start[:1], end_positions=end[:1]).loss
        loss = ours(**full, start_positions=start[:1], end_positions=end[:1]).loss
    close(loss, ref_loss)
    round_trip(theirs, ours, tmp_path, family, b)


def pretraining_matches(family: str, sentence_label: str, sentence_logits: str, tmp_path) -> None:
    """MLM and the sentence head (ALBERT's SOP, ERNIE's NSP) against transformers' ForPreTraining."""
    theirs, ours = both(family, "ForPreTraining", tmp_path)
    b = batch(family)
    labels = b["input_ids"].masked_fill(b["attention_mask"] == 0, -100)
    order = torch.tensor([0, 1, 1, 0])  # 1 = the two segments were swapped (SOP) / B is random (NSP)
    with torch.no_grad():
        ref = theirs(**b, labels=labels, **{sentence_label: order})
        out = ours(**b, mlm_labels=labels, nsp_labels=order)
    close(out.mlm_logits, ref.prediction_logits[labels != -100])
    close(out.nsp_logits, getattr(ref, sentence_logits))
    close(out.loss, ref.loss)
    round_trip(theirs, ours, tmp_path, family, b)


def test_albert_pretraining_mlm_and_sop_match(tmp_path):
    pretraining_matches("albert", "sentence_order_label", "sop_logits", tmp_path)


def test_ernie_pretraining_mlm_and_nsp_match(tmp_path):
    pretraining_matches("ernie", "next_sentence_label", "seq_relationship_logits", tmp_path)


def test_ernie_task_type_row_zero_reaches_every_token(tmp_path):
    """ERNIE 3.0's task-type table: transformers adds row 0 when no task_type_ids are given, and so
    does bertkit, in the padded and the packed path; without the table the states differ."""
    theirs, ours = both("ernie", "Model", tmp_path)
    assert ours.embeddings.task_type_embeddings.weight.shape == (3, 30)
    b = batch("ernie")
    real = b["attention_mask"].bool()
    with torch.no_grad():
        ref = theirs(**b, task_type_ids=torch.zeros_like(b["input_ids"])).last_hidden_state
        close(ours(**b).last_hidden_state[real], ref[real])
        ours.embeddings.task_type_embeddings.weight[0].zero_()
        assert float((ours(**b).last_hidden_state[real] - ref[real]).abs().max()) > 1e-3


def test_ernie_nonzero_task_type_id_matches_padded_and_packed(tmp_path):
    """`task_type_id` in config.json: every token gets that row, as transformers' ErnieModel does
    when task_type_ids is filled with it, in the padded and the packed path."""
    theirs, ours = both("ernie", "Model", tmp_path, task_type_id=2)
    assert ours.config.task_type_id == 2
    b = batch("ernie")
    real = b["attention_mask"].bool()
    with torch.no_grad():
        ref = theirs(**b, task_type_ids=torch.full_like(b["input_ids"], 2)).last_hidden_state
        row_zero = theirs(**b).last_hidden_state
        close(ours(**b).last_hidden_state[real], ref[real])
        packed = ours.forward_packed(b["input_ids"][real], b["token_type_ids"][real],
                                     Packed.from_lengths(b["attention_mask"].sum(1).tolist()))
    close(packed.hidden, ref[real])
    assert float((row_zero[real] - ref[real]).abs().max()) > 1e-3  # the row chosen matters


@pytest.mark.parametrize("values, named", [
    ({"model_type": "ernie", "use_task_id": True, "task_type_vocab_size": 3, "task_type_id": 3}, "between 0 and 2"),
    ({"model_type": "bert", "task_type_id": 1}, "use_task_id False"),
])
def test_task_type_id_outside_the_table_is_refused(values, named):
    with pytest.raises(ValueError, match=named):
        BertConfig.from_dict({"vocab_size": VOCAB, **values})


def test_electra_discriminator_matches(tmp_path):
    """ElectraForPreTraining is the discriminator: one replaced-token logit per token, its loss the
    binary cross-entropy over real tokens; padded and packed, and back to transformers."""
    theirs, ours = both("electra", "ForPreTraining", tmp_path)
    assert type(ours).__name__ == "BertForReplacedTokenDetection"
    b = batch("electra")
    labels = b["input_ids"] % 2  # 1 = replaced
    real = b["attention_mask"].bool()
    with torch.no_grad():
        ref = theirs(**b, labels=labels)
        out = ours(**b, labels=labels)
        packed = ours.forward_packed(b["input_ids"][real], b["token_type_ids"][real],
                                     Packed.from_lengths(b["attention_mask"].sum(1).tolist()))
    close(out.logits[real], ref.logits[real])
    close(out.loss, ref.loss)
    close(packed.logits, ref.logits[real])
    round_trip(theirs, ours, tmp_path, "electra", b)


def test_electra_without_projection_where_the_widths_agree(tmp_path):
    """ELECTRA-base and -large have embedding_size = hidden_size: no embeddings_project either side."""
    theirs, ours = both("electra", "ForMaskedLM", tmp_path, embedding_size=30)
    assert ours.bert.embed_proj is None and not hasattr(theirs.electra, "embeddings_project")
    b = batch("electra")
    real = b["attention_mask"].bool()
    with torch.no_grad():
        close(ours(**b).logits[real], theirs(**b).logits[real])
    round_trip(theirs, ours, tmp_path, "electra", b)


def test_mpnet_relative_buckets_equal_transformers():
    """Every distance of ±300 falls in transformers' bucket (32 buckets, as its attention reads them),
    and a table smaller than that is refused naming the key."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    from bertkit.encoder.relative import bucket

    distances = torch.arange(-300, 301)[None, :]
    assert torch.equal(bucket(distances, 32), MPNetEncoder.relative_position_bucket(distances, 32))
    with pytest.raises(ValueError, match="relative_attention_num_buckets 12 is below the 32 buckets"):
        BertConfig.from_dict({"model_type": "mpnet", "relative_attention_num_buckets": 12})


def test_mpnet_long_sequences_past_the_largest_distance(tmp_path):
    """Rows of 150, 140, 9 and 150 tokens (distances past max_distance 128 share the last bucket):
    padded and packed equal transformers, the packed path in any order and for the first tokens alone."""
    theirs, ours = both("mpnet", "Model", tmp_path, max_position_embeddings=160)
    g = torch.Generator().manual_seed(3)
    lengths = (150, 140, 9, 150)
    ids = torch.randint(3, VOCAB, (4, 150), generator=g)
    mask = (torch.arange(150)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = ids.masked_fill(mask == 0, 1)
    real = mask.bool()
    with torch.no_grad():
        ref = theirs(input_ids=ids, attention_mask=mask)
        out = ours(input_ids=ids, attention_mask=mask)
        first = ours(input_ids=ids, attention_mask=mask, first_only=True)
        order = [2, 0, 3, 1]
        flat = ours.forward_packed(ids[order][real[order]], torch.zeros(int(real.sum()), dtype=torch.long),
                                   Packed.from_lengths([lengths[i] for i in order]))
        flat_first = ours.forward_packed(ids[real], torch.zeros(int(real.sum()), dtype=torch.long),
                                         Packed.from_lengths(list(lengths)), first_only=True)
    close(out.last_hidden_state[real], ref.last_hidden_state[real])
    close(out.pooler_output, ref.pooler_output)
    close(first.last_hidden_state[:, 0], ref.last_hidden_state[:, 0])
    close(flat.hidden, ref.last_hidden_state[order][real[order]])
    close(flat_first.hidden, ref.last_hidden_state[:, 0])
    assert ours.relative_bias.weight.shape == (32, 3)


def test_single_segment_roberta_ignores_segment_ids(tmp_path):
    """BERT-style pair encoders mark segment B with 1s; RoBERTa (one type) adds row 0 regardless."""
    _, ours = both("roberta", "Model", tmp_path)
    b = batch("roberta")
    ones = {**b, "token_type_ids": b["attention_mask"].clone()}
    real = b["attention_mask"].bool()
    with torch.no_grad():
        assert torch.equal(ours(**ones).last_hidden_state, ours(**b).last_hidden_state)
        packed = Packed.from_lengths(b["attention_mask"].sum(1).tolist())
        flat = ours.forward_packed(b["input_ids"][real], torch.ones(int(real.sum()), dtype=torch.long), packed)
    close(flat.hidden, ours(**b).last_hidden_state[real])


def test_albert_shares_layers_as_configured(tmp_path):
    """4 depths × 2 inner layers over 2 groups: 4 stored layers, each run twice, in HF's order."""
    _, ours = both("albert", "Model", tmp_path)
    assert len(ours.layers) == 4
    assert ours.schedule == [0, 1, 0, 1, 2, 3, 2, 3]


@pytest.mark.parametrize("family", FAMILIES)
def test_fine_tuning_gradients_match(family, tmp_path):
    """One training step's gradients equal transformers' (the fine-tune path, not just eval)."""
    theirs, ours = both(family, "ForSequenceClassification", tmp_path, num_labels=3)
    b = batch(family)
    labels = torch.tensor([0, 2, 1, 2])
    theirs.train()
    ours.train()
    theirs(**hf_inputs(family, b), labels=labels).loss.backward()
    ours(**b, labels=labels).loss.backward()
    from bertkit.encoder.checkpoint import to_hf_state_dict

    grads = to_hf_state_dict({n: p.grad for n, p in ours.named_parameters()}, ours.config)
    reference = {n: p.grad for n, p in theirs.named_parameters()}
    worst = max(float((grads[n] - reference[n]).abs().max()) for n in grads)
    assert worst <= 1e-5, worst


def test_configs_round_trip_under_their_own_keys(tmp_path):
    """DistilBERT's dim/n_layers/... and ALBERT's classifier_dropout_prob are written back as such."""
    import json

    for family in FAMILIES:
        hf_config(family).save_pretrained(tmp_path / family)
        config = BertConfig.from_json(tmp_path / family)
        config.save(tmp_path / f"{family}-ours")
        theirs = json.loads((tmp_path / family / "config.json").read_text())
        again = json.loads((tmp_path / f"{family}-ours" / "config.json").read_text())
        for key in ("dim", "n_layers", "n_heads", "hidden_dim", "embedding_size", "num_hidden_groups", "use_task_id",
                    "inner_group_num", "classifier_dropout_prob", "type_vocab_size", "pad_token_id",
                    "relative_attention_num_buckets"):
            assert theirs.get(key) == again.get(key), (family, key)
    distil = BertConfig.from_json(tmp_path / "distilbert")
    assert (distil.hidden_size, distil.num_hidden_layers, distil.intermediate_size) == (30, 3, 37)
    assert not distil.has_segments and not distil.has_pooler
    roberta = BertConfig.from_json(tmp_path / "roberta")
    assert roberta.position_offset == 2 and roberta.max_sequence_length == 38


def test_family_fields_outside_albert_are_refused():
    with pytest.raises(ValueError, match="only ALBERT supports"):
        BertConfig.from_dict({"embedding_size": 128})
    with pytest.raises(ValueError, match="num_hidden_layers 6 is not a multiple of num_hidden_groups 4"):
        BertConfig.from_dict({"model_type": "albert", "num_hidden_layers": 6, "num_hidden_groups": 4})
    with pytest.raises(ValueError, match="model_type 'gpt2' is not in the BERT family"):
        BertConfig.from_dict({"model_type": "gpt2"})

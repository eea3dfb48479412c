"""Checkpoints: real weights, round trips both ways, legacy names, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from bertkit.encoder import heads
from bertkit.encoder.checkpoint import CheckpointError
from bertkit.encoder.config import BertConfig
from bertkit.encoder.model import BertForPreTraining, BertModel

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Shares in the company rose sharply after its quarterly results beat expectations.",
    "A man is playing a guitar.",
]


def _encode(model_dir, pairs=False):
    tok = transformers.BertTokenizerFast.from_pretrained(model_dir)
    second = list(reversed(SENTENCES)) if pairs else None
    return dict(tok(SENTENCES, second, padding=True, return_tensors="pt"))


@pytest.mark.parametrize("pairs", [False, True])
def test_real_minilm_weights_match_reference(minilm_dir, pairs):
    batch = _encode(minilm_dir, pairs)
    ours = BertModel.from_pretrained(minilm_dir)
    ref = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="sdpa").eval()
    assert not ours.load_report.missing and not ours.load_report.unexpected
    with torch.no_grad():
        a, b = ours(**batch), ref(**batch)
    mask = batch["attention_mask"].bool()
    assert (a.last_hidden_state[mask] - b.last_hidden_state[mask]).abs().max() <= 1e-5
    assert (a.pooler_output - b.pooler_output).abs().max() <= 1e-5


def test_reference_to_ours_round_trip(tiny_config, padded_batch, tmp_path):
    """transformers saves → we load → we save → transformers loads: same outputs throughout."""
    hf_config = transformers.BertConfig(**{k: v for k, v in tiny_config.to_dict().items()})
    torch.manual_seed(0)
    ref = transformers.BertForPreTraining(hf_config).eval()
    ref.save_pretrained(tmp_path / "hf")
    ours = BertForPreTraining.from_pretrained(tmp_path / "hf")
    assert not ours.load_report.missing and not ours.load_report.unexpected
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.BertForPreTraining.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        r, o, k = ref(**padded_batch), ours(**padded_batch), back(**padded_batch)
    mask = padded_batch["attention_mask"].bool()
    assert (r.prediction_logits[mask] - o.mlm_logits[mask]).abs().max() <= 1e-5
    assert (r.seq_relationship_logits - o.nsp_logits).abs().max() <= 1e-5
    assert torch.equal(r.prediction_logits, k.prediction_logits)
    # The config round-trips too: extra keys kept, sizes unchanged.
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == ["BertForPreTraining"] and saved["intermediate_size"] == 37
    assert "transformers_version" in saved


def test_bare_encoder_loads_under_a_head_and_head_is_reported(minilm_dir):
    model = heads.BertForSequenceClassification.from_pretrained(minilm_dir, num_labels=3)
    assert model.load_report.missing == ["classifier.bias", "classifier.weight"]
    assert model.config.num_labels == 3


def test_pretraining_checkpoint_loads_as_bare_encoder(tiny_config, tmp_path):
    BertForPreTraining(tiny_config).save_pretrained(tmp_path)
    model = BertModel.from_pretrained(tmp_path)
    assert not model.load_report.missing
    assert "cls.seq_relationship.weight" in model.load_report.unexpected


def test_legacy_names_and_bin_format(tiny_config, padded_batch, tmp_path):
    """TF-era gamma/beta, a position_ids buffer, a saved tied decoder, pytorch_model.bin."""
    torch.manual_seed(1)
    model = BertForPreTraining(tiny_config).eval()
    model.save_pretrained(tmp_path / "new")
    state = load_file(str(tmp_path / "new" / "model.safetensors"))
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in state.items()}
    legacy["bert.embeddings.position_ids"] = torch.arange(40)[None]
    legacy["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    legacy["cls.predictions.decoder.bias"] = legacy.pop("cls.predictions.bias")
    (tmp_path / "old").mkdir()
    torch.save(legacy, tmp_path / "old" / "pytorch_model.bin")
    (tmp_path / "old" / "config.json").write_text((tmp_path / "new" / "config.json").read_text())
    old = BertForPreTraining.from_pretrained(tmp_path / "old")
    assert not old.load_report.missing and not old.load_report.unexpected
    with torch.no_grad():
        assert torch.equal(old(**padded_batch).mlm_logits, model(**padded_batch).mlm_logits)


def test_missing_pooler_is_initialised_and_reported(tiny_config, tmp_path):
    BertModel(tiny_config, add_pooling_layer=False).save_pretrained(tmp_path)
    model = BertModel.from_pretrained(tmp_path)
    assert model.load_report.missing == ["pooler.dense.bias", "pooler.dense.weight"]


def test_shape_mismatch_names_the_tensor(tiny_config, tmp_path):
    heads.BertForSequenceClassification(tiny_config.replace(num_labels=3)).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError,
                       match=r"tensor classifier\.bias has shape \(3,\) in the checkpoint but \(5,\) in the model"):
        heads.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=5)


def test_corrupt_and_truncated_safetensors(tiny_config, tmp_path):
    BertModel(tiny_config).save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        BertModel.from_pretrained(tmp_path)
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        BertModel.from_pretrained(tmp_path)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BertModel.from_pretrained(tmp_path / "nope")
    BertConfig.preset("tiny", vocab_size=50).save(tmp_path)
    with pytest.raises(FileNotFoundError, match="no model.safetensors or pytorch_model.bin"):
        BertModel.from_pretrained(tmp_path)


def test_saved_safetensors_has_no_shared_or_fused_tensors(tiny_config, tmp_path):
    BertForPreTraining(tiny_config).save_pretrained(tmp_path)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "bert.encoder.layer.0.attention.self.query.weight" in names
    assert not any("qkv" in n or "decoder" in n for n in names)
    save_file({"x": torch.zeros(1)}, str(tmp_path / "unrelated.safetensors"))  # the dir may hold other files
    BertForPreTraining.from_pretrained(tmp_path)

"""BertConfig: presets, real config.json files, and invalid values named in the error."""

from __future__ import annotations

import json

import pytest

from bertkit.encoder.config import BertConfig


def test_reads_a_real_config_and_keeps_extra_keys(minilm_dir, tmp_path):
    config = BertConfig.from_json(minilm_dir / "config.json")
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (384, 6, 12)
    assert config.extra["architectures"] == ["BertModel"]
    config.save(tmp_path)
    again = json.loads((tmp_path / "config.json").read_text())
    assert again["_name_or_path"] == "nreimers/MiniLM-L6-H384-uncased" and again["hidden_size"] == 384


@pytest.mark.parametrize("name,layers,hidden,heads", [
    ("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8), ("medium", 8, 512, 8),
    ("base", 12, 768, 12), ("large", 24, 1024, 16)])
def test_presets(name, layers, hidden, heads):
    config = BertConfig.preset(name)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (layers, hidden, heads)
    assert config.intermediate_size == 4 * hidden


def test_labels_round_trip(tmp_path):
    config = BertConfig.preset("tiny", id2label={"0": "neg", "1": "pos"})
    assert config.num_labels == 2 and config.label2id == {"neg": 0, "pos": 1}
    config.save(tmp_path)
    assert BertConfig.from_json(tmp_path).id2label == {0: "neg", 1: "pos"}
    assert BertConfig.from_dict({"num_labels": 3}).id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}


@pytest.mark.parametrize("values,message", [
    ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size 30 is not divisible by num_attention_heads 4"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer, got 0"),
    ({"vocab_size": -5}, "vocab_size must be a positive integer, got -5"),
    ({"hidden_act": "mish"}, "unknown hidden_act 'mish'"),
    ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob must be in"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
    ({"model_type": "gpt2"}, "model_type .gpt2. is not in the BERT family"),
])
def test_invalid_values_are_named(values, message):
    with pytest.raises(ValueError, match=message):
        BertConfig.from_dict(values)


def test_invalid_file_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 30, "num_attention_heads": 4}')
    with pytest.raises(ValueError, match=f"{path}: invalid BertConfig"):
        BertConfig.from_json(path)
    path.write_text('{"hidden_size": ')
    with pytest.raises(ValueError, match="not valid JSON"):
        BertConfig.from_json(path)


def test_resolve_rejects_unknown_model():
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        BertConfig.resolve("huge")

"""DeBERTa-v2's settings in `config.BertConfig`: the values other families imply, and what is refused.

The fields have transformers' DebertaV2Config names (relative_attention, max_relative_positions,
position_buckets, position_biased_input, pos_att_type, share_att_key, norm_rel_ebd,
conv_kernel_size, conv_act, conv_groups, pooler_dropout, pooler_hidden_act, legacy); what they
do is in `disentangled.py`. Torch-free, below `config`, so the config module stays one concern.
"""

from __future__ import annotations

from typing import Any

# The DeBERTa fields with the values every other family implies (and transformers' defaults).
DEBERTA_ONLY: dict[str, Any] = dict(
    relative_attention=False, max_relative_positions=-1, position_buckets=-1, position_biased_input=True,
    pos_att_type=None, share_att_key=False, norm_rel_ebd="none", conv_kernel_size=0, conv_act="tanh",
    conv_groups=1, pooler_dropout=0.0, pooler_hidden_act="gelu", legacy=True)
POSITION_TERMS = ("c2p", "p2c")
# transformers' activation names DeBERTa's pooler and convolution may use, beyond config.ACTIVATIONS.
EXTRA_ACTIVATIONS = ("tanh",)


def deberta_keys_in(values: dict[str, Any]) -> dict[str, Any]:
    """A DeBERTa config.json's keys as the fields take them: pos_att_type "p2c|c2p" (the released
    files' spelling) becomes a list, as transformers' config makes it."""
    kinds = values.get("pos_att_type")
    if isinstance(kinds, str):
        values["pos_att_type"] = [part.strip() for part in kinds.lower().split("|")]
    return values


def check_deberta(config: Any, activations: tuple[str, ...]) -> list[str]:
    """What a DeBERTa-v2 config asks for that the encoder does not implement, each naming its key."""
    problems = []
    if not isinstance(config.relative_attention, bool):
        problems.append(f"relative_attention must be true or false, got {config.relative_attention!r}")
    kinds = config.pos_att_type or []
    if not isinstance(kinds, list) or set(kinds) - set(POSITION_TERMS):
        problems.append(f"pos_att_type {config.pos_att_type!r} is not implemented: give a list of "
                        f"{' and '.join(POSITION_TERMS)} (or 'p2c|c2p')")
    for name in ("max_relative_positions", "position_buckets", "conv_kernel_size", "conv_groups"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"{name} must be an integer, got {value!r}")
    if not problems and config.conv_kernel_size > 0:
        if config.conv_kernel_size % 2 == 0:
            problems.append(f"conv_kernel_size {config.conv_kernel_size} is even: DeBERTa's convolution keeps "
                            "the length only with an odd kernel; use 3")
        if config.conv_groups < 1 or config.hidden_size % config.conv_groups:
            problems.append(f"conv_groups {config.conv_groups} does not divide hidden_size {config.hidden_size}")
    if not problems and 0 < config.position_buckets < 4:
        problems.append(f"position_buckets {config.position_buckets} is too few for log buckets; use 256 or -1")
    for part in str(config.norm_rel_ebd).lower().split("|"):
        if part.strip() not in ("none", "layer_norm"):
            problems.append(f"norm_rel_ebd {config.norm_rel_ebd!r} is not implemented: use 'layer_norm' or 'none'")
    for name in ("conv_act", "pooler_hidden_act"):
        if getattr(config, name) not in activations + EXTRA_ACTIVATIONS:
            problems.append(f"unknown {name} {getattr(config, name)!r}; supported: "
                            f"{', '.join(activations + EXTRA_ACTIVATIONS)}")
    if not 0.0 <= float(config.pooler_dropout) < 1.0:
        problems.append(f"pooler_dropout must be in [0, 1), got {config.pooler_dropout!r}")
    if not config.legacy and config.embedding_dim != config.hidden_size:
        problems.append("legacy false with embedding_size different from hidden_size: the lm_predictions "
                        "head multiplies hidden states by the embeddings; set legacy true")
    for key, expected in (("pooler_hidden_size", config.hidden_size), ("attention_head_size", config.head_dim)):
        if config.extra.get(key, expected) != expected:
            problems.append(f"{key} {config.extra[key]!r} differs from {expected}, which bertkit's DeBERTa "
                            "assumes; convert the checkpoint")
    if config.extra.get("tie_word_embeddings", True) is not True:
        problems.append("tie_word_embeddings false is not implemented: the MLM decoder is the word embeddings")
    return problems


__all__ = ["DEBERTA_ONLY", "POSITION_TERMS", "check_deberta", "deberta_keys_in"]

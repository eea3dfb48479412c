"""BertConfig: the model's settings, with the field names of a Hugging Face BERT `config.json`.

One config describes every family the encoder implements (`model_type`): `bert`, `roberta`,
`xlm-roberta`, `camembert`, `ernie`, `electra`, `mpnet`, `albert`, `distilbert` and `modernbert`, each a record in
`bertkit.families` (`config.family`: its positions, segments, pooler, shared layers, key names).
The family differences are fields with Hugging Face's names:
`embedding_size` (ALBERT, ELECTRA), `num_hidden_groups`, `inner_group_num` (ALBERT), `pad_token_id` (RoBERTa's
positions start after it), `type_vocab_size` (1 for RoBERTa), `use_task_id` and
`task_type_vocab_size` (ERNIE), `relative_attention_num_buckets` (MPNet); DistilBERT's own key names (`dim`,
`n_layers`, `n_heads`, `hidden_dim`, `activation`, `dropout`, `attention_dropout`,
`seq_classif_dropout`) are read into the BERT fields and written back under its names, and
ALBERT's `classifier_dropout_prob` is `classifier_dropout`.

DeBERTa-v2's settings (`relative_attention`, `position_buckets`, `pos_att_type`, `share_att_key`,
`norm_rel_ebd`, `conv_kernel_size`, ...) are fields with its names, checked in `disentangled_config`;
its `cls_dropout` is `classifier_dropout`.

ModernBERT's keys (`hidden_activation`, `norm_eps`, `attention_dropout`, `mlp_dropout`) are read
into the BERT fields and written back under its names; its own settings (`layer_types`,
`local_attention`, `rope_parameters`, the bias switches, `classifier_pooling`, ...) are fields
with its names. Both config formats load: released checkpoints carry `global_attn_every_n_layers`,
`global_rope_theta` and `local_rope_theta`, which become `layer_types` and `rope_parameters`, the
format the installed transformers (5.x) reads and writes, and the one written here. Options the
encoder does not implement are refused naming the key (`check_modernbert`).

Any BERT `config.json` loads: the architecture fields become attributes, task fields (`id2label`,
`label2id`, `problem_type`, `classifier_dropout`) are understood, and everything else the file
carries (`architectures`, `transformers_version`, `gradient_checkpointing`, ...) is kept in `extra`
and written back unchanged, so a round trip loses nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.constants import label_name
from bertkit.encoder.disentangled_config import DEBERTA_ONLY, check_deberta, deberta_keys_in
from bertkit.families import FAMILIES, Family, family_of
from bertkit.util.fileio import atomic_write_json

# Activations the encoder implements; the names are those `config.json` files use.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# (num_hidden_layers, hidden_size, num_attention_heads); the FFN is 4 × hidden as in the paper.
# tiny/mini/small/medium follow Turc et al. 2019 ("Well-Read Students Learn Better"), except tiny
# which uses 2 heads so every preset keeps 64-dim heads.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
    "albert-base": (12, 768, 12),
    "modern-tiny": (2, 128, 2),
    "modern-mini": (4, 256, 4),
}
# Family fields of the presets that are not BERT. albert-base is ALBERT-base (Lan et al. 2020,
# table 1): E = 128 factorised embeddings, all 12 layers sharing one set of weights, ~12M
# parameters with its 30,000-piece vocabulary; dropout 0 and tanh GELU as the released v2 models.
PRESET_FIELDS: dict[str, dict[str, Any]] = {
    "albert-base": dict(model_type="albert", embedding_size=128, num_hidden_groups=1, inner_group_num=1,
                        vocab_size=30000, hidden_act="gelu_new", hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0),
    # ModernBERT-style (Warner et al. 2024): rotary positions, GeGLU, no biases, pre-LN, a global
    # layer every third with a 128-token window in the others, 8,192 positions. Each has the depth,
    # width and heads of tiny / mini and their encoder parameters (tiny 396,544 exactly; mini
    # 3,158,016 against 3,159,040): the GeGLU width I makes up for the biases it lacks (`bench/modern_recipe.py`).
    "modern-tiny": dict(model_type="modernbert", intermediate_size=345, max_position_embeddings=8192,
                        pad_token_id=0),
    "modern-mini": dict(model_type="modernbert", intermediate_size=686, max_position_embeddings=8192,
                        pad_token_id=0),
}

# Fields only ModernBERT has, with the values every other family implies.
_MODERNBERT_ONLY = dict(layer_types=None, local_attention=128, rope_parameters=None, attention_bias=True,
                        mlp_bias=True, norm_bias=True, decoder_bias=True, classifier_bias=True,
                        classifier_activation="gelu", classifier_pooling="cls", embedding_dropout=None)
LAYER_TYPES = ("full_attention", "sliding_attention")
# transformers' default rotary bases: 160,000 in the global layers, 10,000 in the local ones.
_ROPE_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}


def override_keys() -> list[str]:
    """The keys an override may set: BertConfig's fields (config.json names) and num_labels."""
    return sorted({f.name for f in dataclasses.fields(BertConfig)} - {"extra"} | {"num_labels"})


def check_override_keys(overrides: dict[str, Any]) -> None:
    """ValueError for a key that is not a config field, naming the closest valid one.

    Loading a config.json keeps unknown keys (other tools' settings); an override the user types
    is different: `hiden_dropout_prob=0` would be stored and change nothing.
    """
    valid = override_keys()
    for key in overrides:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"unknown config key {key!r}; {hint}valid keys: "
                             f"{', '.join(valid)}")


@dataclass
class BertConfig:
    # 30,522 = bert-base-uncased's WordPiece vocabulary; models trained here set their own.
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    # 4 × hidden, as in the paper.
    intermediate_size: int = 3072
    # Exact (erf) GELU, as the original BERT; "gelu_new"/"gelu_pytorch_tanh" are the tanh form.
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    # Learned absolute positions; inputs longer than this need sliding windows.
    max_position_embeddings: int = 512
    # Two segments (sentence A / B) for pair inputs and NSP.
    type_vocab_size: int = 2
    # Std of the truncated-normal-like init the reference uses (plain normal in practice).
    initializer_range: float = 0.02
    # 1e-12 as the original TensorFlow code; the value matters for parity with checkpoints.
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Only absolute positions exist in BERT; other values are rejected rather than ignored.
    position_embedding_type: str = "absolute"
    # Task heads: dropout before the classifier (None = hidden_dropout_prob, as the reference).
    classifier_dropout: float | None = None
    # Labels of a classification head; num_labels follows id2label.
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    # "regression" | "single_label_classification" | "multi_label_classification" | None (inferred).
    problem_type: str | None = None
    # Which member of the family: a key of `bertkit.families.FAMILIES` (see the module docstring).
    model_type: str = "bert"
    # ALBERT, ELECTRA: token embeddings of this width, projected to hidden_size (None = hidden_size).
    embedding_size: int | None = None
    # ALBERT: the num_hidden_layers depths share num_hidden_groups groups of weights (consecutive
    # depths use the same group), each group being inner_group_num layers.
    num_hidden_groups: int = 1
    inner_group_num: int = 1
    # ERNIE: a table of task_type_vocab_size task types, whose row task_type_id (0: transformers'
    # default task_type_ids) is added to every token when use_task_id (ERNIE 3.0's checkpoints set it).
    use_task_id: bool = False
    task_type_vocab_size: int = 3
    task_type_id: int = 0
    # MPNet: rows of the relative-position bias table (a bias per head for each bucket of distance);
    # its attention reads the first 32, as transformers' does.
    relative_attention_num_buckets: int = 32
    # ModernBERT (model_type "modernbert"; the other families keep these defaults, which are what
    # BERT is): each layer's attention, "full_attention" or "sliding_attention".
    layer_types: list[str] | None = None
    # The whole window of a sliding layer: a token sees local_attention // 2 tokens each side.
    local_attention: int = 128
    # Rotary bases per layer type: {"full_attention": {"rope_type": "default", "rope_theta": ...}, ...}.
    rope_parameters: dict[str, dict[str, Any]] | None = None
    # Bias switches (BERT has every bias; ModernBERT none but the MLM decoder's).
    attention_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True
    decoder_bias: bool = True
    classifier_bias: bool = True
    # ModernBERT's prediction head (MLM and task heads): dense → this activation → LayerNorm.
    classifier_activation: str = "gelu"
    # What ModernBERT's sequence classifier reads: the first token ("cls") or the mean of all.
    classifier_pooling: str = "cls"
    # Dropout after the embedding LayerNorm (None = hidden_dropout_prob, as BERT).
    embedding_dropout: float | None = None
    # DeBERTa-v2/v3 (model_type "deberta-v2", `disentangled.py`; the others keep these defaults, which
    # are transformers' DebertaV2Config's): relative positions in every layer (every release sets it) ...
    relative_attention: bool = False
    # ... over distances up to this (-1: max_position_embeddings), in this many log buckets (-1: none),
    max_relative_positions: int = -1
    position_buckets: int = -1
    # absolute positions added to the embeddings (v2; v3 has none),
    position_biased_input: bool = True
    # the position terms, any of "c2p" and "p2c", through the layer's own Q and K (v3) or their own,
    pos_att_type: list[str] | None = None
    share_att_key: bool = False
    # the relative table LayerNorm'd ("layer_norm", v3) or not ("none"),
    norm_rel_ebd: str = "none"
    # v2's convolution after the first layer (0: none),
    conv_kernel_size: int = 0
    conv_act: str = "tanh"
    conv_groups: int = 1
    # the sequence classifier's context pooler (dropout → dense → activation),
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"
    # and the MLM head's names on disk: cls.predictions (legacy) or lm_predictions.lm_head.
    legacy: bool = True
    # Every other key of the source config.json, written back on save.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}
        if self.label2id is not None:
            self.label2id = {str(k): int(v) for k, v in self.label2id.items()}
        self.validate()

    # ------------------------------------------------------------------ construction
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """A named size (tiny, mini, small, medium, base, large) with optional field overrides."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)} "
                             "or pass a config.json / model directory")
        check_override_keys(overrides)
        layers, hidden, heads = PRESETS[name]
        fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      intermediate_size=4 * hidden)
        fields.update(PRESET_FIELDS.get(name, {}))
        fields.update(overrides)
        return cls.from_dict(fields)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "BertConfig":
        """Build from config.json-style keys; unknown keys go to `extra`, `num_labels` makes labels."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        values = _family_keys_in(values)
        kwargs = {k: v for k, v in values.items() if k in known}
        extra = dict(values.get("extra", {}))
        extra.update({k: v for k, v in values.items() if k not in known and k not in ("extra", "num_labels")})
        num_labels = values.get("num_labels")
        if num_labels is not None and kwargs.get("id2label") is None:
            kwargs["id2label"] = {i: label_name(i) for i in range(int(num_labels))}
        family_of(kwargs.get("model_type", "bert"))
        return cls(**kwargs, extra=extra)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "BertConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {path}: {path.parent} is not a model "
                                    "directory; pass one saved by bertkit or by transformers' "
                                    "save_pretrained (config.json + weights)")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at byte "
                             f"{err.start}); a config.json is UTF-8 JSON: re-save it as UTF-8") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(values).__name__}")
        try:
            return cls.from_dict(values)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}: {err}") from None

    @classmethod
    def resolve(cls, spec: str | os.PathLike, **overrides: Any) -> "BertConfig":
        """A preset name, a config.json path or a model directory → config (overrides applied)."""
        spec_str = str(spec)
        if spec_str in PRESETS:
            return cls.preset(spec_str, **overrides)
        path = Path(spec)
        if path.exists():
            config = cls.from_json(path)
            return config.replace(**overrides) if overrides else config
        raise ValueError(f"unknown model {spec_str!r}: not a preset ({', '.join(PRESETS)}) and not "
                         "a local config.json or model directory; bertkit never downloads: pass a "
                         "local model directory (e.g. one saved by transformers' save_pretrained)")

    def replace(self, **changes: Any) -> "BertConfig":
        """A copy with `changes` (config.json field names; `num_labels` too); unknown keys are a
        ValueError naming the closest field, so a typo never lands silently in `extra`."""
        check_override_keys(changes)
        values = self.to_dict()
        if "num_labels" in changes and "id2label" not in changes:
            values.pop("id2label", None)
            values.pop("label2id", None)
        if "id2label" in changes and "label2id" not in changes:
            values.pop("label2id", None)
        values.update(changes)
        return BertConfig.from_dict(values)

    # ------------------------------------------------------------------ derived values
    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_dim(self) -> int:
        """Width of the embedding tables: ALBERT's E, else hidden_size."""
        return self.embedding_size or self.hidden_size

    @property
    def has_embed_proj(self) -> bool:
        """The embeddings are projected to hidden_size: ALBERT always, ELECTRA where the widths differ."""
        projection = self.family.embedding_projection
        return projection == "always" or (projection == "if_differs" and self.embedding_dim != self.hidden_size)

    @property
    def family(self) -> Family:
        """The record of model_type (`bertkit.families`): what the rooms may ask of the family."""
        return family_of(self.model_type)

    @property
    def position_offset(self) -> int:
        """RoBERTa numbers positions from pad_token_id + 1 (fairseq's convention); others from 0."""
        return self.pad_token_id + 1 if self.family.positions == "after_padding" else 0

    @property
    def max_sequence_length(self) -> int:
        """The longest input, in tokens: the position table less RoBERTa's offset (514 → 512)."""
        return self.max_position_embeddings - self.position_offset

    @property
    def has_segments(self) -> bool:
        """DistilBERT and ModernBERT have no segment embeddings: pairs are told apart by [SEP] alone
        (nor has a DeBERTa with type_vocab_size 0, as v3's)."""
        return self.family.segments and self.type_vocab_size > 0

    @property
    def reads_segments(self) -> bool:
        """Whether segment ids reach the model. DistilBERT has no table; a RoBERTa with one segment
        type adds row 0 to every token whatever the ids say, as its tokenizers return none (pair
        encoders that mark segment B with 1s, as BERT's, would otherwise index past the table)."""
        return self.has_segments and not (self.family.ignores_segment_ids and self.type_vocab_size == 1)

    @property
    def has_pooler(self) -> bool:
        """DistilBERT and ModernBERT have no pooler; their sequence heads read the [CLS] state."""
        return self.family.pooler

    @property
    def is_modernbert(self) -> bool:
        """Pre-LN, rotary, GeGLU, local/global layers: `modern.py` builds its pieces."""
        return self.family.layers == "modern"

    def rope_theta(self, layer_type: str) -> float:
        """The rotary base of a layer type (ModernBERT)."""
        return float((self.rope_parameters or {}).get(layer_type, {}).get("rope_theta", _ROPE_THETA[layer_type]))

    @property
    def num_layer_weights(self) -> int:
        """Distinct encoder layers stored: ALBERT's groups × inner layers, else num_hidden_layers."""
        if self.family.shares_layers:
            return self.num_hidden_groups * self.inner_group_num
        return self.num_hidden_layers

    @property
    def layer_schedule(self) -> list[int]:
        """Which stored layer runs at each depth, in order (ALBERT repeats them).

        As Hugging Face's AlbertTransformer: depth i of num_hidden_layers uses group
        i // (num_hidden_layers // num_hidden_groups), and each group runs its inner layers in turn.
        """
        if not self.family.shares_layers:
            return list(range(self.num_hidden_layers))
        per_group = self.num_hidden_layers // self.num_hidden_groups
        return [(i // per_group) * self.inner_group_num + j
                for i in range(self.num_hidden_layers) for j in range(self.inner_group_num)]

    # ------------------------------------------------------------------ checks and output
    def validate(self) -> None:
        """Raise ValueError naming every invalid value; called on construction."""
        family = family_of(self.model_type)
        problems = []
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if name == "type_vocab_size" and value == 0 and family.layers == "disentangled":
                continue  # DeBERTa: no segment table
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if not problems and self.hidden_size % self.num_attention_heads:
            problems.append(f"hidden_size {self.hidden_size} is not divisible by "
                            f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            problems.append(f"unknown hidden_act {self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                problems.append(f"{name} must be in [0, 1), got {value!r}")
        if self.classifier_dropout is not None and not 0.0 <= float(self.classifier_dropout) < 1.0:
            problems.append(f"classifier_dropout must be in [0, 1), got {self.classifier_dropout!r}")
        if self.layer_norm_eps <= 0:
            problems.append(f"layer_norm_eps must be positive, got {self.layer_norm_eps!r}")
        if self.position_embedding_type != "absolute":
            problems.append(f"position_embedding_type {self.position_embedding_type!r} is not "
                            "supported; BERT uses 'absolute'")
        if not family.embedding_projection:
            if self.embedding_size not in (None, self.hidden_size):
                problems.append(f"embedding_size {self.embedding_size} differs from hidden_size "
                                f"{self.hidden_size}, which only ALBERT supports, and ELECTRA "
                                "(model_type 'albert' or 'electra')")
        elif self.embedding_size is not None and (not isinstance(self.embedding_size, int)
                                                  or self.embedding_size <= 0):
            problems.append(f"embedding_size must be a positive integer, got {self.embedding_size!r}")
        if not family.shares_layers:
            if (self.num_hidden_groups, self.inner_group_num) != (1, 1):
                problems.append(f"num_hidden_groups / inner_group_num {self.num_hidden_groups} / "
                                f"{self.inner_group_num}: shared layers are ALBERT's (model_type 'albert')")
        else:
            for name in ("num_hidden_groups", "inner_group_num"):
                value = getattr(self, name)
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    problems.append(f"{name} must be a positive integer, got {value!r}")
            if (not problems and isinstance(self.num_hidden_layers, int)
                    and self.num_hidden_layers % self.num_hidden_groups):
                problems.append(f"num_hidden_layers {self.num_hidden_layers} is not a multiple of "
                                f"num_hidden_groups {self.num_hidden_groups}")
        if self.use_task_id and not family.task_types:
            problems.append(f"use_task_id is ERNIE's task-type embedding, which model_type {self.model_type!r} "
                            "does not have; remove it or use model_type 'ernie'")
        if family.task_types and (not isinstance(self.task_type_vocab_size, int) or self.task_type_vocab_size <= 0):
            problems.append(f"task_type_vocab_size must be a positive integer, got {self.task_type_vocab_size!r}")
        tabled = family.task_types and self.use_task_id and isinstance(self.task_type_vocab_size, int)
        rows = self.task_type_vocab_size if tabled else 1
        if type(self.task_type_id) is not int or not 0 <= self.task_type_id < rows:
            problems.append(f"task_type_id {self.task_type_id!r} is not a row of ERNIE's {rows} task type(s) "
                            f"(use_task_id {self.use_task_id}); set it between 0 and {rows - 1}")
        if family.relative_attention == "bucketed" and (not isinstance(self.relative_attention_num_buckets, int)
                                          or self.relative_attention_num_buckets < 32):
            # transformers' MPNet buckets distances into 32 whatever the key says (relative.BUCKETS)
            problems.append(f"relative_attention_num_buckets {self.relative_attention_num_buckets!r} is below "
                            "the 32 buckets MPNet's attention reads; set it to 32, as every MPNet checkpoint has")
        if family.positions == "after_padding" and self.max_position_embeddings <= self.position_offset:
            problems.append(f"max_position_embeddings {self.max_position_embeddings} leaves no "
                            f"positions after RoBERTa's offset {self.position_offset} (pad_token_id + 1)")
        if self.is_modernbert:
            problems += check_modernbert(self)
        else:
            for name, default in _MODERNBERT_ONLY.items():
                if getattr(self, name) != default:
                    problems.append(f"{name} {getattr(self, name)!r} is ModernBERT's (model_type 'modernbert')")
        if family.layers == "disentangled":
            problems += check_deberta(self, ACTIVATIONS)
        else:
            for name, default in DEBERTA_ONLY.items():
                if getattr(self, name) != default:
                    problems.append(f"{name} {getattr(self, name)!r} is DeBERTa's (model_type 'deberta-v2')")
        if self.model_type == "distilbert":
            for name, fixed in family.fixed_fields.items():
                if getattr(self, name) != fixed:
                    problems.append(f"{name} {getattr(self, name)!r}: DistilBERT fixes it at {fixed!r}")
        if self.problem_type not in (None, "regression", "single_label_classification",
                                     "multi_label_classification"):
            problems.append(f"unknown problem_type {self.problem_type!r}")
        if problems:
            raise ValueError("invalid BertConfig: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """config.json content: our fields, `num_labels` implied by id2label, then `extra`."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        if self.id2label is None:
            del values["id2label"], values["label2id"]
        else:
            values["id2label"] = {str(k): v for k, v in sorted(self.id2label.items())}
        for optional in ("problem_type", "classifier_dropout"):
            if values[optional] is None:
                del values[optional]
        return {**self.extra, **_family_keys_out(values)}

    def save(self, out_dir: str | os.PathLike, architectures: list[str] | None = None) -> Path:
        """Write `out_dir/config.json` atomically."""
        values = self.to_dict()
        if architectures:
            values["architectures"] = architectures
        path = Path(out_dir) / "config.json"
        atomic_write_json(path, values)
        return path



def _family_keys_in(values: dict[str, Any]) -> dict[str, Any]:
    """config.json keys of a family → BertConfig fields (a field given by name wins), then the
    defaults of the keys it leaves out and the fields its architecture fixes."""
    values = dict(values)
    model_type = values.get("model_type", "bert")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:  # from_dict names the unknown model_type
        return values
    if family.layers == "modern":
        values = _modernbert_keys_in(values, family)
    if family.layers == "disentangled":
        values = deberta_keys_in(values)
    for theirs, ours in family.config_keys.items():
        if theirs in values:
            value = values.pop(theirs)
            values.setdefault(ours, value)
    for name, default in {**family.defaults, **family.fixed_fields}.items():
        values.setdefault(name, default)
    return values


def _modernbert_keys_in(values: dict[str, Any], family: Family) -> dict[str, Any]:
    """A ModernBERT config.json, in either format, in transformers 5's format (its own keys are
    renamed afterwards, by `_family_keys_in`).

    The legacy keys of released checkpoints become what transformers 5 writes:
    global_attn_every_n_layers → layer_types (layer i is global when i % n == 0), global_rope_theta /
    local_rope_theta → rope_parameters. Keys that are BERT fields under another meaning
    (`position_embedding_type`, and `layer_norm_eps` beside `norm_eps`) are kept aside in `extra`.
    """
    extra = dict(values.pop("extra", {}) or {})
    for name in (*family.fixed_fields, *(["layer_norm_eps"] if "norm_eps" in values else [])):
        if name in values:
            extra[name] = values.pop(name)
    every = values.pop("global_attn_every_n_layers", 3)
    if values.get("layer_types") is None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"global_attn_every_n_layers must be a positive integer, got {every!r}")
        layers = values.get("num_hidden_layers", family.defaults["num_hidden_layers"])
        if isinstance(layers, int):
            values["layer_types"] = [LAYER_TYPES[bool(i % every)] for i in range(layers)]
    scaling = values.pop("rope_scaling", None)
    if scaling is not None:
        raise ValueError(f"rope_scaling {scaling!r} is not implemented: bertkit's ModernBERT uses "
                         "plain rotary positions; remove the key or convert the checkpoint")
    rope = {kind: dict(params or {}) for kind, params in (values.get("rope_parameters") or {}).items()}
    for kind, legacy in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        rope.setdefault(kind, {}).setdefault("rope_type", "default")
        theta = values.pop(legacy, None)
        rope[kind].setdefault("rope_theta", float(theta if theta is not None else _ROPE_THETA[kind]))
    values["rope_parameters"] = rope
    values["extra"] = extra
    return values


def check_modernbert(config: "BertConfig") -> list[str]:
    """What a ModernBERT config asks for that the encoder does not implement, each naming its key."""
    problems = []
    types = config.layer_types
    if not isinstance(types, list) or len(types) != config.num_hidden_layers:
        problems.append(f"layer_types must list one of {', '.join(LAYER_TYPES)} per layer "
                        f"({config.num_hidden_layers}), got {types!r}")
    elif set(types) - set(LAYER_TYPES):
        problems.append(f"layer_types {sorted(set(types) - set(LAYER_TYPES))} not implemented; "
                        f"bertkit's ModernBERT has {', '.join(LAYER_TYPES)}")
    if not isinstance(config.local_attention, int) or config.local_attention < 2:
        problems.append(f"local_attention must be an integer window of at least 2, got {config.local_attention!r}")
    for kind, params in (config.rope_parameters or {}).items():
        if kind not in LAYER_TYPES:
            problems.append(f"rope_parameters has an unknown layer type {kind!r}")
        elif params.get("rope_type", "default") != "default" or set(params) - {"rope_type", "rope_theta"}:
            problems.append(f"rope_parameters.{kind} {params!r} is not implemented: only rope_type "
                            "'default' with rope_theta")
    if config.classifier_activation not in ACTIVATIONS:
        problems.append(f"unknown classifier_activation {config.classifier_activation!r}; supported: "
                        f"{', '.join(ACTIVATIONS)}")
    if config.classifier_pooling not in ("cls", "mean"):
        problems.append(f"classifier_pooling {config.classifier_pooling!r} is not implemented; use 'cls' or 'mean'")
    if config.extra.get("tie_word_embeddings", True) is not True:
        problems.append("tie_word_embeddings false is not implemented: the MLM decoder is the word embeddings")
    if config.extra.get("sparse_pred_ignore_index", -100) != -100:
        problems.append(f"sparse_pred_ignore_index {config.extra['sparse_pred_ignore_index']!r} is not "
                        "implemented: masked-LM labels ignore -100")
    if config.extra.get("head_dim") not in (None, config.head_dim):
        problems.append(f"head_dim {config.extra['head_dim']!r} differs from hidden_size / "
                        f"num_attention_heads ({config.head_dim}), which bertkit's ModernBERT assumes")
    if config.embedding_dropout is not None and not 0.0 <= float(config.embedding_dropout) < 1.0:
        problems.append(f"embedding_dropout must be in [0, 1), got {config.embedding_dropout!r}")
    return problems


def _family_keys_out(values: dict[str, Any]) -> dict[str, Any]:
    """BertConfig fields → the keys the family's own config.json uses (its transformers class reads them)."""
    family = family_of(values["model_type"])
    if family.layers != "modern":
        for name in _MODERNBERT_ONLY:
            values.pop(name)
    if family.layers != "disentangled":
        for name in DEBERTA_ONLY:
            values.pop(name)
    if not family.embedding_projection:
        values.pop("embedding_size")
    elif values["embedding_size"] is None:  # transformers would read its own default (128), not hidden_size
        values["embedding_size"] = values["hidden_size"]
    if not family.shares_layers:
        for name in ("num_hidden_groups", "inner_group_num"):
            values.pop(name)
    if not family.task_types:
        for name in ("use_task_id", "task_type_vocab_size"):
            values.pop(name)
    if family.relative_attention != "bucketed":
        values.pop("relative_attention_num_buckets")
    for theirs, ours in family.config_keys.items():
        if ours in values:
            values[theirs] = values.pop(ours)
    for name in family.fixed_fields:
        values.pop(name)
    return values

"""The family records (`bertkit.families`): one place names a family, and each record tells the truth.

(a) Only the rooms allowed to name a family do: a module elsewhere that compares `model_type` to a
literal, asks `is_modernbert`, or holds a family's name fails the test, named by file and line.
(b) Each record's capabilities agree with what the encoder builds from it and with the family's
transformers classes, on a tiny model of each family.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import bertkit
from bertkit.data import tokenizer_backends
from bertkit.encoder.checkpoint import architecture_name
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import BertForSequenceClassification
from bertkit.encoder.model import BertForPreTraining, BertModel
from bertkit.families import FAMILIES, LAYERS, POSITIONS, SEQUENCE_CLASSIFIERS, family_of
from bertkit.train import lora

SRC = Path(bertkit.__file__).parent
# The rooms that may name a family: the records, and the encoder that builds each family's layers.
ALLOWED = ("families.py", "encoder/")
NAMES = {"albert", "roberta", "distilbert", "modernbert", "xlm-roberta", "camembert", "ernie", "electra", "mpnet",
         "deberta-v2"}


# ------------------------------------------------------------------------------------------- (a)
def _mentions_model_type(node: ast.AST) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr == "model_type")
               or (isinstance(n, ast.Name) and n.id == "model_type")
               or (isinstance(n, ast.Constant) and n.value == "model_type") for n in ast.walk(node))


def _string_literals(node: ast.AST) -> list[str]:
    """The str constants `node` is or holds (a tuple, list or set of them)."""
    parts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)]


def offences(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place `source` names a family instead of asking its record."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = [s for o in operands if not _mentions_model_type(o) for s in _string_literals(o)]
            if literals and any(_mentions_model_type(o) for o in operands):
                found.append((node.lineno, f"compares model_type with {', '.join(map(repr, literals))}"))
        elif isinstance(node, ast.Attribute) and node.attr == "is_modernbert":
            found.append((node.lineno, "asks is_modernbert"))
        elif isinstance(node, ast.Constant) and node.value in NAMES:
            found.append((node.lineno, f"holds the family name {node.value!r}"))
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "FAMILIES"
              and _string_literals(node.slice)):
            found.append((node.lineno, f"looks up FAMILIES[{_string_literals(node.slice)[0]!r}] by name"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "family_of"
              and node.args and _string_literals(node.args[0])):
            found.append((node.lineno, f"looks up family_of({_string_literals(node.args[0])[0]!r}) by name"))
    return found


def test_the_check_finds_each_way_of_naming_a_family():
    source = ('if config.model_type == "bert":\n    pass\n'
              'ok = cfg.model_type not in ("x", "y")\n'
              'modern = config.is_modernbert\n'
              'name = "albert"\n'
              'rec = FAMILIES["roberta"]\n'
              'rec = family_of("bert")\n'
              'fine = config.family.shares_layers and model.bert is not None and key == "model_type"\n')
    assert sorted(line for line, _ in offences(source)) == [1, 3, 4, 5, 6, 6, 7]


def test_only_the_family_rooms_name_a_family():
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith(ALLOWED):
            continue
        problems += [f"src/bertkit/{relative}:{line}: {what}"
                     for line, what in offences(path.read_text(encoding="utf-8"))]
    assert not problems, ("ask the family record (config.family, bertkit.families) for the capability "
                          "instead of naming the family:\n" + "\n".join(problems))


# ------------------------------------------------------------------------------------------- (b)
def tiny(model_type: str, **overrides) -> BertConfig:
    """A tiny config of the family, odd distinct sizes; ALBERT runs 3 depths on 1 stored layer."""
    values = dict(model_type=model_type, vocab_size=99, hidden_size=32, num_hidden_layers=3,
                  num_attention_heads=2, intermediate_size=37, max_position_embeddings=40,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.1,
                  pad_token_id=1, num_labels=3)
    if model_type == "albert":
        values["embedding_size"] = 14
    if model_type == "deberta-v2":  # DeBERTa-v2's relative attention, its segments and convolution
        values.update(relative_attention=True, pos_att_type=["p2c", "c2p"], type_vocab_size=2, conv_kernel_size=3)
    return BertConfig.from_dict({**values, **overrides})


def transformers_model(config: BertConfig, kind: str) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    values = config.to_dict()
    theirs = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    return getattr(transformers, config.family.class_prefix + kind)(theirs)


def test_the_lookup_names_an_unknown_model_type():
    assert family_of("roberta") is FAMILIES["roberta"] and tiny("roberta").family is FAMILIES["roberta"]
    with pytest.raises(ValueError, match="model_type 'gpt2' is not in the BERT family bertkit implements"):
        family_of("gpt2")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_record_is_what_the_encoder_builds(model_type):
    family = FAMILIES[model_type]
    assert family.model_type == model_type and family.positions in POSITIONS and family.layers in LAYERS
    assert family.sequence_classifier in SEQUENCE_CLASSIFIERS and 0 < family.mlm_probability < 1
    config = tiny(model_type)
    encoder = BertModel(config)
    assert (len(encoder.layers) < config.num_hidden_layers) == family.shares_layers
    assert len(encoder.layers) == config.num_layer_weights
    segments = family.segments and config.type_vocab_size > 0  # DeBERTa's type_vocab_size may be 0
    assert (getattr(encoder.embeddings, "token_type_embeddings", None) is not None) == segments
    assert (encoder.pooler is not None) == family.pooler
    table = getattr(encoder.embeddings, "position_embeddings", None)
    assert (table is None) == (family.positions == "rotary")
    assert config.position_offset == (config.pad_token_id + 1 if family.positions == "after_padding" else 0)
    projects = family.embedding_projection == "always" or (family.embedding_projection == "if_differs"
                                                             and config.embedding_dim != config.hidden_size)
    assert (encoder.embed_proj is not None) == projects
    pretraining = BertForPreTraining(config)
    assert (pretraining.nsp is not None) == (family.sentence_head is not None)
    assert architecture_name("BertForPreTraining", config) == family.class_prefix + (
        "ForPreTraining" if family.sentence_head else "ForMaskedLM")
    classifier = BertForSequenceClassification(config)
    dense = getattr(classifier.classifier, "out_proj", None)
    activation = getattr(classifier.classifier, "activation", None)
    built = {"pooler": classifier.bert.pooler, "dense_tanh": dense if activation == "tanh" else None,
             "dense_gelu": dense if activation == "gelu" else None,
             "pre_classifier": classifier.pre_classifier, "prediction_head": classifier.head,
             "context_pooler": classifier.context_pooler}
    assert [kind for kind, module in built.items() if module is not None] == [family.sequence_classifier]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_record_matches_the_transformers_classes(model_type):
    family = FAMILIES[model_type]
    config = tiny(model_type)
    theirs = transformers_model(config, "ForMaskedLM")
    assert theirs.base_model_prefix + "." == family.names.prefix
    for key in family.config_keys:  # the family's own config.json keys are its transformers config's
        assert hasattr(theirs.config, key) and key in config.to_dict()
    ours = sum(p.numel() for p in BertModel(config, add_pooling_layer=False).parameters())
    assert ours == sum(p.numel() for p in theirs.base_model.parameters())  # ALBERT's shared layer counted once


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_tokenizer_layout_is_one_the_backends_build(model_type):
    transformers = pytest.importorskip("transformers")
    layout = FAMILIES[model_type].tokenizer
    assert hasattr(transformers, layout.tokenizer_class)
    assert layout.backend == "json" or callable(getattr(tokenizer_backends, layout.backend))
    assert not layout.specials or set(layout.specials) == set(tokenizer_backends.SPECIAL_KEYS)


@pytest.mark.parametrize("model_type", [t for t, f in FAMILIES.items() if not f.shares_layers])
def test_lora_targets_are_modules_of_the_family(model_type):
    family = FAMILIES[model_type]
    config = tiny(model_type)
    theirs = transformers_model(config, "ForSequenceClassification")
    linears = [name for name, module in theirs.named_modules() if isinstance(module, nn.Linear)]
    for target, modules in family.lora_targets.items():
        torch.manual_seed(0)
        model = BertForSequenceClassification(config)
        lora.apply_lora(model, lora.LoraSpec(r=2, alpha=4, targets=(target,)))
        for name, _ in modules:
            assert isinstance(getattr(model.bert.layers[0], name), lora.LoRALinear), (target, name)
        names = lora.peft_target_modules(model)
        matched = [n for n in linears if (re.fullmatch(names, n) if isinstance(names, str)
                                          else any(n == t or n.endswith("." + t) for t in names))]
        assert len(matched) == config.num_hidden_layers * len(modules), (target, names, matched)


def test_shared_layers_take_no_adapters():
    for family in FAMILIES.values():
        assert not (family.shares_layers and family.lora_targets), family.model_type
    with pytest.raises(ValueError, match="layers are shared"):
        lora.apply_lora(BertForSequenceClassification(tiny("albert")), lora.LoraSpec())


def test_xlm_roberta_large_shapes_build_as_transformers():
    """XLM-R-large's config (250,002 pieces, 24 layers of 1,024, 514 positions) builds the
    parameters transformers builds, counted on the meta device."""
    transformers = pytest.importorskip("transformers")
    values = dict(model_type="xlm-roberta", vocab_size=250002, hidden_size=1024, num_hidden_layers=24,
                  num_attention_heads=16, intermediate_size=4096, max_position_embeddings=514,
                  type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1)
    config = BertConfig.from_dict(values)
    assert config.max_sequence_length == 512
    with torch.device("meta"):
        ours = sum(p.numel() for p in BertModel(config).parameters())
        theirs = transformers.XLMRobertaModel(transformers.XLMRobertaConfig(**values))
    assert ours == sum(p.numel() for p in theirs.parameters()) == 559_890_432

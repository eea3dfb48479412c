"""DeBERTa-v2 / v3 (transformers' `deberta-v2`): parity with transformers, checkpoints both ways, the
packed path, `bertkit info`, the spm.model tokenizer and the commands.

Two tiny random layouts made by transformers in the test, odd distinct sizes (nothing downloads):
- v2: absolute positions in the embeddings, two segments, embeddings 14 wide projected to 30,
  c2p + p2c through their own projections, distances clipped at ±6, the convolution after the
  first layer (GELU), the MLM head as `cls.predictions` (legacy);
- v3: no absolute positions nor segments, 8 log buckets, positions through the layers' own Q and K
  (share_att_key), the relative table LayerNorm'd, the MLM head as `lm_predictions.lm_head`.
Every head is compared on a right-padded batch (pairs where there are segments), fp32, within 1e-5.
The LoRA target names (query_proj, key_proj, value_proj, ...) are checked against transformers'
modules with every family's in `tests/test_families.py`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from bertkit.cli import main
from bertkit.encoder.config import BertConfig
from bertkit.encoder.heads import model_class
from bertkit.encoder.packing import Packed

from family_fixtures import CORPUS, SCRIPTS, transformers_mean

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

TOL = 1e-5
VOCAB, LENGTH = 97, 13
LENGTHS = (13, 9, 9, 6)  # two of 9: one packed run of two sequences
KINDS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
STYLES = ("v2", "v3")
TEXTS = ["The cat sat on the mat.", "北京是中国的首都。", "مرحبا بالعالم، كيف حالك؟",
         "Ça va très bien, café naïve 🙂 ✨", "  spaces   and\ttabs\nnewline  "]


def hf_config(style: str, vocab_size: int = VOCAB, **extra):
    common = {**dict(vocab_size=vocab_size, hidden_size=30, num_hidden_layers=3, num_attention_heads=3,
                     intermediate_size=37, max_position_embeddings=40, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, initializer_range=0.2, relative_attention=True,
                     pos_att_type="p2c|c2p", layer_norm_eps=1e-7), **extra}
    if style == "v2":
        return transformers.DebertaV2Config(type_vocab_size=2, embedding_size=14, max_relative_positions=6,
                                            conv_kernel_size=3, conv_act="gelu", **common)
    return transformers.DebertaV2Config(type_vocab_size=0, position_biased_input=False, position_buckets=8,
                                        share_att_key=True, norm_rel_ebd="layer_norm", legacy=False, **common)


def make(style: str, kind: str, out: Path, **extra) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    labels = {"num_labels": 3} if kind in ("ForSequenceClassification", "ForTokenClassification") else {}
    model = getattr(transformers, "DebertaV2" + kind)(hf_config(style, **labels, **extra)).eval()
    model.save_pretrained(out)
    return model, out


def batch(style: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, VOCAB, (len(LENGTHS), LENGTH), generator=g)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
        if style == "v2":
            types[row, n // 2:n] = 1
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "token_type_ids": types}


def outputs(out, kind: str) -> list[torch.Tensor]:
    """The tensors a head returns, theirs or ours, in one order."""
    if kind == "Model":
        return [out.last_hidden_state]
    if kind == "ForQuestionAnswering":
        return [out.start_logits, out.end_logits]
    return [out.logits]


def ours_padded(model, inputs, kind):
    with torch.no_grad():
        return outputs(model(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"]), kind)


def close(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest difference at real tokens ((B, T, ...) tensors) or over all ((B, K))."""
    if a.dim() >= 2 and a.shape[:2] == mask.shape:
        a, b = a[mask.bool()], b[mask.bool()]
    return float((a - b).abs().max())


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("kind", KINDS)
def test_heads_equal_transformers_both_ways_and_packed(style, kind, tmp_path):
    theirs, directory = make(style, kind, tmp_path / "hf")
    inputs = batch(style)
    ours = model_class(kind).from_pretrained(directory)
    assert not ours.load_report.missing and not ours.load_report.unexpected, ours.load_report
    with torch.no_grad():
        reference = outputs(theirs(**inputs), kind)
    for a, b in zip(ours_padded(ours, inputs, kind), reference):
        assert close(a, b, inputs["attention_mask"]) <= TOL

    # written by bertkit, read by transformers with every key matched and the same outputs
    ours.save_pretrained(tmp_path / "ours")
    again, info = getattr(transformers, "DebertaV2" + kind).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        for a, b in zip(outputs(again.eval()(**inputs), kind), reference):
            assert close(a, b, inputs["attention_mask"]) <= TOL

    # the packed engine's path: sequences end to end, no padding, the same values
    mask = inputs["attention_mask"].bool()
    packed = Packed.from_lengths(list(LENGTHS))
    ids, types = inputs["input_ids"][mask], inputs["token_type_ids"][mask]
    with torch.no_grad():
        if kind == "ForMaskedLM":  # the vocabulary at every row
            got = [ours.forward_packed(ids, types, packed, torch.arange(len(ids))).logits]
        elif kind == "Model":
            got = [ours.forward_packed(ids, types, packed).hidden]
        else:
            got = outputs(ours.forward_packed(ids, types, packed), kind)
    for a, b in zip(got, reference):
        b = b if b.dim() == 2 and kind == "ForSequenceClassification" else b[mask]
        assert float((a - b).abs().max()) <= TOL
    if kind == "Model":  # the [CLS] rows alone, padded and packed
        with torch.no_grad():
            first = ours(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"], first_only=True)
            packed_first = ours.forward_packed(ids, types, packed, first_only=True).hidden
        assert float((first.last_hidden_state[:, 0] - reference[0][:, 0]).abs().max()) <= TOL
        assert float((packed_first - reference[0][:, 0]).abs().max()) <= TOL


def test_one_layer_with_the_convolution_reads_the_first_token_alone(tmp_path):
    """The convolution sits on the first layer, which is then also the last: the [CLS]-only path applies it."""
    theirs, directory = make("v2", "ForSequenceClassification", tmp_path, num_hidden_layers=1)
    inputs = batch("v2")
    ours = model_class("ForSequenceClassification").from_pretrained(directory)
    with torch.no_grad():
        reference = theirs(**inputs).logits
        mask = inputs["attention_mask"].bool()
        packed = ours.forward_packed(inputs["input_ids"][mask], inputs["token_type_ids"][mask],
                                     Packed.from_lengths(list(LENGTHS))).logits
    assert close(ours_padded(ours, inputs, "ForSequenceClassification")[0], reference, inputs["attention_mask"]) <= TOL
    assert float((packed - reference).abs().max()) <= TOL


@pytest.mark.parametrize("style", STYLES)
def test_info_total_is_transformers_num_parameters(style, tmp_path, capsys):
    for kind in ("ForMaskedLM", "ForSequenceClassification"):
        theirs, directory = make(style, kind, tmp_path / kind)
        assert main(["info", str(directory)]) == 0
        out = capsys.readouterr().out
        total = int(re.search(r"^total\s+([\d,]+)$", out, re.M).group(1).replace(",", ""))
        assert total == theirs.num_parameters(), out
        assert "relative position embeddings" in out and f"DebertaV2{kind}" in out
        assert ("layer 0 convolution" in out) == (style == "v2")
        assert ("position projections" in out) == (style == "v2")  # v3 shares the layers' Q and K


# ------------------------------------------------------------------------------------------ tokenizer
def spm_dir(work: Path) -> Path:
    """A DeBERTa-v3-style spm.model (Unigram, [PAD] [CLS] [SEP] [UNK] first, nmt_nfkc table) trained
    on text in several scripts, with its tokenizer_config.json and no tokenizer.json."""
    import sentencepiece

    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(CORPUS + SCRIPTS), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(work / "spm"), vocab_size=150, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
        unk_piece="[UNK]", hard_vocab_limit=False, character_coverage=0.98, minloglevel=2)
    (work / "corpus.txt").unlink()
    (work / "spm.vocab").unlink()
    (work / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "DebertaV2Tokenizer", "do_lower_case": False, "split_by_punct": False,
         "vocab_type": "spm"}))
    return work


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return spm_dir(tmp_path_factory.mktemp("spm"))


def test_spm_model_gives_transformers_ids(tokenizer_dir):
    from bertkit.data.tokenizer import BertTokenizer

    ours = BertTokenizer.from_pretrained(tokenizer_dir)
    reference = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    assert not (tokenizer_dir / "tokenizer.json").exists() and ours.tokenizer_class == "DebertaV2Tokenizer"
    pairs = ["x y", "second one", "北京", "the end [MASK]", "🙂"]
    expected = reference(TEXTS, return_token_type_ids=True)
    got = ours.encode_batch(TEXTS)
    assert [e.ids for e in got] == expected["input_ids"]
    expected = reference(TEXTS, pairs, return_token_type_ids=True)
    got = ours.encode_batch(TEXTS, pairs)
    assert [e.ids for e in got] == expected["input_ids"]
    assert [e.type_ids for e in got] == expected["token_type_ids"]
    assert ours.mask_token_id == reference.mask_token_id and ours.vocab_size == len(reference)


def test_a_damaged_spm_model_is_one_line_naming_the_file(tokenizer_dir, tmp_path):
    from bertkit.data.tokenizer import BertTokenizer

    broken = tmp_path / "broken"
    shutil.copytree(tokenizer_dir, broken)
    data = (broken / "spm.model").read_bytes()
    (broken / "spm.model").write_bytes(data[: len(data) // 3] + b"\xff\xfe garbage")
    with pytest.raises(ValueError) as err:
        BertTokenizer.from_pretrained(broken)
    message = str(err.value)
    assert str(broken / "spm.model") in message and "\n" not in message and "damaged" in message


# ------------------------------------------------------------------------------------------- commands
def test_embed_and_classify_commands_on_a_tiny_spm_model(tokenizer_dir, tmp_path, capsys):
    """A DeBERTa-v3 classifier directory as released (spm.model, no tokenizer.json): `bertkit
    classify` gives transformers' probabilities, `embed` transformers' mean-pooled states."""
    from bertkit.inference import embed

    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_dir))
    theirs, directory = make("v3", "ForSequenceClassification", tmp_path / "cls", vocab_size=vocab,
                             id2label={0: "neg", 1: "neu", 2: "pos"})
    for name in ("spm.model", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    text = "Paris is the capital of France. 北京 🙂"
    assert main(["classify", str(directory), "--json", text]) == 0
    scores = json.loads(capsys.readouterr().out)["scores"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    with torch.no_grad():
        probs = theirs(**tokenizer([text], return_tensors="pt")).logits.softmax(-1)[0]
    assert max(abs(scores[name] - float(p)) for name, p in zip(("neg", "neu", "pos"), probs)) <= TOL
    assert main(["embed", str(directory), "--json", *TEXTS]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(TEXTS)
    ours = torch.as_tensor(embed(directory, TEXTS, pooling="mean", normalize=False))
    assert float((ours - transformers_mean(directory, TEXTS)).abs().max()) <= TOL


# ------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("key, value", [("pos_att_type", ["p2p"]), ("conv_kernel_size", 4),
                                        ("norm_rel_ebd", "batch_norm"), ("attention_head_size", 7),
                                        ("pooler_hidden_size", 12), ("conv_act", "softsign")])
def test_options_bertkit_does_not_implement_are_refused_naming_the_key(key, value):
    values = {**hf_config("v2").to_dict(), key: value}
    with pytest.raises(ValueError, match=key):
        BertConfig.from_dict(values)


def test_config_round_trips_as_transformers_writes_it():
    """pos_att_type "p2c|c2p" reads as transformers' list; every DeBERTa key goes back unchanged."""
    theirs = hf_config("v3").to_dict()
    config = BertConfig.from_dict(dict(theirs, pos_att_type="p2c|c2p"))
    assert config.pos_att_type == ["p2c", "c2p"] and not config.has_segments and config.relative_attention
    written = config.to_dict()
    for key in ("position_buckets", "share_att_key", "norm_rel_ebd", "position_biased_input", "legacy",
                "pos_att_type", "type_vocab_size", "max_relative_positions"):
        assert written[key] == theirs[key], key


def test_lm_predictions_load_whatever_legacy_says(tmp_path):
    """Released v3 checkpoints hold `lm_predictions.lm_head.*` with no `legacy` key (so true): the
    head computes the same either way, so bertkit loads it (transformers initialises cls.predictions
    afresh there, on purpose not followed) and the logits are the legacy-false model's."""
    theirs, directory = make("v3", "ForMaskedLM", tmp_path)
    values = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**values, "legacy": True}))
    ours = model_class("ForMaskedLM").from_pretrained(directory)
    assert not ours.load_report.missing and not ours.load_report.unexpected, ours.load_report
    inputs = batch("v3")
    with torch.no_grad():
        reference = theirs(**inputs).logits
    assert close(ours_padded(ours, inputs, "ForMaskedLM")[0], reference, inputs["attention_mask"]) <= TOL


@pytest.mark.parametrize("style", STYLES)
def test_one_training_step_has_transformers_gradients(style, tmp_path):
    """The fine-tuning path: the loss and every parameter's gradient, compared under transformers'
    names (the fused qkv split back; with share_att_key the position terms reach Q and K's gradients)."""
    from bertkit.encoder.checkpoint import to_hf_state_dict

    theirs, directory = make(style, "ForSequenceClassification", tmp_path)
    ours = model_class("ForSequenceClassification").from_pretrained(directory).train()
    theirs.train()
    inputs, labels = batch(style), torch.tensor([0, 2, 1, 2])
    loss = ours(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"], labels=labels).loss
    reference = theirs(**inputs, labels=labels).loss
    loss.backward()
    reference.backward()
    assert abs(float(loss.detach()) - float(reference.detach())) <= TOL
    grads = to_hf_state_dict({name: p.grad for name, p in ours.named_parameters()}, ours.config)
    expected = {name: p.grad for name, p in theirs.named_parameters() if p.grad is not None}
    assert set(grads) == set(expected)
    assert max(float((grads[name] - expected[name]).abs().max()) for name in expected) <= TOL


@pytest.mark.parametrize("style", STYLES)
def test_explorer_attention_equals_transformers_output_attentions(style, tokenizer_dir, tmp_path):
    """The attention view writes out the disentangled weights (softmax of the content, c2p and p2c
    scores): every layer and head equal to transformers' `output_attentions`; with padding the
    trace's states at real tokens equal the model's forward (v2's convolution included)."""
    from bertkit.explore import views

    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_dir))
    theirs, directory = make(style, "ForMaskedLM", tmp_path / "mlm", vocab_size=vocab)
    for name in ("spm.model", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    explorer = views.Explorer.load(directory)
    text = "Paris is the capital of France."
    enc = explorer.encode(text)
    with torch.no_grad():
        reference = theirs(input_ids=torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids]),
                           output_attentions=True).attentions
    out = views.attention(explorer, text, pad=3)
    assert len(out["attention"]) == len(reference)
    for mine, their in zip(out["attention"], reference):
        assert float((torch.tensor(mine) - their[0]).abs().max()) <= TOL
    inputs = batch(style)
    trace = views.attention_trace(explorer.encoder, inputs["input_ids"], inputs["token_type_ids"],
                                  inputs["attention_mask"])
    with torch.no_grad():
        want = explorer.encoder(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"])
    assert close(trace.hidden, want.last_hidden_state, inputs["attention_mask"]) <= TOL


def with_tokenizer(directory: Path, tokenizer_dir: Path) -> Path:
    for name in ("spm.model", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    return directory


@pytest.mark.parametrize("style", STYLES)
def test_fill_mask_ner_and_qa_run_on_the_engine(style, tokenizer_dir, tmp_path, capsys):
    """fill-mask's top 5 are transformers' (ids and probabilities); `ner` and `qa` answer over
    transformers-made heads (QA windows are pairs: segments where v2 has them, none in v3)."""
    from bertkit.inference import fill_mask

    from family_fixtures import transformers_top_masked

    vocab = len(transformers.AutoTokenizer.from_pretrained(tokenizer_dir))
    directory = with_tokenizer(make(style, "ForMaskedLM", tmp_path / "mlm", vocab_size=vocab)[1], tokenizer_dir)
    text = "Paris is the [MASK] of France."
    ours = fill_mask(directory, [text], top_k=5)[0][0]
    ids, scores = transformers_top_masked(directory, text)
    assert [c.token_id for c in ours] == ids
    assert max(abs(c.score - p) for c, p in zip(ours, scores)) <= 1e-6
    tagger = with_tokenizer(make(style, "ForTokenClassification", tmp_path / "ner", vocab_size=vocab,
                                 id2label={0: "O", 1: "B-LOC", 2: "I-LOC"})[1], tokenizer_dir)
    assert main(["ner", str(tagger), "--json", "Paris is the capital of France."]) == 0
    assert "entities" in json.loads(capsys.readouterr().out)
    reader = with_tokenizer(make(style, "ForQuestionAnswering", tmp_path / "qa", vocab_size=vocab)[1], tokenizer_dir)
    assert main(["qa", str(reader), "--json", "--question", "What is the capital?", "--context",
                 "Paris is the capital of France."]) == 0
    assert json.loads(capsys.readouterr().out)["answers"]

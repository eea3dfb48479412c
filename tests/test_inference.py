"""The inference engine and its uses, checked against transformers and sentence-transformers.

Every use must equal the reference on the same weights (fp32: 1e-5) and give each text the same
result alone as in any batch, in any order.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
import transformers

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertkit.encoder.model import BertForMaskedLM, BertModel
from bertkit.inference import Engine, classify, embed, fill_mask, ner, qa, rerank, token_budget_batches

from model_fixtures import save_tiny

SENTENCES = ["A man is playing a guitar.", "Someone plays an instrument on stage tonight.",
             "Stocks fell.", "The central bank raised interest rates by a quarter of a point.",
             "Paris is the capital of France, and Berlin that of Germany."]


@pytest.fixture(scope="module")
def tokenizer(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_pretrained(minilm_dir)


# ---------------------------------------------------------------------------------------------
# batching and the packed forward
# ---------------------------------------------------------------------------------------------
def test_token_budget_batches_cover_every_index_once_within_budget():
    lengths = [5, 1, 9, 3, 7, 9, 2]
    batches = list(token_budget_batches(lengths, 12))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches[0] == [2]  # 9 + 9 > 12: the longest go alone, first
    assert all(sum(lengths[i] for i in b) <= 12 for b in batches)
    assert [lengths[i] for b in batches for i in b] == sorted(lengths, reverse=True)
    assert list(token_budget_batches([20, 3], 10)) == [[0], [1]]  # over budget: a batch of its own
    with pytest.raises(ValueError, match="max_batch_tokens must be positive"):
        list(token_budget_batches([1], 0))


def test_embeddings_match_sentence_transformers(minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    ours = embed(minilm_dir, SENTENCES)  # pooling and normalization read from the model's files
    assert (ours - reference.cpu()).abs().max() <= 1e-5


def test_each_text_alone_equals_any_batch_in_any_order(minilm_dir):
    many = SENTENCES * 3 + ["short", "a somewhat longer sentence that still fits"]
    big = Engine.load(minilm_dir)
    small = Engine.load(minilm_dir, max_batch_tokens=30)  # many batches, several runs each
    together = embed(big, many)
    reordered = embed(small, list(reversed(many))).flip(0)
    alone = torch.cat([embed(big, [text]) for text in many])
    assert small.stats.batches > 3
    assert (together - alone).abs().max() <= 1e-5
    assert (reordered - alone).abs().max() <= 1e-5


@pytest.mark.parametrize("pooling", ["cls", "max", "mean"])
def test_pooling_modes_match_transformers_hidden_states(minilm_dir, tokenizer, pooling):
    ref = transformers.BertModel.from_pretrained(minilm_dir).eval()
    hf_tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    batch = hf_tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = ref(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).bool()
    expected = {"cls": hidden[:, 0], "max": hidden.masked_fill(~mask, -1e9).max(1).values,
                "mean": (hidden * mask).sum(1) / mask.sum(1)}[pooling]
    ours = embed(minilm_dir, SENTENCES, pooling=pooling, normalize=False)
    assert (ours - expected).abs().max() <= 1e-5


def test_long_texts_are_truncated_with_a_count_or_refused(minilm_dir, caplog):
    long_text = "word " * 400  # MiniLM's sentence-transformers limit is 256 tokens
    engine = Engine.load(minilm_dir)
    assert engine.max_length == 256
    with caplog.at_level(logging.WARNING):
        embed(engine, [long_text, "short"])
    assert "1 of 2 inputs were longer than 256 tokens and were truncated" in caplog.text
    assert engine.stats.truncated == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # said once per engine; later ones are only counted
        embed(engine, [long_text, long_text])
    assert "truncated" not in caplog.text
    assert engine.stats.truncated == 3
    with pytest.raises(ValueError, match="exceed the model's limit of 256 tokens.*--truncate"):
        embed(Engine.load(minilm_dir, truncate=False), [long_text])


def test_engine_errors_name_the_problem(minilm_dir):
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        Engine.load(minilm_dir, precision="fp8")
    with pytest.raises(ValueError, match="no weights for fill-mask .*cls.predictions"):
        Engine.load(minilm_dir, use="fill-mask")
    with pytest.raises(ValueError, match="unknown use 'summarize'"):
        Engine.load(minilm_dir, use="summarize")
    with pytest.raises(ValueError, match="text 1 is empty"):
        embed(minilm_dir, ["fine", "  "])
    with pytest.raises(ValueError, match="max_length 600 must be in 3..512"):
        Engine.load(minilm_dir, max_length=600)


# ---------------------------------------------------------------------------------------------
# precision
# ---------------------------------------------------------------------------------------------
def test_bf16_and_int8_stay_within_their_stated_tolerances(minilm_dir):
    texts = SENTENCES * 4
    exact = embed(minilm_dir, texts)
    bf16 = embed(Engine.load(minilm_dir, precision="bf16"), texts)
    int8_engine = Engine.load(minilm_dir, precision="int8", max_batch_tokens=40)
    int8 = embed(int8_engine, texts)
    cos = torch.nn.functional.cosine_similarity
    assert cos(bf16, exact).min() >= 0.999
    assert cos(int8, exact).min() >= 0.99
    # per-token activation scales: a text's int8 result does not depend on its batch
    alone = torch.cat([embed(int8_engine, [t]) for t in texts[:5]])
    assert (alone - int8[:5]).abs().max() <= 1e-6


def test_int8_linear_matches_float_linear_closely():
    from bertkit.backend.int8 import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(37, 64) * torch.linspace(0.1, 5, 37)[:, None]  # rows of very different scale
    x[3] = x[3].abs()  # one-sided rows use the whole 8-bit range
    q = Int8Linear(linear)
    rel = (q(x) - linear(x)).norm(dim=1) / linear(x).norm(dim=1)
    assert rel.max() < 0.02


# ---------------------------------------------------------------------------------------------
# fill-mask
# ---------------------------------------------------------------------------------------------
def test_fill_mask_matches_reference_probabilities(tokenizer, tmp_path):
    save_tiny(BertForMaskedLM, tokenizer, tmp_path)
    texts = ["paris is the [MASK] of france.", "the [MASK] sat on the [MASK] all day long."]
    results = fill_mask(tmp_path, texts, top_k=3)
    assert [len(r) for r in results] == [1, 2]
    ref = transformers.BertForMaskedLM.from_pretrained(tmp_path).eval()
    hf_tok = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    for text, masks in zip(texts, results):
        batch = hf_tok(text, return_tensors="pt")
        with torch.no_grad():
            probs = ref(**batch).logits[0].softmax(-1)
        positions = (batch["input_ids"][0] == hf_tok.mask_token_id).nonzero()[:, 0]
        for pos, cands in zip(positions, masks):
            top = probs[pos].topk(3)
            assert [c.token_id for c in cands] == top.indices.tolist()
            assert max(abs(c.score - p) for c, p in zip(cands, top.values.tolist())) <= 1e-5


def test_fill_mask_targets_score_only_the_given_words(tokenizer, tmp_path):
    save_tiny(BertForMaskedLM, tokenizer, tmp_path)
    text = "paris is the [MASK] of france."
    full = fill_mask(tmp_path, [text], top_k=tokenizer.vocab_size)[0][0]
    by_token = {c.token: c.score for c in full}
    targets = ["capital", "city", "heart"]
    scored = fill_mask(tmp_path, [text], top_k=5, targets=targets)[0][0]
    assert sorted(c.token for c in scored) == sorted(targets)
    assert [c.score for c in scored] == sorted((c.score for c in scored), reverse=True)
    for c in scored:
        assert abs(c.score - by_token[c.token]) <= 1e-6  # probability under the full softmax


def test_fill_mask_errors(minilm_dir, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="no weights for fill-mask"):
        fill_mask(minilm_dir, ["a [MASK] b"])
    save_tiny(BertForMaskedLM, tokenizer, tmp_path)
    with pytest.raises(ValueError, match="has no \\[MASK\\] token"):
        fill_mask(tmp_path, ["no mask here"])
    with pytest.raises(ValueError, match="past the model's limit of 64 tokens"):
        fill_mask(tmp_path, ["word " * 80 + "[MASK]"])
    with pytest.raises(ValueError, match="a \\[MASK\\] lies past the model's limit"):
        fill_mask(tmp_path, ["[MASK] " + "word " * 80 + "[MASK]"])


# ---------------------------------------------------------------------------------------------
# classify and rerank
# ---------------------------------------------------------------------------------------------
def test_classify_matches_transformers_on_texts_and_pairs(tokenizer, tmp_path):
    save_tiny(BertForSequenceClassification, tokenizer, tmp_path,
          id2label={0: "neg", 1: "neu", 2: "pos"})
    ref = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    hf_tok = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    pairs = list(reversed(SENTENCES))
    for second in (None, pairs):
        rows = classify(tmp_path, SENTENCES, second)
        batch = hf_tok(SENTENCES, second, padding=True, return_tensors="pt")
        with torch.no_grad():
            expected = ref(**batch).logits.softmax(-1)
        got = torch.tensor([[r["scores"][name] for name in ("neg", "neu", "pos")] for r in rows])
        assert (got - expected).abs().max() <= 1e-5
        assert [r["label"] for r in rows] == [("neg", "neu", "pos")[i] for i in expected.argmax(-1)]


def test_multi_label_heads_use_sigmoid(tokenizer, tmp_path):
    save_tiny(BertForSequenceClassification, tokenizer, tmp_path, id2label={0: "a", 1: "b"},
          problem_type="multi_label_classification")
    ref = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    batch = transformers.BertTokenizerFast.from_pretrained(tmp_path)(SENTENCES[:2], padding=True,
                                                                        return_tensors="pt")
    with torch.no_grad():
        expected = ref(**batch).logits.sigmoid()
    rows = classify(tmp_path, SENTENCES[:2])
    assert (torch.tensor([[r["scores"]["a"], r["scores"]["b"]] for r in rows]) - expected).abs().max() <= 1e-5


def test_rerank_sorts_documents_by_cross_encoder_sigmoid(tokenizer, tmp_path):
    save_tiny(BertForSequenceClassification, tokenizer, tmp_path, id2label={0: "LABEL_0"})
    ref = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    hf_tok = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    query = "who plays music?"
    batch = hf_tok([query] * len(SENTENCES), SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = ref(**batch).logits[:, 0].sigmoid()
    ranked = rerank(tmp_path, query, SENTENCES)
    assert [r["index"] for r in ranked] == expected.argsort(descending=True).tolist()
    assert max(abs(r["score"] - float(expected[r["index"]])) for r in ranked) <= 1e-5
    assert len(rerank(tmp_path, query, SENTENCES, top_k=2)) == 2
    raw = rerank(tmp_path, query, SENTENCES, raw_scores=True)
    assert abs(torch.tensor(raw[0]["score"]).sigmoid() - ranked[0]["score"]) <= 1e-6


def test_rerank_refuses_a_classifier_with_several_labels(tokenizer, tmp_path):
    save_tiny(BertForSequenceClassification, tokenizer, tmp_path, id2label={0: "neg", 1: "pos"})
    with pytest.raises(ValueError, match="rerank needs a cross-encoder with one output.*2 labels"):
        rerank(tmp_path, "q", ["d"])


# ---------------------------------------------------------------------------------------------
# ner
# ---------------------------------------------------------------------------------------------
NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def test_ner_logits_match_transformers_and_entities_are_valid_spans(tokenizer, tmp_path):
    from bertkit.data.formats.ner import NerSentence, ner_features, split_words
    from bertkit.inference.ner import token_logits

    save_tiny(BertForTokenClassification, tokenizer, tmp_path, id2label=NER_LABELS)
    engine = Engine.load(tmp_path, use="ner")
    ref = transformers.BertForTokenClassification.from_pretrained(tmp_path).eval()
    splits = split_words(engine.word_pieces, SENTENCES)
    encoded = ner_features([NerSentence(s.words, None) for s in splits], engine.word_pieces, 64)
    ours = token_logits(engine, encoded.features)
    for feature, got in zip(encoded.features, ours):
        with torch.no_grad():
            expected = ref(torch.tensor([feature["input_ids"]])).logits[0]
        assert (got - expected).abs().max() <= 1e-5
    for text, entities in zip(SENTENCES, ner(engine, SENTENCES)):
        for e in entities:
            assert text[e["start"]:e["end"]] == e["text"] and e["type"] in ("PER", "LOC")
            assert 0 < e["score"] <= 1


def test_constrained_decoding_never_starts_an_entity_with_inside():
    from bertkit.data.formats.ner import constrained_decode

    names = list(NER_LABELS.values())
    # per word, an argmax would read O I-PER I-PER O (two invalid I- starts)
    probs = torch.tensor([[0.9, 0.02, 0.02, 0.03, 0.03],
                          [0.3, 0.25, 0.4, 0.03, 0.02],
                          [0.2, 0.1, 0.6, 0.05, 0.05],
                          [0.8, 0.05, 0.05, 0.05, 0.05]])
    assert [names[i] for i in probs.argmax(-1)] == ["O", "I-PER", "I-PER", "O"]
    assert constrained_decode(probs.log(), names) == ["O", "B-PER", "I-PER", "O"]
    bioes = ["O", "B-X", "I-X", "E-X", "S-X"]
    # B-X cannot end a sentence in BIOES
    got = constrained_decode(torch.tensor([[0.1, 0.1, 0.1, 0.1, 0.6], [0.1, 0.6, 0.1, 0.1, 0.1]]).log(), bioes)
    assert got[-1] != "B-X" and got[-1] != "I-X"


def test_ner_on_text_longer_than_the_model_uses_windows(tokenizer, tmp_path):
    save_tiny(BertForTokenClassification, tokenizer, tmp_path, id2label=NER_LABELS)
    text = " ".join(["Alice went to Paris."] * 40)  # ~200 pieces, 64 positions
    (entities,) = ner(tmp_path, [text])
    for e in entities:
        assert text[e["start"]:e["end"]] == e["text"]


# ---------------------------------------------------------------------------------------------
# qa
# ---------------------------------------------------------------------------------------------
def test_qa_answers_are_whole_words_with_scores_and_offsets(tokenizer, tmp_path):
    from bertkit.data.formats.qa import QAExample, QASettings, qa_features
    from bertkit.inference.ner import token_logits

    save_tiny(BertForQuestionAnswering, tokenizer, tmp_path)
    context = ("bertkit was released in 2026 and runs on CPUs and GPUs. " * 6).strip()
    questions = ["When was bertkit released?", "What does it run on?"]
    engine = Engine.load(tmp_path, use="qa")
    # the engine's logits equal transformers' on every window
    settings = QASettings(max_seq_length=64, doc_stride=16)
    encoded = qa_features([QAExample("0", questions[0], context)], engine.word_pieces, settings, training=False)
    assert len(encoded.features) > 1  # the context needs several windows
    ref = transformers.BertForQuestionAnswering.from_pretrained(tmp_path).eval()
    for feature, got in zip(encoded.features, token_logits(engine, encoded.features, "spans")):
        with torch.no_grad():
            out = ref(torch.tensor([feature["input_ids"]]), token_type_ids=torch.tensor([feature["token_type_ids"]]))
        assert (got - torch.stack([out.start_logits[0], out.end_logits[0]], -1)).abs().max() <= 1e-5
    results = qa(engine, questions, context, top_k=3, doc_stride=16)
    words = set(context.replace(".", " ").split())
    for answers in results:
        assert 1 <= len(answers) <= 3
        assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
        for a in answers:
            assert context[a["start"]:a["end"]] == a["text"]
            first, last = a["text"].replace(".", " ").split()[0], a["text"].replace(".", " ").split()[-1]
            assert first in words and last in words  # never "202" for 2026, nor "CPU" for CPUs
    with pytest.raises(ValueError, match="2 questions but 3 contexts"):
        qa(engine, questions, ["a", "b", "c"])


# ---------------------------------------------------------------------------------------------
# the command line and files
# ---------------------------------------------------------------------------------------------
def test_cli_embed_a_file_with_bad_rows_into_npy(minilm_dir, tmp_path, capsys):
    import numpy as np

    from bertkit.cli import main

    src = tmp_path / "texts.jsonl"
    src.write_text("\n".join([json.dumps({"text": s}) for s in SENTENCES[:3]] + ["{not json",
                   json.dumps({"other": 1}), json.dumps({"text": SENTENCES[3]})]) + "\n", encoding="utf-8")
    out = tmp_path / "vectors.npy"
    assert main(["embed", str(minilm_dir), "--input", str(src), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr()
    assert "4 rows" in printed.out and "2 bad rows skipped" in printed.out
    assert "texts.jsonl:4" in printed.err + printed.out
    vectors = np.load(out)
    expected = embed(minilm_dir, SENTENCES[:4]).numpy()
    assert vectors.shape == (4, 384) and np.abs(vectors - expected).max() <= 1e-5
    assert main(["embed", str(minilm_dir), "--input", str(src), "--out", str(out)]) == 2  # no --overwrite
    assert "--overwrite" in capsys.readouterr().err


def test_cli_uses_print_results(tokenizer, tmp_path, capsys):
    from bertkit.cli import main

    mlm = save_tiny(BertForMaskedLM, tokenizer, tmp_path / "mlm")
    assert main(["fill-mask", str(mlm), "paris is the [MASK] of france.", "--top-k", "2", "--json"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(row["masks"][0]) == 2
    ce = save_tiny(BertForSequenceClassification, tokenizer, tmp_path / "ce", id2label={0: "LABEL_0"})
    assert main(["rerank", str(ce), "a guitar", "stocks", "--query", "music", "--json"]) == 0
    ranked = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["index"] for r in ranked) == [0, 1]
    qa_dir = save_tiny(BertForQuestionAnswering, tokenizer, tmp_path / "qa")
    assert main(["qa", str(qa_dir), "--question", "when?", "--context", "released in 2026.", "--json"]) == 0
    (answer,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert answer["answers"][0]["text"] in "released in 2026."
    paragraph = "it was released in 2026 after years of work on the engine and its tests. " * 5
    assert main(["qa", str(qa_dir), "--question", "when?", "--context", paragraph, "--json"]) == 0  # not a path
    (answer,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert answer["answers"][0]["text"] in paragraph
    (tmp_path / "context.txt").write_text("released in 2026.\n")
    assert main(["qa", str(qa_dir), "--question", "when?", "--context", str(tmp_path / "context.txt"), "--json"]) == 0
    (answer,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert answer["answers"][0]["text"] in "released in 2026."
    assert main(["embed", str(mlm)]) == 2
    assert "needs texts or --input" in capsys.readouterr().err


def test_encoder_from_a_head_model_embeds_like_the_base_model(tokenizer, tmp_path):
    save_tiny(BertModel, tokenizer, tmp_path)
    base = embed(tmp_path, SENTENCES, pooling="cls", normalize=False)
    ref = transformers.BertModel.from_pretrained(tmp_path).eval()
    batch = transformers.BertTokenizerFast.from_pretrained(tmp_path)(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = ref(**batch).last_hidden_state[:, 0]
    assert (base - expected).abs().max() <= 1e-5


def test_compiled_int8_kernels_equal_the_eager_ones():
    from bertkit.backend import int8

    quantize, dequantize, linear = int8._KERNELS.get()
    if quantize is int8.quantize_rows:
        pytest.skip("torch.compile is not available here (no C++ compiler)")
    torch.manual_seed(0)
    x = torch.randn(29, 48) * torch.linspace(0.1, 4, 29)[:, None]
    eager, compiled = int8.quantize_rows(x), quantize(x)
    assert torch.equal(eager[0], compiled[0])
    assert torch.allclose(eager[1], compiled[1]) and torch.equal(eager[2], compiled[2])
    acc = torch.randint(-5000, 5000, (29, 11), dtype=torch.int32)
    args = (eager[1], eager[2], torch.rand(11), torch.rand(11), torch.rand(11))
    assert torch.allclose(int8.dequantize(acc, *args), dequantize(acc, *args), rtol=1e-6, atol=1e-5)
    weights = (torch.randint(-127, 128, (48, 11), dtype=torch.int8), *args[2:])
    eager, compiled = torch.empty(29, 11), torch.empty(29, 11)
    int8.linear_rows(x, eager, *weights)
    linear(x, compiled, *weights)
    assert torch.allclose(eager, compiled, rtol=1e-6, atol=1e-5)


def test_rerank_reads_pairs_at_the_cross_encoders_own_length(tokenizer, tmp_path):
    """A cross-encoder whose tokenizer says model_max_length 16 (its trained length) is read at 16,
    as sentence-transformers' CrossEncoder reads it, by every use (classify and embed too: one
    length per model, so the CLI, the library and the service answer alike); a bare encoder with
    the same tokenizer keeps the model's limit."""
    import json

    save_tiny(BertForSequenceClassification, tokenizer, tmp_path, num_labels=1)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 16}))
    assert Engine.load(tmp_path, use="rerank").max_length == 16
    assert Engine.load(tmp_path, use="rerank", max_length=40).max_length == 40
    assert Engine.load(tmp_path, use="classify").max_length == 16
    assert Engine.load(tmp_path, use="embed").max_length == 16
    save_tiny(BertModel, tokenizer, tmp_path / "bare")
    (tmp_path / "bare" / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 16}))
    assert Engine.load(tmp_path / "bare").max_length == 64


def test_fused_int8_feed_forward_equals_the_layers_own(minilm_dir, monkeypatch):
    """Int8EncoderLayer's block-by-block feed-forward (dequantize + GELU + quantize fused) gives the
    unfused int8 layer's output within one quantization step, compiled or eager, and a row's
    result does not depend on the rows around it."""
    from bertkit.backend import int8
    from bertkit.encoder.model import EncoderLayer

    layer = Engine.load(minilm_dir, precision="int8").model.layers[2]
    assert type(layer) is int8.Int8EncoderLayer
    torch.manual_seed(0)
    x, y = torch.randn(1500, 384), torch.randn(1500, 384)  # more rows than one block (682)
    with torch.inference_mode():
        plain = EncoderLayer.feed_forward(layer, x, y)
        for kernels in (int8._FUSED, int8._FusedKernels(compile=False)):  # compiled, then eager
            monkeypatch.setattr(int8, "_FUSED", kernels)
            fused = layer.feed_forward(x, y)
            cos = torch.nn.functional.cosine_similarity(fused, plain, dim=-1)
            assert cos.min() > 0.9999 and (fused - plain).abs().max() < 0.05
            alone = layer.feed_forward(x[700:705], y[700:705])
            assert (alone - fused[700:705]).abs().max() < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the varlen flash path)")
def test_cuda_varlen_attention_matches_the_cpu_engine(minilm_dir):
    texts = SENTENCES * 3
    exact = embed(minilm_dir, texts)
    gpu = Engine.load(minilm_dir, device="cuda", precision="bf16")  # 16-bit: the varlen kernel
    vectors = embed(gpu, texts)
    assert torch.nn.functional.cosine_similarity(vectors, exact).min() >= 0.999
    alone = torch.cat([embed(gpu, [t]) for t in texts[:4]])
    assert torch.nn.functional.cosine_similarity(alone, vectors[:4]).min() >= 0.9999

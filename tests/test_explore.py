"""The explorer's numbers (bertkit.explore.views) against the library and transformers, and its routes.

Every view must show what the library computes for the same text: fill-mask equal to `fill_mask`,
the masking view equal to `mask_text` and to the MLM head's own loss, the embedding sum equal to
the Embeddings module, the attention weights equal to transformers' `output_attentions`.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import transformers

from bertkit.data.masking import mask_text
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.heads import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from bertkit.encoder.model import BertForMaskedLM
from bertkit.explore import Explorer, ViewError, views
from bertkit.inference import classify, fill_mask, ner, qa, rerank, similarity

from model_fixtures import save_tiny

TEXT = "the central bank raised interest rates by a quarter of a point."
MASKED = "the central bank raised [MASK] rates."


@pytest.fixture(scope="module")
def dirs(minilm_dir, tmp_path_factory):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    root = tmp_path_factory.mktemp("explore")
    return {"mlm": save_tiny(BertForMaskedLM, tokenizer, root / "mlm", num_hidden_layers=3),
            "clf": save_tiny(BertForSequenceClassification, tokenizer, root / "clf", seed=1,
                         id2label={0: "neg", 1: "neu", 2: "pos"}),
            "ner": save_tiny(BertForTokenClassification, tokenizer, root / "ner", seed=2,
                         id2label={0: "O", 1: "B-PER", 2: "I-PER"}),
            "qa": save_tiny(BertForQuestionAnswering, tokenizer, root / "qa", seed=3),
            "rr": save_tiny(BertForSequenceClassification, tokenizer, root / "rr", seed=4, num_labels=1),
            "minilm": minilm_dir}


@pytest.fixture(scope="module")
def explorer(dirs) -> Explorer:
    return Explorer.load(dirs["mlm"], [("sentiment", dirs["clf"]), ("people", dirs["ner"]),
                                       ("reader", dirs["qa"]), ("ranker", dirs["rr"]),
                                       ("sentences", dirs["minilm"])])


def test_load_reads_each_head_and_the_language(explorer, dirs):
    assert explorer.has_mlm and explorer.language == "en"
    assert {n: t.use for n, t in explorer.tasks.items()} == {
        "sentiment": "classify", "people": "ner", "reader": "qa", "ranker": "rerank", "sentences": "embed"}
    bare = Explorer.load(dirs["minilm"])  # an encoder without an MLM head embeds, nothing more
    assert not bare.has_mlm and [t.use for t in bare.tasks.values()] == ["embed"]
    with pytest.raises(ViewError, match="needs a masked-LM head"):
        views.fill(bare, [MASKED])
    assert views.masking(bare, TEXT)["predictions"][0]["top"] == []  # the mask itself still shows
    with pytest.raises(FileNotFoundError, match="it does not exist"):
        Explorer.load(dirs["mlm"] / "missing")


def test_info_parameter_table_sums_to_the_model(explorer):
    info = views.info(explorer)
    rows = info["model"]["parameters"]
    assert sum(r["count"] for r in rows) == info["model"]["total_parameters"]
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    token_rows = [r for r in rows if r["name"].startswith("embeddings.token")]
    assert token_rows[0]["count"] == explorer.tokenizer.vocab_size * 36
    assert 0 < info["model"]["embedding_share"] < 1
    assert "[MASK]" in info["examples"]["mask_pair"][0]
    assert {t["name"]: t["labels"] for t in info["tasks"]}["sentiment"] == ["neg", "neu", "pos"]


def test_visibility_matrices_and_objectives(explorer):
    out = views.visibility(explorer, TEXT, position=3)
    n = len(out["tokens"])
    assert np.array_equal(out["bert"], np.ones((n, n))) and np.array_equal(out["gpt"], np.tril(np.ones((n, n))))
    mlm, causal, leaky = out["objectives"]
    assert mlm["input"][3] == "[MASK]" and mlm["visible"] == list(range(n)) and not mlm["leak"]
    assert causal["visible"] == [0, 1, 2, 3] and causal["target_position"] == 4 and not causal["leak"]
    assert leaky["leak"] and 4 in leaky["visible"]
    # The masked-LM probability is the fill-mask probability of the true token at that slot.
    masked_text = explorer.tokenizer.decode(explorer.encode(TEXT).ids[1:3]) + " [MASK] " + \
        explorer.tokenizer.decode(explorer.encode(TEXT).ids[4:-1])
    word = out["tokens"][3]
    [[[best]]] = fill_mask(explorer.engine, [masked_text], top_k=1, targets=[word])
    assert mlm["prob"] == pytest.approx(best.score, abs=1e-6)
    with pytest.raises(ViewError, match="position"):
        views.visibility(explorer, TEXT, position=n)


def test_assembly_is_the_embeddings_forward(explorer):
    out = views.assembly(explorer, "the cat sees the ball", "a dog likes a car", position=8)
    assert out["segments"][8] == 1 and out["positions"][8] == 8
    vec = {k: torch.tensor(v) for k, v in out["vectors"].items()}
    assert torch.allclose(vec["sum"], vec["token"] + vec["position"] + vec["segment"], atol=1e-6)
    enc = explorer.encode("the cat sees the ball", "a dog likes a car")
    with torch.inference_mode():
        layer_in = explorer.encoder.embeddings(torch.tensor([enc.ids]), torch.tensor([enc.type_ids]))
    assert torch.allclose(vec["layernorm"], layer_in[0, 8], atol=1e-6)
    assert out["norms"]["token"] == pytest.approx(float(vec["token"].norm()), rel=1e-6)


@pytest.mark.parametrize("whole_word", [False, True])
def test_masking_view_is_the_training_recipe_and_the_models_loss(explorer, whole_word):
    text = "unbelievably, the tokenizer splits rare words into several pieces today."
    out = views.masking(explorer, text, seed=7, whole_word=whole_word)
    ref = mask_text(text, explorer.tokenizer, seed=7, whole_word_mask=whole_word)
    assert out["labels"] == ref.masked.labels[0].tolist()
    assert out["input_tokens"] == explorer.tokenizer.convert_ids_to_tokens(ref.masked.input_ids[0].tolist())
    selected = [p["position"] for p in out["predictions"]]
    assert selected == [i for i, label in enumerate(out["labels"]) if label != -100]
    assert out["counts"]["selected"] == len(selected) == round(0.15 * out["counts"]["candidates"])
    assert sum(out["counts"][k] for k in ("masked", "random", "unchanged")) == len(selected)
    labels = torch.tensor([out["labels"]])
    with torch.inference_mode():
        model_out = explorer.model(torch.tensor(ref.masked.input_ids), labels=labels)
    assert out["loss"] == pytest.approx(float(model_out.loss), rel=1e-5)
    probs = model_out.logits.softmax(-1)  # (M, V) at the selected positions, in order
    for m, entry in enumerate(out["predictions"]):
        top = probs[m].topk(5)
        assert [t["token"] for t in entry["top"]] == explorer.tokenizer.convert_ids_to_tokens(top.indices.tolist())
        assert entry["prob_true"] == pytest.approx(float(probs[m, labels[0, entry["position"]]]), rel=1e-5)
    other = views.masking(explorer, text, seed=8, whole_word=whole_word)
    assert other["labels"] != out["labels"]  # reseeding draws another mask


def test_masking_whole_words_for_chinese_uses_jieba(explorer):
    text = "我喜欢机器学习，也喜欢自然语言处理。"
    out = views.masking(explorer, text, seed=0, whole_word=True)
    assert out["words"] is not None and "".join(out["words"]) == text
    assert views.masking(explorer, text, seed=0)["words"] == out["words"]  # shown with the toggle off too
    assert views.masking(explorer, TEXT)["words"] is None  # English: WordPiece's own boundaries


def test_fill_view_equals_fill_mask(explorer):
    texts = ["[MASK] released a new version of windows.", "[MASK] sold millions of ipods."]
    out = views.fill(explorer, texts, top_k=5)
    ref = fill_mask(explorer.engine, texts, top_k=5)
    assert out["results"] == [[[{"token": c.token, "token_id": c.token_id, "score": c.score} for c in m]
                               for m in t] for t in ref]
    with pytest.raises(ViewError, match="no \\[MASK\\]"):
        views.fill(explorer, ["no mask here"])


def test_attention_trace_equals_the_model_and_transformers(minilm_dir):
    explorer = Explorer.load(minilm_dir)
    texts = ["a man is playing a guitar.", "paris is the capital of france, and berlin that of germany."]
    batch = explorer.tokenizer(texts, padding=True, return_tensors="pt")
    trace = views.attention_trace(explorer.encoder, batch["input_ids"], batch["token_type_ids"],
                                  batch["attention_mask"])
    with torch.inference_mode():
        ours = explorer.encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        ref = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()(
            **batch, output_attentions=True)
    real = batch["attention_mask"].bool()
    assert torch.allclose(trace.hidden[real], ours.last_hidden_state[real], atol=1e-5)
    assert len(trace.probs) == len(ref.attentions) == 6
    for mine, theirs in zip(trace.probs, ref.attentions):
        assert torch.allclose(mine, theirs, atol=1e-5)


def test_attention_view_and_the_padding_mask(explorer, monkeypatch):
    out = views.attention(explorer, TEXT, pad=5, layer=1, head=2)
    n = len(out["tokens"])
    attn = np.array(out["attention"])
    assert attn.shape == (3, 4, n, n) and np.allclose(attn.sum(-1), 1, atol=1e-5)
    pad = out["padding"]
    with_mask, without = np.array(pad["with_mask"]), np.array(pad["without_mask"])
    assert with_mask.shape == (n, n + 5) and pad["tokens"][n:] == ["[PAD]"] * 5
    assert np.all(with_mask[:, n:] == 0) and np.all(without[:, n:] > 0)
    # With the mask, padding changes nothing: the weights are those of the text alone.
    assert np.allclose(with_mask[:, :n], attn[1, 2], atol=1e-5)
    assert np.allclose(without.sum(-1), 1, atol=1e-5)
    with pytest.raises(ViewError, match="layer"):
        views.attention(explorer, TEXT, layer=3)
    monkeypatch.setattr(views, "MAX_ATTENTION_TOKENS", n - 1)  # the tiny model holds 64 tokens
    with pytest.raises(ViewError, match=f"has {n} tokens; the attention view draws at most {n - 1}"):
        views.attention(explorer, TEXT)


def test_task_views_equal_the_library(explorer):
    engines = {n: t.engine for n, t in explorer.tasks.items()}
    out = views.task(explorer, "sentiment", text=TEXT)
    assert out["scores"] == classify(engines["sentiment"], [TEXT])[0]["scores"]
    out = views.task(explorer, "people", text="tony blair met george bush in washington.")
    assert out["entities"] == ner(engines["people"], ["tony blair met george bush in washington."])[0]
    out = views.task(explorer, "reader", question="who?", context="tony blair met george bush.")
    assert out["answers"] == qa(engines["reader"], ["who?"], ["tony blair met george bush."], top_k=3)[0]
    docs = ["paris is in france.", "the weather is nice.", "berlin is a city."]
    out = views.task(explorer, "ranker", query="capital of france", texts=docs)
    assert [(r["index"], r["score"]) for r in out["ranked"]] == \
        [(r["index"], r["score"]) for r in rerank(engines["ranker"], "capital of france", docs)]
    out = views.task(explorer, "sentences", texts=docs)
    assert np.allclose(out["similarity"], similarity(engines["sentences"], docs).numpy(), atol=1e-6)
    with pytest.raises(ViewError, match="no task model named 'nope'"):
        views.task(explorer, "nope", text=TEXT)
    with pytest.raises(ViewError, match="`context` must be a non-empty string"):
        views.task(explorer, "reader", question="who?")


def test_routes_answer_json_and_clear_errors(explorer):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from bertkit.explore import build_app

    with TestClient(build_app(explorer)) as client:
        page = client.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert client.get("/api/info").json()["model"]["has_mlm"] is True
        got = client.post("/api/fill-mask", json={"texts": [MASKED]}).json()
        assert got == views.fill(explorer, [MASKED])
        bad = client.post("/api/attention", json={"text": TEXT, "layer": 9})
        assert bad.status_code == 422 and "`layer` must be in 0..2" in bad.json()["error"]
        unknown = client.post("/api/masking", json={"text": TEXT, "sed": 1})
        assert unknown.status_code == 422
        assert "unknown field `sed` for /api/masking (did you mean `seed`?)" in unknown.json()["error"]
        broken = client.post("/api/masking", content=b"{not json")
        assert broken.status_code == 422 and "not valid JSON" in broken.json()["error"]
        missing = client.get("/api/nothing")
        assert missing.status_code == 404 and "POST /api/masking" in missing.json()["error"]


def test_cli_prints_the_url_and_serves_the_page(dirs):
    """`bertkit explore MODEL --model NAME=DIR --port 0`: loads, prints its URL, answers, stops on SIGTERM."""
    import os
    import re
    import signal
    import subprocess
    import time

    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "bertkit.cli", "explore", str(dirs["mlm"]), "--model",
                             f"sentiment={dirs['clf']}", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url, lines, deadline = None, [], time.monotonic() + 60
        while url is None and time.monotonic() < deadline:  # bounded: a hung start fails the test
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"explorer on (http://127\.0\.0\.1:\d+/)", line)
            url = found and found.group(1)
        assert url, "".join(lines)
        assert any("task sentiment:" in line and "→ classify" in line for line in lines)
        info = httpx.get(url + "api/info", timeout=30).json()
        assert info["model"]["has_mlm"] and [t["name"] for t in info["tasks"]] == ["sentiment"]
        assert "<script" in httpx.get(url, timeout=30).text
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)
    # An orderly stop is a clean exit, as `bertkit serve`'s (uvicorn alone would end it with 143).
    assert status == 0, "".join(lines) + proc.stdout.read()


@pytest.mark.parametrize("family", ["roberta", "albert", "distilbert", "xlm-roberta", "camembert", "ernie",
                                    "electra", "mpnet"])
def test_every_family_explores_with_transformers_attention(family, tmp_path):
    """The views over RoBERTa and its SentencePiece descendants (position offset), ALBERT (E → H,
    shared layers), DistilBERT (no segments), ERNIE (task-type row) and ELECTRA (E → H): attention
    equal to transformers' `output_attentions`, the embedding step equal to the Embeddings module,
    fill-mask through the library; MPNet's weights with its relative-position bias."""
    from family_fixtures import PREFIX, make_checkpoint

    directory = make_checkpoint(family, tmp_path / family)
    explorer = Explorer.load(directory)
    assert explorer.has_mlm
    text = "Paris is the capital of France."
    enc = explorer.encode(text)
    ref = getattr(transformers, PREFIX[family] + "ForMaskedLM").from_pretrained(
        directory, attn_implementation="eager").eval()
    with torch.inference_mode():
        theirs = ref(input_ids=torch.tensor([enc.ids]), output_attentions=True).attentions
    out = views.attention(explorer, text, pad=3)
    assert len(out["attention"]) == len(theirs)
    for mine, their in zip(out["attention"], theirs):
        assert np.allclose(mine, their[0].numpy(), atol=1e-5)
    position = 2
    vec = views.assembly(explorer, text, position=position)
    with torch.inference_mode():
        layer_in = explorer.encoder.embeddings(torch.tensor([enc.ids]), torch.tensor([enc.type_ids]))
    assert np.allclose(vec["vectors"]["layernorm"], layer_in[0, position].numpy(), atol=1e-6)
    assert (vec["vectors"]["segment"] is None) == (family in ("distilbert", "mpnet"))  # no segment table
    mask = explorer.tokenizer.special_tokens["mask_token"]
    assert views.fill(explorer, [f"Paris is the {mask} of France."])["results"][0][0]

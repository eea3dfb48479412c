"""The Python front door: `bertkit.load(path)` and its methods, over the one engine.

`encode` must give sentence-transformers' array for the same directory (the drop-in promise), and
every other method the library use's own answer; a method the head cannot do names the head."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import bertkit
from bertkit import inference

from retrieval_fixtures import save_tokenizer, tiny_config

TEXTS = ["A man is eating food.", "The weather is lovely today, isn't it?", "短い文", "a " * 300]


def test_import_is_light_and_exports_the_main_objects():
    code = "import sys, bertkit; assert 'torch' not in sys.modules; print(bertkit.load.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "bertkit.api"
    for name in bertkit.__all__:
        assert getattr(bertkit, name) is not None
    assert set(bertkit.__all__) == {"__version__", *bertkit._EXPORTS}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bertkit.nope  # noqa: B018


def test_encode_is_sentence_transformers_encode(minilm_dir):
    from sentence_transformers import SentenceTransformer

    ours, theirs = bertkit.load(minilm_dir), SentenceTransformer(str(minilm_dir), device="cpu")
    got, want = ours.encode(TEXTS), theirs.encode(TEXTS)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == want.shape == (4, 384)
    np.testing.assert_allclose(got, want, atol=1e-5)
    one = ours.encode(TEXTS[0])  # one string: one vector, as sentence-transformers
    assert one.shape == theirs.encode(TEXTS[0]).shape == (384,)
    tensor = ours.encode(TEXTS, convert_to_tensor=True, batch_size=3)  # two engine calls
    assert isinstance(tensor, torch.Tensor) and torch.allclose(tensor, torch.from_numpy(want), atol=1e-5)
    np.testing.assert_allclose(ours.similarity(got, got), theirs.similarity(want, want).numpy(), atol=1e-5)
    np.testing.assert_allclose(ours.similarity(TEXTS[:2], TEXTS[2:]), got[:2] @ got[2:].T, atol=1e-5)
    assert ours.get_embedding_dimension() == theirs.get_embedding_dimension() == ours.dimension == 384
    assert ours.max_length == theirs.max_seq_length == 256


def test_encode_of_a_plain_bert_dir_matches_sentence_transformers_defaults(tmp_path):
    """No sentence-transformers files: mean pooling, not normalised (ST's own default), and with
    normalize_embeddings=True unit length, as ST."""
    from sentence_transformers import SentenceTransformer

    from bertkit.encoder.model import BertModel

    torch.manual_seed(0)
    BertModel(tiny_config()).save_pretrained(tmp_path)
    save_tokenizer(tmp_path)
    texts = ["the cat sees a red ball", "a dog"]
    ours, theirs = bertkit.load(tmp_path), SentenceTransformer(str(tmp_path), device="cpu")
    np.testing.assert_allclose(ours.encode(texts), theirs.encode(texts), atol=1e-5)
    np.testing.assert_allclose(ours.encode(texts, normalize_embeddings=True),
                               theirs.encode(texts, normalize_embeddings=True), atol=1e-5)
    assert not np.allclose(np.linalg.norm(ours.encode(texts), axis=1), 1.0)


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """A random tiny checkpoint of every head, with a tokenizer."""
    from bertkit.encoder.heads import (
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from bertkit.encoder.model import BertForMaskedLM

    root = tmp_path_factory.mktemp("heads")
    config = tiny_config()
    models = {"mlm": BertForMaskedLM(config),
              "clf": BertForSequenceClassification(config.replace(id2label={0: "neg", 1: "pos"})),
              "rerank": BertForSequenceClassification(config.replace(num_labels=1)),
              "ner": BertForTokenClassification(config.replace(id2label={0: "O", 1: "B-X", 2: "I-X"})),
              "qa": BertForQuestionAnswering(config)}
    torch.manual_seed(0)
    for name, model in models.items():
        model.save_pretrained(root / name)
        save_tokenizer(root / name)
    from bertkit.data.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(root / "rerank")
    tokenizer.model_max_length = 20  # what finetune --task rerank writes: its trained pair length
    tokenizer.save_pretrained(root / "rerank")
    return root


def test_every_method_answers_as_the_library_use(heads):
    mlm = bertkit.load(heads / "mlm")
    texts = ["the cat [MASK] a red ball", "a [MASK] sees the [MASK]"]
    want = inference.fill_mask(heads / "mlm", texts, top_k=3)
    got = mlm.fill_mask(texts, top_k=3)
    assert got == [[[{"token": c.token, "token_id": c.token_id, "score": c.score} for c in m] for m in t]
                   for t in want]
    alone = mlm.fill_mask(texts[0], top_k=3)  # one string: its masks; equal alone and in a batch
    assert [[c["token"] for c in m] for m in alone] == [[c["token"] for c in m] for m in got[0]]
    assert np.allclose([[c["score"] for c in m] for m in alone], [[c["score"] for c in m] for m in got[0]], atol=1e-6)
    assert mlm.encode("the cat").shape == (32,)  # the encoder under any head embeds

    clf = bertkit.load(heads / "clf")
    assert clf.use == "classify"
    assert clf.classify(["the cat", "a dog"]) == inference.classify(heads / "clf", ["the cat", "a dog"])
    assert clf.classify("the cat")["label"] in ("neg", "pos")

    ce = bertkit.load(heads / "rerank")
    assert ce.use == "rerank" and ce.max_length == 20  # pairs read at the length it was trained at
    docs = ["the cat sees the ball", "market price rises", "a dog " * 30]
    ranked = ce.rerank("the cat", docs, return_documents=True)
    assert [{k: r[k] for k in ("index", "score")} for r in ranked] == inference.rerank(
        inference.Engine.load(heads / "rerank", use="rerank"), "the cat", docs)
    assert [r["text"] for r in ranked] == [docs[r["index"]] for r in ranked]

    ner = bertkit.load(heads / "ner")
    assert ner.ner(["the cat sees a dog"]) == inference.ner(heads / "ner", ["the cat sees a dog"])
    qa = bertkit.load(heads / "qa")
    answers = qa.qa("what does the cat see", "the cat sees a red ball in the park", top_k=2)
    assert answers == inference.qa(heads / "qa", ["what does the cat see"],
                                   ["the cat sees a red ball in the park"], top_k=2)[0]
    tokens = qa.tokenize("the cat")
    assert [t["text"] for t in tokens] == ["[CLS]", "the", "cat", "[SEP]"] and tokens[1]["start"] == 0
    assert [t["text"] for t in qa.tokenize(["the cat"], add_special_tokens=False)[0]] == ["the", "cat"]


def test_a_method_the_head_cannot_do_names_the_head(heads, minilm_dir):
    with pytest.raises(ValueError, match=r"is a bare encoder without a task head .*fill_mask needs a masked-LM"):
        bertkit.load(minilm_dir).fill_mask("a [MASK]")
    with pytest.raises(ValueError, match="is a sequence classifier .*rerank needs a cross-encoder"):
        bertkit.load(heads / "clf").rerank("q", ["d"])
    with pytest.raises(ValueError, match="is a masked-language model .*qa needs a question-answering head"):
        bertkit.load(heads / "mlm").qa("q", "c")
    with pytest.raises(NotADirectoryError, match="is a file, not a model directory; pass its folder"):
        bertkit.load(minilm_dir / "config.json")
    with pytest.raises(ValueError, match="batch_size must be positive"):
        bertkit.load(heads / "mlm").encode(["a"], batch_size=0)


def test_prompts_and_truncation_are_sentence_transformers(minilm_dir, tmp_path):
    """A model whose config_sentence_transformers.json names prompts, a default prompt and a
    truncate_dim: encode equals sentence-transformers' with the same options."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    model_dir = tmp_path / "minilm"
    shutil.copytree(minilm_dir, model_dir)
    config = json.loads((model_dir / "config_sentence_transformers.json").read_text())
    config.update(prompts={"query": "query: ", "passage": "passage: "}, default_prompt_name="passage")
    (model_dir / "config_sentence_transformers.json").write_text(json.dumps(config))
    ours, theirs = bertkit.load(model_dir), SentenceTransformer(str(model_dir), device="cpu")
    texts = TEXTS[:3]
    for options in ({}, {"prompt_name": "query"}, {"prompt": "search: "}, {"truncate_dim": 128},
                    {"truncate_dim": 128, "normalize_embeddings": True}):
        got, want = ours.encode(texts, **options), theirs.encode(texts, **options)
        assert got.shape == want.shape, options
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(options))
    assert not np.allclose(ours.encode(texts), ours.encode(texts, prompt=""))  # the default prompt applies
    with pytest.raises(ValueError, match="unknown prompt_name 'nope'; this model's prompts: 'query', 'passage'"):
        ours.encode(texts, prompt_name="nope")


def test_sentence_transformers_6_pooling_files_are_read(tmp_path):
    """sentence-transformers 6 writes {"pooling_mode": "cls"}; older releases one boolean per mode."""
    import json

    from sentence_transformers import SentenceTransformer, models

    from bertkit.encoder.model import BertModel

    torch.manual_seed(0)
    BertModel(tiny_config()).save_pretrained(tmp_path / "bert")
    save_tokenizer(tmp_path / "bert")
    st = SentenceTransformer(modules=[models.Transformer(str(tmp_path / "bert")),
                                      models.Pooling(32, pooling_mode="cls")], device="cpu")
    st.save(str(tmp_path / "st"))
    assert json.loads((tmp_path / "st" / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "cls"
    texts = ["the cat sees a red ball", "a dog"]
    np.testing.assert_allclose(bertkit.load(tmp_path / "st").encode(texts), st.encode(texts), atol=1e-5)
    config_file = tmp_path / "st" / "1_Pooling" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "include_prompt": False}))
    with pytest.raises(ValueError, match="include_prompt false"):  # ST would pool without the prompt
        bertkit.load(tmp_path / "st").encode(texts, prompt="query: ")

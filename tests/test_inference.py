"""Fill-mask and embeddings, checked against transformers and sentence-transformers."""

from __future__ import annotations

import pytest
import torch
import transformers

from bertkit.config import BertConfig
from bertkit.inference import embed, fill_mask, length_sorted_batches
from bertkit.model import BertForMaskedLM
from bertkit.tokenizer import BertTokenizer

SENTENCES = ["A man is playing a guitar.", "Someone plays an instrument on stage tonight.",
             "Stocks fell.", "The central bank raised interest rates by a quarter of a point."]


def test_mean_pooled_embeddings_match_sentence_transformers(minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    ours = embed(minilm_dir, None, SENTENCES, pooling="mean", normalize=True, batch_size=3)
    assert (ours - reference.cpu()).abs().max() <= 1e-5


def test_cls_pooling_and_order(minilm_dir):
    a = embed(minilm_dir, None, SENTENCES, pooling="cls", normalize=False, batch_size=2)
    b = embed(minilm_dir, None, list(reversed(SENTENCES)), pooling="cls", normalize=False, batch_size=3)
    assert torch.allclose(a, b.flip(0), atol=1e-5)


def test_fill_mask_matches_reference_probabilities(minilm_dir, tmp_path):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=tokenizer.vocab_size)).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    texts = ["paris is the [MASK] of france.", "the [MASK] sat on the [MASK] all day long."]
    results = fill_mask(tmp_path, None, texts, top_k=3)
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
            assert max(abs(c.prob - p) for c, p in zip(cands, top.values.tolist())) <= 1e-5


def test_fill_mask_errors(minilm_dir, tmp_path):
    with pytest.raises(ValueError, match="has no masked-LM head"):
        fill_mask(minilm_dir, None, ["a [MASK] b"])
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=tokenizer.vocab_size))
    with pytest.raises(ValueError, match="has no \\[MASK\\] token"):
        fill_mask(model, tokenizer, ["no mask here"])
    with pytest.raises(ValueError, match="text 0 is empty"):
        fill_mask(model, tokenizer, [" "])


def test_length_sorted_batches_cover_every_index_once():
    batches = list(length_sorted_batches([5, 1, 9, 3, 7], 2))
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    assert batches[0] == [2, 4]

"""PyLate's ColBERT vectors and scores for a tiny random model: the fixture tests/test_colbert_pylate.py
compares bertkit with.

Runs in PyLate's own virtual environment, never in bertkit's (PyLate pins sentence-transformers
and transformers versions of its own):

    python3 -m venv /work/venv-pylate
    /work/venv-pylate/bin/pip install torch==2.13.0
    /work/venv-pylate/bin/pip install --no-deps pylate==1.6.0   # its fast-plaid pins another torch
    /work/venv-pylate/bin/pip install -c <(echo torch==2.13.0) sentence-transformers==5.3.0 \
        "transformers<=5.3.0" datasets accelerate pandas ujson fastkmeans scipy
    /work/venv-pylate/bin/python tests/oracles/colbert_pylate.py            # the random model
    PYTHONPATH=src .venv/bin/python tests/oracles/colbert_pylate.py --make-trained  # bertkit trains one
    /work/venv-pylate/bin/python tests/oracles/colbert_pylate.py --trained  # PyLate reads it

Writes tests/fixtures/colbert_pylate/: model/ (a BERT of hidden 24 over a 92-token vocabulary,
seed 0, made a ColBERT by PyLate: [Q] / [D] added to the tokenizer, a Dense 24 → 12 without
bias, saved by `ColBERT.save`) and expected.npz (each setting's query and document vectors and
their MaxSim scores). With --trained, the directory trained/ (written by bertkit's
`finetune --task colbert`, see the test) is loaded by PyLate and its vectors are written to
trained.npz: the proof that PyLate reads what bertkit saves (--make-trained writes trained/,
in bertkit's environment).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "colbert_pylate"
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "in", "park", "what", "where", "is", "did",
         "bird", "sang", "tree", "blue", "red", "house", "river", "fish", "swim", "##s", "##ed", "##ing"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCTUATION = list(".,?!:;'-()\"")  # a few of string.punctuation: the rest map to [UNK]
QUERIES = ["where did the cat sit?", "blue fish swim in the river", "what sang in the tree",
           "dog", "the red house in the park on the river where a bird sang and fish swims"]
DOCUMENTS = ["The cat sat on the mat.", "A dog ran in the park!", "Blue fish swim, red fish swim.",
             "The bird sang in the tree; the river ran.", "house", "(the) red: house - blue?"]
# Each setting: PyLate's constructor arguments over the saved directory.
SETTINGS = {"default": {}, "attend": {"attend_to_expansion_tokens": True},
            "no_expansion": {"do_query_expansion": False}}


def build_model(out: Path) -> None:
    from pylate import models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = vocabulary()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.txt").write_text("\n".join(vocab) + "\n")
        tokenizer = BertTokenizerFast(vocab_file=str(Path(tmp) / "vocab.txt"), do_lower_case=True)
        torch.manual_seed(0)
        config = BertConfig(vocab_size=len(vocab), hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                            intermediate_size=37, max_position_embeddings=64)
        BertModel(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.manual_seed(0)
        model = models.ColBERT(model_name_or_path=tmp, embedding_size=12, query_length=10,
                               document_length=16, device="cpu")
        if out.exists():
            shutil.rmtree(out)
        model.save(str(out))


def vectors(model_dir: Path, **settings) -> dict[str, np.ndarray]:
    """Flattened vectors of QUERIES and DOCUMENTS, their per-text lengths and the (Q, D) scores."""
    from pylate import models
    from pylate.scores import colbert_scores

    model = models.ColBERT(model_name_or_path=str(model_dir), device="cpu", **settings)
    queries = model.encode(QUERIES, is_query=True, convert_to_numpy=True)
    documents = model.encode(DOCUMENTS, is_query=False, convert_to_numpy=True)
    scores = np.array([[float(colbert_scores(torch.from_numpy(q)[None], torch.from_numpy(d)[None])[0, 0])
                        for d in documents] for q in queries])
    return {"queries": np.concatenate(queries), "query_lengths": np.array([len(q) for q in queries]),
            "documents": np.concatenate(documents), "document_lengths": np.array([len(d) for d in documents]),
            "scores": scores}


def vocabulary() -> list[str]:
    letters = list("abcdefghijklmnopqrstuvwxyz")
    return list(dict.fromkeys(SPECIALS + PUNCTUATION + WORDS + letters + ["##" + c for c in letters]))


def make_trained(out: Path) -> None:
    """bertkit's side (run in bertkit's environment): a plain random BERT over the same
    vocabulary, made a ColBERT by one epoch of `finetune --task colbert`, saved in `out`."""
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.model import BertModel
    from bertkit.train.colbert import finetune_colbert

    vocab = vocabulary()
    with tempfile.TemporaryDirectory() as tmp:
        plain, train = Path(tmp) / "plain", Path(tmp) / "train.jsonl"
        torch.manual_seed(1)
        BertModel(BertConfig(vocab_size=len(vocab), hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                             intermediate_size=37, max_position_embeddings=64)).save_pretrained(plain)
        BertTokenizer.from_vocab({t: i for i, t in enumerate(vocab)}).save_pretrained(plain)
        train.write_text("".join(f'{{"query": "{q}", "positive": "{d}"}}\n'
                                 for q, d in zip(QUERIES, DOCUMENTS)))
        finetune_colbert(model=str(plain), train=str(train), out_dir=str(out), epochs=1, batch_size=3, lr=1e-3,
                         max_length=16, query_length=10, embedding_size=12, mine="none", progress=False,
                         overwrite=True)
    for name in ("finetune_config.json", "eval.json", "steps.jsonl"):  # the run's records, with its temporary paths
        (out / name).unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trained", action="store_true", help="read fixtures/colbert_pylate/trained/ instead")
    parser.add_argument("--make-trained", action="store_true",
                        help="write fixtures/colbert_pylate/trained/ with bertkit (run in bertkit's environment)")
    args = parser.parse_args()
    if args.make_trained:
        make_trained(HERE / "trained")
        print(f"wrote {HERE / 'trained'}")
        return
    if args.trained:
        found = vectors(HERE / "trained")
        np.savez(HERE / "trained.npz", **found)
        print(f"wrote {HERE / 'trained.npz'}")
        return
    HERE.mkdir(parents=True, exist_ok=True)
    build_model(HERE / "model")
    for name in ("README.md",):  # PyLate's model card: large, and nothing a test reads
        (HERE / "model" / name).unlink(missing_ok=True)
    expected = {}
    for name, settings in SETTINGS.items():
        expected.update({f"{name}/{key}": value for key, value in vectors(HERE / "model", **settings).items()})
    np.savez(HERE / "expected.npz", **expected)
    print(f"wrote {HERE / 'model'} and {HERE / 'expected.npz'}")


if __name__ == "__main__":
    main()

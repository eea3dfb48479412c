"""FlagEmbedding's BGE-M3 outputs on a tiny random model: the fixture `tests/test_m3.py` compares
bertkit's with (tests/fixtures/m3_flag/).

FlagEmbedding brings its own transformers and sentence-transformers, so it lives in a venv of its
own, never in bertkit's:

    python3 -m venv /work/venv-flag
    /work/venv-flag/bin/pip install torch==2.13.0
    /work/venv-flag/bin/pip install FlagEmbedding==1.4.2
    PYTHONPATH=tests /work/venv-flag/bin/python tests/oracles/m3_flag.py tests/fixtures/m3_flag

It writes, into OUT (replacing what is there):
  model/        a tiny random XLM-RoBERTa (transformers' XLMRobertaModel, seed 0, hidden 36, a
                SentencePiece Unigram tokenizer trained by `tokenizers`), plus BGE-M3's two heads
                saved as FlagEmbedding saves them: colbert_linear.pt (Linear 36 -> 36) and
                sparse_linear.pt (Linear 36 -> 1), seed 1
  outputs.json  the texts; BGEM3FlagModel.encode's dense_vecs, lexical_weights and colbert_vecs
                (return_dense / return_sparse / return_colbert_vecs, all texts in one batch);
                compute_score's five modes for the pairs, with each pair in a batch of its own
                (batch_size=1) and all pairs in one batch, under default and given weights;
                the versions of FlagEmbedding, transformers and torch.
Nothing downloads. CPU, fp32 (use_fp16=False).
"""

from __future__ import annotations

import json
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

import torch

from family_fixtures import make_checkpoint

TEXTS = ["The cat sat on the mat.",
         "The quick brown fox jumps over the lazy dog, and the dog sleeps.",
         "Paris is the capital of France.",
         "北京是中国的首都。",
         "Ça va très bien, merci à vous.",
         "hello world hello"]
PAIRS = [("Where is the cat?", "The cat sat on the mat."),
         ("capital of France", "Paris is the capital of France."),
         ("capital of France", "Berlin is the capital of Germany, and Paris that of France."),
         ("北京", "北京是中国的首都。"),
         ("hello", "The quick brown fox jumps over the lazy dog.")]
WEIGHTS = [0.4, 0.2, 0.4]  # dense, sparse, colbert: BGE-M3's model card's example


def build_model(out: Path) -> Path:
    """The tiny XLM-R and its two M3 heads, as FlagEmbedding's runner reads them."""
    model_dir = make_checkpoint("xlm-roberta", out / "model", kind="Model", seed=0)
    torch.manual_seed(1)
    hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]
    colbert, sparse = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        sparse.bias.fill_(0.1)  # most tokens above the ReLU, so the lexical weights are many
    torch.save(colbert.state_dict(), model_dir / "colbert_linear.pt")
    torch.save(sparse.state_dict(), model_dir / "sparse_linear.pt")
    return model_dir


def floats(x) -> list:
    return x.astype("float64").tolist()


def main(out: Path) -> None:
    from FlagEmbedding import BGEM3FlagModel

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model_dir = build_model(out)
    model = BGEM3FlagModel(str(model_dir), use_fp16=False, devices="cpu")
    got = model.encode(TEXTS, batch_size=len(TEXTS), return_dense=True, return_sparse=True,
                       return_colbert_vecs=True)
    scores = {
        "alone": model.compute_score(PAIRS, batch_size=1),
        "alone_weighted": model.compute_score(PAIRS, batch_size=1, weights_for_different_modes=WEIGHTS),
        "batched": model.compute_score(PAIRS, batch_size=len(PAIRS)),
    }
    result = {
        "versions": {name: version(name) for name in ("FlagEmbedding", "transformers", "torch")},
        "texts": TEXTS, "pairs": PAIRS, "weights": WEIGHTS,
        "dense": floats(got["dense_vecs"]),
        "sparse": [{k: float(v) for k, v in w.items()} for w in got["lexical_weights"]],
        "colbert": [floats(v) for v in got["colbert_vecs"]],
        "scores": {name: {mode: [float(s) for s in values] for mode, values in modes.items()}
                   for name, modes in scores.items()},
    }
    (out / "outputs.json").write_text(json.dumps(result) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(TEXTS)} texts, {len(PAIRS)} pairs, FlagEmbedding {result['versions']['FlagEmbedding']}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/m3_flag"))

"""Every family through the engine at bf16, int8 and int8-static, within BERT's stated tolerances.

BERT's tolerances (tests/test_inference.py, tests/test_int8_static.py): against the fp32 engine, a
minimum cosine of mean-pooled states of 0.999 at bf16 and 0.99 at int8 / int8-static, and an int8
result that does not depend on its batch. Here each family's own layers are checked the same way on
a tiny random checkpoint made by transformers: RoBERTa's positions, XLM-R / CamemBERT SentencePiece,
ALBERT's shared layers, DistilBERT, ERNIE's task-type table, ELECTRA's embedding projection, MPNet's
relative bias, DeBERTa-v2 / v3's disentangled attention and ModernBERT's layers, each packed. fp32 itself equals
transformers (tests/test_family.py, tests/test_family_deberta.py), so this is the precision's error
alone.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from bertkit.backend.int8 import Int8EncoderLayer, Int8Linear
from bertkit.backend.int8_static import StaticInt8Linear
from bertkit.inference import embed
from bertkit.inference.engine import Engine

from family_fixtures import CORPUS, PREFIX, SCRIPTS, make_checkpoint
from modern_fixtures import make_modernbert

transformers = pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

import test_family_deberta as deberta  # noqa: E402  (after the skips: it needs both)

FAMILIES = (*PREFIX, "deberta-v2", "deberta-v3", "modernbert")
TEXTS = list(dict.fromkeys(CORPUS + SCRIPTS))  # 12 texts in several scripts
BOUND = {"bf16": 0.999, "int8": 0.99, "int8-static": 0.99}


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    """family → a saved transformers base model with its tokenizer files, made on first use."""
    root = tmp_path_factory.mktemp("families")
    made: dict[str, object] = {}

    def get(family: str):
        if family not in made:
            out = root / family
            if family.startswith("deberta"):
                spm = made.get("spm") or deberta.spm_dir(root / "spm")
                made["spm"] = spm
                vocab = len(transformers.AutoTokenizer.from_pretrained(spm))
                deberta.make(family.split("-")[1], "Model", out, vocab_size=vocab)
                for name in ("spm.model", "tokenizer_config.json"):
                    shutil.copy(spm / name, out / name)
            elif family == "modernbert":
                make_modernbert(out, kind="Model")
            else:
                make_checkpoint(family, out, kind="Model")
            made[family] = out
        return made[family]

    return get


def quantized(layer: torch.nn.Module, precision: str) -> bool:
    """Whether `layer` runs in int8: BERT-style layers become one fused Int8EncoderLayer, ModernBERT's
    keep their class with Int8Linear projections; int8-static swaps each Linear for its own kind."""
    kind = StaticInt8Linear if precision == "int8-static" else Int8Linear
    return isinstance(layer, Int8EncoderLayer) or any(isinstance(module, kind) for module in layer.modules())


def states(engine: Engine, texts: list[str]) -> torch.Tensor:
    return torch.as_tensor(embed(engine, texts, pooling="mean", normalize=False)).float()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_precision_stays_within_berts_tolerance(directories, family):
    directory = directories(family)
    exact = states(Engine.load(directory, precision="fp32"), TEXTS)
    for precision, bound in BOUND.items():
        extra = {"calibration": TEXTS} if precision == "int8-static" else {}
        engine = Engine.load(directory, precision=precision, **extra)
        if precision != "bf16":  # the family's layers were quantized, not left in fp32
            assert all(quantized(layer, precision) for layer in engine.model.layers), precision
        got = states(engine, TEXTS)
        cosine = torch.nn.functional.cosine_similarity(got, exact)
        assert float(cosine.min()) >= bound, (family, precision, cosine.min())
        if precision == "int8":  # per-token activation scales: a text's result is its own
            alone = torch.cat([states(engine, [text]) for text in TEXTS[:4]])
            assert float((alone - got[:4]).abs().max()) <= 1e-6, family

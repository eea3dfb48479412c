"""The CLI error contract, over every command × every class of bad input.

For each command of `bertkit.cli` (taken from the parser, so a new command joins the matrix: it
fails `test_every_command_has_a_contract_spec` until it has a `SPECS` or `FILE_FORMS` entry) and
each bad-input class, `bertkit.cli.main` must return 2, print exactly one error line `bertkit CMD: error: ...`
naming the bad value, no traceback, and leave every file as it was: nothing the user had is
overwritten or deleted, and no partial output is left. A command that takes no argument of a
class is skipped for it with the reason from `not_applicable` / `SPECIAL_CASES`, which a test also
checks.

Unwritable output: chmod cannot stop root, so the output goes under /sys, which refuses new
entries to root as well (EACCES; EROFS in most containers).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch

from bertkit import cli

from pretrain_fixtures import TINY_MODEL, make_data

CASES = ("unwritable_output", "output_under_file", "existing_output", "non_utf8_input",
         "binary_input", "missing_input", "dir_for_file", "dir_for_input", "file_for_model",
         "out_suffix", "wrong_model_kind", "truncated_weights", "adapter_without_base")
# What the error line must say, beyond naming the bad value, where a vaguer message once misled:
# a file given as the model ("utf-8 codec can't decode", "no '[CLS]' token"), a directory given as
# the input ("does not exist", "suffix ''"), a .csv output silently filled with JSON Lines.
SAYS = {"file_for_model": "is a file, not a model directory", "dir_for_input": "is a directory",
        "out_suffix": ".jsonl", "adapter_without_base": "pass --base DIR"}
# What an adapter's adapter_config.json names as its base in the adapter_without_base case: a
# path of another machine, as an adapter copied from elsewhere has.
ELSEWHERE = "/elsewhere/models/base-model"


@dataclass
class Spec:
    """How to run one command well; each bad-input case replaces one slot.

    argv: the command line with slots {OUT}, {INPUT}, {MODEL} and fixture names ({PT}, {CLF}, ...).
    out: "file" | "dir" | None: what {OUT} is. existing: names that make {OUT} an existing output.
    input_suffix: suffix of the {INPUT} file (None: the command reads no input file).
    input_default: the good {INPUT} fixture. model_default: the good {MODEL} fixture (None: none).
    wrong_model: the fixture of the wrong kind for {MODEL}. reads_weights: False when {MODEL} is
    only a tokenizer source. model_args: arguments holding {MODEL} that only the model cases add
    (pretrain's --init, which would hide --model {INPUT}).
    """

    argv: list[str]
    out: str | None = None
    existing: list[str] = field(default_factory=list)
    input_suffix: str | None = None
    input_default: str | None = None
    model_default: str | None = None
    wrong_model: str = "TOKENIZER_ONLY"
    reads_weights: bool = True
    model_args: list[str] = field(default_factory=list)  # added for the model cases only


SPECS: dict[str, Spec] = {
    "info": Spec(["info", "{MODEL}"], model_default="PT"),
    "fill-mask": Spec(["fill-mask", "{MODEL}", "the cat [MASK] the ball"], model_default="PT"),
    "embed": Spec(["embed", "{MODEL}", "the cat sees the ball"], model_default="PT"),
    "pretrain": Spec(["pretrain", "--data", "{DATA}", "--out", "{OUT}", "--model", "{INPUT}",
                      "--max-steps", "1", "--batch-size", "8", "--no-progress"],
                     out="dir", existing=["metrics.jsonl"], input_suffix=".json",
                     input_default="MODEL_JSON", model_default="PT", model_args=["--init", "{MODEL}"]),
    "plot": Spec(["plot", "{INPUT}", "--out", "{OUT}"], out="file", existing=["curves.png"],
                 input_suffix="metrics.jsonl", input_default="RUN"),
    "quickstart": Spec(["quickstart", "--out", "{OUT}", "--steps", "1"], out="dir",
                       existing=["notes.txt"]),
    "tokenizer train": Spec(["tokenizer", "train", "--corpus", "{INPUT}", "--vocab-size", "60",
                             "--out", "{OUT}"], out="dir", existing=["vocab.txt"],
                            input_suffix=".txt", input_default="CORPUS"),
    "prepare": Spec(["prepare", "--corpus", "{INPUT}", "--tokenizer", "{MODEL}", "--out", "{OUT}",
                     "--workers", "1", "--max-seq-len", "32"], out="dir", existing=["meta.json"],
                    input_suffix=".txt", input_default="CORPUS", model_default="PT",
                    wrong_model="DATA", reads_weights=False),
    "mask-demo": Spec(["mask-demo", "the cat sees the ball", "--tokenizer", "{MODEL}"],
                      model_default="PT", wrong_model="DATA", reads_weights=False),
    "finetune": Spec(["finetune", "--task", "classify", "--model", "{MODEL}", "--train", "{INPUT}",
                      "--out", "{OUT}", "--epochs", "1", "--max-length", "16", "--no-progress"],
                     out="dir", existing=["config.json", "model.safetensors"],
                     input_suffix=".jsonl", input_default="TRAIN", model_default="PT"),
    "distill": Spec(["distill", "--task", "classify", "--teacher", "{MODEL}", "--train", "{INPUT}",
                     "--out", "{OUT}", "--student-layers", "1", "--epochs", "1", "--max-length", "16",
                     "--no-progress"],
                    out="dir", existing=["distill_config.json"], input_suffix=".jsonl",
                    input_default="TRAIN", model_default="CLF", wrong_model="PT"),
    "predict": Spec(["predict", "--model", "{MODEL}", "--input", "{INPUT}", "--out", "{OUT}",
                     "--no-progress"], out="file", existing=["predictions.jsonl"],
                    input_suffix=".txt", input_default="TEXTS", model_default="CLF",
                    wrong_model="PT"),
    "datasets": Spec(["datasets", "zh-sentiment", "--out", "{OUT}"], out="dir",
                     existing=["zh-sentiment.train.jsonl"]),
    # Every case fails while loading the model, before anything listens (port 0 regardless).
    "serve": Spec(["serve", "{MODEL}", "--port", "0"], model_default="PT"),
    # Likewise: the models load (or fail) before the page listens.
    "explore": Spec(["explore", "{MODEL}", "--port", "0"], model_default="PT"),
    "index": Spec(["index", "{INPUT}", "--model", "{MODEL}", "--out", "{OUT}", "--no-progress"],
                  out="dir", existing=["index.json"], input_suffix=".txt", input_default="TEXTS",
                  model_default="PT"),
    # Every case fails before the exporter runs (output checked, model loaded, tools found).
    "export": Spec(["export", "{MODEL}", "--format", "onnx", "--out", "{OUT}"], out="dir",
                   existing=["config.json"], model_default="PT"),
    # The BEIR-directory errors are tested in tests/test_evaluation.py; here the file form.
    "eval": Spec(["eval", "{MODEL}", "--sts", "{INPUT}"], input_suffix=".jsonl", input_default="STS",
                 model_default="PT"),
    "mine-negatives": Spec(["mine-negatives", "--input", "{INPUT}", "--model", "{MODEL}", "--out", "{OUT}"],
                           out="file", existing=["mined.jsonl"], input_suffix=".jsonl", input_default="PAIRS",
                           model_default="PT"),
    # Calibration text in, the model with its int8-static scales out.
    "calibrate": Spec(["calibrate", "{MODEL}", "--calibration", "{INPUT}", "--out", "{OUT}"], out="dir",
                      existing=["config.json"], input_suffix=".txt", input_default="TEXTS", model_default="PT"),
    # The index is good in every case; the model slot is the reranker.
    "search": Spec(["search", "{INDEX}", "the cat", "--rerank", "{MODEL}"], model_default="RERANK",
                   wrong_model="PT"),
}


def _use(name: str, model: str, *extra: str, input_default: str = "TEXTS",
         input_suffix: str = ".txt") -> Spec:
    return Spec([name, "{MODEL}", "--input", "{INPUT}", "--out", "{OUT}", "--no-progress", *extra],
                out="file", existing=["results.jsonl"], input_suffix=input_suffix,
                input_default=input_default, model_default=model)


# The uses of a model over a file (--input FILE --out FILE): tested in this form wherever the
# command's parser has --input, which also reads and writes files the way SPECS' forms do not.
FILE_FORMS: dict[str, Spec] = {
    "embed": _use("embed", "PT"),
    "fill-mask": _use("fill-mask", "PT", input_default="MASK_TEXTS"),
    "classify": _use("classify", "CLF"),
    "ner": _use("ner", "NER"),
    "qa": _use("qa", "QA", input_default="QA_ROWS", input_suffix=".jsonl"),
    "rerank": _use("rerank", "RERANK", "--query", "a cat"),
}

# Flags that change what a command reads and writes, each tried as a form of its own ("COMMAND
# --FLAG"): BGE-M3's outputs need its head files, so the wrong model is one without them.
FLAG_FORMS: dict[str, Spec] = {
    "embed --output": replace(_use("embed", "M3", "--output", "dense,sparse,colbert"), wrong_model="PT"),
    "embed --calibration": _use("embed", "PT", "--precision", "int8-static", "--calibration", "{TEXTS}"),
}

# (command, case) → why, where the rules in `not_applicable` do not say it already.
SPECIAL_CASES: dict[tuple[str, str], str] = {
    # A corpus source may be a directory (its files are read), so a directory is not wrong there.
    ("tokenizer train", "dir_for_file"): "a directory is a valid corpus source",
    ("prepare", "dir_for_file"): "a directory is a valid corpus source",
    ("quickstart", "missing_input"): "its corpus is built in",
    ("datasets", "missing_input"): "its data are built in",
    ("info", "file_for_model"): "a config.json file is a valid model description there",
    ("prepare", "file_for_model"): "a tokenizer may be one vocab.txt or tokenizer.json file",
    ("mask-demo", "file_for_model"): "a tokenizer may be one vocab.txt or tokenizer.json file",
    ("plot", "dir_for_input"): "its input is a run directory",
    ("plot", "out_suffix"): "it writes a picture, named as the user likes",
}


def has_option(command: str, option: str) -> bool:
    parser = cli.command_parsers(cli.build_parser()).get(command)
    return parser is not None and any(option in a.option_strings for a in parser._actions)


def spec_for(command: str) -> Spec:
    """The command's file form where it reads --input files, else its SPECS entry."""
    if command in FLAG_FORMS:
        return FLAG_FORMS[command]
    if command in FILE_FORMS and (command not in SPECS or has_option(command, "--input")):
        return FILE_FORMS[command]
    return SPECS[command]


def not_applicable(command: str, spec: Spec) -> dict[str, str]:
    """case → why `command` cannot be tried with it (it has no argument of that kind)."""
    skip = {}
    if spec.out is None:
        for case in ("unwritable_output", "output_under_file", "existing_output"):
            skip[case] = "writes no files (prints to stdout)"
    if spec.input_suffix is None:
        for case in ("non_utf8_input", "binary_input"):
            skip[case] = "reads no input file (texts come from the command line)"
    if spec.model_default is None:
        for case in ("wrong_model_kind", "truncated_weights"):
            skip[case] = "takes no model directory"
    elif not spec.reads_weights:
        skip["truncated_weights"] = "reads only the tokenizer files, not weights"
    if spec.input_suffix is None and spec.model_default is None:
        skip["missing_input"] = "reads no input at all"
    if spec.input_suffix is None and spec.out != "file":
        skip["dir_for_file"] = "has no file argument"
    if spec.out != "file" or spec.input_suffix is None:
        skip["dir_for_input"] = "a directory as its input is the dir_for_file case" if spec.input_suffix \
            else "reads no input file"
    if spec.model_default is None:
        skip["file_for_model"] = "takes no model directory"
    if spec.out != "file" or spec.input_suffix is None:
        skip["out_suffix"] = "writes no results file"
    if not has_option(command, "--base"):
        skip["adapter_without_base"] = "takes no LoRA adapter directory as its model"
    skip.update({case: why for (name, case), why in SPECIAL_CASES.items() if name == command})
    return skip


# ---------------------------------------------------------------------------------------------
# fixtures: tiny models and files, made once
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.heads import (
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from bertkit.encoder.model import BertForPreTraining
    from bertkit.train import finetune as ft

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("assets")
    data = make_data(root, n_docs=60, vocab_size=120, max_seq_len=32)
    tokenizer_dir = root / "tokenizer"
    pt = root / "pt"
    torch.manual_seed(0)
    vocab = BertTokenizer.from_pretrained(tokenizer_dir).vocab_size
    BertForPreTraining(BertConfig(**{**TINY_MODEL, "vocab_size": vocab})).save_pretrained(pt)
    BertTokenizer.from_pretrained(tokenizer_dir).save_pretrained(pt)
    train = root / "train.jsonl"
    rows = [{"text": f"the cat sees {'the red ball' if i % 2 else 'a blue car'}",
             "label": "pos" if i % 2 else "neg"} for i in range(16)]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    clf = root / "clf"
    ft.finetune("classify", pt, train, clf, epochs=1, max_length=16, batch_size=8, progress=False)
    texts = root / "texts.txt"
    texts.write_text("the cat sees the ball\na dog likes a car\n", encoding="utf-8")
    corpus = root / "corpus.txt"
    corpus.write_text("the cat sees the red ball in the park.\na dog likes a blue car.\n",
                      encoding="utf-8")
    model_json = root / "model.json"
    model_json.write_text(json.dumps(TINY_MODEL), encoding="utf-8")
    run = root / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "split": "train", "loss": 5.0,
                                                   "lr": 1e-4}) + "\n", encoding="utf-8")
    tokenizer_only = root / "tokenizer_only"
    shutil.copytree(tokenizer_dir, tokenizer_only)
    # Untrained heads of the other uses: the contract concerns inputs, not answers.
    config = BertConfig(**{**TINY_MODEL, "vocab_size": vocab})
    heads = {"NER": BertForTokenClassification(config.replace(id2label={0: "O", 1: "B-X", 2: "I-X"})),
             "QA": BertForQuestionAnswering(config),
             "RERANK": BertForSequenceClassification(config.replace(num_labels=1))}
    for name, model in heads.items():
        model.save_pretrained(root / name.lower())
        BertTokenizer.from_pretrained(tokenizer_dir).save_pretrained(root / name.lower())
    sts = root / "sts.jsonl"
    sts.write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in
                           [("the cat sees the ball", "a cat sees a ball", 4), ("a dog likes a car", "the ball", 1)]),
                   encoding="utf-8")
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in
                             [("cat", "the cat sees the ball"), ("dog", "a dog likes a car"), ("ball", "the red ball"),
                              ("car", "a blue car"), ("park", "the park"), ("tree", "a big tree")]), encoding="utf-8")
    mask_texts = root / "mask_texts.txt"
    mask_texts.write_text("the cat [MASK] the ball\n", encoding="utf-8")
    qa_rows = root / "qa.jsonl"
    qa_rows.write_text(json.dumps({"question": "what does the cat see?",
                                   "context": "the cat sees the red ball."}) + "\n", encoding="utf-8")
    from bertkit.encoder.m3 import M3Heads, write_m3_heads

    # A LoRA adapter over PT whose adapter_config.json names a base that is not on this machine.
    from bertkit.train import lora

    adapted = BertForSequenceClassification.from_pretrained(pt, num_labels=2)
    lora.apply_lora(adapted, lora.LoraSpec(r=2, alpha=4.0, dropout=0.0, targets=("query", "value")))
    lora.save_adapters(adapted, root / "adapter", base_model=ELSEWHERE)
    from bertkit.retrieval import build_index

    shutil.copytree(pt, root / "m3")  # BGE-M3's layout: an encoder and its two head files
    write_m3_heads(M3Heads(config.hidden_size, 17), root / "m3")
    build_index(texts, pt, root / "index", progress=False)
    torch.set_num_threads(before)
    return {"PT": pt, "CLF": clf, "DATA": data, "TRAIN": train, "TEXTS": texts, "CORPUS": corpus,
            "INDEX": root / "index", "MODEL_JSON": model_json, "RUN": run, "TOKENIZER_ONLY": tokenizer_only,
            "MASK_TEXTS": mask_texts, "QA_ROWS": qa_rows, "STS": sts, "M3": root / "m3",
            "ADAPTER": root / "adapter", "PAIRS": pairs,
            **{name: root / name.lower() for name in heads}}


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every entry under `roots`: kind, mode and content hash (files), so any change shows."""
    found = {}
    for root in roots:
        for path in [root, *root.rglob("*")]:
            st = path.lstat()
            digest = hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else None
            found[str(path)] = (path.is_dir(), st.st_mode, digest)
    return found


def bad_input(case: str, tmp: Path, suffix: str) -> Path:
    """The input file (or directory) of one bad-input case."""
    if suffix.startswith("metrics"):  # plot reads RUN_DIR/metrics.jsonl: the bad file goes there
        run = tmp / "badrun"
        run.mkdir()
        inner = bad_input(case, run, ".jsonl") if case != "missing_input" else None
        if inner is not None:
            inner.rename(run / "metrics.jsonl")
        return run if case != "missing_input" else tmp / "no-such-run"
    path = tmp / f"bad{suffix}"
    if case == "non_utf8_input":
        path.write_bytes(b'{"text": "caf\xe9 cr\xe8me", "label": "pos"}\n' if suffix != ".txt"
                         else b"the caf\xe9 is nice\n")
    elif case == "binary_input":
        path.write_bytes(bytes(range(256)) * 8)
    elif case == "dir_for_file":
        path.mkdir()
    elif case == "missing_input":
        pass
    return path


def truncated_copy(model: Path, tmp: Path) -> Path:
    out = tmp / "truncated_model"
    shutil.copytree(model, out)
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return out


def build_argv(spec: Spec, case: str, assets: dict[str, Path], tmp: Path) -> tuple[list[str], str]:
    """The command line for `case`, and the value the error message must name."""
    values = {name: str(path) for name, path in assets.items()}
    values["OUT"] = str(tmp / ("out.png" if spec.argv[0] == "plot" else "out"))
    if spec.out == "file" and spec.argv[0] != "plot":
        values["OUT"] = str(tmp / spec.existing[0])
    if spec.input_default:
        values["INPUT"] = values[spec.input_default]
    if spec.model_default:
        values["MODEL"] = values[spec.model_default]
    named = None
    if case == "unwritable_output":
        values["OUT"] = named = f"/sys/bertkit-contract-test/{Path(values['OUT']).name}"
    elif case == "output_under_file":
        blocker = tmp / "blocker"
        blocker.write_text("the user's file\n")
        values["OUT"] = named = str(blocker / Path(values["OUT"]).name)
    elif case == "existing_output":
        out = Path(values["OUT"])
        if spec.out == "file":
            out.write_text("the user's results\n")
        else:
            out.mkdir()
            for name in spec.existing:
                (out / name).write_text("the user's file\n")
        named = str(out)
    elif case in ("non_utf8_input", "binary_input"):
        values["INPUT"] = str(bad_input(case, tmp, spec.input_suffix))
        named = Path(values["INPUT"]).name
    elif case == "missing_input":
        if spec.input_suffix is not None:
            values["INPUT"] = str(bad_input(case, tmp, spec.input_suffix))
            named = Path(values["INPUT"]).name
        else:
            values["MODEL"] = named = str(tmp / "no-such-model")
    elif case == "dir_for_file":
        if spec.out == "file":
            Path(values["OUT"]).mkdir()
            named = values["OUT"]
        else:
            values["INPUT"] = named = str(bad_input(case, tmp, spec.input_suffix))
    elif case == "dir_for_input":
        values["INPUT"] = named = str(bad_input("dir_for_file", tmp, spec.input_suffix))
    elif case == "file_for_model":
        values["MODEL"] = named = str(Path(values["MODEL"]) / "config.json")
    elif case == "out_suffix":
        values["OUT"] = named = str(tmp / "results.csv")
    elif case == "wrong_model_kind":
        values["MODEL"] = named = values[spec.wrong_model]
    elif case == "truncated_weights":
        values["MODEL"] = str(truncated_copy(Path(values["MODEL"]), tmp))
        named = "model.safetensors"
    elif case == "adapter_without_base":
        values["MODEL"], named = values["ADAPTER"], ELSEWHERE
    model_cases = ("wrong_model_kind", "truncated_weights", "file_for_model")
    template = spec.argv + (spec.model_args if case in model_cases else [])
    argv = [arg.format(**values) if "{" in arg else arg for arg in template]
    return argv, named


# ---------------------------------------------------------------------------------------------
# the matrix
# ---------------------------------------------------------------------------------------------
KNOWN = sorted(set(SPECS) | set(FILE_FORMS) | set(FLAG_FORMS))


def test_every_command_has_a_contract_spec():
    commands = set(cli.command_parsers(cli.build_parser()))
    missing = sorted(commands - set(KNOWN))
    assert not missing, (f"commands without an entry in tests/test_cli_contract.py SPECS or "
                         f"FILE_FORMS: {missing}; add one so the error contract is tested for them")


def test_not_applicable_is_explained():
    """Every skip names a real command and case and says why; no command skips everything."""
    for (name, case), why in SPECIAL_CASES.items():
        assert name in KNOWN and case in CASES and len(why) > 10
    for name in cli.command_parsers(cli.build_parser()):
        skip = not_applicable(name, spec_for(name))
        assert set(skip) <= set(CASES) and all(len(why) > 10 for why in skip.values())
        assert len(skip) < len(CASES), f"{name} is tried with no bad input at all"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", KNOWN)
def test_contract(command, case, assets, tmp_path, capsys, monkeypatch):
    name = command.split(" --")[0]  # a flag's form runs its command
    if name not in cli.command_parsers(cli.build_parser()):
        pytest.skip(f"{command}: not a command of this version of the CLI")
    spec = spec_for(command)
    why = not_applicable(command, spec).get(case)
    if why:
        pytest.skip(f"{command}: {why}")
    if case == "unwritable_output" and not _sys_refuses_writes():
        pytest.skip("/sys accepts new files here; no unwritable location to test with")
    monkeypatch.chdir(tmp_path)
    argv, named = build_argv(spec, case, assets, tmp_path)
    before = snapshot(tmp_path, assets["PT"].parent)
    threads = torch.get_num_threads()
    try:
        status = cli.main([*argv, "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2, f"{command} {case}: exit {status}\n{err}"
    assert "Traceback" not in err
    errors = [line for line in lines if line.startswith(f"bertkit {name}: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    # Lines before the error may only be the data readers' reports of the bad rows they skipped.
    assert all(line.endswith("skipped)") for line in lines[:-1]), err
    assert named in errors[0], f"the message does not name {named!r}: {errors[0]}"
    assert SAYS.get(case, "") in errors[0], f"the message does not say {SAYS[case]!r}: {errors[0]}"
    after = snapshot(tmp_path, assets["PT"].parent)
    assert after == before, f"files changed: {sorted(set(after.items()) ^ set(before.items()))[:5]}"


def _sys_refuses_writes() -> bool:
    try:
        Path("/sys/bertkit-contract-test").mkdir()
    except OSError:
        return True
    Path("/sys/bertkit-contract-test").rmdir()
    return False


# Flags that change what a command reads, beyond the matrix's one form per command.
LATE_INTERACTION = {  # rerank --late-interaction: case → (the model, the extra arguments, what the line names)
    "wrong_model_kind": ("{PT}", [], "is not a ColBERT model"),
    "missing_input": ("{TMP}/no-such-model", [], "no-such-model"),
    "file_for_model": ("{PT}/config.json", [], "is a file, not a model directory"),
    "file_input": ("{PT}", ["--input", "{TEXTS}", "--out", "{TMP}/r.jsonl"], "--input does not go with"),
}


@pytest.mark.parametrize("case", sorted(LATE_INTERACTION))
def test_rerank_late_interaction_contract(case, assets, tmp_path, capsys):
    model, extra, named = LATE_INTERACTION[case]
    values = {"PT": str(assets["PT"]), "TEXTS": str(assets["TEXTS"]), "TMP": str(tmp_path)}
    argv = ["rerank", model.format(**values), "--query", "a cat", "the cat sees the ball", "--late-interaction",
            *[arg.format(**values) for arg in extra], "--threads", "1"]
    before = snapshot(tmp_path, assets["PT"].parent)
    threads = torch.get_num_threads()
    try:
        status = cli.main(argv)
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("bertkit rerank: error: ")
    assert named.format(**values) in lines[0]
    assert snapshot(tmp_path, assets["PT"].parent) == before


# ---------------------------------------------------------------------------------------------
# bad values of single flags: one line naming the value (and the fix), nothing written
# ---------------------------------------------------------------------------------------------
_NEW_INDEX = ["index", "{TEXTS}", "--model", "{PT}", "--out", "{OUT}", "--no-progress"]
FLAG_CASES: dict[str, tuple[list[str], str]] = {
    "index --vector-dtype on faiss": ([*_NEW_INDEX, "--vector-dtype", "int8", "--backend", "faiss-hnsw"],
                                      "--vector-dtype int8 is for the exact backend"),
    "index --rescore-multiplier 0": ([*_NEW_INDEX, "--vector-dtype", "binary", "--rescore-multiplier", "0"],
                                     "--rescore-multiplier 0"),
    "index --rescore-multiplier on floats": ([*_NEW_INDEX, "--rescore-multiplier", "3"],
                                             "--rescore-multiplier 3 re-scores int8 or binary codes"),
    "index --no-float-rescore on floats": ([*_NEW_INDEX, "--no-float-rescore"],
                                           "--no-float-rescore re-scores int8 or binary codes"),
    "index --multi-vector on an update": (["index", "--out", "{INDEX}", "--delete", "d0", "--multi-vector"],
                                          "--multi-vector token-states with --upsert / --delete"),
    "index --multi-vector KIND": ([*_NEW_INDEX, "--multi-vector", "splade-tokens"], "'splade-tokens'"),
    "index --multi-vector colbert on a dense model": ([*_NEW_INDEX, "--multi-vector", "colbert"],
                                                      "is not a ColBERT model"),
    "index --mv-nbits": ([*_NEW_INDEX, "--multi-vector", "--mv-nbits", "3"], "--mv-nbits 3"),
    "index --mv-centroids": ([*_NEW_INDEX, "--multi-vector", "--mv-centroids", "0"], "--mv-centroids 0"),
    "search --multi-vector without a side": (["search", "{INDEX}", "the cat", "--multi-vector"],
                                             "has no multi-vector side"),
    "search --mv-nprobe": (["search", "{INDEX}", "the cat", "--multi-vector", "--mv-nprobe", "0"], "--mv-nprobe 0"),
    "search --rescore-multiplier": (["search", "{INDEX}", "the cat", "--rescore-multiplier", "0"],
                                    "rescore multiplier 0"),
    "search --hybrid weighted --systems": (["search", "{INDEX}", "the cat", "--hybrid", "weighted", "--systems",
                                            "dense,multivector"], "has no multi-vector side"),
}
# Flags whose bad values argparse refuses by their choices (usage and error, exit 2).
CHOICE_FLAGS = {("index", "--vector-dtype"): {"float32", "int8", "binary"},
                ("index", "--bm25-cjk"): {"bigram", "jieba"}, ("search", "--hybrid"): {"rrf", "zscore", "weighted"}}


@pytest.mark.parametrize("name", sorted(FLAG_CASES))
def test_bad_flag_values(name, assets, tmp_path, capsys):
    template, says = FLAG_CASES[name]
    values = {key: str(path) for key, path in assets.items()} | {"OUT": str(tmp_path / "out")}
    before = snapshot(tmp_path, assets["INDEX"])
    status = cli.main([arg.format(**values) if "{" in arg else arg for arg in template] + ["--threads", "1"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith(f"bertkit {template[0]}: error: ") and says in lines[0], err
    assert snapshot(tmp_path, assets["INDEX"]) == before


def test_choice_flags_offer_their_values():
    for (command, flag), values in CHOICE_FLAGS.items():
        parser = cli.command_parsers(cli.build_parser())[command]
        (action,) = [a for a in parser._actions if flag in a.option_strings]
        assert set(action.choices) == values


@pytest.mark.parametrize("task", ["embed", "rerank"])
def test_finetune_resume_of_embed_and_rerank(task, assets, tmp_path, capsys):
    """--resume is taken by embed and rerank as by every fine-tuning task: into a new OUT the run
    starts from step 0; over a finished run it is one line naming --overwrite, nothing changed."""
    argv = ["finetune", "--task", task, "--model", str(assets["PT"]), "--train", str(assets["PAIRS"]),
            "--out", str(tmp_path / "out"), "--epochs", "1", "--batch-size", "2", "--max-length", "16",
            "--no-progress", "--resume", "--threads", "1"]
    threads = torch.get_num_threads()
    try:
        assert cli.main(argv) == 0, capsys.readouterr().err
        capsys.readouterr()
        before = snapshot(tmp_path)
        status = cli.main(argv)
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("bertkit finetune: error: ") and "finished run" in lines[0]
    assert "--overwrite" in lines[0] and snapshot(tmp_path) == before

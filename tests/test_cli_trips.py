"""What tripped a new user on the command line, each pinned: messages that name a flag the command
takes, and a listing that answers at once."""

from __future__ import annotations

import json
import re

import pytest

from bertkit import cli


def test_an_unknown_suffix_names_a_flag_the_command_takes(tmp_path, capsys, minilm_dir):
    data = tmp_path / "texts.bin"
    data.write_text("a text\nanother text\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert cli.main(["embed", str(minilm_dir), "--input", str(data), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    flag = re.search(r"name its format with (--[\w-]+) ([\w|]+)", err)
    assert flag and flag.group(1) == "--input-format", err
    parsers = cli.command_parsers(cli.build_parser())
    for command in ("embed", "fill-mask", "classify", "ner", "qa", "rerank", "predict"):
        options = {o for a in parsers[command]._actions for o in a.option_strings}
        assert "--input-format" in options, command
    assert not out.exists()
    # Named, the format reads the file whatever its suffix.
    assert cli.main(["embed", str(minilm_dir), "--input", str(data), "--input-format", "txt", "--out", str(out),
                     "--no-progress", "--threads", "1"]) == 0
    assert [json.loads(line)["line"] for line in out.read_text().splitlines()] == [1, 2]


def test_datasets_lists_without_building_any_set(monkeypatch, capsys):
    from bertkit.data import labelled
    from bertkit.retrieval import datasets

    def refuse(*args, **kwargs):
        raise AssertionError("listing the sets built one")

    monkeypatch.setattr(labelled, "load_labelled", refuse)
    monkeypatch.setattr(datasets, "load_retrieval", refuse)
    assert cli.main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in [*labelled.LABELLED_SETS, *datasets.RETRIEVAL_SETS]:
        assert re.search(rf"^{re.escape(name)} +\w+ +\S", out, flags=re.M), out


def test_datasets_name_shows_its_sizes_and_unknown_names_list_every_set(capsys):
    from bertkit.data import labelled
    from bertkit.retrieval.datasets import RETRIEVAL_SETS

    assert cli.main(["datasets", "en-news"]) == 0
    out = capsys.readouterr().out
    for split in labelled.SPLITS:
        assert f"{split}: {len(labelled.load_labelled('en-news', split))} examples" in out
    assert "bertkit datasets en-news --out DIR" in out
    assert cli.main(["datasets", "no-such-set"]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in [*labelled.LABELLED_SETS, *RETRIEVAL_SETS]), err


@pytest.mark.parametrize("suffix", [".csv", ".txt", ""])
def test_a_results_file_named_for_another_format_is_refused(tmp_path, capsys, minilm_dir, suffix):
    data = tmp_path / "texts.txt"
    data.write_text("a text\n", encoding="utf-8")
    out = tmp_path / f"results{suffix}"
    assert cli.main(["embed", str(minilm_dir), "--input", str(data), "--out", str(out), "--no-progress"]) == 2
    assert "name the output results.jsonl" in capsys.readouterr().err
    assert not out.exists()


def test_texts_may_follow_options(capsys, minilm_dir):
    """`embed MODEL --json "a text"`: argparse alone leaves "a text" unrecognised."""
    argv = ["embed", str(minilm_dir), "--json", "a text", "--pooling", "cls", "another", "--threads", "1"]
    assert cli.main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["a text", "another"]
    with pytest.raises(SystemExit):  # an unknown option is still an error
        cli.main(["embed", str(minilm_dir), "--no-such-option", "a text"])


def test_embed_takes_prompts_and_matryoshka_dimensions(tmp_path, capsys, minilm_dir):
    """`bertkit embed --prompt/--truncate-dim` are the library's embed(prompt=, truncate_dim=), on the
    command line and over a file (.npy of the cut size)."""
    import numpy as np

    from bertkit.inference import embed

    argv = ["embed", str(minilm_dir), "a cat", "a dog", "--prompt", "query: ", "--truncate-dim", "64", "--json",
            "--threads", "1"]
    assert cli.main(argv) == 0
    got = [json.loads(line)["embedding"] for line in capsys.readouterr().out.splitlines()]
    want = embed(minilm_dir, ["query: a cat", "query: a dog"])[:, :64]
    want = want / want.norm(dim=-1, keepdim=True)
    assert np.allclose(got, want.numpy(), atol=1e-5)
    data = tmp_path / "texts.txt"
    data.write_text("a cat\na dog\n", encoding="utf-8")
    assert cli.main(["embed", str(minilm_dir), "--input", str(data), "--out", str(tmp_path / "v.npy"), "--prompt",
                     "query: ", "--truncate-dim", "64", "--no-progress", "--threads", "1"]) == 0
    assert np.allclose(np.load(tmp_path / "v.npy"), want.numpy(), atol=1e-5)

"""``rstar2-eval run --endpoint`` against servers that are not vLLM.

A real ``transformers serve`` process on loopback serves tiny random-weight checkpoints built
here: the samples differ at temperature 1 (it is asked to sample through its generation_config),
the token counts are the server's, and a tokenizer whose tool-call tags are special tokens (which
that server drops from its text) is refused with the fix. The benchmark's stub server, which
answers every sample alike, shows the identical-samples check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rstar2_data.demo import demo_problems
from rstar2_eval.cli import app

MAX_TOKENS = 40


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", *args, "--no-progress"])
    return result.exit_code, " ".join(result.output.split())


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("problems") / "problems.jsonl"
    path.write_text("".join(p.model_dump_json() + "\n" for p in demo_problems(2, seed=5)))
    return path


@pytest.mark.slow
def test_identical_samples_fail_the_run_unless_accepted(problems: Path, tmp_path: Path) -> None:
    from harness import make_tokenizer
    from servers import stub_server

    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    out = tmp_path / "out"
    with stub_server(tokenizer) as url:
        code, output = invoke(
            *("--endpoint", url, "--tokenizer", str(tokenizer), "--benchmarks", f"s={problems}"),
            *("--samples", "3", "--temperature", "0.6", "--max-tokens", "1000"),
            *("--max-turns", "4", "--out", str(out)),
        )
        assert code == 3, output
        assert "2 of 2 problems with several samples got identical samples" in output
        assert "--allow-identical-samples" in output
        record = json.loads((out / "run.json").read_text())
        diversity = record["sample_diversity"]
        assert diversity | {"collapsed": True, "accepted": False, "identical": 2} == diversity
        assert "may ignore the temperature" in diversity["cause"]  # it took vLLM's fields
        report = json.loads((out / "generations.report.json").read_text())
        assert report["benchmarks"][0]["identical_samples"] == 2

        code, output = invoke("--out", str(out), "--resume", "--allow-identical-samples")
    assert code == 0, output
    record = json.loads((out / "run.json").read_text())
    assert record["sample_diversity"]["accepted"] is True
    assert record["rollouts"]["resumed"] == 6


@pytest.mark.slow
def test_transformers_serve_samples_and_counts_like_the_server(
    problems: Path, tmp_path: Path, transformers_server: str
) -> None:
    from tiny_checkpoint import random_checkpoint
    from transformers import AutoTokenizer

    checkpoint = random_checkpoint(tmp_path / "checkpoint")
    out = tmp_path / "out"
    code, output = invoke(
        *("--endpoint", transformers_server),
        *("--served-model", str(checkpoint), "--tokenizer", str(checkpoint)),
        *("--benchmarks", f"s={problems}", "--samples", "3", "--temperature", "1"),
        *("--max-tokens", str(MAX_TOKENS), "--max-turns", "2", "--out", str(out)),
    )
    assert code == 0, output
    record = json.loads((out / "run.json").read_text())
    # Samples at temperature 1 differ: the server was asked to sample.
    assert (
        record["sample_diversity"] | {"collapsed": False, "identical": 0}
        == (record["sample_diversity"])
    )
    samples = rows(out)
    assert len(samples) == 6
    for index in range(2):
        texts = {row["response"] for row in samples if row["problem_id"].endswith(str(index))}
        assert len(texts) > 1
    (server,) = record["execution"]["servers"]
    assert (
        server
        | {
            "prompt": "text",
            "extension_fields": False,
            "sampling_switch": "generation_config",
            "completion_ids": "reencoded",
            "token_counts": "server",
            "logprobs": False,
            "special_tokens_kept": False,
        }
        == server
    )
    assert any("rejected (HTTP 422" in note for note in server["notes"])
    # A turn cut by the budget spent exactly --max-tokens of the server's tokens, though its
    # text re-encodes into another number (split characters decode to U+FFFD).
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    cut = [row for row in samples if row["truncated"] and row["tool_calls"] == 0]
    assert cut, "a random model should run into the budget"
    assert all(row["response_tokens"] == MAX_TOKENS for row in cut)
    reencoded = [len(tokenizer.encode(row["response"], add_special_tokens=False)) for row in cut]
    assert any(count != MAX_TOKENS for count in reencoded), reencoded


@pytest.mark.slow
def test_transformers_serve_dropping_special_tool_call_tags_is_refused(
    problems: Path, tmp_path: Path, transformers_server: str
) -> None:
    from tiny_checkpoint import random_checkpoint

    markers = ("<tool_call>", "</tool_call>")
    checkpoint = random_checkpoint(tmp_path / "checkpoint", special_markers=markers)
    out = tmp_path / "out"
    code, output = invoke(
        *("--endpoint", transformers_server),
        *("--served-model", str(checkpoint), "--tokenizer", str(checkpoint)),
        *("--benchmarks", f"s={problems}", "--samples", "2", "--temperature", "1"),
        *("--max-tokens", str(MAX_TOKENS), "--out", str(out)),
    )
    assert code == 2, output
    assert "--endpoint: '<tool_call>', '</tool_call>' are special tokens" in output
    assert "drops special tokens from its completion text" in output
    assert "vLLM or SGLang" in output
    assert not (out / "generations.jsonl").exists() or not rows(out)

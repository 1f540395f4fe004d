"""Bad input to ``rstar2-eval run``: one clear line naming the option, exit code 2, no traceback;
problem sets from files; the output directory's partial-line recovery; several endpoints."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_data.demo import demo_problems
from rstar2_eval import InputError, load_problem_sets, parse_sources
from rstar2_eval.cli import app
from rstar2_eval.run_dir import recover_generations

BENCH = Path(__file__).resolve().parents[1] / "bench"
# Shaped as a hub id, so it is not looked up on disk (a missing local --model is reported before
# any other option) and, the other inputs being bad, never fetched.
HUB_MODEL = "org/model"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", *args])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--benchmarks", "aime2024", "--model", HUB_MODEL],
            "--benchmarks: unknown benchmark 'aime2024'; known: aime24",
        ),
        (["--benchmarks", "aime24"], "options: give exactly one of --model and --endpoint"),
        (
            ["--benchmarks", "aime24", "--model", HUB_MODEL, "--engine", "tpu"],
            "--engine: Input should be 'auto', 'vllm' or 'transformers'",
        ),
        (
            ["--benchmarks", "demo=/no/such/file.jsonl", "--model", HUB_MODEL],
            "--benchmarks: demo=/no/such/file.jsonl: no such file or directory",
        ),
        (["--resume"], "--resume: "),
        (["--model", HUB_MODEL, "--benchmarks", "aime24", "--temperature", "-1"], "--temperature"),
        (["--model", HUB_MODEL, "--benchmarks", "aime24", "--top-p", "2"], "--top-p"),
        (["--model", HUB_MODEL, "--benchmarks", "aime24", "--samples", "0"], "--samples"),
        (
            ["--model", HUB_MODEL, "--benchmarks", "aime24", "--tool-name", "python"],
            "--tool-name: expected execute_python_code_with_standard_io or "
            "python_code_with_standard_io",
        ),
    ],
)
def test_bad_options_fail_with_one_clear_line(
    args: list[str], message: str, tmp_path: Path
) -> None:
    code, output = invoke(*args, "--out", str(tmp_path / "out"), "--no-progress")
    assert code == 2
    assert message in output
    assert "Traceback" not in output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/no/such/checkpoint"], "--model: /no/such/checkpoint: no such checkpoint"),
        (
            ["--endpoint", "http://127.0.0.1:9", "--served-model", "m"],
            "--endpoint: http://127.0.0.1:9/v1 is not reachable",
        ),
        (
            # A folder that passes the checks on disk: the sandbox is reached before it loads.
            ["--model", "{checkpoint}", "--sandbox", "http://127.0.0.1:9"],
            "--sandbox: http://127.0.0.1:9 is not reachable",
        ),
    ],
)
def test_unreachable_or_missing_resources(
    args: list[str], message: str, data_dir: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    args = [arg.format(checkpoint=checkpoint) for arg in args]
    code, output = invoke(
        *args, "--benchmarks", "aime24", "--data-dir", str(data_dir), "--out", str(tmp_path / "o")
    )
    assert code == 2
    assert message in output
    assert "Traceback" not in output


def test_problem_files_and_their_errors(tmp_path: Path) -> None:
    problems = demo_problems(3, seed=2)
    file = tmp_path / "heldout.jsonl"
    file.write_text("".join(p.model_dump_json() + "\n" for p in problems))
    (loaded,) = load_problem_sets(f"held={file}")
    assert (loaded.name, loaded.source.kind, loaded.problems) == ("held", "jsonl", problems)

    bad = tmp_path / "bad.jsonl"
    bad.write_text(problems[0].model_dump_json() + "\n" + '{"id": "x"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl, line 2: .*problem"):
        load_problem_sets(f"bad={bad}")
    for spec, match in [
        ("aime24,aime24", "given twice"),
        ("aime24=x.jsonl", "is a registry benchmark"),
        ("Bad Name=x", "not a valid name"),
        ("aime24,,math500", "empty entry"),
    ]:
        with pytest.raises(InputError, match=match):
            parse_sources(spec)


def test_partial_last_line_is_cut_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "generations.jsonl"
    row = {"benchmark": "aime24", "problem_id": "60", "sample_index": 0, "response": "x"}
    path.write_text(json.dumps(row) + "\n" + '{"benchmark": "aime24", "pro')
    (kept,) = recover_generations(path)
    assert kept.generation.problem_id == "60"
    assert path.read_text() == json.dumps(row) + "\n"
    assert "dropping an incomplete last line" in caplog.text
    # A bad line that a kill cannot have left (not the last) is an error naming it.
    path.write_text('{"oops": 1}\n' + json.dumps(row) + "\n")
    with pytest.raises(InputError, match="line 1"):
        recover_generations(path)


@pytest.mark.slow
def test_several_endpoints_share_the_rollouts(tmp_path: Path) -> None:
    from harness import make_tokenizer
    from servers import stub_server

    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(p.model_dump_json() + "\n" for p in demo_problems(40, seed=4)))
    with stub_server(tokenizer) as first, stub_server(tokenizer) as second:
        code, output = invoke(
            *("--endpoint", f"{first},{second}", "--tokenizer", str(tokenizer)),
            *("--benchmarks", f"stub={problems}", "--samples", "2", "--max-tokens", "2000"),
            *("--max-turns", "4", "--concurrency", "8", "--out", str(tmp_path / "out")),
            # The stub answers every sample of a problem alike.
            *("--no-progress", "--allow-identical-samples"),
        )
        served = []
        for url in (first, second):
            with urllib.request.urlopen(url + "/stats") as response:
                served.append(json.load(response)["completions"])
    assert code == 0, output
    # Four turns per rollout, all answered, and one probe per server before the first.
    assert sum(served) == 80 * 4 + 2
    assert min(served) >= 80  # both servers took a fair share
    report = json.loads((tmp_path / "out" / "generations.report.json").read_text())
    (score,) = report["benchmarks"]
    assert (score["samples"], score["tool_calls_per_response"]) == (80, 3.0)
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["spec"]["model"]["name"] == "stub"
    assert record["execution"]["reservation"] == "max"  # the stub publishes no KV statistics

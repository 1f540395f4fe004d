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
# Inputs that pass the checks made before the options are validated: a checkpoint as far as the
# disk can tell (it is never loaded, the other inputs being bad) and a local problem file.
MODEL, PROBLEMS = "{tmp}/checkpoint", "demo={tmp}/problems.jsonl"


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["run", *args])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--benchmarks", "aime2024", "--model", MODEL],
            "--benchmarks: unknown benchmark 'aime2024'; known: aime24",
        ),
        (["--benchmarks", PROBLEMS], "options: give exactly one of --model and --endpoint"),
        (
            ["--benchmarks", PROBLEMS, "--model", MODEL, "--engine", "tpu"],
            "--engine: Input should be 'auto', 'vllm' or 'transformers'",
        ),
        (
            ["--benchmarks", "demo=/no/such/file.jsonl", "--model", MODEL],
            "--benchmarks: demo=/no/such/file.jsonl: no such file or directory",
        ),
        (["--resume"], "--out: {tmp}/out holds no run.json to resume"),
        (["--model", MODEL, "--benchmarks", PROBLEMS, "--temperature", "-1"], "--temperature"),
        (["--model", MODEL, "--benchmarks", PROBLEMS, "--top-p", "2"], "--top-p"),
        (["--model", MODEL, "--benchmarks", PROBLEMS, "--samples", "0"], "--samples"),
        (
            ["--model", MODEL, "--benchmarks", PROBLEMS, "--tool-name", "python"],
            "--tool-name: expected execute_python_code_with_standard_io or "
            "python_code_with_standard_io",
        ),
    ],
)
def test_bad_options_fail_with_one_clear_line(
    args: list[str], message: str, tmp_path: Path
) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text("{}")
    (tmp_path / "problems.jsonl").write_text(demo_problems(1, seed=0)[0].model_dump_json() + "\n")
    args = [arg.format(tmp=tmp_path) for arg in args]
    message = message.format(tmp=tmp_path)
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


@pytest.fixture
def unstartable_sandbox(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An embedded sandbox that cannot start; the list records each attempt."""
    from rstar2_sandbox.local import LocalSandbox

    attempts: list[str] = []

    async def start(self: LocalSandbox) -> None:
        attempts.append("start")
        raise RuntimeError("fork-server 0 exited with 1 during start")

    monkeypatch.setattr(LocalSandbox, "start", start)
    return attempts


@pytest.mark.parametrize("sandbox", ["local", "http://127.0.0.1:9"])
@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("org/no-such-model", "--model: could not reach org/no-such-model on the Hugging Face hub"),
        ("{tmp}/no-such-dir", "--model: {tmp}/no-such-dir: no such checkpoint directory"),
    ],
)
def test_the_model_is_checked_before_the_sandbox(
    model: str,
    message: str,
    sandbox: str,
    unstartable_sandbox: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from huggingface_hub import constants

    from rstar2_data.hub import hub_problem

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no hub: the hub id cannot be had
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_problem.cache_clear()
    problems = tmp_path / "problems.jsonl"
    problems.write_text(demo_problems(1, seed=0)[0].model_dump_json() + "\n")
    try:
        code, output = invoke(
            *("--model", model.format(tmp=tmp_path), "--sandbox", sandbox),
            *("--benchmarks", f"demo={problems}", "--out", str(tmp_path / "o"), "--no-progress"),
        )
        from rstar2_eval import RunOptions, run_evaluation

        options = RunOptions(
            model=model.format(tmp=tmp_path),
            sandbox=sandbox,
            benchmarks=[f"demo={problems}"],
            out=tmp_path / "api",
        )
        with pytest.raises(InputError) as raised:
            run_evaluation(options)
    finally:
        hub_problem.cache_clear()
    assert code == 2
    assert message.format(tmp=tmp_path) in output
    assert "sandbox" not in output
    assert raised.value.origin == "model"
    assert unstartable_sandbox == []  # neither the command nor the API started it

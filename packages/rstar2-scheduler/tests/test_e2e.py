"""End to end on CPU: tiny random model, two TransformersEngines, kv-aware scheduler, real sandbox.

The turns that must call the tool are forced (``ForcedTurnsEngine``: chosen tokens, scored by the
model); every other turn is sampled by ``TransformersEngine``. Each trajectory is checked token by
token: the loss mask splits it into the model turns and tool-response glue its turn records
describe, the glue holds exactly the tool output the sandbox produced, model log-probs equal a
trainer-style recomputation over the whole sequence, and the append-only conversation decodes to
the whole conversation rendered at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from forced import ForcedTurnsEngine
from tiny import Score
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from rstar2_data import PYTHON_TOOL_NAME, MathProblem
from rstar2_data.demo import TaskInstance, generate_tasks, to_problem
from rstar2_sandbox.client import SandboxClient
from rstar2_sandbox.executor.settings import ExecutorSettings
from rstar2_sandbox.local import LocalSandbox
from rstar2_sandbox.models import RunStatus
from rstar2_sandbox.protocol import Sandbox
from rstar2_scheduler import RolloutScheduler
from rstar2_scheduler.engines import TransformersEngine, TransformersEngineConfig
from rstar2_scheduler.protocol import Message
from rstar2_scheduler.rollout import RolloutConfig, RolloutRunner
from rstar2_scheduler.scheduler import RolloutJob
from rstar2_scheduler.trajectory import Trajectory

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

TEMPERATURE = 0.9
CONFIG = RolloutConfig(
    max_turns=4, max_response_tokens=320, temperature=TEMPERATURE, tool_timeout_s=1.0
)


def call_text(code: str, stdin: str = "") -> str:
    payload = {"name": PYTHON_TOOL_NAME, "arguments": {"code": code, "input": stdin}}
    return f"\nI will let Python do it.\n<tool_call>\n{json.dumps(payload)}\n</tool_call>"


# Rollout kind -> (first-turn text, sandbox status, text the tool response must contain).
def scenarios(task: TaskInstance) -> dict[str, tuple[str | None, RunStatus | None, str]]:
    return {
        "ok": (call_text(task.code, task.stdin), RunStatus.SUCCESS, f"{task.answer}\n"),
        "error": (call_text("print(undefined_name)"), RunStatus.RUNTIME_ERROR, "NameError"),
        "parse": (call_text("print(1)").replace("}}", "}"), None, "not valid JSON"),
        "free": (None, None, ""),
    }


EXTRA = {
    "timeout": (call_text("while True:\n    pass"), RunStatus.TIMEOUT, "TimeoutError"),
    "long": (call_text("print('the answer is ' * 400)"), RunStatus.SUCCESS, "characters omitted"),
}


def forced_ids(runner: RolloutRunner, text: str) -> list[int]:
    return [*runner.chat.encode(text), runner.chat.end_of_turn_id]


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(mask value, start, end) of each run of equal mask values."""
    out, start = [], 0
    for value, group in itertools.groupby(mask):
        size = len(list(group))
        out.append((value, start, start + size))
        start += size
    return out


def check_trajectory(trajectory: Trajectory, runner: RolloutRunner, score: Score) -> None:
    chat = runner.chat
    turns = trajectory.turns
    ids, mask = trajectory.response_ids, trajectory.loss_mask
    segments = runs(mask)
    # Model turns (mask 1) alternate with tool-response glue (mask 0), as the records say.
    assert [value for value, _, _ in segments] == [1, 0] * (len(segments) // 2) + [1] * (
        len(segments) % 2
    )
    model_runs = [ids[a:b] for value, a, b in segments if value == 1]
    glue_runs = [ids[a:b] for value, a, b in segments if value == 0]
    assert [len(run) for run in model_runs] == [turn.model_tokens for turn in turns]
    shown = [turn for turn in turns if turn.tool_response is not None]
    assert [len(run) for run in glue_runs] == [turn.glue_tokens for turn in shown]
    for turn, run in zip(turns, model_runs, strict=True):
        ended = run[-1] in chat.stop_token_ids
        assert chat.decode(run[:-1] if ended else run) == turn.text
    for turn, run in zip(shown, glue_runs, strict=True):
        glue = (
            f"\n<|im_start|>user\n<tool_response>\n{turn.tool_response}\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n"
        )
        assert run == chat.encode(glue)
    # Sampling log-probs of model tokens equal a recomputation over the whole sequence.
    recomputed = score(trajectory.prompt_ids, ids, TEMPERATURE)
    for position, (bit, logprob) in enumerate(zip(mask, trajectory.logprobs, strict=True)):
        if bit:
            assert logprob == pytest.approx(recomputed[position], abs=1e-4), position
        else:
            assert logprob == 0.0
    # The append-only conversation is the whole conversation's rendering: the prompt and glue are
    # its canonical encoding; sampled turns keep the model's own (possibly non-canonical) ids.
    messages: list[Message] = chat.initial_messages(problem_text(runner, trajectory))
    prompt = chat.render(messages, add_generation_prompt=True) + chat.config.reason_prefill
    assert trajectory.prompt_ids == chat.encode(prompt)
    for index, turn in enumerate(turns):
        prefill = chat.config.reason_prefill if index == 0 else ""
        messages.append({"role": "assistant", "content": prefill + turn.text})
        if turn.tool_response is not None:
            messages.append({"role": "tool", "content": turn.tool_response})
    whole = chat.render(messages, add_generation_prompt=False)
    built = trajectory.input_ids
    if trajectory.stop_reason == "end_of_sequence":  # the template closes turns with im_end only
        built = built[:-1]
    assert whole.startswith(chat.decode(built))


PROBLEMS: dict[str, MathProblem] = {}


def problem_text(runner: RolloutRunner, trajectory: Trajectory) -> str:
    return PROBLEMS[trajectory.problem_id].problem


def check_first_turn(
    trajectory: Trajectory, status: RunStatus | None, contains: str, parse: bool
) -> None:
    first = trajectory.turns[0]
    assert first.sandbox_status is status
    assert first.executed is (status is not None)
    if parse:
        assert first.parse_error is not None
        assert contains in first.parse_error
    if status is not None:
        assert first.tool_latency_s is not None
        assert first.tool_latency_s >= 0
    # A shown response (the budget allows all of these) holds what the sandbox printed.
    assert first.tool_response is not None
    assert contains in first.tool_response
    assert trajectory.quality.tool_calls >= 1


@pytest_asyncio.fixture
async def local_sandbox() -> AsyncIterator[LocalSandbox]:
    async with LocalSandbox(ExecutorSettings(servers=2, preload=[])) as sandbox:
        yield sandbox


async def test_kv_aware_rollouts_over_two_engines(
    tokenizer: PreTrainedTokenizerFast,
    model: Qwen2ForCausalLM,
    score: Score,
    local_sandbox: LocalSandbox,
) -> None:
    runner = RolloutRunner(tokenizer, local_sandbox, CONFIG)
    tasks = generate_tasks(3, seed=11)
    plans: list[tuple[str, MathProblem, str | None, RunStatus | None, str, bool]] = []
    for index, task in enumerate(tasks):
        problem = to_problem(task, problem_id=f"p{index}")
        PROBLEMS[problem.id] = problem
        for kind, (text, status, contains) in scenarios(task).items():
            plans.append((f"p{index}-{kind}", problem, text, status, contains, kind == "parse"))
    for kind, (text, status, contains) in EXTRA.items():
        plans.append((f"p0-{kind}", PROBLEMS["p0"], text, status, contains, False))
    forced = {rid: {0: forced_ids(runner, text)} for rid, _, text, *_ in plans if text}

    reservation = runner.max_tokens(PROBLEMS["p0"])
    engines = [
        ForcedTurnsEngine(
            TransformersEngine(
                model,
                TransformersEngineConfig(name=f"engine-{i}", kv_budget_tokens=3 * reservation),
            ),
            model,
            forced,
        )
        for i in range(2)
    ]
    jobs = [
        RolloutJob(
            run=lambda engine, rid=rid, problem=problem, seed=seed: runner.rollout(
                problem, engine, rollout_id=rid, seed=seed
            ),
            kv_tokens=runner.max_tokens(problem),
            key=rid,
        )
        for seed, (rid, problem, *_) in enumerate(plans)
    ]
    async with RolloutScheduler(engines, policy="kv-aware") as scheduler:
        phase = await scheduler.run(jobs)

    assert [result.error for result in phase.results] == [None] * len(plans)
    trajectories = {r.key: r.value for r in phase.results if r.value is not None}
    assert {t.engine for t in trajectories.values()} == {"engine-0", "engine-1"}
    assert sorted(itertools.chain(*(e.forced_requests for e in engines))) == sorted(
        f"{rid}-0" for rid in forced
    )
    for rid, problem, text, status, contains, parse in plans:
        trajectory = trajectories[rid]
        assert trajectory.problem_id == problem.id
        check_trajectory(trajectory, runner, score)
        if text is not None:
            check_first_turn(trajectory, status, contains, parse)
            # Turns after the tool response were sampled by the TransformersEngine.
            assert len(trajectory.turns) >= 2 or trajectory.stop_reason == "budget"
    long_output = trajectories["p0-long"].turns[0].tool_response or ""
    head, marker, tail = long_output.split("\n", 2)
    assert head == ("the answer is " * 10)[:128]
    assert marker == "... [5345 characters omitted] ..."  # 400 * 14 + newline - 256 shown
    assert tail.endswith("the answer is \n")
    quality = [t.quality for t in trajectories.values()]
    assert sum(q.runtime_errors for q in quality) >= 3
    assert sum(q.timeouts for q in quality) >= 1
    assert sum(q.parse_errors for q in quality) >= 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest_asyncio.fixture
async def served_sandbox() -> AsyncIterator[Sandbox]:
    """``rstar2-sandbox serve`` in its own process, reached through ``SandboxClient``."""
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "rstar2-sandbox"),
        "serve",
        "--port",
        str(port),
        "--servers",
        "1",
        "--preload",
        "",
    ]
    server = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(f"{url}/healthz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if server.returncode is not None:
                    stderr = await server.stderr.read() if server.stderr else b""
                    pytest.fail(f"rstar2-sandbox serve exited: {stderr.decode()[-2000:]}")
                await asyncio.sleep(0.1)
        client = SandboxClient(url)
        yield client
        await client.aclose()
    finally:
        if server.returncode is None:
            server.terminate()
        await asyncio.wait_for(server.wait(), timeout=30)


async def test_rollout_through_a_served_sandbox(
    tokenizer: PreTrainedTokenizerFast,
    model: Qwen2ForCausalLM,
    score: Score,
    served_sandbox: Sandbox,
) -> None:
    runner = RolloutRunner(tokenizer, served_sandbox, CONFIG)
    task = generate_tasks(1, seed=5)[0]
    problem = to_problem(task, problem_id="served")
    PROBLEMS[problem.id] = problem
    forced = {"served": {0: forced_ids(runner, call_text(task.code, task.stdin))}}
    inner = TransformersEngine(model, TransformersEngineConfig(kv_budget_tokens=4096))
    async with ForcedTurnsEngine(inner, model, forced) as engine:
        trajectory = await runner.rollout(problem, engine, rollout_id="served", seed=1)
    check_trajectory(trajectory, runner, score)
    check_first_turn(trajectory, RunStatus.SUCCESS, f"{task.answer}\n", parse=False)
    assert trajectory.turns[0].tool_response == f"{task.answer}\n"

"""The evaluation harness's own cost per rollout, against an instant stub server.

``evaluate`` runs four-turn rollouts (three tool calls, then a boxed answer) against
``stub_server.py`` in a separate process, with real ``LocalSandbox`` tool calls, real grading and
real writing of the generations file and reports. The stub answers at once, so what is measured
is everything rstar2-eval adds around a GPU server: prompt rendering and tokenization, tool-call
parsing, sandbox round trips, grading, writing, scheduling.

CPU time is split by process: this one (the harness), the stub server, and everything else on
the machine (mostly the sandbox's fork-servers and the programs they run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rstar2_data import build_tokenizer
from rstar2_data.demo import demo_problems
from rstar2_eval import EvalSettings, Grader, GraderConfig, ProblemSet, evaluate
from rstar2_eval.backends import endpoint_scheduler, longest_request
from rstar2_sandbox.local import LocalSandbox
from rstar2_scheduler import (
    ChatConfig,
    ChatProtocol,
    OpenAIEngine,
    OpenAIEngineConfig,
    install_chat_template,
    user_prompt,
)
from rstar2_scheduler.protocol import SPECIAL_TOKENS

HERE = Path(__file__).resolve().parent
_TICKS = os.sysconf("SC_CLK_TCK")


def make_tokenizer(directory: Path) -> Path:
    """A small BPE tokenizer with rstar2's chat template, saved as a checkpoint's would be."""
    specials = ["<|endoftext|>", *SPECIAL_TOKENS]
    bootstrap = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(["bootstrap"], special_tokens=specials, vocab_size=300)
    )
    chat = ChatProtocol(bootstrap)
    texts = [
        chat.render(
            [{"role": "user", "content": user_prompt(p.problem)}], add_generation_prompt=True
        )
        for p in demo_problems(64, seed=3)
    ]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(texts, special_tokens=specials, vocab_size=2000),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    install_chat_template(tokenizer)
    tokenizer.save_pretrained(directory)
    return directory


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / _TICKS


def start_stub(tokenizer_dir: Path, turns: int) -> tuple[subprocess.Popen[str], str]:
    stub = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "stub_server.py"),
            *("--tokenizer", str(tokenizer_dir), "--turns", str(turns)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stub.stdout is not None
    line = stub.stdout.readline()
    if not line.startswith("listening on "):
        stub.kill()
        raise RuntimeError(f"the stub server did not start: {line!r}")
    return stub, f"http://127.0.0.1:{int(line.split()[-1])}/v1"


async def measure(rollouts: int, turns: int, concurrency: int) -> dict[str, Any]:
    """Run ``rollouts`` rollouts of ``turns`` turns with ``concurrency`` in flight; figures."""
    with tempfile.TemporaryDirectory(prefix="rstar2-eval-bench-") as scratch:
        root = Path(scratch)
        tokenizer_dir = make_tokenizer(root / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        problems = ProblemSet.of("bench", demo_problems(rollouts, seed=1))
        settings = EvalSettings(samples=1, temperature=1.0, max_tokens=4096, max_turns=turns)
        chat = ChatConfig()
        longest = longest_request(tokenizer, chat, settings, [p.problem for p in problems.problems])
        stub, url = start_stub(tokenizer_dir, turns)
        try:
            engine = OpenAIEngine(
                OpenAIEngineConfig(base_url=url, model="stub", require_logprobs=False)
            )
            async with LocalSandbox() as sandbox, engine:
                # The command line's own placement for endpoints.
                scheduler = await endpoint_scheduler(
                    [engine], concurrency=concurrency, longest_request=longest
                )
                with Grader(GraderConfig(workers=1)) as grader:
                    cpu0, stub0 = time.process_time(), process_cpu_s(stub.pid)
                    machine0, load_before = machine_cpu_s(), os.getloadavg()
                    report = await evaluate(
                        [engine],
                        tokenizer,
                        sandbox,
                        grader,
                        [problems],
                        settings,
                        chat=chat,
                        out_dir=root / "out",
                        scheduler=scheduler,
                        plot=False,
                    )
                    cpu = time.process_time() - cpu0
                    stub_cpu = process_cpu_s(stub.pid) - stub0
                    machine = machine_cpu_s() - machine0
        finally:
            stub.terminate()
            stub.wait(10)
    score = report.benchmark("bench")
    done = report.rollouts.generated
    if report.rollouts.failed or score.tool_calls_per_response != turns - 1:
        raise RuntimeError(f"the benchmark's rollouts did not run as scripted: {report.rollouts}")
    return {
        "rollouts": done,
        "turns": turns,
        "concurrency": concurrency,
        "reservation": scheduler.reservation,
        "seconds": report.elapsed_s,
        "rollouts_per_s": done / report.elapsed_s,
        "harness_cpu_ms_per_rollout": 1000 * cpu / done,
        "stub_cpu_ms_per_rollout": 1000 * stub_cpu / done,
        "other_cpu_ms_per_rollout": 1000 * (machine - cpu - stub_cpu) / done,
        "harness_bound_rollouts_per_s": done / cpu,
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }

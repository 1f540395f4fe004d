"""Shared fixtures: tiny demo data written by the tests, and a tiny SFT'd checkpoint.

The checkpoint is a tiny model overfitted on three demo transcripts, so that sampling at
temperature 1.0 solves those three problems often but not always: RL steps then see groups
with mixed rewards and really update the policy.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Ray reads this when it is imported: its workers then run this interpreter as it is, instead
# of packaging the checkout for `uv run` (which fails from a workspace member's folder).
os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"

import pytest

from rstar2_data.demo import generate_tasks, to_problem, to_transcript
from rstar2_data.rows import rows_bytes
from rstar2_scheduler import ToolOutputFormatter
from rstar2_train import run_stage

sys.path.insert(0, str(Path(__file__).parent / "helpers"))

from tiny_runs import DemoData, sft_config


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> DemoData:
    folder = tmp_path_factory.mktemp("data")
    tasks = generate_tasks(3, seed=5, levels=(1,), families=["multiply"])
    formatter = ToolOutputFormatter().format_execution
    transcripts = [
        to_transcript(task, example_id=f"t{i}", tool_response=formatter)
        for i, task in enumerate(tasks)
    ]
    problems = [to_problem(task, problem_id=f"p{i}") for i, task in enumerate(tasks)]
    data = DemoData(folder / "sft.jsonl", folder / "rl.jsonl")
    data.transcripts.write_bytes(rows_bytes(transcripts, kind="chat", fmt="jsonl"))
    data.problems.write_bytes(rows_bytes(problems, kind="math", fmt="jsonl"))
    return data


@pytest.fixture(scope="session")
def sft_run(demo_data: DemoData, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of a finished tiny SFT stage."""
    output = tmp_path_factory.mktemp("runs") / "sft"
    run_stage(sft_config(demo_data, output))
    return output

"""``rstar2-eval run`` as a Python function: ``run_evaluation(RunOptions(...))``.

The command line is a thin wrapper around this module, and this module around ``evaluate``: a
script, a notebook or ``rstar2-train demo`` get exactly what the command does, in-process.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from rich.console import Console

from rstar2_data.protocol import ANSWER_CLOSE, ANSWER_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from rstar2_eval.backends import (
    EngineKind,
    TemplateChoice,
    api_root,
    chat_config,
    choose_engine,
    endpoint_scheduler,
    load_tokenizer,
    longest_request,
    open_sandbox,
    resolve_checkpoint,
    resolve_served_model,
    transformers_engine,
    vllm_engine,
    weights_digest,
)
from rstar2_eval.code_grading import CodeGrader, CodeGradingConfig, TaskGrader
from rstar2_eval.errors import InputError
from rstar2_eval.evaluation import EvalReport, evaluate
from rstar2_eval.grading import Grader, GraderConfig
from rstar2_eval.problem_sets import ProblemSet, absolute_path, load_source, parse_sources
from rstar2_eval.run_dir import RUN_FILE, ModelInfo, RunRecord
from rstar2_eval.settings import EvalSettings
from rstar2_scheduler import (
    ChatConfig,
    Engine,
    OpenAIEngine,
    OpenAIEngineConfig,
    SchedulerConfig,
)

# What the rollout parses out of completion text: a server must not drop them.
_TEXT_MARKERS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

logger = logging.getLogger(__name__)


class RunOptions(BaseModel):
    """Everything ``rstar2-eval run`` takes; ``rstar2-eval run --help`` explains each option."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(default=None, description="Checkpoint directory or hub id.")
    endpoints: list[str] = Field(default_factory=list, description="OpenAI-compatible API roots.")
    served_model: str | None = None
    tokenizer: str | None = Field(default=None, description="Endpoint runs: tokenizer source.")
    benchmarks: list[str] = Field(
        min_length=1, description="Problem sets: registry names and NAME=PATH entries."
    )
    data_dir: Path | None = None
    settings: EvalSettings = Field(default_factory=EvalSettings)
    out: Path
    sandbox: str = "local"
    engine: EngineKind = "auto"
    chat_template: TemplateChoice = "auto"
    reason_prefill: str | None = None
    batch_size: int = Field(default=8, ge=1)
    kv_budget: int | None = Field(default=None, ge=1)
    device: str = "auto"
    dtype: str = "auto"
    vllm_args: dict[str, Any] = Field(default_factory=dict)
    concurrency: int = Field(default=64, ge=1, description="Rollouts in flight per endpoint.")
    grading: GraderConfig = Field(default_factory=GraderConfig)
    tests: CodeGradingConfig = Field(
        default_factory=CodeGradingConfig, description="Code benchmarks: limits of a test run."
    )
    plot: bool = True
    progress: bool = True
    allow_identical_samples: bool = Field(
        default=False,
        description="Accept k identical samples per problem at temperature > 0 (still reported).",
    )

    @field_validator("benchmarks")
    @classmethod
    def _absolute_benchmark_paths(cls, entries: list[str]) -> list[str]:
        # Recorded in run.json: --resume and score find the files again from any folder.
        absolute = []
        for entry in entries:
            name, sep, path = entry.partition("=")
            absolute.append(f"{name}={absolute_path(path.strip())}" if sep else entry)
        return absolute

    @field_validator("data_dir")
    @classmethod
    def _absolute_data_dir(cls, data_dir: Path | None) -> Path | None:
        return None if data_dir is None else Path(absolute_path(str(data_dir)))

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.model is None) == (not self.endpoints):
            raise ValueError("give exactly one of `model` and `endpoints`")
        return self

    @classmethod
    def resume(cls, out: Path, **overrides: Any) -> RunOptions:
        """The options recorded in ``out/run.json``, with ``overrides`` (e.g. a new endpoint)."""
        if not (out / RUN_FILE).is_file():
            raise InputError("out", f"{out} holds no {RUN_FILE} to resume")
        recorded = RunRecord.load(out).options
        if recorded is None:
            raise InputError(
                str(out / RUN_FILE), "was not written by rstar2-eval run; it holds no options"
            )
        merged = {**recorded, "out": out}
        for key, value in overrides.items():
            nested = isinstance(value, dict) and isinstance(merged.get(key), dict)
            merged[key] = {**merged[key], **value} if nested else value
        return cls.model_validate(merged)


def _longest_request(
    tokenizer: Any, chat: ChatConfig, options: RunOptions, sets: list[ProblemSet]
) -> int:
    problems = (p.problem for s in sets for p in s.problems)
    return longest_request(tokenizer, chat, options.settings, problems)


async def _checkpoint(
    options: RunOptions, checkpoint: Path, problem_sets: list[ProblemSet], stack: AsyncExitStack
) -> tuple[list[Engine], Any, ChatConfig, ModelInfo, SchedulerConfig, dict[str, Any]]:
    tokenizer = load_tokenizer(str(checkpoint), "model")
    chat = chat_config(tokenizer, options.chat_template, reason_prefill=options.reason_prefill)
    longest = _longest_request(tokenizer, chat, options, problem_sets)
    digest, size = await asyncio.to_thread(weights_digest, checkpoint)
    kind = choose_engine(options.engine)
    engine: Engine
    if kind == "vllm":
        engine = vllm_engine(
            checkpoint,
            max_model_len=longest,
            seed=options.settings.seed,
            engine_args=options.vllm_args,
        )
    else:
        engine = await asyncio.to_thread(
            transformers_engine,
            checkpoint,
            longest_request=longest,
            batch_size=options.batch_size,
            kv_budget=options.kv_budget,
            device=options.device,
            dtype=options.dtype,
            seed=options.settings.seed,
        )
    stack.push_async_callback(engine.close)
    model = ModelInfo(
        kind="checkpoint", name=str(checkpoint), weights_sha256=digest, weights_bytes=size
    )
    execution = {"engine": kind, "longest_request_tokens": longest}
    if kind == "transformers":
        execution |= {"kv_budget_tokens": engine.kv_stats().capacity_tokens}
    return [engine], tokenizer, chat, model, SchedulerConfig(), execution


async def _endpoints(
    options: RunOptions, problem_sets: list[ProblemSet], stack: AsyncExitStack
) -> tuple[list[Engine], Any, ChatConfig, ModelInfo, SchedulerConfig, dict[str, Any]]:
    roots = [api_root(url) for url in options.endpoints]
    if len(set(roots)) != len(roots):
        raise InputError("endpoints", "the same endpoint is given twice")
    served = await resolve_served_model(roots, options.served_model)
    tokenizer = load_tokenizer(options.tokenizer or served, "tokenizer")
    chat = chat_config(tokenizer, options.chat_template, reason_prefill=options.reason_prefill)
    longest = _longest_request(tokenizer, chat, options, problem_sets)
    engines: list[Engine] = []
    for index, root in enumerate(roots):
        config = OpenAIEngineConfig(
            base_url=root,
            model=served,
            name=f"endpoint-{index}",
            require_logprobs=False,
            text_markers=_TEXT_MARKERS,
        )
        engine = OpenAIEngine(config, tokenizer)
        stack.push_async_callback(engine.close)
        engines.append(engine)
    scheduler = await endpoint_scheduler(
        engines, concurrency=options.concurrency, longest_request=longest
    )
    model = ModelInfo(kind="endpoint", name=served)
    execution = {
        "endpoints": roots,
        "reservation": scheduler.reservation,
        # What each server was found to accept and return (prompts, counts, sampling switch).
        "servers": [
            engine.server_capabilities.model_dump(mode="json")
            for engine in engines
            if isinstance(engine, OpenAIEngine) and engine.server_capabilities is not None
        ],
    }
    return engines, tokenizer, chat, model, scheduler, execution


async def arun_evaluation(options: RunOptions, *, console: Console | None = None) -> EvalReport:
    """Evaluate as ``rstar2-eval run`` does: fetch the checkpoint (a hub id), load the problem
    sets, start the sandbox, load the checkpoint or connect to the endpoints, run ``evaluate``
    into ``options.out``, and close what was started. Bad input raises ``InputError`` naming the
    ``RunOptions`` field at fault; local paths are checked before anything is fetched over the
    network, and the model before the sandbox starts."""
    sources = parse_sources(options.benchmarks)
    checkpoint = resolve_checkpoint(options.model) if options.model is not None else None
    problem_sets = [load_source(source, options.data_dir) for source in sources]
    limited = [s.head(options.settings.limit) for s in problem_sets]
    async with AsyncExitStack() as stack:
        sandbox = await open_sandbox(options.sandbox)
        stack.push_async_callback(sandbox.aclose)
        if checkpoint is not None:
            built = await _checkpoint(options, checkpoint, limited, stack)
        else:
            built = await _endpoints(options, limited, stack)
        engines, tokenizer, chat, model, scheduler, execution = built
        math_grader = Grader(options.grading)
        stack.callback(math_grader.close)
        # Code benchmarks run their tests in the run's sandbox, beside the tool calls.
        grader = TaskGrader(math_grader, CodeGrader(sandbox, options.tests))
        settings = options.settings
        logger.info(
            "evaluating %s on %s: %d samples per problem, temperature %g, top-p %g, up to %d "
            "tokens and %d turns, seed %d; %s chat template",
            model.name,
            ", ".join(f"{s.name} ({len(s.problems)})" for s in limited),
            settings.samples,
            settings.temperature,
            settings.top_p,
            settings.max_tokens,
            settings.max_turns,
            settings.seed,
            "the checkpoint's" if chat.use_checkpoint_template else "rstar2's",
        )
        return await evaluate(
            engines,
            tokenizer,
            sandbox,
            grader,
            problem_sets,
            settings,
            chat=chat,
            model=model,
            out_dir=options.out,
            scheduler=scheduler,
            progress=options.progress,
            console=console,
            plot=options.plot,
            options=options.model_dump(mode="json"),
            execution={**execution, "sandbox": options.sandbox},
            allow_identical_samples=options.allow_identical_samples,
        )


def run_evaluation(options: RunOptions, *, console: Console | None = None) -> EvalReport:
    """``arun_evaluation`` for callers without an event loop."""
    return asyncio.run(arun_evaluation(options, console=console))

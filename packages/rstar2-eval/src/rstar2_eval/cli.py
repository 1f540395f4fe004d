"""The ``rstar2-eval`` command line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rstar2_data.cli_errors import OneLineErrors
from rstar2_data.cli_output import command_console, configure_logging
from rstar2_data.paths import checked_output_dir, checked_output_file
from rstar2_data.protocol import ANSWER_OPEN
from rstar2_data.terminal import FittedTable
from rstar2_eval.cli_errors import flag_wording, option_flags
from rstar2_eval.cli_run import RUN_FILE, run
from rstar2_eval.code_grading import CodeGradingConfig, SandboxedGrading
from rstar2_eval.errors import InputError
from rstar2_eval.generations import read_generations
from rstar2_eval.grading import Grader, GraderConfig
from rstar2_eval.pool import GradingError
from rstar2_eval.problem_sets import (
    ProblemSet,
    load_source,
    parse_sources,
    recorded_problem_sets,
)
from rstar2_eval.registry import BENCHMARKS
from rstar2_eval.reports import (
    score_table,
    write_graded_samples,
    write_problems_csv,
    write_report_json,
)
from rstar2_eval.scoring import score_generations

app = typer.Typer(
    help="Evaluate checkpoints and endpoints with the tool loop, score generation files, list "
    "the benchmark registry.",
    cls=OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    # Plain help: it wraps between words at any width, where rich's option panels cut words.
    rich_markup_mode=None,
)
logger = logging.getLogger("rstar2_eval")
app.command("run")(run)


@app.command()
def score(
    generations: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            help="JSON Lines of generations: benchmark, problem_id, sample_index, response, and "
            "optionally response_tokens, tool_calls, tool_errors, truncated.",
        ),
    ],
    data_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Directory with local benchmark files (aime24.jsonl, ...). Without it, "
            "benchmarks are downloaded from the Hugging Face hub.",
        ),
    ] = None,
    benchmarks: Annotated[
        str | None,
        typer.Option(
            help="Problem sets the generations name that are not registry benchmarks, as in "
            "`run --benchmarks` (e.g. demo=path/to/build-dir). Default: when a run.json of "
            "`rstar2-eval run` lies beside the generations, the sets it records (with its "
            "--limit); registry benchmarks named in the file are always found.",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            callback=checked_output_dir,
            help="Where to write <stem>.report.json, <stem>.problems.csv and, with --plot, "
            "<stem>.scores.png (<stem> is the generations file name without its suffix). "
            "Default: the generations file's directory.",
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False, hidden=True, callback=checked_output_dir, help="Old name of --out."
        ),
    ] = None,
    plot: Annotated[
        bool, typer.Option("--plot", help="Also write a PNG bar chart (needs the plot extra).")
    ] = False,
    samples_out: Annotated[
        Path | None,
        typer.Option(
            dir_okay=False,
            callback=checked_output_file,
            help="Also write one graded record per sample (rstar2-data GradedSample JSONL).",
        ),
    ] = None,
    k: Annotated[
        list[int] | None,
        typer.Option(
            "--k",
            min=1,
            help="k values for pass@k and maj@k (repeat the option). Default: powers of two "
            "up to the samples per problem, and that number itself.",
        ),
    ] = None,
    boxed_fallback: Annotated[
        bool,
        typer.Option(
            help=f"When the {ANSWER_OPEN} block holds no \\boxed{{}}, use the last \\boxed{{}} "
            f"anywhere (the released code's rule). Off: only the {ANSWER_OPEN} block counts (the "
            "paper's rule).",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="Wall-clock seconds math-verify may spend on one answer; past it the answer is "
            "a timeout, and a worker still busy one second later is killed and replaced.",
        ),
    ] = 5.0,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Grading worker processes. Default: one per available CPU."),
    ] = None,
    max_answer_chars: Annotated[
        int,
        typer.Option(min=1, help="Longer extracted answers are reported ungradable unparsed."),
    ] = 2000,
    sandbox: Annotated[
        str,
        typer.Option(
            help="Code benchmarks (humaneval, livecodebench): where their tests run, 'local' (an "
            "embedded rstar2-sandbox) or the URL of an rstar2-sandbox service.",
        ),
    ] = "local",
    test_timeout: Annotated[
        float,
        typer.Option(
            min=0.001, max=300.0, help="Code benchmarks: seconds of one test run (as in run)."
        ),
    ] = 10.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False,
) -> None:
    """Grade a generations file against its benchmarks and report per-benchmark metrics."""
    console, errors = command_console(), command_console(stderr=True)
    configure_logging(logging.INFO if verbose else logging.WARNING, errors)
    config = GraderConfig(
        boxed_fallback=boxed_fallback,
        timeout_s=timeout,
        max_answer_chars=max_answer_chars,
        **({"workers": workers} if workers is not None else {}),
    )
    try:
        if out is not None and out_dir is not None and out != out_dir:
            raise InputError("--out", f"--out-dir (its old name) says {out_dir}; give --out only")
        numbered = read_generations(generations)
        run_file = generations.parent / RUN_FILE
        if benchmarks is not None:
            listed = [load_source(source, data_dir) for source in parse_sources(benchmarks)]
        elif run_file.is_file():
            listed = recorded_problem_sets(run_file, data_dir)
        else:
            listed = []
        sets: dict[str, ProblemSet] = {s.name: s for s in listed}
        named = sorted({n.generation.benchmark for n in numbered} & set(BENCHMARKS) - set(sets))
        # Unknown names are reported by score_generations, with their line.
        sets |= {name: ProblemSet.registry(name, data_dir) for name in named}
        tasks = any(s.answer_format in ("code", "instructions") for s in sets.values())
        with Grader(config) as grader, _progress(errors) as progress:
            task = progress.add_task("grading", total=len(numbered))
            result = score_generations(
                numbered,
                sets,
                # Programs run their tests in a sandbox; IFEval responses meet its checkers.
                SandboxedGrading(grader, sandbox, CodeGradingConfig(timeout_s=test_timeout))
                if tasks
                else grader,
                origin=str(generations),
                ks=k,
                on_graded=lambda graded: progress.advance(task, len(graded)),
            )
            if grader.worker_replacements:
                logger.warning(
                    "%d grading workers were replaced after a hang or crash",
                    grader.worker_replacements,
                )
    except (InputError, GradingError) as error:
        message = flag_wording(error, SCORE_FLAGS) if isinstance(error, InputError) else error
        errors.print(f"[red]error:[/red] {message}", highlight=False, markup=True, soft_wrap=True)
        raise typer.Exit(code=2) from None

    directory = out or out_dir or generations.parent
    stem = generations.stem
    written = [directory / f"{stem}.report.json", directory / f"{stem}.problems.csv"]
    write_report_json(result.report, written[0])
    write_problems_csv(result.problems, written[1])
    if plot:
        from rstar2_eval.plotting import plot_scores

        written.append(directory / f"{stem}.scores.png")
        plot_scores(result.report, written[-1])
    if samples_out is not None:
        write_graded_samples(result.samples, samples_out)
        written.append(samples_out)
    console.print(score_table(result.report))
    for path in written:
        console.print(f"wrote {path}", highlight=False)


SCORE_FLAGS = option_flags(score)
"""Argument -> ``rstar2-eval score`` flag, for the errors the command prints."""


def _progress(errors: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=errors,
        transient=True,
    )


@app.command()
def benchmarks() -> None:
    """List the benchmark registry: names, hub sources, local file names and answer formats."""
    table = Table(title="rstar2-eval benchmarks", title_justify="left")
    for column in ("name", "title", "hub dataset", "config(s)", "split", "local file", "answers"):
        table.add_column(column)
    for spec in BENCHMARKS.values():
        hub = spec.hub
        configs = ", ".join(config or "default" for config in hub.configs) if hub else ""
        table.add_row(
            spec.name,
            spec.title,
            hub.path if hub else "",
            configs,
            hub.split if hub else "",
            str(spec.path or ""),
            spec.answer_format,
        )
    command_console().print(FittedTable(table))

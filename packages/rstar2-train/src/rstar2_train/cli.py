"""The ``rstar2-train`` command line.

Heavy modules (torch, transformers, the trainers, the other rstar2 packages' engines) load only
once a command has a valid config: loading and validating one imports neither torch nor
transformers, so ``--help``, ``show`` and every bad input answer in about a second.
Results (tables, where the final weights are) go to stdout; logs and progress to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rstar2_data.cli_errors import OneLineErrors, print_error
from rstar2_data.cli_output import command_console, configure_logging
from rstar2_data.paths import checked_output_dir
from rstar2_data.terminal import FittedTable
from rstar2_eval.cli_errors import flag_wording, option_flags

app = typer.Typer(
    help="Train math reasoning models with a Python tool: SFT and GRPO-RoC stages.",
    cls=OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    # Plain help: it wraps between words at any width, where rich's option panels cut words.
    rich_markup_mode=None,
)

ConfigArgument = Annotated[
    str,
    typer.Argument(
        help="A shipped config name (see `rstar2-train configs`) or a YAML config file.",
        show_default=False,
    ),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override a key: KEY.PATH=VALUE, VALUE read as YAML (e.g. --set rl.steps=10 "
        "--set model.path=runs/sft/final). Repeatable; applied after the file and its extends.",
    ),
]
LogEveryOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Without a live display (--no-progress, or stderr not a terminal, e.g. a log "
        "file): log a progress line (steps done / total, elapsed, ETA, headline metrics) every "
        "N steps. Default: about every 5% of the run.",
    ),
]


def _configure_logging(level: str, errors: Console) -> None:
    configure_logging(level, errors)
    # transformers' own bars (loading and writing shards) would break the live display.
    import transformers

    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def _interrupted(step: int | None, code: int, *, again: str = "again") -> typer.Exit:
    """The line a stopped run ends with; exit status 128 + the signal, as the shell reports."""
    where = f" at step {step}" if step is not None else ""
    command_console(stderr=True).print(
        f"interrupted{where}; run the same command {again} to resume",
        highlight=False,
        soft_wrap=True,
    )
    return typer.Exit(code)


def _fail(message: str, code: int = 2) -> typer.Exit:
    """One ``error:`` line; exit status 2 for bad input, 1 for a run that failed."""
    print_error(message)
    return typer.Exit(code)


@app.command()
def stage(
    config: ConfigArgument,
    overrides: SetOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            callback=checked_output_dir,
            help="Run directory (overrides output_dir from the config).",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(hidden=True, callback=checked_output_dir, help="Old name of --out."),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run in the run directory (--out or the config's output_dir) "
            "from its newest checkpoint, with the same data order and random state.",
        ),
    ] = False,
    allow_changes: Annotated[
        bool,
        typer.Option(
            "--allow-changes",
            help="With --resume: accept a config that differs from the run's config.yaml.",
        ),
    ] = False,
    progress: Annotated[
        bool,
        typer.Option(
            help="Show a live progress display in a terminal (--no-progress: log lines only)."
        ),
    ] = True,
    log_every: LogEveryOption = None,
    log_level: Annotated[
        str, typer.Option(help="Logging level: DEBUG, INFO, WARNING, ERROR.")
    ] = "INFO",
) -> None:
    """Run one training stage (SFT or RL) to its end; the final weights go to OUT/final."""
    from rstar2_train.config.loader import ConfigError, load_config

    settings = list(overrides or [])
    if out is not None and output is not None and out != output:
        raise _fail(f"--out {out} and --output {output} (its old name) disagree; give --out only")
    run_dir = out if out is not None else output
    if run_dir is not None:
        settings.append(f"output_dir={run_dir}")
    try:
        resolved = load_config(config, settings)
    except ConfigError as error:
        raise _fail(flag_wording(str(error), option_flags(stage))) from None
    if not resume:  # a resumed stage loads its checkpoint instead
        from rstar2_train.sources import CheckpointNotFoundError, check_stage_sources

        try:
            check_stage_sources(resolved)
        except CheckpointNotFoundError as error:
            raise _fail(str(error)) from None
    # A valid config and loadable sources: now the trainer and its libraries.
    from rstar2_train.interrupt import StageInterrupted
    from rstar2_train.progress_log import stage_reporter
    from rstar2_train.rl.sandbox_health import SandboxUnavailableError
    from rstar2_train.run_dir import RunError
    from rstar2_train.runner import run_stage

    errors = command_console(stderr=True)  # logs and progress
    _configure_logging(log_level, errors)
    reporter = stage_reporter(errors, live=progress, every=log_every)
    try:
        final = run_stage(resolved, resume=resume, allow_changes=allow_changes, reporter=reporter)
    except StageInterrupted as stop:
        again = "again" if resume else "again with --resume"
        raise _interrupted(stop.step, stop.exit_code, again=again) from None
    except SandboxUnavailableError as error:
        raise _fail(str(error), code=1) from None
    except (RunError, ValueError, OSError, ImportError) as error:
        raise _fail(str(error)) from None
    command_console().print(f"done: final weights in {final}", highlight=False)


@app.command()
def configs() -> None:
    """List the shipped configs."""
    from rstar2_train.config.loader import shipped_configs

    table = Table("name", "description")
    for name, description in shipped_configs().items():
        table.add_row(name, description)
    command_console().print(FittedTable(table))


@app.command()
def show(config: ConfigArgument, overrides: SetOption = None) -> None:
    """Print a config resolved (extends and --set applied, every default spelled out)."""
    from rstar2_train.config.loader import ConfigError, dump_config, load_config

    try:
        resolved = load_config(config, list(overrides or []))
    except ConfigError as error:
        raise _fail(flag_wording(str(error), option_flags(show))) from None
    typer.echo(dump_config(resolved), nl=False)


@app.command()
def demo(
    out: Annotated[
        Path,
        typer.Option(
            callback=checked_output_dir,
            help="Where everything is kept (data, runs, evaluations, summary). Run again with "
            "the same --out to skip finished stages and resume an interrupted one.",
        ),
    ] = Path("runs/demo"),
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="A few SFT and RL steps and an 8-problem held-out slice: checks that every "
            "stage runs, not what RL achieves. Mostly start-up time (model, sandbox, grader).",
        ),
    ] = False,
    ablation: Annotated[
        bool,
        typer.Option(
            "--ablation",
            help="Also run the RL stage with roc.strategy sample (Resample-on-Correct) and none "
            "(plain GRPO), 3 seeds each, same budget, and compare the tool-error ratio among "
            "correct held-out rollouts.",
        ),
    ] = False,
    ablation_async: Annotated[
        bool,
        typer.Option(
            "--ablation-async",
            help="Instead of the demo's RL run and its table: the RL stage synchronous and at "
            "rl.max_staleness 1 and 2, 3 seeds each, the same steps, the engine in a process "
            "pinned to the last CPU core and the trainer on the others (needs 2 cores); every "
            "10th step's checkpoint evaluated on the held-out split. Prints wall-clock to the "
            "synchronous runs' final accuracy, final accuracy, steps/hour, idle fractions and "
            "the ideal overlap; writes OUT/ablation-async/ (JSON, text, plot).",
        ),
    ] = False,
    seed: Annotated[
        int, typer.Option(help="Seed of the SFT stage and the RL run (ablation: SEED..SEED+2).")
    ] = 0,
    eval_samples: Annotated[
        int,
        typer.Option(
            min=1,
            help="Samples per held-out problem in each evaluation (more: finer tool-error "
            "ratios, longer evaluations).",
        ),
    ] = 1,
    rl_steps: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="RL steps of every RL run, the ablations' arms alike (default: demo-rl's 60; "
            "fewer: a shorter ablation on a slow machine).",
        ),
    ] = None,
    progress: Annotated[
        bool,
        typer.Option(help="Show live progress bars in a terminal (--no-progress: log lines only)."),
    ] = True,
    log_every: LogEveryOption = None,
    log_level: Annotated[
        str, typer.Option(help="Logging level: DEBUG, INFO, WARNING, ERROR.")
    ] = "INFO",
) -> None:
    """The whole loop on a CPU: build the synthetic tool tasks, train a tokenizer and a tiny model
    (SFT), run GRPO-RoC with real tool calls, evaluate both checkpoints on a held-out split with
    rstar2-eval, and print a before/after table (on stdout; logs and progress on stderr)."""
    from rstar2_eval import InputError
    from rstar2_train.demo import DemoOptions, run_async_ablation, run_demo
    from rstar2_train.interrupt import StageInterrupted
    from rstar2_train.rl.sandbox_health import SandboxUnavailableError
    from rstar2_train.run_dir import RunError

    errors = command_console(stderr=True)  # logs and progress
    _configure_logging(log_level, errors)
    options = DemoOptions(
        out=out,
        quick=quick,
        ablation=ablation,
        ablation_async=ablation_async,
        seed=seed,
        rl_steps=rl_steps,
        progress=progress,
        log_every=log_every,
        eval_samples=eval_samples,
    )
    if ablation and ablation_async:
        raise _fail("--ablation and --ablation-async are separate runs: give one of them")
    try:
        if ablation_async:
            run_async_ablation(options, console=errors, results=command_console())
        else:
            run_demo(options, console=errors, results=command_console())
    except StageInterrupted as stop:
        raise _interrupted(stop.step, stop.exit_code) from None
    except KeyboardInterrupt:  # between stages, or in an evaluation (which resumes too)
        raise _interrupted(None, 130) from None
    except SandboxUnavailableError as error:
        raise _fail(str(error), code=1) from None
    except (RunError, ValueError, OSError, ImportError, InputError) as error:
        raise _fail(flag_wording(str(error), option_flags(demo))) from None

"""``rstar2-data``: build datasets from recipes, inspect builds, list shipped recipes."""

from __future__ import annotations

import logging
import statistics
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Table

from rstar2_data.build import BuildError, build, load_built, read_manifest
from rstar2_data.cli_errors import OneLineErrors
from rstar2_data.cli_output import command_console, configure_logging
from rstar2_data.filter_stage import CHECKPOINT_ROWS
from rstar2_data.hub import HubUnreachableError
from rstar2_data.jsonl import MAX_LINE_BYTES, DataFileError
from rstar2_data.lock import FolderLockedError
from rstar2_data.paths import checked_output_dir
from rstar2_data.recipe import RecipeError, load_recipe, shipped_recipes
from rstar2_data.schemas import MathProblem
from rstar2_data.terminal import FittedTable

app = typer.Typer(
    cls=OneLineErrors,
    help="Dataset recipes, converters and filters for rstar2.",
    no_args_is_help=True,
    # Plain help: it wraps between words at any width, where rich's option panels cut words.
    rich_markup_mode=None,
)
# What a command reports in one line (exit code 2) instead of a traceback.
InputErrors = (
    RecipeError,
    BuildError,
    DataFileError,
    FolderLockedError,
    HubUnreachableError,
    OSError,
)


def _fail(error: Exception | str) -> typer.Exit:
    command_console(stderr=True).print(
        f"[red]error:[/red] {error}", highlight=False, soft_wrap=True
    )
    return typer.Exit(2)


def _variables(pairs: list[str]) -> dict[str, str]:
    variables = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"expected NAME=VALUE, got {pair!r}", param_hint="--var")
        variables[name] = value
    return variables


@app.command("build")
def build_command(
    recipe: Annotated[str, typer.Argument(help="A shipped recipe name or a recipe YAML path.")],
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", callback=checked_output_dir, help="Folder for data and manifest.json."
        ),
    ],
    var: Annotated[
        list[str] | None,
        typer.Option(help="NAME=VALUE filling ${NAME} in the recipe; repeatable."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Override the recipe's seed.")] = None,
    num_proc: Annotated[
        int,
        typer.Option(
            min=1,
            help="Processes for the filters' per-row work (normalizing, decontamination "
            "tests), through datasets' multiprocess map; the output does not depend on it.",
        ),
    ] = 1,
    checkpoint_rows: Annotated[
        int,
        typer.Option(
            min=1,
            help="Rows between checkpoints of the filter stage: an interrupted build resumes "
            "from the last one.",
        ),
    ] = CHECKPOINT_ROWS,
    max_line_mib: Annotated[
        int,
        typer.Option(
            min=1,
            help="Longest line a JSONL source may hold, in MiB: a longer one stops the build "
            "before it is parsed (parsing takes many times a line's size in memory).",
        ),
    ] = MAX_LINE_BYTES >> 20,
    wait: Annotated[
        bool,
        typer.Option(
            help="When another build is writing into OUT, wait for it to finish instead of "
            "exiting with its pid."
        ),
    ] = False,
    progress: Annotated[
        bool, typer.Option(help="Show one progress line per stage (on stderr).")
    ] = True,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log each stage and checkpoint.")
    ] = False,
) -> None:
    """Build RECIPE into OUT: same recipe, inputs and seed give the same bytes.

    Finished stages are kept in OUT/.cache under keys of their inputs' content and of
    rstar2-data's code, so running the same command again after an interruption (Ctrl-C)
    resumes where it stopped, and a changed source, recipe or code rebuilds what depends on it.
    One build at a time writes into OUT."""
    console, errors = command_console(), command_console(stderr=True)
    configure_logging(logging.INFO if verbose else logging.WARNING, errors)
    try:
        loaded = load_recipe(recipe, variables=_variables(var or []))
        if seed is not None:
            loaded = loaded.model_copy(update={"seed": seed})
        manifest = build(
            loaded,
            out,
            progress=progress,
            num_proc=num_proc,
            checkpoint_rows=checkpoint_rows,
            max_line_bytes=max_line_mib << 20,
            wait=wait,
        )
    except InputErrors as error:
        raise _fail(error) from None
    except KeyboardInterrupt:
        errors.print(
            f"interrupted; run the same command again to resume from {out / '.cache'}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(130) from None
    _print_manifest(out, console)
    console.print(f"wrote {manifest.rows} rows to {out / manifest.data_file}")


def _print_manifest(out: Path, console: Console) -> None:
    manifest = read_manifest(out)
    sources = Table(title=f"{manifest.recipe} ({manifest.kind}, seed {manifest.seed})")
    for column in ("source", "origin", "read", "converted", "malformed", "taken"):
        sources.add_column(column)
    for s in manifest.sources:
        malformed = ", ".join(f"{k}: {v}" for k, v in s.malformed.items()) or "-"
        sources.add_row(
            s.name, s.origin, str(s.rows_read), str(s.converted), malformed, str(s.taken)
        )
    console.print(FittedTable(sources))
    if manifest.filters:
        filters = Table(title="filters")
        also = any(f.also_matched for f in manifest.filters)
        for column in ("filter", "in", "kept", "removed", *(["also matched"] if also else [])):
            filters.add_column(column)
        for f in manifest.filters:
            removed = ", ".join(f"{k}: {v}" for k, v in f.removed.items()) or "-"
            matched = ", ".join(f"{k}: {v}" for k, v in f.also_matched.items()) or "-"
            filters.add_row(
                f.name, str(f.rows_in), str(f.kept), removed, *([matched] if also else [])
            )
        console.print(FittedTable(filters))
    console.print(f"rows: {manifest.rows}  sha256: {manifest.content_sha256}")


@app.command()
def stats(
    directory: Annotated[Path, typer.Argument(help="A folder written by `rstar2-data build`.")],
) -> None:
    """Summarize a built dataset: manifest counts and row statistics."""
    console = command_console()
    try:
        _print_manifest(directory, console)
        rows = load_built(directory)
    except InputErrors as error:
        raise _fail(error) from None
    table = Table(title="rows")
    table.add_column("statistic")
    table.add_column("value")
    table.add_row(
        "rows per source",
        ", ".join(f"{k}: {v}" for k, v in sorted(Counter(r.source for r in rows).items())),
    )
    problems = [r for r in rows if isinstance(r, MathProblem)]
    if problems:
        kinds = Counter(p.answer_kind for p in problems)
        table.add_row("answer kinds", ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())))
        table.add_row(
            "median problem chars", str(statistics.median(len(p.problem) for p in problems))
        )
    chats = [r for r in rows if not isinstance(r, MathProblem)]
    if chats:
        calls = [sum(len(m.tool_calls or []) for m in c.messages) for c in chats]
        table.add_row("median messages", str(statistics.median(len(c.messages) for c in chats)))
        table.add_row("with tool calls", str(sum(1 for n in calls if n)))
        table.add_row("tool calls", str(sum(calls)))
    console.print(FittedTable(table))


@app.command()
def recipes() -> None:
    """List the recipes shipped with rstar2-data."""
    console = command_console()
    table = Table(title="shipped recipes")
    table.add_column("name")
    table.add_column("kind")
    table.add_column("description")
    for name, text in shipped_recipes().items():
        # Header fields only: full validation needs the --var values some recipes take.
        header = yaml.safe_load(text)
        table.add_row(name, header["kind"], header.get("description", ""))
    console.print(FittedTable(table))

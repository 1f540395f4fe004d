"""One error format for a whole command line: click's own errors (an option that does not
validate, a missing file argument, an unknown command) as one ``error:`` line on stderr, like
every error the commands report themselves, instead of click's three-line Usage/Try/Error block.
The command lines of rstar2-data, -scheduler, -eval and -train are built on it
(``typer.Typer(cls=OneLineErrors)``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from rstar2_data.cli_output import command_console


def print_error(message: str) -> None:
    """``error: MESSAGE`` on stderr, as one line however narrow the terminal."""
    command_console(stderr=True).print(
        f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True
    )


class OneLineErrors(TyperGroup):
    """A typer app's group whose click errors are one ``error:`` line naming the command's
    ``--help``; exit statuses stay click's (2 for bad input)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        given = sys.argv[1:] if args is None else list(args)
        if not standalone_mode or not given:  # the caller handles errors; or the help
            return super().main(
                args, prog_name, complete_var, standalone_mode, windows_expand_args, **extra
            )
        try:
            result = super().main(
                args, prog_name, complete_var, False, windows_expand_args, **extra
            )
        except typer.TyperException as error:  # click's errors, as typer carries them
            context = getattr(error, "ctx", None)
            hint = f" (see {context.command_path} --help)" if context is not None else ""
            print_error(f"{error.format_message()}{hint}")
            sys.exit(error.exit_code)
        except typer.Abort:
            print_error("aborted")
            sys.exit(1)
        # Without standalone mode click returns an Exit's status, and a command's own result.
        sys.exit(result if isinstance(result, int) else 0)

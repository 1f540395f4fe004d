"""One error format for a whole command line: click's own errors (an option that does not
validate, a missing file argument, an unknown command) as one ``error:`` line on stderr, like
every error the commands report themselves, instead of click's three-line Usage/Try/Error block.
rstar2-eval's and rstar2-train's command lines are built on it (``typer.Typer(cls=...)``).

Library errors name the Python argument at fault (``sandbox: ...``; inside a message, in
backticks); ``flag_wording`` rewords them with the command line's flags (``--sandbox``,
``--data-dir``) for the one line a command prints."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import typer
from typer.core import TyperGroup
from typer.models import OptionInfo
from typer.utils import get_params_from_function

from rstar2_data.cli_output import command_console
from rstar2_eval.errors import InputError

_NAMED = re.compile(r"`([a-z_][a-z0-9_.]*)`")
"""An argument named inside a library error's message."""


def option_flags(
    command: Callable[..., object], arguments: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Python argument name -> flag for each option of a typer ``command``: keyed by the
    parameter's own name, or by the argument it sets (``arguments``: parameter -> argument,
    e.g. ``{"endpoint": "endpoints"}``); the flag is the one the option declares (``--set``),
    else typer's (``--data-dir`` for ``data_dir``)."""
    renamed = arguments or {}
    flags: dict[str, str] = {}
    for name, parameter in get_params_from_function(command).items():
        if not isinstance(parameter.default, OptionInfo):
            continue  # a positional argument has no flag
        declared = [d for d in parameter.default.param_decls or () if d.startswith("--")]
        flag = declared[0].split("/")[0] if declared else "--" + name.replace("_", "-")
        flags[renamed.get(name, name)] = flag
    return flags


def flag_wording(error: InputError | str, flags: Mapping[str, str]) -> str:
    """A library error as a command line says it: the argument it names first, and each
    argument its message names in backticks, replaced by the flag that sets it (``flags``, as
    ``option_flags`` gives); names without a flag are left as they are."""
    if isinstance(error, str):
        return _NAMED.sub(lambda named: flags.get(named[1], named[0]), error)
    origin = flags.get(error.origin, error.origin)
    message = flag_wording(error.message, flags)
    return str(InputError(origin, message, line=error.line, field=error.field))


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

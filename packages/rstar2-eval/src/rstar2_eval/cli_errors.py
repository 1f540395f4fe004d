"""Library errors as a command line words them.

Library errors name the Python argument at fault (``sandbox: ...``; inside a message, in
backticks); ``flag_wording`` rewords them with the command line's flags (``--sandbox``,
``--data-dir``) for the one line a command prints."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from typer.models import OptionInfo
from typer.utils import get_params_from_function

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

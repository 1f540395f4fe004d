"""Which fork-server tier a call should go to.

A fork costs time in proportion to what the parent maps: forking from a fork-server that has
numpy and sympy loaded costs about three times as much as from a lean one. Code that imports only
the standard library gains nothing from the preloads, so it goes to the lean tier. This is a
speed heuristic only: either tier runs any code correctly (the lean one imports on demand).

Clients often wrap the model's code before sending it: rStar2-Agent's Code Judge client embeds it
base64-encoded in a template that decodes it and runs it with ``exec``. Such code is routed by
what it carries: ``exec``/``eval`` in code whose only hidden code is base64 literals passed to
``b64decode`` is judged by those literals' decoded imports (and the wrapper's own).
"""

from __future__ import annotations

import base64
import binascii
import re
import sys

_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import|import[ \t]+([^#\n;]+))", re.M)
# Imports the regex cannot see: send such code to the tier that has everything loaded.
_DYNAMIC_IMPORT = re.compile(r"__import__|importlib")
_EXEC = re.compile(r"\bexec\b|\beval\b")
# Code carried as a base64 string literal, as wrappers of the model's code do.
EMBEDDED_CODE = re.compile(r"""b64decode\(\s*(["'])([A-Za-z0-9+/=]*)\1""")


def imported_modules(code: str) -> set[str]:
    """Top-level names of the modules ``code`` imports with import statements."""
    names: set[str] = set()
    for from_module, import_list in _IMPORT.findall(code):
        if from_module:
            names.add(from_module.split(".")[0])
            continue
        for part in import_list.split(","):
            words = part.split()
            if words:
                names.add(words[0].strip("()\\").split(".")[0])
    names.discard("")
    return names


def needs_preloads(code: str) -> bool:
    """True unless ``code`` evidently imports nothing outside the standard library."""
    if _DYNAMIC_IMPORT.search(code):
        return True
    if _EXEC.search(code):
        # What runs is hidden, unless the code carries it: then route by what it carries.
        payloads = [_decoded(literal) for _, literal in EMBEDDED_CODE.findall(code)]
        if not payloads or any(p is None or needs_preloads(p) for p in payloads):
            return True
    return any(name not in sys.stdlib_module_names for name in imported_modules(code))


def _decoded(literal: str) -> str | None:
    """The text a base64 literal holds; None when it is not base64 of UTF-8 text."""
    try:
        return base64.b64decode(literal, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None

"""Which fork-server tier a call should go to.

A fork costs time in proportion to what the parent maps: forking from a fork-server that has
numpy and sympy loaded costs about three times as much as from a lean one. Code that imports only
the standard library gains nothing from the preloads, so it goes to the lean tier. This is a
speed heuristic only: either tier runs any code correctly (the lean one imports on demand).
"""

from __future__ import annotations

import re
import sys

_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import|import[ \t]+([^#\n;]+))", re.M)
# Imports the regex cannot see: send such code to the tier that has everything loaded.
_DYNAMIC = re.compile(r"__import__|importlib|\bexec\b|\beval\b")


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
    if _DYNAMIC.search(code):
        return True
    return any(name not in sys.stdlib_module_names for name in imported_modules(code))

"""Compiled wrapper prefixes, kept by the fork-server so its runs do not compile them again.

A client that wraps the model's code sends the same wrapper with every call (rStar2-Agent's Code
Judge client: ~3 KB of template, then the model's code as a base64 literal). Compiling that
wrapper costs a run several times more than running it. The fork-server splits such code before
the first line that carries embedded code, compiles the part before it once, and hands the
compiled prefix to every later run that starts with the same text; the run compiles only the rest.

Running a module as two parts in one namespace is the same as running it whole when each part
is a complete module on its own: the split is at a line that starts in column 0 and not with a
string, the prefix compiles alone and has no ``__future__`` import (which would change how the
rest compiles); the run checks the rest (``child.compiled_parts``) and compiles the code whole
when the rest does not stand alone. Standard library only (see ``syscalls``).
"""

from __future__ import annotations

from collections import OrderedDict
from types import CodeType

from rstar2_sandbox.executor.child import FILENAME, Split
from rstar2_sandbox.executor.routing import EMBEDDED_CODE

# Wrappers are a few KB; a prefix this long is not one (and would cost memory to keep).
MAX_PREFIX_CHARS = 64 << 10
MAX_ENTRIES = 32


class PrefixCache:
    """Compiled prefixes of wrapped code, most recently used kept."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._compiled: OrderedDict[str, CodeType | None] = OrderedDict()

    def split(self, code: str) -> Split | None:
        """``code`` as a compiled prefix and the source of the rest; None to compile it whole."""
        match = EMBEDDED_CODE.search(code)
        if match is None:
            return None
        start = code.rfind("\n", 0, match.start()) + 1
        if start == 0 or start > MAX_PREFIX_CHARS or code[start] in " \t\"'":
            return None
        prefix = code[:start]
        if prefix in self._compiled:
            self._compiled.move_to_end(prefix)
            compiled = self._compiled[prefix]
        else:
            compiled = self._compile(prefix)
            self._compiled[prefix] = compiled
            if len(self._compiled) > self.max_entries:
                self._compiled.popitem(last=False)
        if compiled is None:
            return None
        return compiled, "\n" * prefix.count("\n") + code[start:]

    @staticmethod
    def _compile(prefix: str) -> CodeType | None:
        if "__future__" in prefix:
            return None
        try:
            return compile(prefix, FILENAME, "exec")
        except (SyntaxError, ValueError):
            return None

"""The fork-server warm-up snippets."""

from __future__ import annotations


def test_every_warm_up_snippet_runs() -> None:
    import importlib.util

    from rstar2_sandbox.executor.warmup import WARMUPS, warm_up

    installed = [name for name in WARMUPS if importlib.util.find_spec(name)]
    assert {"numpy", "sympy"} <= set(installed)
    assert warm_up(installed) == {}

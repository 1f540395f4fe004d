"""Warm-up work a fork-server does once after preloading, so its children do not each repeat it.

Libraries finish importing lazily: sympy's first ``factor`` loads 16 more modules and builds
tables (~160 ms here; the second call takes 1 ms). Children start from a copy of the fork-server,
so whatever it has warmed they get for free. Each snippet exercises common entry points on tiny
inputs; a failing snippet only costs the speed-up.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

WARMUPS: dict[str, str] = {
    "numpy": """
import numpy as np
a = np.arange(12.0).reshape(3, 4)
np.linalg.det(np.eye(3) * 2); np.linalg.inv(np.eye(2) + 1); np.linalg.eig(np.eye(2))
np.linalg.solve(np.eye(2), np.ones(2)); np.fft.fft(np.ones(4)); np.random.default_rng(0).random(3)
np.sort(a, axis=None); np.unique(a); np.polyfit([0, 1, 2], [1, 3, 5], 1); np.roots([1, -3, 2])
""",
    "sympy": """
import sympy as sp
x, y = sp.symbols("x y")
sp.factor(x**4 - 1); sp.expand((x + y)**3); sp.simplify(sp.sin(x)**2 + sp.cos(x)**2)
sp.solve([x + y - 2, x - y], [x, y]); sp.solve(x**2 - 4, x); sp.integrate(x**2 + 1, x)
sp.diff(sp.exp(x) * x, x); sp.limit(sp.sin(x) / x, x, 0); sp.series(sp.exp(x), x, 0, 4)
sp.Rational(3, 4) + sp.Rational(1, 3); sp.nsimplify(0.5); sp.isprime(97); sp.factorint(360)
sp.binomial(10, 3); sp.Matrix([[1, 2], [3, 4]]).det(); sp.N(sp.pi, 20); sp.latex(x**2)
sp.summation(x, (x, 1, 10)); sp.gcd(12, 18); sp.sqrt(8); sp.Poly(x**2 + 1, x).all_coeffs()
""",
    "scipy": """
import scipy.optimize, scipy.special, scipy.integrate
scipy.special.comb(10, 3); scipy.optimize.brentq(lambda t: t * t - 2, 0, 2)
scipy.integrate.quad(lambda t: t, 0, 1)
""",
}


def warm_up(modules: list[str]) -> dict[str, str]:
    """Run the warm-up of each listed module that has one; returns errors by module."""
    errors: dict[str, str] = {}
    for name in modules:
        code = WARMUPS.get(name)
        if code is None:
            continue
        try:
            exec(compile(code, f"<warm-up {name}>", "exec"), {"__name__": "__warmup__"})
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
            log.warning("warm-up of %s failed: %s", name, errors[name])
    return errors

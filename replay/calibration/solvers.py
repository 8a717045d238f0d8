"""Bounded least-squares and derivative-free minimizers (numpy only)."""

from __future__ import annotations

from typing import Callable

import numpy as np


def nelder_mead(
    f: Callable[[np.ndarray], float],
    x0: np.ndarray,
    step: float | np.ndarray = 0.3,
    max_evals: int = 300,
    xtol: float = 2e-3,
    ftol: float = 1e-7,
) -> tuple[np.ndarray, float, int]:
    """Minimize ``f`` from ``x0`` (standard coefficients: reflect 1, expand 2, contract 0.5, shrink 0.5).
    Returns (x, f(x), evaluations)."""
    x0 = np.asarray(x0, dtype=float)
    n = len(x0)
    steps = np.broadcast_to(np.asarray(step, dtype=float), (n,))
    simplex = [x0] + [x0 + steps[i] * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        spread_x = max(np.max(np.abs(x - simplex[0])) for x in simplex[1:])
        if spread_x < xtol and values[-1] - values[0] < ftol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        xr = centroid + (centroid - worst)
        fr = f(xr)
        evals += 1
        if values[0] <= fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
            continue
        if fr < values[0]:
            xe = centroid + 2.0 * (centroid - worst)
            fe = f(xe)
            evals += 1
            if fe < fr:
                simplex[-1], values[-1] = xe, fe
            else:
                simplex[-1], values[-1] = xr, fr
            continue
        # Contraction (outside if the reflection beat the worst, else inside).
        if fr < values[-1]:
            xc = centroid + 0.5 * (xr - centroid)
        else:
            xc = centroid + 0.5 * (worst - centroid)
        fc = f(xc)
        evals += 1
        if fc < min(fr, values[-1]):
            simplex[-1], values[-1] = xc, fc
            continue
        best = simplex[0]
        simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
        values = [values[0]] + [f(x) for x in simplex[1:]]
        evals += n
    i = int(np.argmin(values))
    return simplex[i], float(values[i]), evals


def levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray],
    x0: np.ndarray,
    lows: np.ndarray,
    highs: np.ndarray,
    max_evals: int = 200,
    h: float = 1e-3,
    tol: float = 1e-10,
) -> tuple[np.ndarray, float, int]:
    """Minimize ``sum(residuals(x)**2)`` within ``[lows, highs]`` (forward-difference Jacobian, Marquardt's
    diagonal damping).  Returns (x, loss, evaluations)."""
    x = np.clip(np.asarray(x0, dtype=float), lows, highs)
    n = len(x)
    r = residuals(x)
    f = float(r @ r)
    evals = 1
    lam = 1e-3
    while evals + n + 1 <= max_evals:
        jac = np.empty((len(r), n))
        for i in range(n):
            step = h if x[i] + h <= highs[i] else -h
            xi = x.copy()
            xi[i] += step
            jac[:, i] = (residuals(xi) - r) / step
        evals += n
        a = jac.T @ jac
        g = jac.T @ r
        improved = False
        while evals < max_evals and lam < 1e10:
            damped = a + lam * np.diag(np.maximum(np.diag(a), 1e-12))
            try:
                dx = np.linalg.solve(damped, -g)
            except np.linalg.LinAlgError:
                lam *= 10.0
                continue
            x_new = np.clip(x + dx, lows, highs)
            r_new = residuals(x_new)
            evals += 1
            f_new = float(r_new @ r_new)
            if f_new < f:
                converged = f - f_new <= tol * max(f, 1e-30) or np.max(np.abs(x_new - x)) < 1e-6
                x, r, f = x_new, r_new, f_new
                lam = max(lam / 3.0, 1e-9)
                improved = True
                if converged:
                    return x, f, evals
                break
            lam *= 4.0
        if not improved:
            break
    return x, f, evals


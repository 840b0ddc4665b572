"""The Dormand-Prince 5(4) tableau of the adaptive Runge-Kutta integrators of
:mod:`pysharp.flow` and :mod:`pysharp.central_flow` (the nodes are implied by the rows)."""

import numpy as np

A = [
    [],
    [1 / 5],
    [3 / 40, 9 / 40],
    [44 / 45, -56 / 15, 32 / 9],
    [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
    [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656],
]
#: Fifth-order weights (the step taken) and fourth-order weights (the error estimate).
B5 = np.array([35 / 384, 0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0])
B4 = np.array([5179 / 57600, 0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40])

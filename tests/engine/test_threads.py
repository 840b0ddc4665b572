"""How the core shares the cores (pysharp/_engine/loader.py, csrc/cpu/threads.hpp): libgomp's
spin is short unless the user chose one, a worker process takes one thread unless its pool
says otherwise, and concurrent calls from several Python threads split the threads among
themselves and still give every bit of a lone call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import pysharp as ps
from pysharp._engine import loader

_core = pytest.importorskip("pysharp._core")

_PROBE = ("import json, os, pysharp; from pysharp._engine.loader import core; "
          "print(json.dumps([os.environ.get('GOMP_SPINCOUNT'), "
          "os.environ.get('OMP_NUM_THREADS'), core().max_threads()]))")


def _probe(tmp, **env) -> list:
    """GOMP_SPINCOUNT, OMP_NUM_THREADS and the core's threads of a fresh interpreter (in
    tmp: not the source tree, whose pysharp has no compiled core)."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env}, cwd=tmp,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_short_spin_unless_the_user_chose_the_wait(tmp_path):
    assert _probe(tmp_path)[0] == str(loader.GOMP_SPINCOUNT)
    assert _probe(tmp_path, GOMP_SPINCOUNT="77")[0] == "77"
    assert _probe(tmp_path, OMP_WAIT_POLICY="active")[0] is None


def _worker_threads() -> list:
    from pysharp._engine.loader import core

    return [os.environ.get("OMP_NUM_THREADS"), core().max_threads()]


def test_a_worker_process_takes_one_thread_unless_its_pool_says_otherwise():
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    saved = os.environ.pop("OMP_NUM_THREADS", None)
    try:
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            assert pool.submit(_worker_threads).result(timeout=120) == ["1", 1]
        os.environ["OMP_NUM_THREADS"] = "2"
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            assert pool.submit(_worker_threads).result(timeout=120) == ["2", 2]
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def test_concurrent_calls_give_a_lone_calls_bits_and_restore_the_threads():
    model = ps.BNLinearRegression.synthetic(d=40, n=20, seed=0)
    W = model.random_point(4096, seed=1, norm=3.0)
    loss, grad = model.loss_and_grad(W)
    hv = model.hvp(W, grad)
    before = _core.max_threads()
    results, after, errors = [None] * 4, [None] * 4, []

    def call(i):
        try:
            for _ in range(5):
                results[i] = (*model.loss_and_grad(W), model.hvp(W, grad))
            after[i] = _core.max_threads()  # this thread's own setting, restored by each call
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    for r in results:
        for a, b in zip(r, (loss, grad, hv)):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    assert after == [before] * 4

"""Threads: generations in several threads at once, of two models and of one, each giving its
single-threaded answer; the GIL released while the engine computes."""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List

import g4
from conftest import MODEL, questions

QS = questions(6)
SETTINGS = [dict(temperature=0), dict(temperature=1.0, seed=3), dict(temperature=0.8, seed=11, top_k=8)]


def alone(m: g4.Model) -> Dict[tuple, str]:
    return {(i, j): m.generate(q, max_tokens=48, **kw) for i, q in enumerate(QS) for j, kw in enumerate(SETTINGS)}


def at_once(workers: List[Callable[[], Dict[tuple, str]]]) -> List[Dict[tuple, str]]:
    """Runs the workers in threads started together; each returns its answers; checks they overlapped."""
    start = threading.Barrier(len(workers))
    out: List = [None] * len(workers)
    spans: List = [None] * len(workers)
    errors: List[BaseException] = []

    def run(k: int) -> None:
        try:
            start.wait()
            t0 = time.perf_counter()
            out[k] = workers[k]()
            spans[k] = (t0, time.perf_counter())
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert max(s[0] for s in spans) < min(s[1] for s in spans), f"the threads did not run at the same time: {spans}"
    return out


def test_two_models_in_two_threads() -> None:
    with g4.Model(MODEL) as a, g4.Model(MODEL, act="fake", kv="f32") as b:
        want_a, want_b = alone(a), alone(b)
        assert want_a != want_b  # different engine options: different answers somewhere
        got_a, got_b = at_once([lambda: alone(a), lambda: alone(b)])
    assert got_a == want_a and got_b == want_b


def test_one_model_in_three_threads() -> None:
    """Each generation gets a session of its own: one model serves several threads at once."""
    with g4.Model(MODEL) as m:
        want = alone(m)
        got = at_once([lambda: alone(m)] * 3)
        assert got == [want] * 3
        assert len(m._idle) >= 2  # the sessions the threads used are kept for later calls


def test_streams_in_threads(model: g4.Model, greedy) -> None:
    text, ids = greedy
    from conftest import PROMPT

    def stream() -> Dict[tuple, str]:
        with model.generate(PROMPT, temperature=0, stream=True) as s:
            return {(0, 0): "".join(s)}

    assert at_once([stream, stream]) == [{(0, 0): text}] * 2


def test_gil_released_while_the_engine_computes(model: g4.Model) -> None:
    """Python code runs in another thread all through a foreign call (ctypes.CDLL releases the GIL;
    a library loaded with ctypes.PyDLL fails this: no Python step for most of the call)."""
    big = "Lily has 149 coins and doubles them. " * 80000  # about 3 MB: a tokenization of about 0.1 s
    window: List[float] = []
    ticks: List[float] = []
    done = threading.Event()

    def tokenize() -> None:
        t0 = time.perf_counter()
        model.tokenize(big)
        window.extend([t0, time.perf_counter()])
        done.set()

    t = threading.Thread(target=tokenize)
    t.start()
    while not done.is_set():
        ticks.append(time.perf_counter())
    t.join()
    t0, t1 = window
    assert t1 - t0 > 0.02, "the call was too short to tell"
    steps = [t0] + [x for x in ticks if t0 < x < t1] + [t1]
    gap = max(b - a for a, b in zip(steps, steps[1:]))
    assert gap < 0.5 * (t1 - t0), f"no Python step for {gap:.3f} s of the {t1 - t0:.3f} s call"


def test_thread_pool_resized_while_generating(model: g4.Model) -> None:
    """set_threads waits for generations in other threads (g4.h: only while no session computes)."""
    before = g4.threads()
    stop = threading.Event()
    answers: List[str] = []

    def generate() -> None:
        while not stop.is_set():
            answers.append(model.generate(QS[0], temperature=0, max_tokens=24))

    t = threading.Thread(target=generate)
    t.start()
    try:
        for n in (1, 2, 1, 2):
            g4.set_threads(n)
            assert g4.threads() == n
    finally:
        stop.set()
        t.join()
        g4.set_threads(before)
    assert answers and len(set(answers)) == 1

"""The thread runtime's pool of worker threads: arrivals are never held back by a thread
that is still starting (on a busy machine a start takes milliseconds, and a burst with no
idle thread used to fall seconds behind the trace)."""

from __future__ import annotations

import threading

import pytest

from lanequeue.replay.runtimes.threads import _ThreadPool


class HeldStarts:
    """``start_thread`` for the pool that holds every start until ``release`` is set,
    as a machine with no free CPU does."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.asked = threading.Event()  # a start has been asked for
        self.count = 0

    def __call__(self, thread: threading.Thread) -> None:
        self.count += 1
        self.asked.set()
        assert self.release.wait(10), "start never released"
        thread.start()


@pytest.mark.timeout(10)
def test_submit_returns_while_the_thread_for_it_is_still_starting() -> None:
    starts = HeldStarts()
    ran: list[int] = []
    done = threading.Semaphore(0)

    def job(rid: int) -> None:
        ran.append(rid)
        done.release()

    pool = _ThreadPool(job, start_thread=starts)
    submitter = threading.Thread(target=lambda: [pool.submit(rid) for rid in range(3)])
    submitter.start()
    submitter.join(5)
    try:
        # Every submit returned although no thread could start yet: nothing waited.
        assert not submitter.is_alive()
        assert starts.asked.wait(5)
        assert ran == []
    finally:
        starts.release.set()
    for _ in range(3):
        assert done.acquire(timeout=5)
    assert ran == [0, 1, 2]  # pending requests are taken up in arrival order
    pool.close()


@pytest.mark.timeout(10)
def test_a_thread_that_is_done_takes_the_pending_request_while_a_start_is_held() -> None:
    starts = HeldStarts()
    first_started = threading.Event()
    finish_first = threading.Event()
    ran_on: dict[int, str] = {}
    second_done = threading.Event()

    def job(rid: int) -> None:
        ran_on[rid] = threading.current_thread().name
        if rid == 0:
            first_started.set()
            assert finish_first.wait(5)
        else:
            second_done.set()

    pool = _ThreadPool(job, start_thread=starts)
    pool.submit(0)
    starts.release.set()  # the thread for request 0 starts
    assert first_started.wait(5)
    starts.release.clear()  # from now on every start is held
    starts.asked.clear()
    pool.submit(1)  # no idle thread: pending, and a start is asked for
    assert starts.asked.wait(5)
    finish_first.set()  # request 0's thread is free: it takes request 1
    assert second_done.wait(5)
    assert ran_on[1] == ran_on[0]
    pool.close()
    starts.release.set()  # the held start goes on, and its thread exits at once
    assert pool.started == 2


@pytest.mark.timeout(10)
def test_close_lets_parked_threads_exit() -> None:
    done = threading.Event()
    pool = _ThreadPool(lambda rid: done.set())
    pool.submit(0)
    assert done.wait(5)
    pool.close()
    for t in threading.enumerate():
        if t.name.startswith("lanequeue-replay-"):
            t.join(5)
            assert not t.is_alive()

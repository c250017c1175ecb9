"""Argument checks of both dispatchers (one place: ``DispatcherBase``) and of ``Ticket``:
every bad value raises at the call, naming the argument, and nothing is submitted."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
import redis
import redis.asyncio
from dispatch_helpers import Stepped

from lanequeue import (
    AsyncLaneQueue,
    Dispatcher,
    Lane,
    LaneQueue,
    ThreadDispatcher,
    build_default_async_lanes,
    build_default_lanes,
)


def thread_queue() -> LaneQueue:
    q = LaneQueue()
    q.add_session_lane("session", timeout_s=5.0)
    q.add_lane("global", max_concurrent=2, timeout_s=5.0)
    return q


def async_queue() -> AsyncLaneQueue:
    q = AsyncLaneQueue()
    q.add_session_lane("session", timeout_s=5.0)
    q.add_lane("global", max_concurrent=2, timeout_s=5.0)
    return q


FACES = [
    pytest.param(lambda kw: ThreadDispatcher(thread_queue(), **kw), id="threads"),
    pytest.param(lambda kw: Dispatcher(async_queue(), **kw), id="asyncio"),
]
#: The call each face's constructor errors name (as the FACES above).
CALLS = {"threads": "ThreadDispatcher()", "asyncio": "Dispatcher()"}

BAD_CONSTRUCTOR = [
    # (arguments, error, what the message must name)
    ({"debounce_s": math.inf}, ValueError, "debounce_s"),
    ({"debounce_s": math.nan}, ValueError, "debounce_s"),
    ({"debounce_s": -0.5}, ValueError, "debounce_s"),
    ({"debounce_s": 10**400}, ValueError, "debounce_s"),
    ({"debounce_s": 1e300}, ValueError, "debounce_s"),  # beyond any timer
    ({"debounce_s": None}, TypeError, "debounce_s"),
    ({"max_wait_s": -1}, ValueError, "max_wait_s"),
    ({"max_wait_s": math.nan}, ValueError, "max_wait_s"),
    ({"max_wait_s": "1"}, TypeError, "max_wait_s"),
    ({"dedupe_ttl_s": math.nan}, ValueError, "dedupe_ttl_s"),
    ({"dedupe_ttl_s": -1}, ValueError, "dedupe_ttl_s"),
    ({"ageing_s": math.inf}, ValueError, "ageing_s"),
    ({"ageing_s": math.nan}, ValueError, "ageing_s"),
    ({"ageing_s": 0}, ValueError, "ageing_s"),
    ({"ageing_s": -1}, ValueError, "ageing_s"),
    ({"ageing_s": "30"}, TypeError, "ageing_s"),
    ({"ageing_s": True}, TypeError, "ageing_s"),  # a bool is not a number of seconds
    ({"debounce_s": True}, TypeError, "debounce_s"),
    ({"max_wait_s": False}, TypeError, "max_wait_s"),
    ({"dedupe_ttl_s": "300"}, TypeError, "dedupe_ttl_s"),
    ({"max_pending": True}, TypeError, "max_pending"),
    ({"busy": "nope"}, ValueError, "busy"),
    ({"busy": None}, TypeError, "busy"),
    ({"overflow": "nope"}, ValueError, "overflow"),
    ({"dedupe_redis": object()}, TypeError, "dedupe_redis"),
    ({"dedupe_redis": redis.asyncio.Redis()}, TypeError, "dedupe_redis"),  # (not used)
    ({"dedupe_redis": object(), "dedupe_ttl_s": None}, ValueError, "dedupe_ttl_s"),
    ({"dedupe_redis": redis.Redis(), "dedupe_ttl_s": 1e10}, ValueError, "dedupe_ttl_s"),
    ({"dedupe_redis": redis.Redis(), "dedupe_ttl_s": 0}, ValueError, "dedupe_ttl_s"),
    ({"dedupe_redis": redis.Redis(), "dedupe_prefix": ""}, ValueError, "dedupe_prefix"),
    ({"max_pending": math.inf}, TypeError, "max_pending"),
    ({"max_pending": -1}, ValueError, "max_pending"),
    ({"dedupe_max": 1.5}, TypeError, "dedupe_max"),
    ({"dedupe_max": -1}, ValueError, "dedupe_max"),
    ({"overflow": 3}, TypeError, "overflow"),
    ({"on_drop": 5}, TypeError, "on_drop"),
    ({"dedupe_prefix": ""}, ValueError, "dedupe_prefix"),
    ({"dedupe_prefix": None}, TypeError, "dedupe_prefix"),
    ({"lanes": ["session", "session"]}, ValueError, "lanes"),
    ({"lanes": [3]}, TypeError, "lanes"),
    ({"lanes": ["session", None]}, TypeError, "lanes"),
    ({"lanes": ["session", ""]}, ValueError, "lanes"),
    ({"lanes": []}, ValueError, "lanes"),
    ({"lanes": ["nope"]}, KeyError, "lanes"),
    ({"lanes": "session"}, TypeError, "lanes"),
]


def test_a_queue_without_the_default_lanes_is_named_in_the_error() -> None:
    """A dispatcher made without ``lanes`` takes the default ones: a queue whose lanes
    have other names is refused with a message that says the lanes asked for were the
    default, and lists the queue's."""
    from lanequeue import AsyncLaneQueue, Dispatcher, LaneQueue, ThreadDispatcher

    for queue, cls in ((AsyncLaneQueue(), Dispatcher), (LaneQueue(), ThreadDispatcher)):
        queue.add_session_lane("sess")
        queue.add_lane("llm")
        with pytest.raises(KeyError) as info:
            cls(queue)
        assert info.value.args[0] == (
            f"{cls.__name__}() argument 'lanes' ['session', 'global'] (the default: the "
            "lanes every turn takes): lane 'session' not found (the queue's lanes: "
            "['sess', 'llm'])")


def test_concurrent_futures_refuses_a_ticket_saying_what_to_use() -> None:
    """``concurrent.futures.wait``/``as_completed`` do not take tickets: a TypeError that
    names ``ticket.result`` (it was an AttributeError from their internals)."""
    import concurrent.futures as cf

    from lanequeue import ThreadDispatcher, build_default_lanes

    d = ThreadDispatcher(build_default_lanes())
    try:
        ticket = d.submit("k", int, 1)
        for call in (lambda: cf.wait([ticket], timeout=1),
                     lambda: list(cf.as_completed([ticket], timeout=1))):
            with pytest.raises(TypeError, match=r"not a concurrent.futures.Future: wait "
                               r"for it with ticket.result\(timeout\)"):
                call()
        assert ticket.result(5) == 1
    finally:
        assert d.drain(5)
        d.close()


@pytest.mark.parametrize("make", FACES)
@pytest.mark.parametrize("ttl", [1e10, 0, None, math.inf])
def test_a_shared_dedupe_window_names_the_range_of_its_ttl(make: Any, ttl: Any) -> None:
    """With ``dedupe_redis`` the TTL has no "no limit" and a bound: the message says so
    and shows the value given (1e10 is finite and > 0; it was refused as if it were
    not)."""
    with pytest.raises(ValueError, match=r"'dedupe_ttl_s' must be > 0 and at most "
                       r"\d+ seconds .*with dedupe_redis.* got (1e\+?10|1000|0|None|inf)"):
        make({"dedupe_redis": redis.Redis(), "dedupe_ttl_s": ttl})


@pytest.mark.parametrize("make", FACES)
@pytest.mark.parametrize(("kw", "error", "names"), BAD_CONSTRUCTOR)
def test_bad_constructor_argument_raises_naming_it(
        request: pytest.FixtureRequest, make: Any, kw: dict[str, Any],
        error: type[Exception], names: str) -> None:
    """Every constructor error names the call and the argument, as a lane's does
    (``Dispatcher() argument 'ageing_s' ...``; the ageing_s ones once lacked the call)."""
    call = CALLS[request.node.callspec.id.split("-")[-1]]
    with pytest.raises(error) as info:
        make(kw)
    message = info.value.args[0]
    assert message.startswith(f"{call} argument '{names}'"), message


@pytest.mark.parametrize("make", FACES)
def test_bad_queue_names_the_call(request: pytest.FixtureRequest, make: Any) -> None:
    call = CALLS[request.node.callspec.id]
    other = async_queue() if call == "ThreadDispatcher()" else thread_queue()
    cls = ThreadDispatcher if call == "ThreadDispatcher()" else Dispatcher
    for queue in (other, None):
        with pytest.raises(TypeError, match=rf"^{call[:-2]}\(\) argument 'queue' must be"):
            cls(queue)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "error", "arg"), [
    ({"max_workers": 0}, ValueError, "max_workers"),
    ({"max_workers": True}, TypeError, "max_workers"),
    ({"clock": 3.0}, TypeError, "clock"),
])
def test_thread_dispatcher_own_arguments_name_the_call(
        kw: dict[str, Any], error: type[Exception], arg: str) -> None:
    with pytest.raises(error, match=rf"^ThreadDispatcher\(\) argument '{arg}' "):
        ThreadDispatcher(thread_queue(), **kw)


def test_ageing_s_has_one_message_on_the_dispatcher_and_on_lane() -> None:
    """-1 and 0 used to say ">= 0" and "> 0": one check, one message, everywhere, each
    naming its call (the dispatcher's once named none)."""
    bound = "a finite number of seconds > 0 and < 9223372036"  # (< AGEING_MAX)
    for bad in (-1, 0, math.inf):
        for call, make in (
                ("ThreadDispatcher()", lambda v: ThreadDispatcher(thread_queue(), ageing_s=v)),
                ("Dispatcher()", lambda v: Dispatcher(async_queue(), ageing_s=v)),
                ("Lane()", lambda v: Lane("g", ageing_s=v))):
            with pytest.raises(ValueError) as info:
                make(bad)
            assert str(info.value) == f"{call} argument 'ageing_s' must be {bound}, got {bad!r}"


@pytest.mark.parametrize("make", FACES)
def test_documented_no_limit_values_are_taken(make: Any) -> None:
    d = make({"max_wait_s": math.inf, "dedupe_ttl_s": math.inf, "ageing_s": None,
              "debounce_s": 0})
    assert d._machine.max_wait_s is None
    assert d._machine.dedupe_ttl_s == math.inf
    assert d._machine.ageing_s is None


def test_a_finite_debounce_merges_on_the_asyncio_dispatcher() -> None:
    """The window a finite debounce_s opens (inf used to behave like 0: no window)."""
    h = Stepped(busy="collect", debounce_s=2.0)
    try:
        seen: list[list[int]] = []
        a = h.submit("k", seen.append, 1)
        h.advance(1.0)
        b = h.submit("k", seen.append, 2)
        h.advance(1.5)
        assert seen == []  # the window was reopened by the second submit
        h.advance(1.0)
        assert seen == [[1, 2]]
        assert a.state == b.state == "done"
    finally:
        h.close()


async def coro_fn(x: int) -> int:
    return x


class AsyncCallable:
    async def __call__(self, x: int) -> int:
        return x


async def agen_fn(x: int) -> Any:
    yield x


def test_thread_dispatcher_refuses_a_coroutine_function_at_submit() -> None:
    d = ThreadDispatcher(thread_queue())
    try:
        for fn in (coro_fn, AsyncCallable(), agen_fn, 3, None):
            with pytest.raises(TypeError, match="fn"):
                d.submit("k", fn, 1)
        assert d.stats.submitted == 0
        # A plain function that returns a coroutine anyway: the turn fails with
        # TypeError and the coroutine is closed, never run (no "never awaited").
        t = d.submit("k", lambda: coro_fn(1))
        exc = t.exception(timeout=5)
        assert isinstance(exc, TypeError) and "awaitable" in str(exc)
        assert t.state == "failed"
        assert d.submit("k", lambda x: x * 2, 21).result(timeout=5) == 42
    finally:
        d.close()


def test_asyncio_dispatcher_awaits_a_coroutine_function_and_runs_a_plain_one() -> None:
    h = Stepped()
    try:
        a = h.submit("k", coro_fn, 7)
        b = h.submit("j", AsyncCallable(), 8)
        c = h.submit("i", lambda x: x + 1, 9)
        h.settle()
        assert (a.result(0), b.result(0), c.result(0)) == (7, 8, 10)
        for fn in (agen_fn, 3):
            with pytest.raises(TypeError, match="fn"):
                h.submit("k", fn, 1)
        assert h.d.stats.submitted == 3
    finally:
        h.close()


@pytest.mark.parametrize("bad", [2**62, -(2**31) - 1, 2**31])
def test_submit_priority_has_the_lanes_range(bad: int) -> None:
    d = ThreadDispatcher(thread_queue())
    h = Stepped()
    try:
        with pytest.raises(ValueError, match="priority"):
            d.submit("k", print, priority=bad)
        with pytest.raises(ValueError, match="priority"):
            h.submit("k", print, priority=bad)
        with pytest.raises(ValueError, match="priority"):
            thread_queue().acquire_all("k", ["global"], priority=bad)
        assert d.stats.submitted == h.d.stats.submitted == 0
        assert d.submit("k", lambda: 1, priority=2**31 - 1).result(timeout=5) == 1
    finally:
        d.close()
        h.close()


@pytest.mark.parametrize("ended", [False, True])
def test_ticket_wait_checks_its_timeout_at_every_call(ended: bool) -> None:
    d = ThreadDispatcher(thread_queue())
    gate = threading.Event()
    try:
        t = d.submit("k", lambda: 5 if ended else gate.wait(5))
        if ended:
            assert t.result(timeout=5) == 5
        for wait in (t.result, t.exception):
            with pytest.raises(TypeError, match="timeout"):
                wait("x")
            with pytest.raises(TypeError, match="timeout"):
                wait(True)
            for bad in (-1, math.nan):
                with pytest.raises(ValueError, match="timeout"):
                    wait(bad)
        gate.set()
        # inf, 10**400 and None mean no limit (the library's own check_timeout).
        assert t.result(math.inf) == t.result(10**400) == t.result(None) == (5 if ended
                                                                            else True)
        assert t.exception(math.inf) is None and t.exception(10**400) is None
    finally:
        gate.set()
        d.close()


def test_a_failed_ticket_never_returns_a_bad_timeout_as_its_exception() -> None:
    d = ThreadDispatcher(thread_queue())
    try:
        t = d.submit("k", lambda: 1 / 0)
        assert isinstance(t.exception(5), ZeroDivisionError)
        with pytest.raises(TypeError, match="timeout"):
            t.exception("x")
    finally:
        d.close()


def test_add_done_callback_refuses_a_non_callable_at_the_call() -> None:
    d = ThreadDispatcher(thread_queue())
    try:
        t = d.submit("k", lambda: 1)
        with pytest.raises(TypeError, match="fn"):
            t.add_done_callback(3)  # type: ignore[arg-type]
        assert t.result(5) == 1
        with pytest.raises(TypeError, match="fn"):
            t.add_done_callback(None)  # type: ignore[arg-type]
        seen: list[Any] = []
        t.add_done_callback(seen.append)
        assert seen == [t]
    finally:
        d.close()


def test_asyncio_dispatcher_argument_errors_need_no_loop() -> None:
    """Bad arguments are refused before the loop check (same order on both faces)."""
    d = Dispatcher(async_queue())
    with pytest.raises(TypeError, match="fn"):
        d.submit("k", coro_fn.__name__, 1)  # a str is not callable
    assert d.stats.submitted == 0
    assert asyncio.iscoroutinefunction(coro_fn)


BAD_DRAIN = [(-1, ValueError), (math.nan, ValueError), ("x", TypeError)]


@pytest.mark.parametrize(("bad", "error"), BAD_DRAIN)
def test_async_dispatcher_drain_with_bad_timeout_changes_nothing(
    bad: Any, error: type[Exception]
) -> None:
    """A refused drain() leaves the dispatcher taking turns (the argument is checked
    before it starts draining)."""

    async def main_() -> Any:
        d = Dispatcher(build_default_async_lanes())
        with pytest.raises(error, match="timeout_s"):
            await d.drain(bad)
        assert not d.draining
        return await d.submit("k", lambda: 1)

    assert asyncio.run(main_()) == 1


@pytest.mark.parametrize(("bad", "error"), BAD_DRAIN)
def test_thread_dispatcher_drain_with_bad_timeout_changes_nothing(
    bad: Any, error: type[Exception]
) -> None:
    d = ThreadDispatcher(build_default_lanes())
    try:
        with pytest.raises(error, match="timeout_s"):
            d.drain(bad)
        assert not d.draining
        assert d.submit("k", lambda: 1).result(5) == 1
    finally:
        d.close()


@pytest.mark.parametrize("make", FACES)
def test_close_checks_cancel_pending_before_closing(make: Any) -> None:
    async def go() -> None:  # (the asyncio dispatcher is closed from its loop)
        d = make({})
        with pytest.raises(TypeError, match="cancel_pending"):
            d.close(cancel_pending="yes")
        assert not d.draining
        d.close()
        assert d.draining

    asyncio.run(go())


def test_async_ticket_result_on_its_loop_refuses_at_once() -> None:
    """On the loop's own thread, result() could never see the turn end (the loop would be
    blocked): it raises RuntimeError at once, whatever the timeout but 0 (a poll). The
    turn waits on an event set only after those calls: a call that blocked would hang
    the test (pytest-timeout) instead of raising."""
    import concurrent.futures

    async def main_() -> tuple[Any, Any]:
        d = Dispatcher(build_default_async_lanes())
        go = asyncio.Event()

        async def work() -> int:
            await go.wait()
            return 1

        ticket = d.submit("k", work)
        for call in (ticket.result, ticket.exception):
            for timeout in (None, 1.0, math.inf):
                with pytest.raises(RuntimeError, match="await ticket"):
                    call(timeout)
        with pytest.raises(concurrent.futures.TimeoutError):
            ticket.result(0)
        go.set()
        value = await ticket
        with pytest.raises(RuntimeError, match="await ticket"):
            ticket.result()
        # Another thread may block on it while the loop runs.
        other = await asyncio.get_running_loop().run_in_executor(None, ticket.result, 5)
        return value, (ticket.result(0), other)

    assert asyncio.run(main_()) == (1, (1, 1))


def test_a_str_subclass_key_is_its_plain_value_in_the_dispatcher() -> None:
    """C23: a ``str`` Enum key is its plain value on the ticket, in pending(), and in
    the lanes the turn holds."""
    from enum import Enum

    class Key(str, Enum):
        A = "a"

    queue = thread_queue()
    seen: list[Any] = []
    d = ThreadDispatcher(queue)
    try:
        ticket = d.submit(Key.A, lambda: seen.append(list(queue["session"].get_active())))
        assert ticket.key == "a" and ticket.key.__class__ is str
        assert d.pending(Key.A) == d.pending("a")
        ticket.result(5)
        assert seen == [["a"]] and seen[0][0].__class__ is str
    finally:
        d.close()


@pytest.mark.parametrize(("kw", "error", "arg"), [
    ({"priority": 2**31}, ValueError, "priority"),
    ({"priority": 1.5}, TypeError, "priority"),
    ({"timeout_s": -1}, ValueError, "timeout_s"),
    ({"run_timeout_s": "x"}, TypeError, "run_timeout_s"),
    ({"dedupe_id": ""}, ValueError, "dedupe_id"),  # empty: a value out of range
    ({"dedupe_id": 7}, TypeError, "dedupe_id"),
    ({"busy": "nope"}, ValueError, "busy"),
    ({"fn": 5}, TypeError, "fn"),
])
def test_submit_argument_errors_name_the_call(
        kw: dict[str, Any], error: type[Exception], arg: str) -> None:
    """As the README's dispatcher-arguments row says: the error names the call and the
    argument, on both faces (the asyncio one through its own loop)."""
    rest = {k: v for k, v in kw.items() if k != "fn"}
    d = ThreadDispatcher(thread_queue())
    try:
        with pytest.raises(error, match=rf"^ThreadDispatcher\.submit\(\) argument '{arg}' "):
            d.submit("k", kw.get("fn", lambda: None), **rest)
        ticket = d.submit("k", lambda: None)
        for method in ("result", "exception"):
            with pytest.raises(ValueError, match=rf"^Ticket\.{method}\(\) argument 'timeout' "):
                getattr(ticket, method)(-1)
    finally:
        d.close()
    h = Stepped()
    try:
        with pytest.raises(error, match=rf"^Dispatcher\.submit\(\) argument '{arg}' "):
            h.submit("k", kw.get("fn", lambda: None), **rest)
        assert h.d.stats.submitted == 0
    finally:
        h.close()


def test_a_dedupe_id_redis_cannot_take_is_refused_at_the_call(
        redis_server: Any, redis_prefix: str) -> None:
    """With a shared window, a ``dedupe_id`` that cannot be sent as UTF-8 (a lone
    surrogate) is a ValueError at the call, as for a Redis lane's key, not a backend
    failure (threads) or a failed ticket with a stray give-back warning (asyncio); a
    local window takes any non-empty ``str``."""
    client = redis.Redis(port=redis_server.port)
    d = ThreadDispatcher(thread_queue(), dedupe_redis=client, dedupe_prefix=redis_prefix)
    try:
        with pytest.raises(ValueError, match=r"argument 'dedupe_id' must be encodable as "
                           r"UTF-8 \(it contains a lone surrogate at index 1\)"):
            d.submit("k", lambda: None, dedupe_id="a\ud800")
        # The claim names the key as well (ids are scoped per key): so is the key checked
        # when a dedupe_id goes to the window, also on local lanes.
        with pytest.raises(ValueError, match=r"argument 'key' must be encodable as "
                           r"UTF-8 \(it contains a lone surrogate at index 1\)"):
            d.submit("k\ud800", lambda: None, dedupe_id="a")
        assert d.stats.submitted == 0
        assert d.submit("k\ud800", lambda: 2).result(5) == 2  # no id: no claim, no check
    finally:
        d.close()
    local = ThreadDispatcher(thread_queue())
    try:
        assert local.submit("k", lambda: 1, dedupe_id="a\ud800").result(5) == 1
        assert local.submit("k\ud800", lambda: 1, dedupe_id="a").result(5) == 1
    finally:
        local.close()


def test_the_asyncio_dispatchers_waits_must_be_awaited() -> None:
    """``drain()`` and ``wait_idle()`` of the asyncio dispatcher are coroutines that
    refuse to be read unawaited, as the asyncio lanes' are: ``if d.wait_idle(5):``
    raises TypeError naming the call instead of reading as True, and the drain never
    runs."""

    async def main() -> None:
        d = Dispatcher(async_queue())
        try:
            for call in (lambda: d.wait_idle(0), lambda: d.drain()):
                with pytest.raises(TypeError, match=r"^Dispatcher\.[a-z_]+\(\) must be awaited"):
                    if call():
                        pass
            assert not d.draining
            assert await d.wait_idle(0) is True
        finally:
            d.close()

    asyncio.run(main())


@pytest.mark.parametrize("max_threads, min_threads, name", [
    (0, 0, "max_threads"), (2, -1, "min_threads"), (2, 3, "min_threads"),
])
def test_the_worker_service_refuses_bounds_it_cannot_keep(
    max_threads: int, min_threads: int, name: str
) -> None:
    from lanequeue.dispatch._workers import Service

    before = threading.active_count()
    with pytest.raises(ValueError, match=name):
        Service(max_threads=max_threads, min_threads=min_threads, name="bounds")
    assert threading.active_count() == before  # no thread was started


@pytest.mark.parametrize("call, value, error, arg", [
    ("drain", -1, ValueError, "timeout_s"), ("drain", "x", TypeError, "timeout_s"),
    ("wait_idle", -1, ValueError, "timeout_s"), ("clear", 5, TypeError, "key"),
    ("pending", 5, TypeError, "key"), ("cancel", 3, TypeError, "ticket"),
])
def test_the_other_calls_argument_errors_name_the_call(
        call: str, value: Any, error: type[Exception], arg: str) -> None:
    """As submit's: ``drain``, ``wait_idle``, ``clear``, ``pending`` and ``cancel`` name
    the call and the argument, on both faces; a refused drain drains nothing."""
    d = ThreadDispatcher(thread_queue())
    try:
        with pytest.raises(error, match=rf"^ThreadDispatcher\.{call}\(\) argument '{arg}' "):
            getattr(d, call)(value)
        assert not d.draining
    finally:
        d.close()

    async def main() -> None:
        a = Dispatcher(async_queue())
        with pytest.raises(error, match=rf"^Dispatcher\.{call}\(\) argument '{arg}' "):
            got = getattr(a, call)(value)
            if asyncio.iscoroutine(got):
                await got
        assert not a.draining
        a.close()

    asyncio.run(main())


@pytest.mark.parametrize("make", FACES)
def test_a_keyword_argument_for_fn_is_refused_saying_how_to_bind_it(
    request: pytest.FixtureRequest, make: Any
) -> None:
    """``submit`` passes ``fn`` positional arguments only: a keyword it does not take is
    a TypeError that says so and names ``functools.partial``, before anything is
    submitted (no loop needed on the asyncio face)."""
    d = make({})
    try:
        with pytest.raises(TypeError) as info:
            d.submit("k", print, "x", sep="-")
        text = str(info.value)
        face = CALLS[request.node.callspec.id].rstrip("()")
        assert text.startswith(f"{face}.submit() got an unexpected keyword argument 'sep'")
        assert "functools.partial(fn, sep=...)" in text
        # A misspelt option of submit's own is named, not sent to functools.partial.
        for typo, meant in [("dedupeid", "dedupe_id"), ("run_timeout", "run_timeout_s"),
                            ("timeout", "timeout_s"), ("priorty", "priority")]:
            with pytest.raises(TypeError) as info:
                d.submit("k", print, "x", **{typo: 1})
            assert str(info.value).endswith(
                f"unexpected keyword argument {typo!r}: did you mean {meant!r}?")
        assert d.stats.submitted == 0
    finally:
        if isinstance(d, ThreadDispatcher):
            d.close()


@pytest.mark.parametrize("make", FACES)
def test_a_dedupe_id_is_scoped_per_key_so_another_keys_turn_runs(make: Any) -> None:
    """README "Idempotency": ids are scoped per key, as a channel's message ids are per
    chat (a Telegram ``message_id`` is unique only within its chat). The same id for
    another conversation within the window is another turn: it runs, with its own
    ticket and reply (it used to get the first conversation's ticket, and its reply,
    silently); a repeat for the same key is still answered with the original ticket."""
    async def go() -> None:
        d = make({"busy": "enqueue"})
        try:
            first = d.submit("tg:chat-a", lambda: "a", dedupe_id="42")
            other = d.submit("tg:chat-b", lambda: "b", dedupe_id="42")
            assert other is not first and other.dedupe_id == "42"
            assert d.submit("tg:chat-a", lambda: "a", dedupe_id="42") is first
            assert d.submit("tg:chat-b", lambda: "b", dedupe_id="42") is other
            # (Key "4:x" with id "y" and key "4" with id "x:y" are two ids as well: the
            # scope's border cannot shift.)
            x = d.submit("4:x", lambda: "x", dedupe_id="y")
            y = d.submit("4", lambda: "y", dedupe_id="x:y")
            assert x is not y
            for t, want in ((first, "a"), (other, "b"), (x, "x"), (y, "y")):
                if isinstance(d, ThreadDispatcher):
                    assert await asyncio.to_thread(t.result, 10.0) == want
                else:
                    assert await asyncio.wait_for(t, 10.0) == want
            s = d.stats
            assert (s.submitted, s.deduped, s.done) == (4, 2, 4)
        finally:
            d.close()

    asyncio.run(go())

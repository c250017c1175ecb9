"""An exception (``KeyboardInterrupt``) injected at each point of a call in turn, one
point per run: the deterministic interrupt tests' one tracer and sweep (the random-timer
ones use ``interrupt_timer.py``).

An :class:`Injector` is a trace function (``sys.settrace``) and a profile function
(``sys.setprofile``) of the thread it is installed in that counts the points of the
frames it traces (``traced``, a test of their code: lanequeue's own, see
:func:`library`; by default every frame) and raises at the ``n``-th, once. The
kinds of points (``points``):

- ``"call"``: every entry or resumption of a frame;
- ``"entry"``: only those where CPython checks for a pending signal (a RESUME with oparg
  0 or 1: a function's entry, a generator's resumption after a plain ``yield``; not
  after ``yield from`` or ``await``);
- ``"opcode"``: before every instruction (more than CPython can do);
- ``"backward jump"``: at a backward jump (a loop checks for a pending signal there);
- ``"return"``: at a return (as if raised at the caller's check after the call);
- ``"c_return"``: after a builtin called from the frame returns (its ``CALL`` checks);
- ``"line"``: at the start of each line.

:data:`DELIVERY` is where CPython itself can deliver an asynchronous exception (a signal
handler's, ``PyThreadState_SetAsyncExc``'s: at the eval breaker's checks).

A :class:`Sweep` makes ``Injector(1)``, ``Injector(2)``, ... until a run ends with its
injection not fired: every point of the operation was tried.
"""

from __future__ import annotations

import dis
import functools
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import lanequeue

DELIVERY = frozenset({"call", "backward jump", "return", "c_return"})
EVERY_INSTRUCTION = frozenset({"call", "opcode", "return", "c_return"})

PKG = str(Path(lanequeue.__file__).resolve().parent)
_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)
_OPCODES = frozenset({"opcode", "backward jump"})
_LOCAL = _OPCODES | {"return", "line"}  # the kinds a frame's local trace function sees


@functools.cache
def _backward_jumps(code: CodeType) -> frozenset[int]:
    """Offsets of the backward jumps of ``code``: they check the eval breaker (a loop can
    be interrupted there); JUMP_BACKWARD_NO_INTERRUPT does not."""
    return frozenset(
        ins.offset for ins in dis.get_instructions(code)
        if ins.opcode in _JUMPS and isinstance(ins.argval, int) and ins.argval < ins.offset
        and "NO_INTERRUPT" not in ins.opname
    )


@functools.cache
def _signal_checks(code: CodeType) -> frozenset[int] | None:
    """Offsets of the RESUME instructions of ``code`` that check for a pending signal
    (oparg 0 or 1); None before Python 3.11 (no RESUME: every entry checks)."""
    if "RESUME" not in dis.opmap:
        return None
    return frozenset(i.offset for i in dis.get_instructions(code)
                     if i.opname == "RESUME" and (i.arg or 0) < 2)


def library(files: Collection[str] | None = None, *,
            skip: Collection[str] = ()) -> Callable[[CodeType], bool]:
    """Which code is traced: that of ``files`` (full paths, looked up as each new code
    is met, so a test may add one for a while), by default any file of the lanequeue
    package; never the functions named in ``skip``."""
    def traced(code: CodeType) -> bool:
        if code.co_name in skip:
            return False
        if files is None:
            return code.co_filename.startswith(PKG)
        return code.co_filename in files
    return traced


class Injector:
    """Raises ``exc(where)`` at the ``n``-th point (counted from 1) of the traced frames
    of the thread it is installed in, once; ``fired`` says where (None: not reached) and
    ``fired_code`` in which code, ``count`` how many points it counted. Points count only while:

    - ``paused`` is false (a test turns counting off around its own helpers, or on from
      a first interrupt of its own: :meth:`pause`);
    - with ``scope``: a frame it accepts is running (from its entry, which is a point,
      traced or not, until its return, a point only with ``scope_return``);
    - with ``start_at``: from the first entry of a traced function of that name on
      (``on_start()`` is called then, untraced);
    - with ``stop_at``: until the entry of a traced function of that name (tracing
      stops there: ``stopped``);
    - with ``only``: at the points of the frames it accepts.

    ``points``: the kinds of points (see the module), or a function of the code giving
    them. Reports of exceptions raised in finalizers while it is :meth:`active` go to
    ``unraisable`` (one may be an injection)."""

    def __init__(
        self, n: int, *,
        traced: Callable[[CodeType], bool] | None = None,
        points: Collection[str] | Callable[[CodeType], Collection[str]] = DELIVERY,
        scope: Callable[[FrameType], bool] | None = None,
        scope_return: bool = False,
        start_at: str | None = None,
        on_start: Callable[[], object] | None = None,
        stop_at: str | None = None,
        only: Callable[[FrameType], bool] | None = None,
        exc: Callable[[str], BaseException] = KeyboardInterrupt,
    ) -> None:
        self.n, self.exc = n, exc
        self.traced, self.points, self.only = traced, points, only
        self.scope, self.scope_return = scope, scope_return
        self.start_at, self.on_start, self.stop_at = start_at, on_start, stop_at
        self.count = 0
        self.fired: str | None = None
        self.fired_code: CodeType | None = None
        self.paused = start_at is not None
        self.stopped = False
        self.unraisable: list[Any] = []
        self._depth = 0  # scope frames running
        self._kinds: dict[CodeType, frozenset[str]] = {}
        self._locals: dict[tuple[frozenset[str], bool], Callable[..., Any]] = {}
        # One object per callback, kept alive here: the interpreter drops its own
        # references when a trace or profile function raises (with a bound method made
        # afresh on each use, CPython 3.11 was seen calling a freed object).
        self._trace_fn = self._trace
        self._profile_fn = self._profile

    def _kinds_of(self, code: CodeType) -> frozenset[str]:
        kinds = self._kinds.get(code)
        if kinds is None:
            if self.traced is not None and not self.traced(code):
                kinds = frozenset()
            else:
                kinds = frozenset(self.points(code) if callable(self.points)
                                  else self.points)
            self._kinds[code] = kinds
        return kinds

    def _point(self, frame: FrameType, what: str) -> None:
        if self.paused or self.stopped or self.fired is not None:
            return
        if self.scope is not None and not self._depth:
            return
        if self.only is not None and not self.only(frame):
            return
        self.count += 1
        if self.count == self.n:
            code = frame.f_code
            self.fired_code = code
            self.fired = (f"{Path(code.co_filename).name}:{frame.f_lineno} "
                          f"{getattr(code, 'co_qualname', code.co_name)} {what} "
                          f"(point {self.n})")
            raise self.exc(self.fired)

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        opens = self.scope is not None and self.scope(frame)
        if opens:
            self._depth += 1
        elif self.scope is not None and not self._depth:
            return None
        kinds = self._kinds_of(code)
        if kinds:
            if code.co_name == self.start_at:
                self.start_at = None
                self.paused = False
                if self.on_start is not None:
                    self.on_start()
            if code.co_name == self.stop_at:
                self.stopped = True
                sys.settrace(None)
                sys.setprofile(None)
                return None
            if kinds & _OPCODES:
                frame.f_trace_opcodes = True
        elif not opens:
            return None
        local = self._local(kinds, opens) if opens or kinds & _LOCAL else None
        if opens or "call" in kinds:
            self._point(frame, "call")
        elif "entry" in kinds:
            checks = _signal_checks(code)
            if checks is None or frame.f_lasti in checks:
                self._point(frame, "entry")
        return local

    def _local(self, kinds: frozenset[str], opens: bool) -> Callable[..., Any]:
        """The local trace function of the frames with these kinds of points (``opens``:
        of a scope frame)."""
        cached = self._locals.get((kinds, opens))
        if cached is not None:
            return cached
        every, back = "opcode" in kinds, "backward jump" in kinds
        returns, lines = "return" in kinds, "line" in kinds
        point = self._point

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                if every:
                    point(frame, f"before {dis.opname[frame.f_code.co_code[frame.f_lasti]]}")
                elif back and frame.f_lasti in _backward_jumps(frame.f_code):
                    point(frame, "backward jump")
            elif event == "return":
                if not opens:
                    if returns:
                        point(frame, "return")
                else:
                    try:
                        if self.scope_return:
                            point(frame, "return")
                    finally:
                        self._depth -= 1
            elif event == "line" and lines:
                point(frame, f"line {frame.f_lineno}")
            return local

        self._locals[(kinds, opens)] = local
        return local

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_return" and "c_return" in self._kinds_of(frame.f_code):
            self._point(frame, f"after {getattr(arg, '__qualname__', arg)}()")

    def install(self) -> None:
        """Trace the calling thread from its next new frame on, for good (a worker
        thread's; see :meth:`active`)."""
        sys.setprofile(self._profile_fn)
        sys.settrace(self._trace_fn)

    @contextmanager
    def active(self) -> Iterator[Injector]:
        """Trace the calling thread while the block runs. Reports of exceptions in
        finalizers go to ``unraisable`` meanwhile (CPython 3.11's default report,
        printing a traceback through the tracer's frames while tracing, can crash the
        interpreter)."""
        old_trace, old_profile = sys.gettrace(), sys.getprofile()
        old_hook, sys.unraisablehook = sys.unraisablehook, self.unraisable.append
        self.install()
        try:
            yield self
        finally:
            sys.settrace(old_trace)
            sys.setprofile(old_profile)
            sys.unraisablehook = old_hook
            self._depth = 0  # (a scope frame the injection ended never returned here)

    @contextmanager
    def pause(self) -> Iterator[None]:
        """No points counted while the block runs (the test's own steps)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def run(self, fn: Callable[[], Any],
            catch: type[BaseException] | tuple[type[BaseException], ...] = ()) -> Any:
        """``fn()`` traced (:meth:`active`): what it returned, or the exception of a
        ``catch`` type it raised."""
        try:
            with self.active():
                return fn()
        except catch as exc:
            return exc


class Sweep:
    """``for inj in Sweep(limit, **args)``: ``Injector(n, **args)`` for n = 1, 2, ...,
    each for one run of the loop's body, until a run ends with its injection not fired
    (the operation had no point left: each was tried). ``fired`` lists where each of the
    other runs' landed. Fails if the first run had no point (the tracer saw nothing), or
    if ``limit`` runs all fired."""

    def __init__(self, limit: int, **injector: Any) -> None:
        self.limit = limit
        self.injector = injector
        self.fired: list[str] = []

    def __iter__(self) -> Iterator[Injector]:
        for n in range(1, self.limit + 1):
            inj = Injector(n, **self.injector)
            yield inj
            if inj.fired is None:
                assert n > 1, "the operation had no injection point: the tracer saw nothing"
                return
            self.fired.append(inj.fired)
        raise AssertionError(f"more than {self.limit} injection points")


def inject_everywhere(run_once: Callable[[Injector], object], limit: int,
                      **injector: Any) -> int:
    """``run_once(inj)`` for each injector of a :class:`Sweep`; how many injections were
    made (the points of the operation)."""
    sweep = Sweep(limit, **injector)
    for inj in sweep:
        run_once(inj)
    return len(sweep.fired)

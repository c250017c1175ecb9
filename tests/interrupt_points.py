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
- ``"line"``: at the start of each line;
- ``"taken jump"`` (Python 3.10 only): a jump to a later instruction that checks (see
  below);
- ``"handler entry"`` (Python 3.10 only): the first instruction of an exception handler
  (``except``, ``finally``, a ``with``'s exit) entered by an exception.

Python 3.10 (no ``RESUME``) checks at the top of its evaluation loop, which it reaches
at a frame's start or resumption (not ``gen.throw()``'s), after each ``CALL_*`` that
returned, at ``JUMP_ABSOLUTE``, at a ``POP_JUMP_IF_FALSE``/``POP_JUMP_IF_TRUE`` that is
taken (not ``JUMP_IF_*_OR_POP``), and on entering an exception handler; and it skips the
check when the next instruction is ``SETUP_FINALLY``, ``SETUP_WITH``,
``BEFORE_ASYNC_WITH`` or ``YIELD_FROM``. There the kinds mean: ``"entry"`` a frame's
start or resumption that checks; ``"backward jump"`` a jump that checks with an earlier
target (a ``JUMP_ABSOLUTE``, or a conditional jump when taken), and it brings
``"taken jump"``, the same with a later target (one mechanism: a test asking for the
checks of jumps gets them all); ``"return"`` a normal return to a caller's ``CALL_*``
that checks; ``"c_return"`` a builtin's return to a ``CALL_*`` that checks.

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

#: Python 3.10's evaluation loop: see the module docstring (``_PyEval_EvalFrameDefault``
#: of CPython 3.10, ``CHECK_EVAL_BREAKER`` and the check at the top of ``main_loop``).
_PY310 = sys.version_info < (3, 11)

DELIVERY = frozenset({"call", "backward jump", "return", "c_return"}
                     | ({"taken jump", "handler entry"} if _PY310 else set()))
EVERY_INSTRUCTION = frozenset({"call", "opcode", "return", "c_return"})

PKG = str(Path(lanequeue.__file__).resolve().parent)
_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)
_OPCODES = frozenset({"opcode", "backward jump"}
                     | ({"taken jump", "handler entry", "entry", "return"} if _PY310
                        else set()))
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


def _ops(*names: str) -> frozenset[int]:
    return frozenset(dis.opmap[n] for n in names if n in dis.opmap)


#: 3.10: the instructions before which the top of the loop does not check.
_NO_CHECK_BEFORE = _ops("SETUP_FINALLY", "SETUP_WITH", "BEFORE_ASYNC_WITH", "YIELD_FROM")
_CALLS = _ops("CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX")
_COND_JUMPS = _ops("POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE")
_ABS_JUMPS = _ops("JUMP_ABSOLUTE")
_HANDLERS = _ops("SETUP_FINALLY", "SETUP_WITH", "SETUP_ASYNC_WITH")


class _Code310:
    """3.10: what the model needs of one code object. Offsets are those ``f_lasti`` shows
    while an instruction runs: with ``EXTENDED_ARG`` prefixes, the first prefix's (the
    tracer's opcode event comes there; the prefixed instruction has none)."""

    def __init__(self, code: CodeType) -> None:
        raw = code.co_code
        self.raw = raw
        self.checks_at = frozenset(o for o in range(0, len(raw), 2)
                                   if raw[o] not in _NO_CHECK_BEFORE)
        self.cond: dict[int, tuple[int, int]] = {}  # at -> (target, fall-through)
        self.absolute: dict[int, int] = {}  # at -> target
        self.after_call: dict[int, int] = {}  # a CALL_* at -> offset after it
        self.handlers: set[int] = set()
        start: int | None = None
        for ins in dis.get_instructions(code):
            if start is None:
                start = ins.offset
            if ins.opname == "EXTENDED_ARG":
                continue
            end = ins.offset + 2
            if ins.opcode in _COND_JUMPS:
                self.cond[start] = (ins.argval, end)
            elif ins.opcode in _ABS_JUMPS:
                self.absolute[start] = ins.argval
            elif ins.opcode in _CALLS:
                self.after_call[start] = end
            elif ins.opcode in _HANDLERS:
                self.handlers.add(ins.argval)
            start = None

    def checks_before(self, at: int) -> bool:
        return at >= len(self.raw) or at in self.checks_at


@functools.cache
def _code310(code: CodeType) -> _Code310:
    return _Code310(code)


def _checked_return_310(frame: FrameType | None) -> bool:
    """3.10: whether a frame whose callee (or builtin) returns now checks right after:
    it is at a ``CALL_*`` not followed by an instruction that skips the check."""
    if frame is None:
        return False
    info = _code310(frame.f_code)
    after = info.after_call.get(frame.f_lasti)
    return after is not None and info.checks_before(after)


_RETURNS = _ops("RETURN_VALUE", "YIELD_VALUE")
_YIELD_FROM = dis.opmap.get("YIELD_FROM")


def _returned_310(frame: FrameType) -> bool:
    """3.10, at a "return" event: whether the frame returns or yields (else an exception
    leaves it, and its caller goes to its handlers without a check)."""
    raw, at = frame.f_code.co_code, frame.f_lasti
    return 0 <= at < len(raw) and (raw[at] in _RETURNS
                                   or (at + 2 < len(raw) and raw[at + 2] == _YIELD_FROM))


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
        # 3.10, by id(frame) (reset at each "call" event of the frame): the frames resumed
        # whose entry point waits for their first instruction, the offset of each
        # frame's previous instruction, the frames an exception is leaving (its
        # "exception" event not followed by an instruction).
        self._resuming: dict[int, int] = {}
        self._prev: dict[int, int] = {}
        self._raising: set[int] = set()
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
                if _PY310 and "backward jump" in kinds:
                    kinds |= {"taken jump"}  # one mechanism on 3.10 (see the module)
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
        if _PY310:
            self._prev.pop(id(frame), None)
            self._resuming.pop(id(frame), None)
            self._raising.discard(id(frame))
        if opens or "call" in kinds:
            self._point(frame, "call")
        elif "entry" in kinds:
            if _PY310:
                self._entry310(frame)
            else:
                checks = _signal_checks(code)
                if checks is None or frame.f_lasti in checks:
                    self._point(frame, "entry")
        return local

    def _entry310(self, frame: FrameType) -> None:
        """3.10: the top of the loop checks as a frame starts or resumes, unless its next
        instruction is one of _NO_CHECK_BEFORE. A ``gen.throw()`` goes to the handlers
        unchecked: a resumption's point waits for its first instruction (a throw's first
        event is "exception" instead)."""
        at = frame.f_lasti + 2 if frame.f_lasti >= 0 else 0
        if _code310(frame.f_code).checks_before(at):
            if frame.f_lasti < 0:
                self._point(frame, "entry")
            else:
                self._resuming[id(frame)] = at

    def _returning(self, frame: FrameType, opens: bool, delivers: bool) -> None:
        """A "return" event of a local trace function (either Python's): a point when
        ``delivers`` (a plain frame), or the scope's return (a scope frame, whose depth
        goes down whatever its point does)."""
        if not opens:
            if delivers:
                self._point(frame, "return")
        else:
            try:
                if self.scope_return:
                    self._point(frame, "return")
            finally:
                self._depth -= 1

    def _local(self, kinds: frozenset[str], opens: bool) -> Callable[..., Any]:
        """The local trace function of the frames with these kinds of points (``opens``:
        of a scope frame)."""
        cached = self._locals.get((kinds, opens))
        if cached is not None:
            return cached
        every, back = "opcode" in kinds, "backward jump" in kinds
        returns, lines = "return" in kinds, "line" in kinds
        point = self._point
        if _PY310 and not every:
            return self._local310(kinds, opens)

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                if every:
                    point(frame, f"before {dis.opname[frame.f_code.co_code[frame.f_lasti]]}")
                elif back and frame.f_lasti in _backward_jumps(frame.f_code):
                    point(frame, "backward jump")
            elif event == "return":
                self._returning(frame, opens, returns)
            elif event == "line" and lines:
                point(frame, f"line {frame.f_lineno}")
            return local

        self._locals[(kinds, opens)] = local
        return local

    def _local310(self, kinds: frozenset[str], opens: bool) -> Callable[..., Any]:
        """:meth:`_local` on Python 3.10 (see the module docstring)."""
        back, taken = "backward jump" in kinds, "taken jump" in kinds
        handlers, entry = "handler entry" in kinds, "entry" in kinds
        returns, lines = "return" in kinds, "line" in kinds
        point = self._point
        resuming, prev, raising = self._resuming, self._prev, self._raising

        def jump(frame: FrameType, at: int, target: int, info: _Code310) -> None:
            if info.checks_before(target):
                if target <= at:
                    if back:
                        point(frame, "backward jump")
                elif taken:
                    point(frame, "taken jump")

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                at, key = frame.f_lasti, id(frame)
                info = _code310(frame.f_code)
                before = prev.get(key)
                prev[key] = at
                raising.discard(key)
                if entry and key in resuming and resuming.pop(key) == at:
                    point(frame, "entry")
                if before is not None:
                    cond = info.cond.get(before)
                    if cond is not None and at == cond[0] != cond[1]:
                        jump(frame, before, at, info)  # taken: checked before ``at``
                if handlers and at in info.handlers and before not in info.cond \
                        and info.checks_before(at):
                    point(frame, "handler entry")
                target = info.absolute.get(at)
                if target is not None:
                    jump(frame, at, target, info)  # (nothing to run before its check)
            elif event == "exception":
                resuming.pop(id(frame), None)  # a throw: no check at its resumption
                raising.add(id(frame))
            elif event == "return":
                resuming.pop(id(frame), None)
                prev.pop(id(frame), None)
                returned = id(frame) not in raising and _returned_310(frame)
                raising.discard(id(frame))
                self._returning(frame, opens, not opens and returns and returned
                                and _checked_return_310(frame.f_back))
            elif event == "line" and lines:
                point(frame, f"line {frame.f_lineno}")
            return local

        self._locals[(kinds, opens)] = local
        return local

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_return" and "c_return" in self._kinds_of(frame.f_code):
            if _PY310 and "opcode" not in self._kinds_of(frame.f_code) \
                    and not _checked_return_310(frame):
                return
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
            self._resuming.clear()
            self._prev.clear()
            self._raising.clear()

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

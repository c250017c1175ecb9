"""Argument checks shared by every face; each raises at the caller's line with the
argument's name in the message."""

from __future__ import annotations

import math
import numbers
import operator
import types
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from decimal import Decimal
from threading import TIMEOUT_MAX
from typing import Any, NoReturn, TypeVar, cast

from ._errors import shown

F = TypeVar("F")
T = TypeVar("T", bound=type)

__all__ = [
    "AGEING_MAX", "argument_of", "as_int", "as_seconds", "bad_key", "check_ageing",
    "check_bool", "check_count", "check_key", "check_priority", "check_seconds",
    "check_timeout", "check_utf8", "made_by", "own_signatures", "public_name",
    "real_number", "shown_number",
]


def real_number(value: object, name: str, kind: str = "a number of seconds") -> int | float:
    """``value`` as a plain ``int`` or ``float``: itself when it is one, else a real
    number of another type converted (``fractions.Fraction``, ``decimal.Decimal``,
    NumPy's scalars; an integral one as ``int``; one too large for a float as ``inf``,
    ``Decimal("sNaN")`` as NaN). TypeError naming ``name`` (``f"{name} must be {kind}"``)
    for anything else, ``bool`` included (never read as a number)."""
    if value.__class__ is int or value.__class__ is float:
        return value
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Decimal)):
        raise TypeError(f"{name} must be {kind}, not {type(value).__name__}")
    if isinstance(value, numbers.Integral):
        return operator.index(value)
    try:
        return float(value)
    except OverflowError:  # a Fraction too large for a float: as an int too large
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]
    except ValueError:  # Decimal("sNaN"), which float() refuses: a NaN all the same
        return math.nan


def as_int(value: object, name: str) -> int:
    """``value`` as a plain ``int``: an integer of any integral type (NumPy's ``int64``,
    say); TypeError naming ``name`` for anything else (``bool`` too, and floats such as
    ``2.0``)."""
    if value.__class__ is int:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return operator.index(value)


#: The public call being made, while it builds a lane (``LaneQueue.add_lane()``): set by
#: :func:`made_by`, read by :func:`argument_of`.
_CALL: ContextVar[str | None] = ContextVar("lanequeue_public_call", default=None)


def argument_of(call: str) -> str:
    """The start of an argument error of ``call`` (``"Lane()"``): ``"Lane() argument"``,
    or, inside :func:`made_by`, the public call the caller made (``"LaneQueue.add_lane()
    argument"``), so a lane built for a queue or a backend names that call, not the
    lane's constructor."""
    return f"{_CALL.get() or call} argument"


@contextmanager
def made_by(call: str) -> Iterator[None]:
    """Within the block, the lane constructors' argument errors name ``call`` (see
    :func:`argument_of`). The outermost call wins: ``LaneQueue.add_lane(backend=...)``
    calling ``RedisBackend.lane()`` names ``LaneQueue.add_lane()``. Per thread and per
    task (a context variable)."""
    token = _CALL.set(_CALL.get() or call)
    try:
        yield
    finally:
        _CALL.reset(token)


def bad_key(key: object, name: str = "key") -> NoReturn:
    """Raise the error that explains why ``key`` is not a valid lane key."""
    if not isinstance(key, str):
        raise TypeError(f"{name} must be a str, not {type(key).__name__}")
    raise ValueError(f"{name} must be a non-empty string")


def check_utf8(key: str, name: str = "key") -> str:
    """``key`` if it can be sent as UTF-8 (what a Redis lane sends); ValueError naming
    ``name`` (and where the lone surrogate is) otherwise."""
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{name} must be encodable as UTF-8 (it contains a lone surrogate at "
                f"index {exc.start}): {shown(key)}"
            ) from None
    return key


def check_key(key: object, name: str = "key") -> str:
    """Return ``key`` as a plain ``str`` if it is a non-empty ``str``: a ``str`` subclass
    (a ``str`` Enum member) becomes its string value (``str.__str__``), so a key is the
    same plain string in every view of every face, in-process as on Redis. Raise
    TypeError/ValueError otherwise."""
    if not isinstance(key, str) or not key:
        bad_key(key, name)
    return key if key.__class__ is str else str.__str__(key)


def check_timeout(value: object, name: str = "timeout_s") -> float | None:
    """Validate a timeout in seconds.

    ``None``, ``math.inf`` and any value of ``threading.TIMEOUT_MAX`` seconds or more
    (about 292 years on Linux; also integers too large for a float, such as ``10**400``)
    mean "wait without limit" and return ``None``; ``0`` means "do not wait". Negative
    numbers and NaN raise ValueError; non-numbers (and ``bool``) raise TypeError.
    """
    if value is None:
        return None
    if value.__class__ is not float and value.__class__ is not int:  # (acquire's path)
        value = real_number(value, name, "a number of seconds or None")
    if value < 0:
        raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")
    if value >= TIMEOUT_MAX:  # (an int compares exactly, without converting)
        return None
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must not be NaN")
    return v


def check_seconds(value: object, name: str, *, positive: bool = False,
                  limit: float = math.inf) -> float:
    """Validate a duration that has no "no limit" meaning: a finite number of seconds
    ``>= 0`` (``> 0`` with ``positive``) and below ``limit``. ``inf``, NaN, negative
    numbers and values of ``limit`` or more (``10**400`` too) raise ValueError naming
    ``name``; non-numbers (and ``bool``) raise TypeError."""
    v = as_seconds(value, name)
    if not (v > 0 if positive else v >= 0) or not v < limit:  # (NaN fails both)
        bound = "> 0" if positive else ">= 0"
        if limit != math.inf:
            bound += f" and < {limit:.0f}"
        raise ValueError(
            f"{name} must be a finite number of seconds {bound}, got {shown_number(value)}")
    return v


def as_seconds(value: object, name: str) -> float:
    """``value``, a number of seconds of any real type, as a float (``inf`` for one too
    large for a float, ``10**400``); TypeError naming ``name`` for what is not a number
    (``bool`` included). The range is the caller's to check."""
    value = real_number(value, name)
    try:
        return float(value)
    except OverflowError:  # an int too large for a float
        return math.inf


def shown_number(value: object) -> str:
    """``value`` for an error message: its repr (shortened past 80 characters), or the
    length of an int too large for a float (``10**400``: "an integer of 401 digits")."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1024:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value)
    if len(text) > 80:  # a Fraction of huge terms, say: its start, end and length
        return f"{text[:40]}...{text[-20:]} ({len(text)} characters)"
    return text


#: ``ageing_s`` must stay below this (``threading.TIMEOUT_MAX``, about 292 years): then
#: ``priority * ageing_s`` (priorities within ``±2**31``) is a finite float in every rank.
AGEING_MAX = TIMEOUT_MAX


def check_ageing(value: object, name: str = "ageing_s") -> float:
    """Validate ``ageing_s`` (a lane's, a dispatcher's): the seconds of waiting that raise
    a waiter by one priority level, a finite number ``> 0`` and ``< AGEING_MAX`` (about
    292 years, so no rank ``now - priority * ageing_s`` can overflow). The one check and
    message for every face: ValueError for ``0``, negatives, ``inf``, NaN and ``1e308``;
    TypeError for what is not a number: ``None`` (a dispatcher's ``None``, no ageing, is
    handled by the caller), a ``str``, a ``bool``."""
    return check_seconds(value, name, positive=True, limit=AGEING_MAX)


def check_bool(value: object, name: str) -> bool:
    """Validate a flag: a ``bool`` (TypeError naming ``name`` otherwise, so ``"yes"`` or
    ``0`` is not read as a truth value)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def check_count(value: object, name: str) -> int:
    """Validate a positive integer count (``max_concurrent``, ``max_sessions``); an
    integer of another integral type (NumPy's ``int64``) is taken as its ``int``."""
    value = as_int(value, name)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


_PUBLIC_NAMES: dict[type, str] = {}


def public_name(cls: type) -> str:
    """The name of ``cls``, or of its nearest base whose name does not start with ``_``
    and that is not a mixin of steps (a class whose own ``_mixin`` is True: the holds'
    ``SessionHoldSteps`` and kin): the public class an error should name; remembered
    per class."""
    name = _PUBLIC_NAMES.get(cls)
    if name is None:
        name = _PUBLIC_NAMES[cls] = next(
            (c.__name__ for c in cls.__mro__
             if not c.__name__.startswith("_") and not c.__dict__.get("_mixin")),
            cls.__name__)
    return name


def shown_as_public(cls: T) -> T:
    """Class decorator: ``cls`` (an internal hold class that ``acquire`` makes) is named
    by its public class (:func:`public_name`) in the messages Python itself makes of an
    object of it: ``object AsyncHold can't be used in 'await' expression`` (``await
    lane.acquire(key)``), ``'AsyncHold' object does not support the context manager
    protocol`` (``with`` on an asyncio hold), where the internal name told a user
    nothing. Its ``__qualname__`` (its ``repr``, tracebacks) keeps the real name."""
    cls.__name__ = public_name(cls)
    return cls


def function_copy(fn: F, qualname: str | None = None) -> F:
    """A copy of the function ``fn`` with its own code object: the same code, defaults,
    closure (so ``super()`` is unchanged) and attributes; ``qualname`` renames it.

    CPython 3.11 and later keep a function's inline caches (its specialised attribute
    loads and stores) in its code object, and a site that sees instances of two classes
    is not specialised. A class that runs a shared function on its own instances only
    (each lane class its inherited methods, each hold class its face's steps) takes a
    copy, so its sites stay specialised when a process uses several lane kinds or both
    faces (``benchmarks/run.py`` prints what alternating a SessionLane and a Lane costs
    against each alone: its "ratio alternating / alone" row). A copy is made once, with
    its class: patching the original function later does not reach it.
    """
    func: Any = fn
    copy = types.FunctionType(
        func.__code__.replace(), func.__globals__, func.__name__, func.__defaults__,
        func.__closure__,
    )
    copy.__kwdefaults__ = func.__kwdefaults__
    copy.__dict__.update(func.__dict__)
    copy.__doc__ = func.__doc__
    copy.__annotations__ = func.__annotations__
    copy.__module__ = func.__module__
    copy.__qualname__ = func.__qualname__ if qualname is None else qualname
    return cast(F, copy)


def own_signatures(cls: type, *internal: type) -> None:
    """Give ``cls`` its own copy of each method it inherits from an internal base.

    An internal base is one of ``internal`` or a class whose name starts with ``_``.
    Python names the function's ``__qualname__`` in its own argument errors, so without
    this ``Lane()`` would report ``CountingKind.__init__() missing 1 required positional
    argument: 'name'``; with it, ``Lane.__init__() ...``. Public methods and
    ``__init__`` are copied (:func:`function_copy`: their own code objects, so each
    public class's ``acquire`` is specialised for its own instances), renamed after
    ``cls``. Private ones are not: patching an internal base's private method reaches
    every lane class, as it always did.
    """
    for base in cls.__mro__[1:]:
        if base not in internal and not base.__name__.startswith("_"):
            continue
        for attr, fn in vars(base).items():
            if not isinstance(fn, types.FunctionType):
                continue
            if attr.startswith("_") and attr != "__init__":
                continue
            if id(getattr(cls, attr, None)) != id(fn):  # overridden nearer to cls
                continue
            setattr(cls, attr, function_copy(fn, f"{cls.__qualname__}.{attr}"))


#: Bounds of a waiter's ``priority`` on a counting lane.
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


def check_priority(value: object, name: str = "priority") -> int:
    """Validate a waiter's priority: an ``int`` (not ``bool``) in
    ``[-2**31, 2**31 - 1]``; TypeError/ValueError otherwise."""
    value = as_int(value, name)
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(f"{name} must be between -2**31 and 2**31 - 1, got {value}")
    return int(value)


def check_no_priority(value: object, owner: str, why: str) -> int:
    """The priority of an acquire on a lane whose waiters are served in arrival order
    only (a per-key lane, a Redis lane): 0; TypeError/ValueError for a bad priority, and
    ValueError naming ``owner`` (its class) and ``why`` for any other valid one."""
    if (value.__class__ is int and not value) or (
            isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return 0
    check_priority(value)
    raise ValueError(f"{owner} takes no priority (got {value!r}): {why}")

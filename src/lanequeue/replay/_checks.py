"""Range checks of the replay's and the planner's settings, in one place.

Every setting of :class:`~lanequeue.replay.ReplayConfig`, :class:`~lanequeue.replay.plan.
PlanGoal`, :func:`~lanequeue.replay.plan.plan_capacity` and
:func:`~lanequeue.replay.plan.verify_plan` is checked by these functions, and only there:
the command line passes its options straight through and names the option of a refused
setting from :attr:`SettingError.setting`.

The bounds keep every derived time finite and every loop bounded: NaN and infinities are
refused, and so are numbers beyond the documented maxima (a count of 10**30 is as much a
typo as -1).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = [
    "MAX_COUNT",
    "MAX_PROCESSES",
    "MAX_SECONDS",
    "MAX_SPEED",
    "MAX_TPOT_MS",
    "MIN_SPEED",
    "SettingError",
    "above_setting",
    "check_count",
    "check_seconds",
    "check_speed",
    "check_tpot_ms",
    "decimal_text",
    "decimal_value",
]

#: Largest cap, registry size or request count a setting may name.
MAX_COUNT = 1_000_000_000
#: Largest number of processes (``workers``, ``jobs``).
MAX_PROCESSES = 1024
#: Largest duration setting (a wait goal, an idle timeout), seconds: about 31 years.
MAX_SECONDS = 1e9
#: Range of ``speed`` (trace time is divided by it).
MIN_SPEED = 1e-6
MAX_SPEED = 1e6
#: Largest work per output token, milliseconds (a minute per token).
MAX_TPOT_MS = 60_000.0


# Numbers in text: ASCII decimal notation only, so that what Python's float(), int() and
# Fraction() also take (underscores, "nan", "inf", "2/3", other scripts' digits; Fraction
# takes underscores only from Python 3.11) is refused alike on every Python.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?0*[0-9]{1,4})?")


def decimal_text(text: str) -> str | None:
    """``text`` without surrounding blanks if it is a number in ASCII decimal notation (an
    optional sign, digits with an optional ``.`` fraction, an optional exponent of at most
    4 digits after its leading zeros: ``-1.5``, ``.5``, ``2e3``, ``1e0005``), else None.

    Example::

        >>> decimal_text(" 2.5e-1 "), decimal_text("1_000"), decimal_text("nan")
        ('2.5e-1', None, None)
    """
    text = text.strip()
    return text if _DECIMAL.fullmatch(text) else None


def decimal_value(text: str) -> Fraction | None:
    """The exact value of ``text`` if it is a number in ASCII decimal notation (as
    :func:`decimal_text` takes it), however many digits it has (``Fraction()`` refuses
    more than 4,300, as ``int()`` does), else None.

    Example::

        >>> decimal_value(" 0.1 "), decimal_value("1e-3"), decimal_value("1_000")
        (Fraction(1, 10), Fraction(1, 1000), None)
    """
    from decimal import Decimal

    decimal = decimal_text(text)
    return None if decimal is None else Fraction(Decimal(decimal))


class SettingError(ValueError):
    """A setting refused: out of range, or excluded by another setting.

    Attributes:
        setting: the name of the refused setting (a keyword argument or config field, e.g.
            ``"speed"``); the command line names its option from it.
        expected: for a value out of range, what the setting must be (``"speed must be a
            number from 1e-06 to 1e+06"``): the message is this, ``, got`` and the value;
            the command line shows the value as it was typed instead. Else None.
        excluded_by: for a setting another one excludes, that setting's name (``"busy"``),
            and ``reason`` says why; the command line says it in its one form for
            options that do not go together. Else None.
        compared_with: for a value out of range of another setting's value (``min_global``
            above ``max_global``), that setting's name: ``expected`` names it, and the
            message is ``expected``, its value in parentheses, ``, got`` and the value;
            the command line shows both values as they were typed. Else None.
    """

    def __init__(
        self,
        setting: str,
        message: str,
        *,
        expected: str | None = None,
        excluded_by: str | None = None,
        reason: str | None = None,
        compared_with: str | None = None,
    ) -> None:
        super().__init__(message)
        self.setting = setting
        self.expected = expected
        self.excluded_by = excluded_by
        self.reason = reason
        self.compared_with = compared_with


def _out_of_range(setting: str, expected: str, value: object) -> SettingError:
    return SettingError(setting, f"{expected}, got {_shown(value)}", expected=expected)


def above_setting(setting: str, value: object, other: str, limit: object) -> SettingError:
    """The error of ``setting`` = ``value`` above ``other`` = ``limit`` (``min_global``
    above ``max_global``), in the form of a value out of range: ``min_global must be at
    most max_global (3), got 9``."""
    expected = f"{setting} must be at most {other}"
    return SettingError(setting, f"{expected} ({_shown(limit)}), got {_shown(value)}",
                        expected=expected, compared_with=other)


def _shown(value: object) -> str:
    """``value`` for a message, as it was given: a huge number (``1e400`` from the command
    line, ``10**400``) in scientific notation (``1e+400``; ``about`` when rounded to 12
    significant digits), never its thousands of digits nor only its size."""
    if isinstance(value, Fraction):
        if value.denominator != 1:
            try:
                return f"{float(value):g}"
            except OverflowError:
                return _scientific(value.numerator, value.denominator)
        value = value.numerator
    if isinstance(value, int) and value.bit_length() > 64:
        return _scientific(value, 1)
    return str(value)


def _scientific(numerator: int, denominator: int) -> str:
    import decimal

    with decimal.localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = 12, decimal.MAX_EMAX, decimal.MIN_EMIN
        ctx.traps[decimal.Inexact] = False
        number = (decimal.Decimal(numerator) / decimal.Decimal(denominator)).normalize()
        rounded = ctx.flags[decimal.Inexact]
    shown = f"{number:g}"
    return f"about {shown}" if rounded else shown


def _number(value: object, name: str, what: str) -> float | Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    return value


def check_seconds(
    value: object, name: str, *, maximum: float = MAX_SECONDS
) -> float | Fraction | int:
    """Return ``value``, a number of seconds from 0 to ``maximum`` (int, float or Fraction).

    Raises:
        TypeError: not a number (``bool`` included).
        SettingError: NaN, negative, infinite or above ``maximum``.
    """
    v = _number(value, name, "a number of seconds")
    if not 0 <= v <= maximum:  # NaN fails too
        raise _out_of_range(
            name, f"{name} must be a number of seconds from 0 to {maximum:g}", value
        )
    return v


def check_speed(value: object, name: str = "speed") -> float:
    """Return ``value`` as a float from :data:`MIN_SPEED` to :data:`MAX_SPEED`.

    Raises:
        TypeError: not a number.
        SettingError: NaN, infinite, or out of that range (0 and negatives included).
    """
    v = _number(value, name, "a number")
    if not MIN_SPEED <= v <= MAX_SPEED:
        raise _out_of_range(
            name, f"{name} must be a number from {MIN_SPEED:g} to {MAX_SPEED:g}", value
        )
    return float(v)


def check_tpot_ms(value: object, name: str = "tpot_ms") -> float | None:
    """Return ``value`` (None, or milliseconds from 0 to :data:`MAX_TPOT_MS`) as a float.

    Raises:
        TypeError: not a number or None.
        SettingError: NaN, negative, infinite or above the maximum.
    """
    if value is None:
        return None
    v = _number(value, name, "a number of milliseconds")
    if not 0 <= v <= MAX_TPOT_MS:
        raise _out_of_range(
            name, f"{name} must be a number of milliseconds from 0 to {MAX_TPOT_MS:g}", value
        )
    return float(v)


def check_count(value: object, name: str, *, maximum: int = MAX_COUNT) -> int:
    """Return ``value``, an integer from 1 to ``maximum``.

    Raises:
        TypeError: not an int (``bool`` and floats included).
        SettingError: below 1 or above ``maximum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not 1 <= value <= maximum:
        raise _out_of_range(name, f"{name} must be an integer from 1 to {maximum:,}", value)
    return value

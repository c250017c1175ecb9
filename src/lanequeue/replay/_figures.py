"""Figures shown next to a limit, in decimal notation computed exactly.

A figure printed beside the limit it was compared with must compare the same way as
printed: a share "more than 1%" is never shown as ``1%``, a wait that misses a 2 s goal
never as ``2.000``, and one within a limit never rounded up past it. :func:`against`
rounds to the usual number of digits and adds digits only where the rounded figure would
cross (or reach) the limit; past :data:`MAX_EXTRA_DIGITS` more it rounds towards the
limit's side (up for a figure above the limit, down for one within it), so what is
printed is on the right side whatever the limit. Everything is computed on fractions, so
no float noise (``33.33333333333333``, ``0.30000000000000004``) is ever printed: a float
is taken as its shortest decimal form (its ``repr``).
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["MAX_EXTRA_DIGITS", "against", "exact", "exact_text"]

#: Digits :func:`against` adds at most to the ones asked for before it rounds towards the
#: limit's side instead of to the nearest.
MAX_EXTRA_DIGITS = 15
#: Significant digits of :func:`exact_text` for a number with no finite decimal form.
_REPEATING_DIGITS = 12


def exact(value: int | float | Fraction) -> Fraction:
    """``value`` as a Fraction: exact for an int or a Fraction; a (finite) float as the
    decimal number its ``repr`` shows (``0.1`` is one tenth, not the nearest binary
    fraction)."""
    if isinstance(value, float):
        return Fraction(repr(value))
    return Fraction(value)


def _rounded(value: Fraction, places: int, mode: str) -> str:
    """``value`` to ``places`` decimals (a negative number rounds to tens, hundreds...):
    ``mode`` ``"nearest"`` (ties to even), ``"up"`` or ``"down"``. Trailing zeros are
    kept up to ``places``."""
    scaled = value * Fraction(10) ** places
    if mode == "up":
        units = math.ceil(scaled)
    elif mode == "down":
        units = math.floor(scaled)
    else:
        units = round(scaled)
    sign = "-" if units < 0 else ""
    digits = str(abs(units))
    if places <= 0:
        return sign + (digits + "0" * -places if units else "0")
    digits = digits.rjust(places + 1, "0")
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def _magnitude(value: Fraction) -> int:
    """The exponent ``e`` with ``10**e <= |value| < 10**(e + 1)`` (``value`` not 0)."""
    v = abs(value)
    e = len(str(v.numerator)) - len(str(v.denominator))
    while Fraction(10) ** e > v:
        e -= 1
    while Fraction(10) ** (e + 1) <= v:
        e += 1
    return e


def _digits(value: Fraction, digits: int, significant: bool, mode: str) -> str:
    if not significant:
        return _rounded(value, digits, mode)
    if value == 0:
        return "0"
    text = _rounded(value, digits - 1 - _magnitude(value), mode)
    if "." in text:  # significant digits: no trailing zeros, as %g prints
        text = text.rstrip("0").rstrip(".")
    return text


def against(
    value: int | float | Fraction,
    limit: int | float | Fraction | None,
    digits: int,
    *,
    significant: bool = False,
) -> str:
    """``value`` rounded to ``digits`` decimals (``significant``: significant digits,
    without trailing zeros), with as many more digits as it takes for the figure shown
    to compare with ``limit`` as ``value`` does: above it when ``value`` is above it, at
    most it when ``value`` is not. None: no limit, the figure rounded as asked.

    Example::

        >>> against(Fraction(101 * 100, 10_099), 1, 3, significant=True)
        '1.0001'
        >>> against(2.0004, 2, 3), against(2.0004, None, 3), against(1.99996, 2, 3)
        ('2.0004', '2.000', '2.000')
    """
    v = exact(value)
    if limit is None:
        return _digits(v, digits, significant, "nearest")
    lim = exact(limit)
    above = v > lim
    for more in range(MAX_EXTRA_DIGITS + 1):
        text = _digits(v, digits + more, significant, "nearest")
        if (Fraction(text) > lim) == above:
            return text
    return _digits(v, digits + MAX_EXTRA_DIGITS, significant, "up" if above else "down")


def exact_text(value: int | float | Fraction) -> str:
    """``value`` in plain decimal notation, exactly when it has a finite decimal form
    (every int and float, and the Fraction of a decimal such as ``--p99-wait-s 0.1``),
    else to 12 significant digits: a limit is shown as it was given, never rounded
    (``1.0000001``, not ``1``).

    Example::

        >>> exact_text(2), exact_text(1e-05), exact_text(Fraction("1.0000001"))
        ('2', '0.00001', '1.0000001')
    """
    v = exact(value)
    d = v.denominator
    places = 0
    while d % 10 == 0:
        d //= 10
        places += 1
    while d % 2 == 0 or d % 5 == 0:
        d //= 2 if d % 2 == 0 else 5
        places += 1
    if d != 1:
        return _digits(v, _REPEATING_DIGITS, True, "nearest")
    return _digits(v, places, False, "nearest") if places else str(v.numerator)

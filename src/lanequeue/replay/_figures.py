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

__all__ = ["MAX_EXACT_DIGITS", "MAX_EXTRA_DIGITS", "against", "exact", "exact_text"]

#: Digits :func:`against` adds at most to the ones asked for before it rounds towards the
#: limit's side instead of to the nearest.
MAX_EXTRA_DIGITS = 15
#: Most significant digits :func:`exact_text` shows of a number with a finite decimal
#: form; one with more is rounded to this many (``about``).
MAX_EXACT_DIGITS = 20
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
    # From the sizes in bits (str() of an int of more than 4,300 digits is refused).
    e = int((v.numerator.bit_length() - v.denominator.bit_length()) * 0.30102999566398)
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
    """``value`` as it was given, short: exactly when it has a finite decimal form of at
    most :data:`MAX_EXACT_DIGITS` significant digits (every float, and the Fraction of a
    decimal such as ``--p99-wait-s 0.1``), never rounded (``1.0000001``, not ``1``); with
    more, rounded to that many and marked ``about``; with no finite decimal form, to 12
    significant digits. In plain notation from 1e-6 to below 1e21, else in scientific
    notation (``1e-9999``, ``5e+300``), so a tiny or huge value is never printed as its
    thousands of digits.

    Example::

        >>> exact_text(2), exact_text(1e-05), exact_text(Fraction("1.0000001"))
        ('2', '0.00001', '1.0000001')
        >>> exact_text(Fraction(1, 10**9999)), exact_text(5e300), exact_text(10**40 + 1)
        ('1e-9999', '5e+300', 'about 1e+40')
    """
    v = exact(value)
    sign = "-" if v < 0 else ""
    v = abs(v)
    if v == 0:
        return "0"
    # v = n / d; a finite decimal form when d has no prime factor but 2 and 5.
    d = v.denominator
    twos = (d & -d).bit_length() - 1
    d >>= twos
    fives = 0
    while d % 5 == 0:
        d //= 5
        fives += 1
    about = ""
    if d != 1:
        exponent = _magnitude(v) + 1 - _REPEATING_DIGITS
        digits = _digit_string(round(v / Fraction(10) ** exponent))
    else:
        places = max(twos, fives)
        digits, exponent = _digit_string(v.numerator * 10**places // v.denominator), -places
        digits, exponent = _stripped(digits, exponent)
        if len(digits) > MAX_EXACT_DIGITS:
            digits, exponent = _round_digits(digits, exponent, MAX_EXACT_DIGITS)
            about = "about "
    return about + sign + _notation(*_stripped(digits, exponent))


def _stripped(digits: str, exponent: int) -> tuple[str, int]:
    """``digits * 10**exponent`` without the trailing zeros of ``digits``."""
    kept = digits.rstrip("0")
    return kept, exponent + len(digits) - len(kept)


def _digit_string(n: int) -> str:
    """The decimal digits of ``n`` >= 0, however many (``str()`` refuses more than 4,300
    by default)."""
    from decimal import Decimal

    return "".join(map(str, Decimal(n).as_tuple().digits))


def _round_digits(digits: str, exponent: int, keep: int) -> tuple[str, int]:
    """``digits * 10**exponent`` rounded (half to even) to ``keep`` significant digits."""
    head, rest = digits[:keep], digits[keep:]
    exponent += len(rest)
    units = int(head)
    tail = rest.rstrip("0")
    if rest[0] > "5" or (rest[0] == "5" and (len(tail) > 1 or units % 2)):
        units += 1
    return str(units), exponent


def _notation(digits: str, exponent: int) -> str:
    """The number ``digits * 10**exponent`` (``digits`` without trailing zeros): plain
    when its leading digit is from the 1e-6 to the 1e20 place, else scientific, as
    Python writes exponents (``1e-07``, ``5e+300``)."""
    lead = exponent + len(digits) - 1
    if not -7 < lead < 21:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{mantissa}e{lead:+03d}"
    if exponent >= 0:
        return digits + "0" * exponent
    point = len(digits) + exponent
    if point > 0:
        return f"{digits[:point]}.{digits[point:]}"
    return "0." + "0" * -point + digits

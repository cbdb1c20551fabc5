"""fairseq's search settings (its GenerationConfig: fairseq-generate's options, the hub's keyword
arguments), checked before a search. fairseq's SequenceGenerator takes them as given, then fails
deep inside (an assertion, a reshape of 0 elements) or returns another search's result (a NaN
length penalty ranks hypotheses arbitrarily). ``check_search_settings`` raises a UserError naming
the setting as the caller's user spells it and what it allows."""

import math
import numbers
from typing import Any, Callable

from .errors import UserError

FINITE = ("lenpen", "unkpen", "diverse_beam_strength", "diversity_rate")
EXCLUSIVE = ("sampling", "diverse_beam_groups", "match_source_len", "diversity_rate")


def _integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


def check_search_settings(get: Callable[[str], Any], spell: Callable[[str], str]) -> None:
    """GET(name): the setting's value (None where the caller has none); SPELL(name): how the user
    writes it ("--max-len-b", "max_len_b")."""
    def refuse(name, allowed):
        raise UserError(f"invalid {spell(name)}: {_shown(get(name))} (must be {allowed})")

    beam = get("beam")
    if not (_integer(beam) and beam >= 1):
        refuse("beam", "an integer >= 1")
    for name in FINITE:
        value = get(name)
        if value is not None and not (_number(value) and math.isfinite(value)):
            refuse(name, "a finite number")
    temperature = get("temperature")
    if temperature is not None and not (_number(temperature) and math.isfinite(temperature) and temperature > 0):
        refuse("temperature", "a finite number > 0")
    groups = get("diverse_beam_groups")
    if groups is not None and not _integer(groups):
        refuse("diverse_beam_groups", "an integer")
    if groups is not None and groups > 0 and beam % groups:
        refuse("diverse_beam_groups", f"a divisor of {spell('beam')} {beam}, or -1 for none")
    chosen = [name for name, on in zip(EXCLUSIVE, (get("sampling"), (groups or -1) > 0, get("match_source_len"),
                                                   (get("diversity_rate") or -1) > 0)) if on]
    if len(chosen) > 1:
        raise UserError(f"{' and '.join(spell(name) for name in chosen)} choose other searches: give one of them")
    check_lengths(get, spell)


def check_lengths(get: Callable[[str], Any], spell: Callable[[str], str]) -> None:
    """The output lengths (at most a * x + b tokens for a source of x, at least min_len). What
    depends on the source is checked once it is known (``plot.check_length_range``)."""
    a, b, shortest = get("max_len_a"), get("max_len_b"), get("min_len")
    if a is not None and not (_number(a) and math.isfinite(a) and a >= 0):
        raise UserError(f"invalid {spell('max_len_a')}: {_shown(a)} (must be a finite number >= 0)")
    for name, value in (("min_len", shortest), ("max_len_b", b)):
        if value is not None and not (_integer(value) and value >= 0):
            raise UserError(f"invalid {spell(name)}: {_shown(value)} (must be an integer >= 0)")
    if a == 0 and b is not None and shortest is not None and b < shortest and not get("match_source_len"):
        raise UserError(f"invalid {spell('max_len_b')}: {b} (must be >= {spell('min_len')} {shortest})")

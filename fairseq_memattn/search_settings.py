"""fairseq's search settings (its GenerationConfig: fairseq-generate's options, the hub's keyword
arguments), checked before a search. fairseq's SequenceGenerator takes them as given, then fails
deep inside (an assertion, a reshape of 0 elements) or returns another search's result (a NaN
length penalty ranks hypotheses arbitrarily). ``check_search_settings`` raises a UserError naming
the setting as the caller's user spells it and what it allows."""

import math
import operator
from typing import Any, Callable, Optional

from .errors import UserError

EXCLUSIVE = ("sampling", "diverse_beam_groups", "match_source_len", "diversity_rate")


def _integer(value) -> Optional[int]:
    """VALUE as an int where it is one (numpy's and 0-dim tensors too), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _number(value) -> Optional[float]:
    """VALUE as a float where it is a number (numpy's and 0-dim tensors too), else None."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_search_settings(get: Callable[[str], Any], spell: Callable[[str], str]) -> None:
    """GET(name): the setting's value (None where the caller has none); SPELL(name): how the user
    writes it ("--max-len-b", "max_len_b")."""
    def refuse(name, allowed, shown=repr):
        raise UserError(f"invalid {spell(name)}: {shown(get(name))} (must be {allowed})")

    beam = _integer(get("beam"))
    if beam is None or beam < 1:
        refuse("beam", "an integer >= 1")
    for name in ("lenpen", "diverse_beam_strength", "diversity_rate"):
        number = _number(get(name))
        if get(name) is not None and (number is None or not math.isfinite(number)):
            refuse(name, "a finite number", shown=str)
    unkpen = _number(get("unkpen"))
    if get("unkpen") is not None and (unkpen is None or math.isnan(unkpen) or unkpen == -math.inf):
        refuse("unkpen", "a number, inf to ban <unk>", shown=str)
    temperature = _number(get("temperature"))
    if get("temperature") is not None and not (temperature is not None and math.isfinite(temperature)
                                               and temperature > 0):
        refuse("temperature", "a finite number > 0", shown=str)
    groups = get("diverse_beam_groups")
    if groups is not None and _integer(groups) is None:
        refuse("diverse_beam_groups", "an integer")
    if groups is not None and groups > 0 and beam % groups:
        refuse("diverse_beam_groups", f"a divisor of {spell('beam')} {beam}, or -1 for none")
    chosen = [name for name, on in zip(EXCLUSIVE, (get("sampling"), (groups or -1) > 0, get("match_source_len"),
                                                   (get("diversity_rate") or -1) > 0)) if on]
    if len(chosen) > 1:
        raise UserError(f"{' and '.join(spell(name) for name in chosen)} choose other searches: give one of them")
    if get("sampling_topk") is not None and _integer(get("sampling_topk")) is None:
        refuse("sampling_topk", "an integer, -1 for none")
    topp = _number(get("sampling_topp"))
    if get("sampling_topp") is not None and (topp is None or math.isnan(topp)):
        refuse("sampling_topp", "a number, -1 for none")
    for name in ("sampling_topk", "sampling_topp"):  # fairseq's "off" is below 0
        if (get(name) if get(name) is not None else -1) >= 0 and not get("sampling"):
            raise UserError(f"{spell(name)} {get(name)} samples: give {spell('sampling')} too, or leave it out")
    check_lengths(get, spell)


def check_lengths(get: Callable[[str], Any], spell: Callable[[str], str]) -> None:
    """The output lengths (at most a * x + b tokens for a source of x, at least min_len). What
    depends on the source is checked once it is known (``plot.check_length_range``)."""
    a, b, shortest = (get(name) for name in ("max_len_a", "max_len_b", "min_len"))
    for name, value, least in (("max_len_a", a, 0), ("min_len", shortest, 0), ("max_len_b", b, None)):
        number = _number(value)
        if value is not None and (number is None or not math.isfinite(number) or
                                  (least is not None and number < least)):
            allowed = "a finite number" + (f" >= {least}" if least is not None else "")
            shown = f"{number:g}" if number is not None else repr(value)
            raise UserError(f"invalid {spell(name)}: {shown} (must be {allowed})")
    # with a > 0, a negative b still leaves long sources room
    if a == 0 and b is not None and shortest is not None and b < shortest and not get("match_source_len"):
        raise UserError(f"invalid {spell('max_len_b')}: {b:g} (must be >= {spell('min_len')} {shortest:g})")

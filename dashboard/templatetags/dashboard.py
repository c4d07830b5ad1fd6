import json
import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

from veri.money import usd_places

register = template.Library()


@register.filter
def code_spans(text: str) -> str:
    """The error catalog's sentences mark commands with backticks: show those as code."""
    return mark_safe(re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text)))


@register.filter
def binary_size(n: int | None) -> str:
    """Bytes in binary units, as the CLI writes them (`234 B`, `539.1 KiB`); Django's
    `filesizeformat` says `KB` and `bytes`."""
    if n is None:
        return "—"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


# Every amount on the dashboard has this many decimals: a small job's cost is a fraction of a
# cent, and amounts in one column line up.
MONEY_PLACES = 4


@register.filter
def dollars(micros: int) -> str:
    """Micro-dollars as the dashboard writes them: `0.0123` (views and JSON reads use it too)."""
    return usd_places(micros, MONEY_PLACES)


@register.filter
def money(micros: int | None) -> str:
    """Micro-dollars as `0.0123 USD` (`—` for none)."""
    return "—" if micros is None else f"{dollars(micros)} USD"


@register.filter
def to_json(value) -> str:
    """A value as JSON for a `data-` attribute (escaped there like any text): the policy allows
    no inline script, so scripts read their data from attributes."""
    return json.dumps(value)

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

from veri import money

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


@register.filter
def usd(micros: int) -> str:
    """Micro-dollars as the API writes dollars (`veri.money.usd`)."""
    return money.usd(micros)

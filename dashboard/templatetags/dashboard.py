import re

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

register = template.Library()


@register.filter
def code_spans(text: str) -> str:
    """The error catalog's sentences mark commands with backticks: show those as code."""
    return mark_safe(re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text)))

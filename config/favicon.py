"""`/favicon.ico`, which every browser asks each page for: Veri's mark, a small SVG (a 404 there
filled the logs and the browser's console)."""

from django.http import HttpResponse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe

ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    '<rect width="32" height="32" rx="6" fill="#0969da"/>'
    '<path d="M8 8l8 17 8-17" fill="none" stroke="#fff" stroke-width="4" '
    'stroke-linecap="round" stroke-linejoin="round"/></svg>'
)


@require_safe
@cache_control(public=True, max_age=86400)
def favicon(request):
    return HttpResponse(ICON, content_type="image/svg+xml")

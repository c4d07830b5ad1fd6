"""The JSON parser of `/v1`: DRF's, refusing up front what would otherwise surface as a 500
further in (a database that cannot store it, a float that overflows, a recursion limit)."""

from rest_framework.parsers import JSONParser

MAX_DEPTH = 32  # the deepest body /v1 takes is 4 levels; a deep one only burns stack
INT64 = 2**63


def _refuse(message: str, path: str) -> Exception:
    # Imported here: DRF loads this parser while `veri.errors` itself imports DRF.
    from veri.errors import VeriError

    return VeriError(message, field=path or None, code="parse_error")


def check_json(value, *, max_depth: int = MAX_DEPTH) -> None:
    """Raise `parse_error` (naming the field) for nesting deeper than `max_depth`, integers
    beyond 64 bits, non-finite numbers, and strings the database cannot hold (NUL in a key, a
    lone surrogate anywhere). Iterative, so a deep body cannot exhaust the stack here either."""
    stack = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > max_depth:
            raise _refuse(f"The body is nested more than {max_depth} levels deep.", path)
        if isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in key or not _encodable(key):
                    raise _refuse("An object key holds a NUL or a lone surrogate.", path)
                stack.append((child, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(item, list):
            for index, child in enumerate(item):
                stack.append((child, f"{path}.{index}" if path else str(index), depth + 1))
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -INT64 <= item < INT64:
                raise _refuse("Whole numbers must fit in 64 bits.", path)
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise _refuse("Numbers must be finite.", path)
        elif isinstance(item, str) and not _encodable(item):
            raise _refuse("A string holds a lone surrogate (not valid Unicode).", path)


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class SafeJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise _refuse(f"The body is nested more than {MAX_DEPTH} levels deep.", "") from None
        check_json(data)
        return data

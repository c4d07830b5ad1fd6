"""Money as integers: micro-dollars (`1_000_000` = 1 USD) everywhere, `Decimal` only to read a
dollar amount in or write one out, whole cents only at Stripe's edge. Pure functions, no models:
every app may import them (billing turns facts into money with them; training and the dashboard
show amounts with `usd`)."""

from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

MICROS = 1_000_000  # micro-dollars in a dollar


def usd(micros: int) -> str:
    """Micro-dollars as a dollar string with cents or more (`12.5` → `"12.50"`)."""
    value = (Decimal(micros) / MICROS).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)
    text = f"{value:f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"{whole}.{cents.ljust(2, '0')}"


def usd_places(micros: int, places: int) -> str:
    """Micro-dollars as a dollar string with exactly `places` decimals (0 to 6), half up: a
    column of amounts lines up (`usd_places(1_234, 4)` → `"0.0012"`)."""
    value = (Decimal(micros) / MICROS).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return f"{value if value else abs(value):f}"  # no "-0.0000"


def micros_from_usd(amount) -> int:
    """A dollar amount (a number or a decimal string) in micro-dollars, half up."""
    return int((Decimal(str(amount)) * MICROS).to_integral_value(rounding=ROUND_HALF_UP))


def cents_half_up(micros: int) -> int:
    """Micro-dollars as whole cents, a half cent away from zero (ROUND_HALF_UP), in integers."""
    cents = (abs(micros) + 5_000) // 10_000
    return cents if micros >= 0 else -cents


def micros_for(*, price_per_hour_micros: int, elapsed: timedelta) -> int:
    """`elapsed` (to the microsecond; nothing when negative) at an hourly price, rounded down to
    the micro-dollar; integers throughout (a float can lose the last micro-dollar)."""
    elapsed_us = (elapsed.days * 86_400 + elapsed.seconds) * 1_000_000 + elapsed.microseconds
    return price_per_hour_micros * max(elapsed_us, 0) // 3_600_000_000


def compute_micros(*, price_per_hour_micros: int, start: datetime, end: datetime) -> int:
    """Per second from `start` to `end` (nothing when `end` is earlier), at an hourly price."""
    return micros_for(price_per_hour_micros=price_per_hour_micros, elapsed=end - start)

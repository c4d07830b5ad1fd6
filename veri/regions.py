"""Where Veri runs: its regions. The platform's geography, which volumes (a volume lives in a
region) and providers (each has zones in some regions; `providers.catalog`) both read."""

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True, slots=True)
class Region:
    code: str
    name: str
    coming_soon: bool = False


REGIONS = (
    Region("us-east-1", "US East (N. Virginia)"),
    Region("us-west-2", "US West (Oregon)"),
    Region("eu-west-1", "Europe (Ireland)"),
    Region("eu-central-1", "Europe (Frankfurt)", coming_soon=True),
    Region("ap-northeast-1", "Asia Pacific (Tokyo)", coming_soon=True),
)


def available_region_codes() -> list[str]:
    return [region.code for region in REGIONS if not region.coming_soon]


def default_region() -> str:
    return settings.VERI_DEFAULT_REGION

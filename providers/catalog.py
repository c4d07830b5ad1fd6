"""Where Veri runs: regions, and per provider its zones, GPU types, hourly prices and limits.

The catalog lists every provider; one is *usable* when this deployment has its adapter and
credentials (`local` always is). Prices are USD per GPU-hour, kept as strings for exactness.
"""

import shutil
import subprocess
from dataclasses import dataclass
from decimal import Decimal
from functools import cache

from django.conf import settings

# Regions are the platform's geography, shared with volumes; the catalog answers for them too.
from veri.regions import REGIONS as REGIONS
from veri.regions import Region as Region
from veri.regions import available_region_codes as available_region_codes
from veri.regions import default_region as default_region


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_gb: int
    price_per_gpu_hour: str  # USD
    max_count: int
    tflops: float = 0.0  # dense bf16 peak, for quotes (cpu: what a laptop-class CPU reaches)

    @property
    def price_per_gpu_hour_micros(self) -> int:
        return int(Decimal(self.price_per_gpu_hour) * 1_000_000)


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    name: str
    title: str
    zones: dict[str, tuple[str, ...]]  # region -> zones, tried in order
    gpus: tuple[GpuType, ...]
    launch_timeout_seconds: int
    boot_seconds: int = 300  # launch to a training worker, for quotes
    # How long a launched worker has to register before the job fails with provisioning_error
    # (None: the provisioning deadline, VERI_PROVISIONING_TIMEOUT_SECONDS, which covers a boot).
    register_timeout_seconds: int | None = None

    def gpu(self, name: str) -> GpuType | None:
        return next((g for g in self.gpus if g.name == name), None)


CLOUD_PROVIDERS = (
    ProviderSpec(
        "aws",
        "AWS (EC2)",
        {
            "us-east-1": ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"),
            "us-west-2": ("us-west-2a", "us-west-2b", "us-west-2c"),
            "eu-west-1": ("eu-west-1a", "eu-west-1b", "eu-west-1c"),
        },
        (
            GpuType("L4-24GB", 24, "0.805", 8, tflops=121),
            GpuType("A10G-24GB", 24, "1.212", 8, tflops=70),
            GpuType("A100-80GB", 80, "5.120", 8, tflops=312),
            GpuType("H100-80GB", 80, "6.880", 8, tflops=989),
        ),
        launch_timeout_seconds=600,
    ),
    ProviderSpec(
        "vast",
        "Vast.ai",
        {"us-east-1": ("vast-us",), "us-west-2": ("vast-us",), "eu-west-1": ("vast-eu",)},
        (
            GpuType("RTX4090-24GB", 24, "0.400", 8, tflops=165),
            GpuType("A100-80GB", 80, "1.300", 8, tflops=312),
            GpuType("H100-80GB", 80, "2.400", 8, tflops=989),
        ),
        launch_timeout_seconds=900,
    ),
    ProviderSpec(
        "digitalocean",
        "DigitalOcean GPU Droplets",
        {"us-east-1": ("nyc2",), "eu-west-1": ("ams3",)},
        (GpuType("H100-80GB", 80, "3.390", 8, tflops=989),),
        launch_timeout_seconds=900,
    ),
    ProviderSpec(
        "gcp",
        "Google Cloud (Flex-start)",
        {"us-east-1": ("us-east4-a", "us-east4-c"), "us-west-2": ("us-west1-a",)},
        (
            GpuType("A100-80GB", 80, "3.930", 1, tflops=312),
            GpuType("H100-80GB", 80, "11.060", 1, tflops=989),
        ),
        launch_timeout_seconds=1080,
    ),
)


# Data-parallel processes a `cpu` job may run on this machine (gloo): enough to exercise the
# multi-GPU path without a GPU.
LOCAL_CPU_PROCESSES = 2


@cache
def local_gpus() -> tuple[str, int] | None:
    """The machine's own NVIDIA GPU as `<model>-<memory>GB` and how many there are, or None (no
    driver, no GPU)."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out:
        return None
    name, memory_mib = (part.strip() for part in out[0].split(","))
    gpu = f"{name.replace('NVIDIA ', '').replace(' ', '-')}-{round(int(memory_mib) / 1024)}GB"
    return gpu, len(out)


def local_provider() -> ProviderSpec:
    """Runs the worker on this machine, in any region: `cpu`, plus its GPU when it has one."""
    price = settings.VERI_LOCAL_PRICE_PER_HOUR
    gpus = [GpuType("cpu", 0, price, LOCAL_CPU_PROCESSES, tflops=0.2)]
    if found := local_gpus():
        gpu, count = found
        memory = int(gpu.rsplit("-", 1)[1].removesuffix("GB"))
        gpus.append(GpuType(gpu, memory, price, count, tflops=100))
    zones = {region.code: ("local",) for region in REGIONS if not region.coming_soon}
    return ProviderSpec(
        "local",
        "This machine",
        zones,
        tuple(gpus),
        launch_timeout_seconds=120,
        boot_seconds=20,
        register_timeout_seconds=settings.VERI_LOCAL_REGISTER_TIMEOUT_SECONDS,
    )


def providers() -> list[ProviderSpec]:
    return [local_provider(), *CLOUD_PROVIDERS]


def get_provider(name: str) -> ProviderSpec | None:
    return next((p for p in providers() if p.name == name), None)

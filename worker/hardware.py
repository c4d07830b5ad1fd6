"""The hardware check: `python -m worker.hardware DEVICE`, one process per rank (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment, as for training). It runs before any
customer code and again after a failure, and loads none: every expected device present, a
memory test on each CUDA device, and a small collective across all ranks. Each rank prints one
JSON line, `{"rank", "ok", "problem", "code"}`; that result, not text in a log, is what makes a
`hardware_error` verdict (or `provisioning_error`: torch cannot use GPUs the driver lists)."""

import json
import os
import subprocess
import sys
from datetime import timedelta

MEMORY_TEST_BYTES = 256 * 1024**2
COLLECTIVE_TIMEOUT = timedelta(seconds=60)


def check(device: str) -> str | None:
    """None when this rank's device and its link to the other ranks work, else the problem."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device == "cuda":
        present = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if present < local_world:
            listed, driver = driver_gpus()
            if listed >= local_world:  # the GPUs are there: the torch installed cannot use them
                raise TorchMismatch(
                    f"torch {torch.__version__} (built for CUDA {torch.version.cuda or 'none'}) "
                    f"sees {present} of the {listed} GPUs nvidia-smi lists (driver {driver}): "
                    "the installed torch does not match this machine's driver"
                )
            return f"{local_world} GPUs expected on this machine, {present} present"
        torch.cuda.set_device(local_rank)
        pattern = torch.arange(MEMORY_TEST_BYTES // 4, dtype=torch.int32, device="cuda")
        if int((pattern.flip(0).flip(0) - pattern).abs().sum()) != 0:
            return f"GPU {local_rank} returned different bytes than were written to its memory"
        del pattern
    if world > 1:
        backend = "nccl" if device == "cuda" else "gloo"
        try:
            dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
            total = torch.tensor([rank + 1.0], device=device if device == "cuda" else "cpu")
            dist.all_reduce(total)
            if int(total.item()) != world * (world + 1) // 2:
                return f"an all-reduce across {world} ranks summed to {total.item()}"
            dist.destroy_process_group()
        except (RuntimeError, ValueError) as exc:  # a rank that never came, a broken link
            return f"the {backend} collective across {world} ranks failed: {exc}"[:500]
    return None


class TorchMismatch(Exception):
    """torch cannot use GPUs the driver lists: the machine was set up wrong (the platform's
    `provisioning_error`), not a broken GPU."""


def driver_gpus() -> tuple[int, str]:
    """(GPUs `nvidia-smi` lists, driver version); (0, "none") without a driver."""
    try:
        found = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return 0, "none"
    return len(found), found[0] if found else "none"


def main() -> int:
    code = "hardware_error"
    try:
        problem = check(sys.argv[1])
    except TorchMismatch as mismatch:
        code, problem = "provisioning_error", str(mismatch)
    rank = int(os.environ.get("RANK", 0))
    result = {"rank": rank, "ok": problem is None, "problem": problem, "code": code}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

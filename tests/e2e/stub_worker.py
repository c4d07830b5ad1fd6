"""A stand-in for the real worker: speaks the worker API as the real one does (register, spec,
running, logs, metrics, a final checkpoint, complete), without training anything.

Usage (as the local provider runs it): stub_worker.py run --job ID --api URL
"""

import argparse
import os
import time

import httpx

from worker.runner import registration


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--job", required=True)
    parser.add_argument("--api", required=True)
    args = parser.parse_args()
    api = httpx.Client(
        base_url=f"{args.api}/v1/worker/jobs/{args.job}",
        timeout=30,
        headers={"Authorization": f"Bearer {os.environ['VERI_JOB_TOKEN']}"},
    )
    print("stub worker starting", flush=True)
    api.post("/register", json=registration() | {"hostname": "stub"}).raise_for_status()
    spec = api.get("/spec").raise_for_status().json()
    api.post("/status", json={"status": "running"}).raise_for_status()
    for step in range(1, 4):
        line = f"stub step {step} of {spec['method']} on {spec['base_model']}"
        print(line, flush=True)
        api.post("/logs", json={"lines": [{"seq": step, "text": line}]}).raise_for_status()
        api.post("/metrics", json={"points": [{"step": step, "values": {"loss": 1 / step}}]})
        api.post("/heartbeat", json={"step": step}).raise_for_status()
        time.sleep(float(os.environ.get("STUB_STEP_SECONDS", "0.2")))
    [target] = (
        api.post("/output-credentials", json={"paths": ["final/adapter_config.json"]})
        .raise_for_status()
        .json()["files"]
    )
    httpx.put(
        target["url"],
        content=b"{}",
        headers={**target["headers"], "Content-Type": "application/octet-stream"},
    ).raise_for_status()
    api.post(
        "/checkpoints",
        json={"step": 3, "final": True, "files": [{"path": "adapter_config.json", "size": 2}]},
    ).raise_for_status()
    api.post("/complete", json={"ok": True}).raise_for_status()


if __name__ == "__main__":
    main()

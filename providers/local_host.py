"""The `local` provider's "machine": runs the worker as its child and stays up after the worker
exits, as a VM would, until the control plane terminates it (kills this process group).

A simulated preemption: when the notice file (see local.py) appears in this machine's folder, the
host takes the machine away at the notice's time, as a spot market would, and marks it reclaimed.

Run as a script (`python providers/local_host.py LOG -- CMD...`); it imports nothing of Veri.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

NOTICE_FILE = "preemption-notice.json"
RECLAIMED_DIR = ".reclaimed"


def take_away_when_noticed(folder: Path) -> None:
    notice = folder / NOTICE_FILE
    while not notice.exists():
        time.sleep(0.2)
    when = datetime.fromisoformat(json.loads(notice.read_text())["terminates_at"])
    time.sleep(max(0.0, when.timestamp() - time.time()))
    reclaimed = folder.parent / RECLAIMED_DIR
    reclaimed.mkdir(exist_ok=True)
    (reclaimed / str(os.getpid())).touch()
    os.killpg(os.getpgid(0), signal.SIGKILL)  # the whole machine, worker and host


def main() -> None:
    log_path, separator, *command = sys.argv[1:]
    assert separator == "--", "usage: local_host.py LOG -- COMMAND..."
    folder = Path(log_path).parent
    threading.Thread(target=take_away_when_noticed, args=(folder,), daemon=True).start()
    with open(log_path, "ab", buffering=0) as log:
        worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        code = worker.wait()
        log.write(f"\n[local host] worker exited with {code}; host stays up\n".encode())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()

"""The `local` provider's "machine": runs the worker as its child and stays up after the worker
exits, as a VM would, until the control plane terminates it (kills this process group).

Run as a script (`python providers/local_host.py LOG -- CMD...`); it imports nothing of Veri.
"""

import signal
import subprocess
import sys
import time


def main() -> None:
    log_path, separator, *command = sys.argv[1:]
    assert separator == "--", "usage: local_host.py LOG -- COMMAND..."
    with open(log_path, "ab", buffering=0) as log:
        worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        code = worker.wait()
        log.write(f"\n[local host] worker exited with {code}; host stays up\n".encode())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()

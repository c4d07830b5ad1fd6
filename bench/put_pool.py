"""The upload benchmark's ceiling: 16 threads of plain PUTs from a folder to a bucket, each with
the SHA-256 the store checks (as each of Veri's PUTs carries), and nothing else. It runs as its
own process, spawned and timed like every tool, so its start-up (Python, boto3's import, the
client) counts as theirs does; it imports boto3 and the standard library only.

    python -m bench.put_pool FOLDER BUCKET PREFIX    (the store: AWS_ENDPOINT_URL and AWS_*)
"""

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from botocore.config import Config

THREADS = 16


def main() -> None:
    folder, bucket, prefix = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    s3 = boto3.client("s3", config=Config(max_pool_connections=THREADS))

    def put(file: Path) -> None:
        key, body = f"{prefix}{file.name}", file.read_bytes()
        s3.put_object(Bucket=bucket, Key=key, Body=body, ChecksumAlgorithm="SHA256")

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(put, sorted(folder.iterdir())))


if __name__ == "__main__":
    main()

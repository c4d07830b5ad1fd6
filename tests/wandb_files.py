"""Read an offline W&B run back: the records of its `.wandb` file (LevelDB's log format, which
W&B writes: a 7-byte file header, then 32 KiB blocks of checksummed chunks; wandb 0.31 ships no
Python reader of its own), parsed with wandb's own protobuf `Record`."""

import json
import struct
import time
import zlib
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    found, pending, at = [], b"", HEADER
    while at + HEADER <= len(data):
        left_in_block = BLOCK - at % BLOCK
        if left_in_block < HEADER:  # the block's tail is padding
            at += left_in_block
            continue
        checksum, length, kind = struct.unpack("<IHB", data[at : at + HEADER])
        if at + HEADER + length > len(data):  # a chunk still being written: read up to it
            break
        chunk = data[at + HEADER : at + HEADER + length]
        at += HEADER + length
        if kind == 0 and length == 0:
            continue
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == checksum
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
    return found


def offline_run(work: Path, timeout: float = 30) -> Path:
    """The one offline run's `.wandb` file under a job's work folder, once W&B has written its
    end: `run.finish` returns when W&B's own service took the last records, which writes them to
    the file a moment later."""
    [path] = work.glob("wandb/wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + timeout
    while not any(r.WhichOneof("record_type") == "exit" for r in records(path)):
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout} s"
        time.sleep(0.2)
    return path


def history(path: Path) -> list[dict]:
    """Each logged row: `_step` and the values, as W&B will show them."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            rows.append(row)
    return rows


def run_record(path: Path):
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run
    return None

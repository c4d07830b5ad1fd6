"""Reading what the training wrote (checkpoints, the final model) without trusting it: the
folders are the training's, so a file there may be a link to a secret of the runner's, a FIFO
that blocks a reader, or be swapped for one between a check and a read. Every folder and file is
opened relative to its parent's descriptor without following links, kept open from hashing to
uploading, and only regular files are taken."""

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_FILES = 1000  # what one output-credentials request signs
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


@dataclass
class OutputFile:
    path: str  # relative to the folder, with /
    fd: int
    size: int
    sha256: str


class Unreadable(Exception):
    """The folder is not one the runner can take: the message says why."""


def _hash(fd: int) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1024 * 1024):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def _walk(dir_fd: int, prefix: str, found: list[OutputFile], skipped: list[str]) -> None:
    with os.scandir(dir_fd) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        path = f"{prefix}{name}"
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            child = None
        if child is not None:
            try:
                _walk(child, f"{path}/", found, skipped)
            finally:
                os.close(child)
            continue
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
        except OSError:
            skipped.append(path)  # a link, or gone
            continue
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            skipped.append(path)
            continue
        if len(found) >= MAX_FILES:
            os.close(fd)
            raise Unreadable(f"more than {MAX_FILES} files")
        os.set_blocking(fd, True)
        size, digest = _hash(fd)
        found.append(OutputFile(path=path, fd=fd, size=size, sha256=digest))


def open_files(root: Path, *parts: str) -> tuple[list[OutputFile], list[str]]:
    """The regular files under `root/parts…` (each part a folder name, not a link), opened, with
    their sizes and sha256; and the paths skipped (links, devices, FIFOs). `root` is the
    runner's own folder. The caller closes the files (`close_all`)."""
    fd = os.open(root, DIR_FLAGS)
    found: list[OutputFile] = []
    try:
        for part in parts:
            try:
                inner = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise Unreadable(f"{part!r} is not a folder ({exc.strerror})") from exc
            os.close(fd)
            fd = inner
        skipped: list[str] = []
        _walk(fd, "", found, skipped)
    except BaseException:
        close_all(found)
        raise
    finally:
        os.close(fd)
    return found, skipped


def close_all(files: list[OutputFile]) -> None:
    for file in files:
        os.close(file.fd)


def body(file: OutputFile):
    """The file's bytes from the start, as a file object of its own (the descriptor stays)."""
    os.lseek(file.fd, 0, os.SEEK_SET)
    return os.fdopen(os.dup(file.fd), "rb")

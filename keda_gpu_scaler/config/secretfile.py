"""Files read again whenever they change: secrets (a bearer token, a password) and certificates."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


FileVersion = tuple[int, int, int]


def file_version(path: Path) -> FileVersion:
    """What tells a changed file: rewritten in place (size, mtime) or swapped in through a symlink as
    Kubernetes does for Secret volumes (a new inode). Raises OSError when the file cannot be read."""
    stat = os.stat(path)
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


class SecretFileError(Exception):
    """The secret cannot be read; the message names the flag and the file."""


class SecretFile:
    """A secret kept in a file and read again whenever the file changes.

    Tokens refreshed by workload identity or a sidecar are rewritten in place, or swapped in through a
    symlink as Kubernetes does for Secret volumes: a new inode, size or mtime means a new secret.
    `error` is the exception class raised when it cannot be read (its message names the flag).
    """

    def __init__(self, path: Path, flag: str, error: type[Exception] = SecretFileError) -> None:
        self._path = path
        self._flag = flag
        self._error = error
        self._version: FileVersion | None = None
        self._value = ""

    def read(self) -> str:
        try:
            version = file_version(self._path)
            if version != self._version:
                value = self._path.read_text().strip()
                if not value:
                    raise self._error(f"{self._flag}: {self._path} is empty")
                self._value, self._version = value, version
                log.info("read %s from %s", self._flag, self._path)
        except OSError as error:
            raise self._error(f"{self._flag}: cannot read {self._path}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise self._error(f"{self._flag}: {self._path} is not UTF-8 text") from None
        return self._value

"""Real small tmpfs mounts for storage-fault tests: a disk that fills up, a folder that turns read-only.

Needs root with the right to mount (CAP_SYS_ADMIN); where mounting is refused, the
tests that use it skip and say why. No filesystem wrapper stands in for the fault:
ENOSPC and EROFS come from the kernel.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


class Tmpfs:
    """A tmpfs of ``size`` bytes mounted at ``path``; can be filled, remounted read-only and back."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._filler = path / ".filler"

    def read_only(self) -> None:
        _run("mount", "-o", "remount,ro", str(self.path))

    def writable(self) -> None:
        _run("mount", "-o", "remount,rw", str(self.path))

    def fill(self) -> None:
        """Write a filler file until the kernel answers ENOSPC (the disk is then full)."""
        chunk = b"\0" * 4096
        with open(self._filler, "ab", buffering=0) as sink, contextlib.suppress(OSError):
            while True:
                sink.write(chunk)
        # A last small write must fail now, or the disk is not full.
        with pytest.raises(OSError), open(self._filler, "ab", buffering=0) as sink:
            sink.write(b"\0")
            os.fsync(sink.fileno())

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._filler.unlink()


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")


@contextlib.contextmanager
def tmpfs(path: Path, size: int = 4 * 1024 * 1024) -> Iterator[Tmpfs]:
    """Mount a fresh tmpfs at ``path`` (created) for the block; skip the test where mounting is refused."""
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}); these tests need root with CAP_SYS_ADMIN")
    try:
        yield Tmpfs(path, size)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)

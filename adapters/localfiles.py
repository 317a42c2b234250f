"""Reading a file from this machine's disk that someone else may have put there: a manifest of a
checkout (whoever can push chose it), a key list named in reconciler.yaml. Only a regular file is
read: a symbolic link that leaves the repository (to /proc/self/environ, to a key) is refused, and
so are a FIFO (whose read would wait forever), a device, a socket and a folder, each in one
sentence naming the file."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class Refused(Exception):
    """The file is not read; the message names it and says why."""


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def inside(path: Path, root: Path, shown: str) -> Path:
    """`path` with its symbolic links resolved, refused when that leaves `root`."""
    real = path.resolve()
    if not real.is_relative_to(root.resolve()):
        raise Refused(f"{shown} is a symbolic link to {real}, outside the repository; it is not read "
                      "(name a file inside the repository)")
    return real


def read_regular(path: Path, limit: int, shown: str, root: Path | None = None) -> bytes:
    """The bytes of the regular file at `path` (at most `limit`), `shown` naming it in messages.
    With `root`, the file (after its links) must lie inside that folder. Opened without following
    a link in its last step and without waiting on a FIFO, and checked on the open file, so a file
    swapped after the check is refused too. Raises Refused, or OSError when it cannot be read."""
    real = inside(path, root, shown) if root is not None else path.expanduser()
    mode = os.stat(real).st_mode
    if not stat.S_ISREG(mode):  # not even opened: opening a device can act (a tape rewinds)
        raise Refused(f"{shown} is {kind_of(mode)}, not a regular file; it is not read")
    fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if root is not None else 0))
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{shown} is {kind_of(info.st_mode)}, not a regular file; it is not read")
        if info.st_size > limit:
            raise Refused(f"{shown}: file is {info.st_size} bytes; the limit is {limit} bytes")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"{shown}: file is more than {limit} bytes; the limit is {limit} bytes")
    return data

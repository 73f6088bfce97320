"""Files from elsewhere are opened only once they are known to be regular files.

A FIFO where a config or a data file is expected blocks its reader for ever, ``/dev/zero``
never ends, a directory gives a confusing ``IsADirectoryError`` far from the cause:
``regular_file`` refuses each by type from ``os.stat``, before anything opens the path,
naming it and what it is; ``read_json_file`` adds a size bound and the parser's failures.
Every loader of files from elsewhere (Hugging Face and zoo folders, adapters, fine-tuning
data, tokenizers and chat templates) goes through these; like ``zoo.units`` this module
sits under every package and imports none. The error type is the caller's.
"""

import json
import os
import stat

MAX_JSON_BYTES = 1 << 20  # a config.json is a few kilobytes; 1 MiB of JSON is not one
FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def regular_file(path, *, error=ValueError, what="a file"):
    """``path`` after checking, without opening it, that it is a regular file (symlinks
    followed): a directory, FIFO, device or socket where ``what`` is expected raises
    ``error`` naming it (a FIFO would block the reader, ``/dev/zero`` never ends).
    ``FileNotFoundError`` when nothing is there."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")
        raise error(f"{path} is {kind}, not {what}: refused without opening it")
    return path


def read_json_file(path, *, error=ValueError, max_bytes=MAX_JSON_BYTES):
    """The JSON value in ``path``, a regular file of at most ``max_bytes``; ``error`` naming
    the file and what is wrong (a special file, its size, where the JSON breaks, nesting
    too deep for the parser). ``FileNotFoundError`` when there is none."""
    regular_file(path, error=error, what="a JSON file")
    size = os.path.getsize(path)
    if size > max_bytes:
        raise error(f"{path} is {size:,} bytes, above the {max_bytes:,} a JSON file of this kind may have")
    with open(path, encoding="utf-8") as file:
        try:
            return json.load(file)
        except ValueError as failure:  # json.JSONDecodeError (line and column), UnicodeDecodeError, 4,300+ digits
            raise error(f"{path} is not JSON: {failure}") from None
        except RecursionError:
            raise error(f"{path} is not JSON the zoo reads: nested too deeply") from None


def write_target(path, *, error=ValueError):
    """The path the OS writes for ``path`` (a file or folder about to be written): the
    symlinks of its folders resolved before any ``..`` is applied (``os.path.realpath`` of
    its folder, as the kernel walks it; ``os.path.abspath`` would drop ``lnk/..`` lexically
    and name a place where nothing is written), its last part kept. Refused (``error``
    naming the path): an empty path, the root or the working folder or a folder above it
    (writing there replaces what holds everything else), and a last part that is a symlink
    (its target would be written, somewhere the caller never named)."""
    text = os.fspath(path)
    if not text.strip():
        raise error(f"{text!r}: an empty path names no file or folder; give a path")
    parent, name = os.path.split(text.rstrip("/") or text)
    if name in ("", ".", ".."):
        real = os.path.realpath(text)
    else:
        real = os.path.join(os.path.realpath(parent or "."), name)
    working = os.path.realpath(os.getcwd())
    if real == os.path.dirname(real) or working == real or working.startswith(real.rstrip("/") + "/"):
        raise error(f"{text!r}: is {real}, the root, the working folder or a folder above it; give a new path to write")
    if os.path.islink(real):
        raise error(
            f"{text!r}: {real} is a symlink to {os.readlink(real)!r}; the zoo does not write through a symlink it did "
            f"not create: give the path it points to, or another"
        )
    return real

"""The on-disk layout of a checkpoint directory, read without Orbax.

    <directory>/
      6/                                  one complete checkpoint per step (optimizer steps)
        commit_success.txt                written last, just before the rename that commits
        _CHECKPOINT_METADATA              Orbax's own step record
        state/                            the arrays (Orbax OCDBT: manifest.ocdbt, d/, ...)
        zoo/checkpoint.json               position, data, model/optimizer/variable description
      8.orbax-checkpoint-tmp/             a write in progress, or one a kill interrupted:
                                          never read; Orbax deletes it before the next save
      trash/                              checkpoints past keep-last-N, renamed here (atomic)
                                          and then deleted
      quarantine/6/                       a checkpoint resume could not use (kept, not deleted)
      zoo.lock                            held by the run using the folder (_lock.py)

Only directories named by a bare integer are checkpoints; everything else is ignored.
"""

import hashlib
import json
import os
import shutil

import jax

COMMIT_MARKER = "commit_success.txt"  # Orbax writes it into the tmp dir just before the final rename
STATE_ITEM = "state"  # Orbax item with the array tree
METADATA_ITEM = "zoo"  # Orbax JSON item with our description
METADATA_FILE = "checkpoint.json"  # file name of that JSON item inside <step>/zoo/
TMP_MARKER = ".orbax-checkpoint-tmp"  # suffix of Orbax's uncommitted step directories
TRASH = "trash"
QUARANTINE = "quarantine"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; ``path`` says which, ``problem`` what is wrong."""

    def __init__(self, path, problem):
        super().__init__(f"checkpoint {path}: {problem}")
        self.path = str(path)
        self.problem = problem


def step_paths(directory):
    """``[(step, path)]`` of every directory named by an integer, oldest first."""
    if not os.path.isdir(directory):
        return []
    steps = [(int(name), os.path.join(directory, name)) for name in os.listdir(directory) if name.isdigit()]
    return sorted(step for step in steps if os.path.isdir(step[1]))


def incomplete_paths(directory):
    """Uncommitted writes left in ``directory`` (Orbax tmp directories), sorted."""
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, name) for name in os.listdir(directory) if TMP_MARKER in name)


def metadata_path(path):
    return os.path.join(path, METADATA_ITEM, METADATA_FILE)


def completeness_problem(path):
    """Why ``path`` is not a complete checkpoint, or None if it is (no array data read)."""
    if not os.path.isfile(os.path.join(path, COMMIT_MARKER)):
        return f"no commit marker {COMMIT_MARKER}: the write never completed"
    if not os.path.isdir(os.path.join(path, STATE_ITEM)):
        return f"the array data folder {STATE_ITEM}/ is missing"
    if not os.path.isfile(metadata_path(path)):
        return f"the metadata file {METADATA_ITEM}/{METADATA_FILE} is missing"
    return None


def read_metadata(path):
    """The JSON description of the checkpoint at ``path``; ``CheckpointError`` if unusable."""
    problem = completeness_problem(path)
    if problem:
        raise CheckpointError(path, problem)
    try:
        with open(metadata_path(path)) as handle:
            metadata = json.load(handle)
    except (OSError, ValueError) as error:
        raise CheckpointError(
            path, f"the metadata file {METADATA_ITEM}/{METADATA_FILE} is unreadable ({error})"
        ) from error
    if not isinstance(metadata, dict):
        raise CheckpointError(path, f"the metadata file {METADATA_ITEM}/{METADATA_FILE} does not hold a JSON object")
    missing = [key for key in ("format", "position", "data", "description") if key not in metadata]
    if missing:
        raise CheckpointError(path, f"the metadata file {METADATA_ITEM}/{METADATA_FILE} lacks {', '.join(missing)}")
    if "checksum" in metadata and metadata["checksum"] != _checksum(metadata):
        raise CheckpointError(
            path, f"the metadata file {METADATA_ITEM}/{METADATA_FILE} does not match its own checksum: it is damaged"
        )
    return metadata


def with_checksum(metadata):
    """``metadata`` plus ``"checksum"``: the SHA-256 of its canonical JSON (sorted keys), so
    that damage which still parses (a changed digit) is found too."""
    return {**metadata, "checksum": _checksum(metadata)}


def _checksum(metadata):
    content = {key: value for key, value in metadata.items() if key != "checksum"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def is_primary_process():
    """Only process 0 touches shared files outside Orbax's own coordinated writes."""
    return jax.process_index() == 0


def set_aside(directory, path):
    """Move a checkpoint resume could not use into ``quarantine/`` (process 0); returns the new path."""
    target = os.path.join(directory, QUARANTINE, os.path.basename(path))
    suffix = 1
    while os.path.exists(target):
        target = os.path.join(directory, QUARANTINE, f"{os.path.basename(path)}-{suffix}")
        suffix += 1
    if is_primary_process():
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(path, target)
    return target


def empty_trash(directory):
    """Delete what keep-last-N renamed into ``trash/`` (process 0); a kill here leaves only trash."""
    trash = os.path.join(directory, TRASH)
    if is_primary_process() and os.path.isdir(trash):
        for name in os.listdir(trash):
            shutil.rmtree(os.path.join(trash, name), ignore_errors=True)

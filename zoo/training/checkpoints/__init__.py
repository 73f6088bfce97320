"""Checkpoints that survive a kill: model, optimizer, RNG and data position, through Orbax.

Why Orbax directly and not ``keras.callbacks.OrbaxCheckpoint``: that callback saves the
model's state tree (the same arrays as here) but (1) it has no place for the data
position, or for a description of the model, optimizer and data the arrays belong to,
inside the same atomic commit, so a resumed run could neither skip exactly the consumed
batches nor refuse a checkpoint of another model; (2) Keras offers no way back into an
existing compiled model: ``keras.saving.load_model`` on an Orbax directory rebuilds a new
model from the saved config and cannot fall back past a damaged checkpoint. Orbax's
``CheckpointManager`` gives what is needed underneath: every step is written into
``<step>.orbax-checkpoint-tmp`` and committed by one rename after ``commit_success.txt``
(so a kill leaves either a complete ``<step>`` or an ignored tmp directory), keep-last-N,
array writes coordinated across processes, and restores straight into a target sharding.

What a checkpoint holds (``zoo/training/checkpoints/_state.py``): every ``model.variables``
value (weights, batch-norm statistics, the state of every seed generator, so dropout
resumes identically) and every ``model.optimizer.variables`` value (iteration count,
learning rate, moments), each saved and restored in its sharded layout; plus a JSON item
with the ``TrainingPosition`` (epoch, batch, step), a caller-given ``data`` description
and the model/optimizer/variable description. Orbax's JSON handler writes that item on
process 0 only (``jax.process_index() == 0``), and so do the trash and quarantine moves
here; array writes are coordinated by Orbax itself.

On-disk layout: see ``zoo/training/checkpoints/_files.py`` and ``docs/checkpoints.md``.
"""

import gc
import os
import shutil
import warnings

import jax
import numpy as np
import orbax.checkpoint as ocp

from zoo._compat import standard_handler_with_min_replica_slice
from zoo._version import __version__
from zoo.training.checkpoints import _files as files
from zoo.training.checkpoints import _integrity as integrity
from zoo.training.checkpoints import _state as state
from zoo.training.checkpoints._block_forms import BlockFormConversion
from zoo.training.checkpoints._data_position import ResumableBatches, TrainingPosition, fit_from
from zoo.training.checkpoints._files import CheckpointError
from zoo.training.checkpoints._lock import CheckpointLock, describe_holder
from zoo.training.checkpoints._write_failure import FailedWrites, OrbaxNoise, drop_closed_loop_callbacks, write_failure

FORMAT = "zoo-checkpoint/2"  # 2: per-array checksums and a checksum of the metadata itself
READABLE_FORMATS = ("zoo-checkpoint/1", FORMAT)  # 1: read without the integrity checks it lacks

__all__ = [
    "FORMAT",
    "CheckpointError",
    "CheckpointLock",
    "Checkpoints",
    "ResumableBatches",
    "TrainingPosition",
    "describe_holder",
    "fit_from",
    "write_failure",
]


class Checkpoints:
    """The checkpoints of one training run, in one directory.

    Args:
        directory: where the step directories go (created if missing).
        keep: how many complete checkpoints to keep (the newest); None keeps all.
        data: JSON-ready description of the training data (dataset, batch size, seed,
            batches per epoch, ...). A checkpoint is only restored under an equal ``data``:
            its position means nothing for other batches.
    """

    def __init__(self, directory, *, keep=3, data=None):
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep must be a positive number of checkpoints or None, got {keep!r}")
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self.data = state.json_ready(data or {})
        self._opened = None  # the Orbax CheckpointManager, opened by the first save: reading touches nothing
        self._lock = CheckpointLock(self.directory)
        self._half_written = set()  # <step>.orbax-checkpoint-tmp folders of failed saves, removed at each save

    def lock(self):
        """Hold the folder's lock (``zoo.lock``) until ``close``: a second run gets a
        ``CheckpointError`` naming this one. Returns the holder a stale lock named, or None."""
        self._lock.acquire()
        return self._lock.previous_holder

    @property
    def _manager(self):
        if self._opened is None:
            files.empty_trash(self.directory)
            self._opened = _open_manager(self.directory, self.keep)
        return self._opened

    def steps(self):
        """Steps of the complete checkpoints (committed, with metadata), oldest first."""
        return [step for step, path in files.step_paths(self.directory) if files.completeness_problem(path) is None]

    def existing_steps(self):
        """Steps of every directory named by an integer, complete or not, oldest first."""
        return [step for step, _ in files.step_paths(self.directory)]

    def latest_complete(self):
        """Path of the newest complete checkpoint, or None (no array data is read)."""
        steps = self.steps()
        return os.path.join(self.directory, str(steps[-1])) if steps else None

    def save(self, model, position):
        """Save ``model``'s arrays at ``position`` (a ``TrainingPosition``); returns the path.

        Every process must call it (Orbax coordinates the array writes); nothing appears
        under ``<directory>/<step>`` until the whole checkpoint is written.
        """
        self._remove_half_written()
        tree = state.state_tree(model)
        metadata = files.with_checksum(
            {
                "format": FORMAT,
                "zoo_version": __version__,
                "position": position.as_dict(),
                "data": self.data,
                "description": state.describe(model),
                "checksums": integrity.checksums(tree),
            }
        )
        args = ocp.args.Composite(
            **{files.STATE_ITEM: ocp.args.StandardSave(tree), files.METADATA_ITEM: ocp.args.JsonSave(metadata)}
        )
        path = os.path.join(self.directory, str(position.step))
        try:
            saved = self._manager.save(position.step, args=args, force=True)
            self._manager.wait_until_finished()
        except ocp.checkpoint_manager.StepAlreadyExistsError as error:
            raise CheckpointError(path, "already exists; a run saves each step once") from error
        if not saved:
            raise CheckpointError(path, "Orbax declined to save this step")
        files.empty_trash(self.directory)
        return path

    def try_save(self, model, position):
        """``save``, but a write that fails (a full disk, a quota, a removed folder) returns
        ``(None, reason)`` instead of raising; ``(path, None)`` when saved.

        The half-written ``<step>.orbax-checkpoint-tmp`` is removed (its space is wanted, and
        it is never read) and Orbax's tracebacks about the failed writes are dropped, now and
        when their futures are collected later. Any other error (a ``CheckpointError``: a
        refused step) is raised."""
        tmp = os.path.join(self.directory, f"{position.step}{files.TMP_MARKER}")
        with OrbaxNoise() as noise:
            try:
                return self.save(model, position), None
            except Exception as error:  # noqa: BLE001 (only write failures are kept; the rest is raised)
                reason = write_failure(error)
                if reason is None:
                    raise
                failure = error
            noise.drop()
            FailedWrites.instance().add(tmp, failure)
            gc.collect()  # Orbax's abandoned write tasks end now, while their noise is held
        self._half_written.add(tmp)
        self._remove_half_written()
        return None, reason

    def _remove_half_written(self):
        """Remove the folders failed saves left, at every later save and at ``close``. A
        removed one can come back: an abandoned Orbax writer of the failed step can finish
        once the disk has room again and recreate its folder (seen twice in clean-clone
        runs: ``4.orbax-checkpoint-tmp`` beside the later steps), so a failed step's folder
        is never struck off the list; removing one that is gone costs a ``stat``."""
        if not files.is_primary_process():
            return
        for tmp in sorted(self._half_written):
            shutil.rmtree(tmp, ignore_errors=True)

    def restore(self, model, path=None):
        """Restore the checkpoint at ``path`` (default: the newest complete one) into ``model``.

        The model must be built and compiled like the one that saved it; arrays land in
        the layout the model's variables have now. Returns the ``TrainingPosition``.
        Raises ``CheckpointError`` naming the path and the problem; ``model`` is left
        unchanged on any error.
        """
        path = path or self.latest_complete()
        if path is None:
            raise CheckpointError(self.directory, "holds no complete checkpoint")
        metadata, conversion = self._checked_metadata(model, path)
        if conversion is None:
            tree = self._read_arrays(path, state.abstract_state_tree(model))
            _check_integrity(path, tree, metadata)
        else:  # the other block form: read as saved, then stacked or unstacked into the model's
            saved = self._read_arrays(path, _saved_abstract_tree(metadata))
            _check_integrity(path, saved, metadata)
            tree = conversion.apply(saved, state.state_tree(model))
        position = TrainingPosition(**metadata["position"])
        _check_iterations(path, tree, model, position)
        rate = state.learning_rate(model)
        state.assign_state(model, tree)
        if rate is not None and state.learning_rate(model) != rate:
            warnings.warn(
                f"{path}: the learning rate {state.learning_rate(model):g} restored from the checkpoint replaces {rate:g}",
                stacklevel=2,
            )
        return position

    def resume(self, model, report=print):
        """Restore the newest checkpoint that works, falling back past broken ones.

        Each unusable checkpoint (incomplete, damaged, of another model or data) is
        reported and warned about; if an older one restores, the newer unusable ones are
        moved to ``quarantine/`` so that the resumed run can write those steps again.
        Returns the ``TrainingPosition``, or None when there is no checkpoint at all.
        Raises ``CheckpointError`` listing every problem when none can be restored.
        """
        failures = []
        for _step, path in reversed(files.step_paths(self.directory)):
            try:
                position = self.restore(model, path)
            except CheckpointError as error:
                failures.append(error)
                warnings.warn(f"{error}; trying the previous checkpoint", stacklevel=2)
                report(f"skipping unusable {error}")
                continue
            self._set_aside(failures, report)
            report(f"resumed from {path}: epoch {position.epoch + 1}, batch {position.batch}, step {position.step}")
            return position
        if failures:
            raise CheckpointError(
                self.directory, "no checkpoint could be restored:\n" + "\n".join(f"  {e}" for e in failures)
            )
        return None

    def read(self, path):
        """``(metadata, {"model": [np.ndarray], "optimizer": [np.ndarray]})`` of a checkpoint, without a model."""
        metadata = files.read_metadata(path)
        tree = self._read_arrays(path, _saved_abstract_tree(metadata))
        _check_integrity(path, tree, metadata)
        return metadata, {group: [np.asarray(a) for a in arrays] for group, arrays in tree.items()}

    def close(self):
        if self._opened is not None:
            self._opened.close()
            self._opened = None
        self._remove_half_written()
        self._lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _checked_metadata(self, model, path):
        metadata = files.read_metadata(path)
        if metadata["format"] not in READABLE_FORMATS:
            raise CheckpointError(
                path, f"has format {metadata['format']!r}; this zoo reads {' and '.join(map(repr, READABLE_FORMATS))}"
            )
        step = int(os.path.basename(path))
        if metadata["position"].get("step") != step:
            raise CheckpointError(
                path, f"its metadata says step {metadata['position'].get('step')}, its name step {step}"
            )
        if metadata["data"] != self.data:
            raise CheckpointError(
                path, f"was written for other training data: {metadata['data']} in the checkpoint, {self.data} now"
            )
        saved, current = metadata["description"], state.describe(model)
        found = state.differences(saved, current)
        if not found:
            return metadata, None
        conversion = None
        if not state.differences(saved, current, variables=False):  # the same model, other variables
            conversion = BlockFormConversion.between(saved["variables"], current["variables"])
        if conversion is None:
            raise CheckpointError(path, "was written by a different model or optimizer: " + "; ".join(found))
        return metadata, conversion

    def _read_arrays(self, path, abstract):
        """The arrays of checkpoint ``path``; ``CheckpointError`` naming it when damaged data
        cannot be read. Orbax then leaves the other reads of the restore abandoned: they are
        closed here, their tracebacks (one error, already reported) dropped, not printed
        when the garbage collector meets them in some later test or step."""
        restore = ocp.args.StandardRestore(abstract)
        reader = ocp.Checkpointer(ocp.StandardCheckpointHandler())
        with OrbaxNoise() as noise:
            try:
                return reader.restore(os.path.join(path, files.STATE_ITEM), args=restore)
            except (TypeError, AttributeError, NameError):
                raise  # a bug here, not damaged data: no fallback
            except Exception as error:  # Orbax/TensorStore raise many types for damaged data
                detail = (str(error).strip().splitlines() or [""])[0].split(" See full TensorStore details")[0][:300]
                failure = CheckpointError(
                    path, f"its array data in {files.STATE_ITEM}/ cannot be read ({type(error).__name__}: {detail})"
                )
            finally:
                reader.close()
            noise.drop()  # (the except clause let go of the error: its traceback held their frames)
            gc.collect()  # the abandoned reads end now, while their noise is held
        raise failure

    def _set_aside(self, failures, report):
        for error in failures:
            if os.path.isdir(error.path) and os.path.dirname(error.path) == self.directory:
                target = files.set_aside(self.directory, error.path)
                report(f"moved unusable checkpoint {error.path} to {target}")
        if failures:
            _barrier("zoo_checkpoints_set_aside")
            if self._opened is not None:
                self._opened.reload()


# A replicated array is saved in slices, one per replica, only where each slice holds at
# least this much: below it a slice's dispatch (and on the first save, a compile for each
# shape) costs more than the transfer it shares out. gpt_tiny on 8 simulated devices: 275
# compiles and 1.4 s a save with Orbax's default (every array sliced); the resume test
# 17.8 -> 11.5 s.
MIN_REPLICA_SLICE_BYTES = 1 << 20


def _open_manager(directory, keep):
    drop_closed_loop_callbacks()
    policy = None if keep is None else ocp.checkpoint_managers.LatestN(keep)
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policy,
        enable_async_checkpointing=False,  # the step is on disk when save returns; see docs/checkpoints.md
        todelete_subdir=files.TRASH,  # keep-last-N renames (atomic) before deleting
        cleanup_tmp_directories=True,  # writes a kill interrupted are deleted before the next save
        multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=0),
    )
    handlers = {
        files.STATE_ITEM: standard_handler_with_min_replica_slice(MIN_REPLICA_SLICE_BYTES),
        files.METADATA_ITEM: ocp.JsonCheckpointHandler(filename=files.METADATA_FILE),
    }
    return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


def _saved_abstract_tree(metadata):
    """The restore target of a checkpoint's arrays as saved: each whole on this process's first device."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return {
        group: [jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype), sharding=device) for _, shape, dtype in specs]
        for group, specs in metadata["description"]["variables"].items()
    }


def _check_integrity(path, tree, metadata):
    """The restored arrays are the saved ones (checksums), and every float in them is finite."""
    recorded = metadata.get("checksums")
    if recorded is not None:
        found = integrity.checksums(tree)
        for group in state.GROUPS:
            for index, (saved, restored) in enumerate(zip(recorded[group], found[group], strict=True)):
                if saved != restored:
                    raise CheckpointError(
                        path,
                        f"{_variable_name(metadata, group, index)} does not match the checksum recorded at save: "
                        f"its array data in {files.STATE_ITEM}/ is damaged",
                    )
    non_finite = integrity.first_non_finite(tree)
    if non_finite is not None:
        raise CheckpointError(
            path,
            f"{_variable_name(metadata, *non_finite)} holds NaN or infinite values: training from it would go nowhere",
        )


def _variable_name(metadata, group, index):
    variables = metadata["description"]["variables"][group]
    return (
        f"{group} variable {index} ({variables[index][0]})" if index < len(variables) else f"{group} variable {index}"
    )


def _check_iterations(path, tree, model, position):
    """The arrays must be those of the step the metadata names: the optimizer counted it."""
    variables = state.group_variables(model)["optimizer"]
    index = next((i for i, v in enumerate(variables) if v is model.optimizer.iterations), None)
    if index is not None and int(np.asarray(tree["optimizer"][index])) != position.step:
        raise CheckpointError(
            path,
            f"its optimizer has taken {int(np.asarray(tree['optimizer'][index]))} steps but its metadata says step {position.step}",
        )


def _barrier(name):
    if jax.process_count() > 1:
        ocp.multihost.sync_global_processes(name)

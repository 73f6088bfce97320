"""``zoo bench hf-load``: memory while a Hugging Face checkpoint of Llama-3.2-1B's size
loads into a ``GPTCausalLM`` under a layout, each device reading its own shard.

The claim checked (``zoo.presets.safetensors_weights``): under a layout every device
reads only its shard of each tensor, and its memory during the load stays within 1.1x
its share of the weights ("sharded size"). tests/models/test_hf_checkpoints.py checks it
on a 4-block model of 181 K parameters; this is the same measurement at 1.24 B.

The checkpoint: ``--checkpoint DIR`` (a downloaded Llama-3.2-1B, say), or a synthetic
one written without building a zoo model: Llama-3.2-1B's ``config.json`` (``LLAMA_CONFIG``
with the sizes of the settings) and a random bfloat16 tensor for every name and shape
``hf_checkpoints.weight_views`` implies (``SyntheticTensors``: each made when
``write_safetensors`` asks for it, so the host holds one file's tensors at a time, not
the checkpoint), in files of at most ``max_file_size_mb``.

Each run (``<layout>:<mesh>``): ``GPTCausalLM.from_preset(folder, load_weights=False)``
built under ``zd.distribution_for(GPTCausalLM, layout, mesh, config=config.json)``, then
``hf_checkpoints.load_hf_weights``, with ``hf_checkpoints.load_into`` wrapped
(``watching``) to measure, per device, the bytes of every live ``jax.Array`` from its
shard shapes (``jax.live_arrays()``; reading ``shard.data`` would make arrays) above the
bytes live before the build:

- after each tensor is assigned (what the unit test samples), and
- just before each assign, when the variable's old value and the new array are both
  alive (the loader's transient: the unit test's sampling cannot see it);

and each slice a device receives (``on_read``) against that variable's shard. Also: the
host's peak resident memory during the load (``VmHWM``, reset before the load through
``/proc/self/clear_refs``; on CPU the 8 devices' buffers live in host memory), the
wall time of the build and of the load, and, after the load, a few weights compared bit
for bit with the file's tensors (``check_weights``: two device shards of each).
"""

import collections
import contextlib
import dataclasses
import gc
import math
import os
import time

import jax
import keras
import numpy as np

from zoo import distribution as zd
from zoo.bench._output import publish, size_text
from zoo.bench._synthetic_hf import checkpoint_folder, describe_checkpoint
from zoo.config.bench_settings import HFLoadBenchSettings  # noqa: F401 (the settings run_benchmark takes)
from zoo.models import GPTCausalLM
from zoo.models.dtype_policy import dtype_policy_scope
from zoo.models.gpt import hf_checkpoints
from zoo.presets.safetensors_weights import SafetensorsFiles
from zoo.units import KIB

GOAL = 1.1  # the claim: peak per-device memory during the load <= 1.1 x the sharded size
# --- measuring ----------------------------------------------------------------------------


def live_bytes_per_device(exclude=frozenset()):
    """Bytes of every live jax.Array on each device, from shard shapes: reading
    ``shard.data`` would itself create arrays (tests/models/test_hf_checkpoints.py uses it too).
    ``exclude``: ids of arrays not to count (ones the caller holds from before)."""
    totals = collections.Counter()
    for array in jax.live_arrays():
        if id(array) in exclude:
            continue
        nbytes = math.prod(array.sharding.shard_shape(array.shape)) * array.dtype.itemsize
        for device in array.sharding.device_set:
            totals[device] += nbytes
    return totals


def shard_bytes(variable):
    value = variable.value
    return math.prod(value.sharding.shard_shape(value.shape)) * value.dtype.itemsize


def sharded_bytes_per_device(model):
    """The most bytes of the model's weights any one device holds."""
    totals = collections.Counter()
    for variable in model.weights:
        for device in variable.value.sharding.device_set:
            totals[device] += shard_bytes(variable)
    return max(totals.values())


@dataclasses.dataclass
class LoadWatch:
    """What ``watching`` saw during one load (bytes per device above ``baseline``)."""

    baseline: collections.Counter
    after_tensor: int = 0  # peak sampled after each tensor is assigned (the unit test's sampling)
    before_assign: int = 0  # peak sampled just before each assign (old value and new array both alive)
    largest_slice: int = 0  # the largest slice a device received
    oversize: int = 0  # slices larger than their variable's shard (0: each device read only its shard)
    slices: int = 0
    elements_read: int = 0

    def sample(self):
        above = live_bytes_per_device() - self.baseline
        return max(above.values(), default=0)

    def on_read(self, variable, shard):
        def seen(block):
            self.slices += 1
            self.elements_read += block.size
            self.largest_slice = max(self.largest_slice, block.nbytes)
            self.oversize += block.nbytes > shard

        return seen


class _SampledVariable:
    """The variable ``load_into`` assigns, sampling the watch just before the assign."""

    def __init__(self, variable, watch):
        self._variable, self._watch = variable, watch

    def __getattr__(self, name):
        return getattr(self._variable, name)

    def assign(self, value):
        self._watch.before_assign = max(self._watch.before_assign, self._watch.sample())
        return self._variable.assign(value)


@contextlib.contextmanager
def watching(watch):
    """``hf_checkpoints.load_into`` wrapped to fill ``watch`` (restored on exit)."""
    original = hf_checkpoints.load_into

    def watched(variable, files, view, on_read=None):
        original(_SampledVariable(variable, watch), files, view, on_read=watch.on_read(variable, shard_bytes(variable)))
        watch.after_tensor = max(watch.after_tensor, watch.sample())

    hf_checkpoints.load_into = watched
    try:
        yield watch
    finally:
        hf_checkpoints.load_into = original


def host_rss():
    """``(resident, peak resident)`` bytes of this process (``/proc/self/status``;
    elsewhere ``ru_maxrss`` for both)."""
    try:
        with open("/proc/self/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
        return int(fields["VmRSS"].split()[0]) * KIB, int(fields["VmHWM"].split()[0]) * KIB
    except (OSError, KeyError, ValueError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB
        return peak, peak


def reset_peak_rss():
    """Reset the peak resident memory to the current one (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False


CHECKED = (
    "token_embedding/embeddings",
    "block_0/attention/query/kernel",
    "block_0/attention/output/kernel",
    "final_norm/scale",
)


def check_weights(model, folder, shards_per_weight=2):
    """``(slices compared, mismatches)``: for a few weights (``CHECKED`` and the last
    block's down kernel), the first and last device shards against the file's whole
    tensor turned into the weight by numpy (``TensorView.to_weight``), bit for bit in the
    model's dtype."""
    arguments = model.backbone.get_config()
    views = hf_checkpoints.weight_views(arguments)
    variables = {variable.path: variable for variable in model.weights}
    paths = [*CHECKED, f"block_{arguments['num_layers'] - 1}/mlp/down/kernel"]
    compared = mismatches = 0
    with SafetensorsFiles(folder) as files:
        for path in paths:
            value = variables[path].value
            expected = views[path].to_weight(files.read(views[path].name)).astype(value.dtype)
            shards = sorted(value.addressable_shards, key=lambda shard: shard.device.id)
            for shard in (shards[0], shards[-1])[:shards_per_weight]:
                got = np.asarray(shard.data)
                compared += 1
                mismatches += not np.array_equal(_bits(got), _bits(expected[shard.index]))
    return compared, mismatches


def _bits(array):
    array = np.ascontiguousarray(array)
    return array.view(f"u{array.dtype.itemsize}")


@dataclasses.dataclass
class Row:
    """One load: its layout and what it needed (bytes per device unless said)."""

    layout: str
    mesh: str
    parameters: int = 0
    sharded: int = 0  # the model's weights on the busiest device
    largest_shard: int = 0  # the largest shard of one weight on one device
    watch: LoadWatch = None
    read_ratio: float = 0.0  # elements read / elements in the checkpoint
    rss_before: int = 0  # host resident bytes when the load starts
    rss_peak: int = 0  # host peak resident bytes during the load
    rss_reset: bool = True  # False: the peak is the process's since it started
    build_s: float = 0.0
    load_s: float = 0.0
    compared: int = 0
    mismatches: int = 0

    @property
    def peak(self):
        return max(self.watch.after_tensor, self.watch.before_assign)

    @property
    def ratio(self):
        return self.peak / self.sharded


def build(folder, distribution, dtype):
    """The ``GPTCausalLM`` of ``folder``, its weights initialised, not loaded, under
    ``distribution`` and the ``dtype`` policy (None: the current one)."""
    with dtype_policy_scope(dtype or keras.config.dtype_policy()):
        return zd.build_distributed(lambda: GPTCausalLM.from_preset(folder, load_weights=False), distribution)


def measure(folder, layout, mesh, settings, checkpoint_elements):
    """One ``Row``: the checkpoint in ``folder`` loaded under ``layout`` on ``mesh``."""
    row = Row(layout, mesh)
    distribution = zd.distribution_for(GPTCausalLM, layout, mesh, config=hf_checkpoints.read_config(folder))
    watch = LoadWatch(baseline=live_bytes_per_device())
    start = time.perf_counter()
    model = build(folder, distribution, settings.dtype)
    row.build_s = time.perf_counter() - start
    row.parameters = sum(math.prod(v.shape) for v in model.weights)
    row.sharded = sharded_bytes_per_device(model)
    row.largest_shard = max(shard_bytes(v) for v in model.weights)
    row.rss_before = host_rss()[0]
    row.rss_reset = reset_peak_rss()
    start = time.perf_counter()
    with watching(watch):
        hf_checkpoints.load_hf_weights(model, folder)
    jax.block_until_ready([v.value for v in model.weights])
    row.load_s = time.perf_counter() - start
    row.rss_peak = host_rss()[1]
    row.watch = watch
    row.read_ratio = watch.elements_read / checkpoint_elements
    row.compared, row.mismatches = check_weights(model, folder)
    del model
    keras.distribution.set_distribution(None)
    keras.backend.clear_session()
    gc.collect()
    return row


def check_settings(settings):
    """Refuse, before writing or building anything, a mesh the devices cannot take or a
    ``--checkpoint`` that is not a Hugging Face folder."""
    for run in settings.runs:
        zd.make_mesh(run.split(":", 1)[1])  # raises naming the mesh and the device count
    if settings.checkpoint and not hf_checkpoints.is_hf_directory(settings.checkpoint):
        raise ValueError(
            f"--checkpoint {settings.checkpoint!r} is not a Hugging Face folder (config.json with model_type and safetensors weights)"
        )


def run_benchmark(settings, report=print):
    """Load the checkpoint once per run; report the markdown table (also to
    ``settings.output``). Returns ``{"rows": [Row], "failures": [{"error": ...}]}``
    (a bitwise mismatch is a failure: ``zoo bench`` exits 1)."""
    check_settings(settings)
    rows = []
    with checkpoint_folder(settings, report) as folder:
        files, nbytes, elements, dtypes = describe_checkpoint(folder)
        source = settings.checkpoint or "synthetic (random)"
        checkpoint = f"{source}, {files} safetensors file(s), {size_text(nbytes)} of {'/'.join(dtypes)}"
        for run in settings.runs:
            layout, mesh = run.split(":", 1)
            row = measure(folder, layout, mesh, settings, elements)
            report(
                f"{layout} {mesh}: peak {size_text(row.peak)} per device for {size_text(row.sharded)} sharded ({row.ratio:.3f}x); "
                f"built in {row.build_s:.0f} s, loaded in {row.load_s:.1f} s"
            )
            rows.append(row)
    text = format_report(settings, checkpoint, rows)
    publish(text, settings, report)
    failures = [
        {"error": f"{row.layout} {row.mesh}: {row.mismatches} of {row.compared} slices differ from the file"}
        for row in rows
        if row.mismatches
    ]
    return {"rows": rows, "failures": failures}


# --- the report ---------------------------------------------------------------------------


def _host_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def format_row(row):
    w = row.watch
    within = "yes" if row.ratio <= GOAL else "**no**"
    rss = f"{size_text(row.rss_before)} / {size_text(row.rss_peak)}{'' if row.rss_reset else ' (since start)'}"
    check = f"{row.compared - row.mismatches} / {row.compared}"
    return (
        f"| {row.layout} | {row.mesh} | {row.parameters:,} | {size_text(row.sharded)} | {size_text(w.after_tensor)} | {size_text(w.before_assign)} | "
        f"**{row.ratio:.3f}x** | {within} | {size_text(w.largest_slice)} / {size_text(row.largest_shard)} | {w.oversize} of {w.slices:,} | "
        f"{row.read_ratio:.2f}x | {rss} | {row.build_s:.0f} | {row.load_s:.1f} | {check} |"
    )


def format_report(settings, checkpoint, rows):
    dtype = settings.dtype or keras.config.dtype_policy().name
    lines = [
        (
            f"devices: {len(jax.devices())} x {jax.devices()[0].platform}; host: {os.cpu_count()} cores, {size_text(_host_memory())}; "
            f"checkpoint: {checkpoint}; model weights held as {dtype}; jax {jax.__version__}, keras {keras.__version__}."
        ),
        "",
        (
            "Per device, above what was live before the build (jax.live_arrays, shard shapes): the model's weights (sharded), the peak "
            "sampled after each tensor and just before each assign (old value and new array both alive); within = peak <= "
            f"{GOAL}x sharded. Slices: the largest a device received / the largest shard, and how many exceeded their shard. "
            "Read: elements read / elements in the checkpoint. Host RSS: when the load starts / its peak during the load "
            "(on CPU the devices' buffers are host memory). Check: device shards equal to the file's tensors, bit for bit."
        ),
        "",
        (
            "| layout | mesh | parameters | sharded / device | peak after each tensor | peak before each assign | peak / sharded | "
            f"within {GOAL}x | largest slice / shard | slices over their shard | read / checkpoint | host RSS start / peak | build (s) | load (s) | check |"
        ),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    return "\n".join(lines + [format_row(row) for row in rows])

"""Test session set-up: 8 simulated CPU devices, the JAX backend and one persistent
compilation cache for the whole session, before JAX starts."""

import gc
import importlib.metadata
import os
import shutil
import tempfile

os.environ["KERAS_BACKEND"] = "jax"
_OWN_XLA_FLAGS = (
    "--xla_force_host_platform_device_count",
    "--xla_cpu_collective",
    "--xla_backend_optimization_level",
    "--xla_llvm_disable_expensive_passes",
    "--xla_cpu_use_fusion_emitters",
    "--xla_cpu_enable_concurrency_optimized_scheduler",
)


def _fast_compile_flags():
    """XLA:CPU flags that compile the suite's tiny programs fast rather than well (compiling,
    not running, is most of the suite's time). Both sides of every parity check compile
    with the same flags."""
    flags = ["--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true"]
    jaxlib = tuple(int(part) for part in importlib.metadata.version("jaxlib").split(".")[:2])
    if jaxlib < (0, 12):  # JAX 0.12's XLA has no legacy emitters, and refuses the flag
        # The elemental emitters instead of the MLIR fusion emitters: the same maths
        # (no fast-math either way), half the compile time (a tier-1 MoE fit test:
        # 18.5 -> 9.2 s of CPU on JAX 0.10).
        flags.append("--xla_cpu_use_fusion_emitters=false")
    return flags


# Set here, not through zoo, so no zoo import happens before the flags are in place.
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_OWN_XLA_FLAGS)]
    + [
        "--xla_force_host_platform_device_count=8",
        # 8 simulated devices share 2 cores: give slow collectives 2 minutes, not 40 s
        # (bounded: a true XLA:CPU deadlock must fail, not hang; see docs/distribution.md).
        "--xla_cpu_collective_timeout_seconds=120",
        "--xla_cpu_collective_call_terminate_timeout_seconds=120",
        # XLA:CPU's concurrency-optimized scheduler off: with it, the context-layout GPT's
        # fit step loaded from the persistent compilation cache deadlocked in 3 of 3 runs
        # (a collective-permute over the 8 devices and an all-gather over 4 entered in
        # different orders by different devices; compiled in the process, it ran), and so
        # did every test that loaded it, e.g. tests/training/checkpoints/test_resume_anywhere.py's
        # context cases after another process compiled it; with it off, 0 of 3.
        "--xla_cpu_enable_concurrency_optimized_scheduler=false",
        *_fast_compile_flags(),
    ]
)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Embedded datasets are prepared on first use: into a folder of this test session, never
# into the user's ~/tensorflow_datasets.
os.environ["ZOO_DATA_DIR"] = tempfile.mkdtemp(prefix="zoo-test-data-")

# One JAX persistent compilation cache per test session, in a folder made by the pytest
# process that starts first (the xdist controller) and inherited through the environment
# by its workers and by every subprocess a test starts (CLI, doc examples, kill/resume,
# multi-host): a program compiled once is loaded, not recompiled, everywhere else. The
# thresholds are lowered so that CPU programs, which compile fast and are small, are cached.
# ZOO_TEST_COMPILATION_CACHE=<folder> keeps the cache there (across runs, too);
# ZOO_TEST_COMPILATION_CACHE=off runs without one (docs/testing.md).
_OWN_CACHE = "ZOO_TEST_COMPILATION_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["ZOO_TEST_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="zoo-test-jax-cache-")
if os.environ["ZOO_TEST_COMPILATION_CACHE"] != "off":
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["ZOO_TEST_COMPILATION_CACHE"]
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

import keras  # noqa: E402
import pytest  # noqa: E402

from tests import _tiers as tiers  # noqa: E402


@pytest.fixture(autouse=True)
def no_distribution_leaks():
    """Every test starts and ends with no global Keras distribution."""
    keras.distribution.set_distribution(None)
    yield
    keras.distribution.set_distribution(None)


def pytest_sessionfinish(session):
    """An xdist worker collects its garbage and freezes what is left (``gc.freeze``) before it
    reports itself finished (xdist's hook sends that after this one). Once told to stop,
    execnet gives the worker 5 s and then sends it a SIGINT (``execnet/gateway_base.py``,
    ``_terminate_execution``); pytest's own ``gc.collect`` at unconfigure, a full pass over
    the worker's heap with JAX's callback freeing XLA's buffers, outlasted that on a slow
    machine, and a green run ended with a ``KeyboardInterrupt`` warning (docs/testing.md).
    Frozen objects are not scanned again, so that last pass has only the newest to visit."""
    if hasattr(session.config, "workerinput"):
        gc.collect()
        gc.freeze()


def pytest_unconfigure(config):
    """The process that made the session's compilation cache removes it at the end."""
    if _OWN_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["ZOO_TEST_COMPILATION_CACHE"], ignore_errors=True)


# The modules that take longest (tests/planning's and the end-to-end ones), started first:
# pytest-xdist's loadscope hands each worker the next module when it is free, so the
# long ones must not be left for the end, where one worker would run them alone while
# the other idles (longest-first scheduling; docs/testing.md). Order only: nothing is skipped.
LONGEST_FIRST = (  # seconds of test time per module, tier 1 on 2 workers (2026-12-07: 735 s in all)
    "tests/models/test_hf_checkpoints.py",  # 39
    "tests/distribution/test_multihost.py",  # 30
    "tests/models/test_gpt_parity.py",  # 22
    "tests/training/checkpoints/test_kill_resume.py",  # 22
    "tests/training/test_lm_finetune.py",  # 21
    "tests/training/lora/test_qlora.py",  # 20
    "tests/models/test_gpt_moe.py",  # 18
    "tests/cli/test_cli.py",  # 17
    "tests/kernels/test_moe.py",  # 16
    "tests/training/checkpoints/test_checkpoints.py",  # 16
    "tests/training/checkpoints/test_save_failures.py",  # 14
    "tests/layers/test_multi_head_attention_parallel.py",  # 14
    "tests/models/test_gpt_remat.py",  # 14
    "tests/layers/test_mixed_precision.py",  # 12
    "tests/models/test_gpt_pipeline.py",  # 12
    "tests/layers/test_pipelined_blocks.py",  # 11
    "tests/kernels/test_splash_attention.py",  # 11
    "tests/training/test_finetune.py",  # 11
    "tests/models/test_gpt_scan.py",  # 11
    "tests/layers/test_tensor_parallel_layers.py",  # 11
    "tests/training/test_remat_choice.py",  # 11
    "tests/kernels/test_sequence_parallel.py",  # 10
    "tests/training/lora/test_lora_stacked.py",  # 10
    "tests/layers/test_multi_head_attention.py",  # 9
    "tests/training/test_optimizers.py",  # 9
    "tests/bench/test_moe.py",  # 9
    "tests/models/test_vit.py",  # 9
    "tests/models/test_chunked_loss.py",  # 9
    "tests/planning/test_search.py",  # 9
    "tests/kernels/test_attention_seam.py",  # 9
    "tests/models/test_small_cnn.py",  # 8
    "tests/training/checkpoints/test_resume_anywhere.py",  # 8
    "tests/models/test_gpt_generate.py",  # 8
    "tests/distribution/test_context_parallel.py",  # 8
    "tests/planning/test_plan.py",  # 8
    "tests/layers/test_transformer_block_weights_after_input.py",  # 8
    "tests/test_docs.py",  # 8
    "tests/models/test_encoder.py",  # 8
    "tests/training/test_model_files.py",  # 7
    "tests/bench/test_step.py",  # 7
    "tests/kernels/test_sliding_window.py",  # 7
    "tests/bench/test_sliding_window_bench.py",  # 7
    "tests/test_loading.py",  # 7
    "tests/training/checkpoints/test_checkpoint_integrity.py",  # 7
    "tests/cli/test_data_cli.py",  # 7
    "tests/models/test_gpt.py",  # 6
    "tests/layers/test_moe_feed_forward.py",  # 6
    "tests/training/test_packing.py",  # 6
    "tests/training/test_validation_loss.py",  # 6
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the matrix marker must be on the items by then
def pytest_collection_modifyitems(config, items):
    _mark_the_second_tier(items)
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


def _mark_the_second_tier(items):
    """The ``matrix`` marker on tests/_tiers.py's ids; a listed id of a collected module
    that matches no test is an error (a renamed test must take its entry along)."""
    collected = {item.nodeid for item in items}
    modules = {tiers.module_of(test_id) for test_id in collected}
    stale = [test_id for test_id in tiers.MATRIX if tiers.module_of(test_id) in modules and test_id not in collected]
    if stale and all(tiers.module_of(test_id) in modules for test_id in tiers.MATRIX):  # the whole suite collected
        raise pytest.UsageError(f"tests/_tiers.py lists tests that do not exist: {stale}")
    for item in items:
        if item.nodeid in tiers.MATRIX:
            item.add_marker(pytest.mark.matrix)

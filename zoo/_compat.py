"""Every private API of Keras, JAX or another library that the zoo uses, in one place.

Nothing else in ``zoo/`` may touch ``keras.src``, ``jax._src`` or an underscore
attribute of another library's object (``tests/test_architecture.py`` enforces it).
Each function names the versions it was checked on and the public API that would
replace it; when upgrading Keras or JAX, this file is the list to re-check.

Checked on: JAX 0.10.2 (Python 3.11) and JAX 0.12.0.1 (Python 3.12), both with
Keras 3.15.1.

Private modules are imported inside the functions, so this module's own imports need
neither Keras nor a particular JAX layout, and a version that moved something fails
only where it is used, with a ``PrivateAPIError`` naming what is missing. (The package
root, ``zoo/__init__.py``, imports Keras anyway: it registers every saveable zoo class.)
"""

import contextlib


class PrivateAPIError(RuntimeError):
    """A private Keras/JAX API the zoo relies on is missing from the installed version."""


def _missing(what, error):
    return PrivateAPIError(
        f"{what} is missing from this installation ({type(error).__name__}: {error}); zoo._compat was "
        f"checked on JAX 0.10.2 / 0.12.0.1 with Keras 3.15.1 and needs updating for this version"
    )


# --- Keras ---------------------------------------------------------------------------


def sublayers(layer):
    """Every layer nested inside ``layer`` (recursively, ``layer`` itself excluded), in
    Keras' tracking order.

    Private: ``Layer._flatten_layers(include_self=False)``. Checked on Keras 3.15.1
    (JAX 0.10.2 and 0.12.0.1). Public replacement: none for arbitrary layers (only
    ``Model.layers``, which lists a functional model's direct layers but not the
    sublayers held as attributes of custom layers).
    """
    try:
        flatten = layer._flatten_layers
    except AttributeError as error:
        raise _missing("keras.Layer._flatten_layers", error) from None
    return list(flatten(include_self=False))


@contextlib.contextmanager
def adding_state_after_build(layer):
    """Lets a built layer take new variables (Keras locks its state after ``build``), as
    Keras' own ``Dense.enable_lora`` does. Private: ``Layer._tracker`` (Keras 3.10-3.15)."""
    layer._tracker.unlock()
    try:
        yield
    finally:
        layer._tracker.lock()


def saved_variables(layer):
    """A layer's own variables in the order Keras' ``Layer.save_own_variables`` writes them
    (and ``load_own_variables`` reads them): those made trainable, then the others, each in
    the order made, whatever their ``trainable`` is now. Private: ``Layer._trainable_variables``
    and ``_non_trainable_variables`` (Keras 3.10-3.15); no public API lists them so."""
    return list(layer._trainable_variables) + list(layer._non_trainable_variables)


def distribution_layout_map(distribution):
    """The ``LayoutMap`` of a ``ModelParallel`` distribution (the object itself, so
    keys added to it take effect); None for no distribution or one without a map
    (``DataParallel``).

    Private: ``ModelParallel._layout_map`` (read when the distribution has no public
    ``layout_map`` property, as zoo's ``CheckedModelParallel`` has). Checked on Keras
    3.15.1 (JAX 0.10.2 and 0.12.0.1). Public replacement: a ``ModelParallel.layout_map``
    property, which Keras 3.15 lacks.
    """
    if distribution is None:
        return None
    public = getattr(distribution, "layout_map", None)
    return public if public is not None else getattr(distribution, "_layout_map", None)


def place_variable_in_memory(variable, memory_kind):
    """Keep ``variable``'s array in ``memory_kind`` ("device", "pinned_host"), its sharding
    otherwise unchanged, from now on. Keras lays every value assigned to a JAX variable out
    by the variable's layout (``_direct_assign``: after a fit, when its state is written
    back), so the layout becomes the array's sharding in that memory, and the array moves
    there (``_layout``, ``_value``; checked on Keras 3.15.1). A variable not yet allocated
    (``StatelessScope(initialize_variables=False)``: a plan's abstract build) is left as is:
    the plan places its slot by ``AdamW.host_slots``."""
    import jax

    if variable._value is None:
        return
    value = variable.value
    sharding = value.sharding.with_memory_kind(memory_kind)
    variable._layout = sharding
    variable._value = jax.device_put(value, sharding)


def variable_layout(variable):
    """The layout ``variable`` was created with (``keras.Variable(layout=...)``), or the
    one Keras gave it at initialisation; None when it has neither yet (e.g. deferred in
    ``StatelessScope(initialize_variables=False)``).

    Private: ``Variable._layout``. Checked on Keras 3.15.1 (JAX 0.10.2 and 0.12.0.1).
    Public replacement: a ``Variable.layout`` property, which Keras 3.15 lacks
    (``ModelParallel.get_variable_layout`` returns it first, but also consults and
    records the layout map, so it is not a side-effect-free read).
    """
    return getattr(variable, "_layout", None)


def add_weight_with_layout(
    layer,
    layout,
    *,
    shape,
    initializer,
    dtype,
    trainable,
    autocast,
    regularizer,
    constraint,
    aggregation,
    overwrite_with_gradient,
    name,
):
    """``layer.add_weight(...)`` with the variable created under ``layout`` (a
    ``TensorLayout`` or a JAX ``Sharding``), which becomes the variable's own layout.

    A copy of ``Layer.add_weight`` of Keras 3.15.1 (dtype and initializer defaults, the
    layer's name scope, i.e. the variable path; regulariser, constraint, tracking), with
    ``layout=`` passed to ``keras.Variable``, which takes it publicly. The layout must be
    given at construction: a variable created in ``StatelessScope(initialize_variables=
    False)`` picks its layout only when it is initialised later, when the distribution
    that was active may be gone.

    Private: ``Layer._track_variable`` (what ``add_weight`` calls to add the variable to
    the layer's trainable / non-trainable lists). Checked on Keras 3.15.1 (JAX 0.10.2
    and 0.12.0.1). Public replacement: a ``layout=`` argument of ``Layer.add_weight``.
    """
    import keras

    dtype = keras.backend.standardize_dtype(dtype) if dtype is not None else layer.variable_dtype
    if initializer is None:
        initializer = "glorot_uniform" if "float" in dtype else "zeros"
    with keras.name_scope(layer.name, caller=layer):
        variable = keras.Variable(
            initializer=keras.initializers.get(initializer),
            shape=shape or (),
            dtype=dtype,
            trainable=trainable,
            autocast=autocast,
            aggregation=aggregation,
            name=name,
            layout=layout,
        )
    variable.regularizer = keras.regularizers.get(regularizer)
    variable.constraint = keras.constraints.get(constraint)
    variable.overwrite_with_gradient = overwrite_with_gradient
    try:
        track = layer._track_variable
    except AttributeError as error:
        raise _missing("keras.Layer._track_variable", error) from None
    track(variable)
    return variable


@contextlib.contextmanager
def deleting_variables_without_full_collections():
    """While inside, Keras deletes a layer's variable without a full garbage collection.

    Keras' ``Layer.__delattr__`` runs ``gc.collect()`` each time a variable attribute is
    deleted, which ``layer.quantize`` does once a layer (its float kernel): 0.6 s a call in
    a test process holding many compiled models, 14 calls for a 2-block model, and a few
    hundred for an 8B one. The deleted kernel is released by reference counting alone,
    once nothing else holds it (Keras keeps a predict's values until its next call; a
    collection does not free them sooner): ``tests/training/lora/test_qlora.py`` checks
    that every float kernel is freed with no collection. Inside this context
    ``gc.collect`` is a no-op (process-wide: nothing else should collect meanwhile).

    Not a private API, a Keras behaviour: ``keras.src.layers.layer.Layer.__delattr__``.
    Checked on Keras 3.15.1. Public replacement: none (a Keras option not to collect).
    """
    import gc

    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect


@contextlib.contextmanager
def forgetting_deferred_variables():
    """Restore Keras' global list of not-yet-initialised variables on exit.

    Keras keeps every variable created in a ``StatelessScope(initialize_variables=False)``
    in a global list and initialises the whole list when some later scope exits; without
    this, a model built abstractly (1B parameters, say) would be allocated by the next
    symbolic call.

    Private: ``keras.src.backend.common.global_state`` (attribute
    ``"uninitialized_variables"``). Checked on Keras 3.15.1 (JAX 0.10.2 and 0.12.0.1).
    Public replacement: none (e.g. a ``StatelessScope`` option not to defer, or
    ``jax.eval_shape`` over model construction if Keras supported it).
    """
    try:
        from keras.src.backend.common import global_state
    except ImportError as error:
        raise _missing("keras.src.backend.common.global_state", error) from None
    before = list(global_state.get_global_attribute("uninitialized_variables") or [])
    try:
        yield
    finally:
        global_state.set_global_attribute("uninitialized_variables", before)


def build_compile_state(model, x, y):
    """Create the compiled loss' and metrics' variables of ``model`` for a batch of
    ``x``, ``y`` (``jax.ShapeDtypeStruct``s, any nesting), as ``fit`` does before its first step; the
    step's state then has every variable it will update.

    Private: ``Trainer._symbolic_build(data_batch=...)``. Checked on Keras 3.15.1 (JAX
    0.10.2 and 0.12.0.1). Public replacement: none (``fit`` does it on its first batch).
    """
    import keras

    symbolic = getattr(model, "_symbolic_build", None)
    if symbolic is None:
        raise _missing("keras Trainer._symbolic_build", AttributeError("_symbolic_build"))
    symbolic(
        data_batch=tuple(
            keras.tree.map_structure(lambda spec: keras.KerasTensor(spec.shape, dtype=spec.dtype), part)
            for part in (x, y)
        )
    )


def keras_layer_test_case():
    """Keras' own layer harness: a ``TestCase`` whose ``run_layer_test(layer_cls,
    init_kwargs, input_shape=..., call_kwargs=..., run_training_check=...,
    run_mixed_precision_check=...)`` runs the checks Keras runs on its own layers
    (config and serialisation round trips, build, symbolic and eager calls, weight
    counts, a ``fit`` step, and a ``mixed_float16`` call whose output dtypes must equal
    ``compute_output_spec``'s). For tests; needs ``absl-py`` (a Keras dependency).

    Private: ``keras.src.testing.TestCase``. Checked on Keras 3.15.1 (JAX 0.10.2 and
    0.12.0.1). Public replacement: none (Keras publishes no testing module; keras-hub's
    ``TestCase.run_layer_test`` wraps this same private class).
    """
    try:
        from keras.src.testing import TestCase
    except ImportError as error:
        raise _missing("keras.src.testing.TestCase", error) from None
    return TestCase()  # unittest's default method name: no test method is needed to call run_layer_test


def initialize_keras_rng():
    """What ``keras.distribution.initialize`` does after ``jax.distributed.initialize``:
    one global seed for all processes (unless ``keras.utils.set_random_seed`` set one).

    Private: ``keras.src.backend.jax.distribution_lib.initialize_rng``. Checked on Keras
    3.15.1 (JAX 0.10.2 and 0.12.0.1). Public replacement: ``keras.distribution.
    initialize()``, which also calls ``jax.distributed.initialize`` (zoo's ``initialize``
    calls that itself, with its own checks and timeouts).
    """
    try:
        from keras.src.backend.jax.distribution_lib import initialize_rng
    except ImportError as error:
        raise _missing("keras.src.backend.jax.distribution_lib.initialize_rng", error) from None
    initialize_rng()


# --- JAX -----------------------------------------------------------------------------


def jax_backends_initialized():
    """True once JAX has initialised its backends (device counts are then fixed).

    Private: ``jax._src.xla_bridge.backends_are_initialized``. Checked on JAX 0.10.2
    and 0.12.0.1. Public replacement: none (``jax.devices()`` and
    ``jax.extend.backend.backends()`` answer by initialising them).
    """
    try:
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError as error:
        raise _missing("jax._src.xla_bridge.backends_are_initialized", error) from None
    return backends_are_initialized()


def detected_jax_cluster():
    """The name JAX gives the managed cluster this process runs in (``"slurm"``,
    ``"ompi"``, ``"gcetpu"``, ``"gketpu"``, ``"k8s"``), or None, also when this JAX has
    no cluster registry where it is looked for (auto-detection is only reported).

    Private: ``jax._src.clusters.ClusterEnv._cluster_types`` and each type's
    ``opt_in_only_method``, ``is_env_present()`` and ``name``. Checked on JAX 0.10.2 and
    0.12.0.1. Public replacement: none (``jax.distributed.initialize()`` detects the
    cluster but does not say which).
    """
    try:
        from jax._src.clusters import ClusterEnv

        kinds = list(ClusterEnv._cluster_types)
    except (ImportError, AttributeError):  # JAX moved its private cluster registry
        return None
    for kind in kinds:
        if not getattr(kind, "opt_in_only_method", False) and kind.is_env_present():
            return kind.name or kind.__name__
    return None


def jax_distributed_client():
    """The client of ``jax.distributed`` (its coordinator's key-value store:
    ``key_value_set``, ``blocking_key_value_get``), or None before
    ``jax.distributed.initialize``.

    Private: ``jax._src.distributed.global_state.client``. Checked on JAX 0.10.2 and
    0.12.0.1. Public replacement: none (``jax.experimental.multihost_utils`` exchanges
    arrays over the devices, which cannot report that the processes' devices differ).
    """
    try:
        from jax._src import distributed

        return distributed.global_state.client
    except (ImportError, AttributeError) as error:
        raise _missing("jax._src.distributed.global_state.client", error) from None


def deferred_initializer(variable):
    """The initializer of a variable created in ``StatelessScope(initialize_variables=False)``
    and not initialised yet (None once it has a value).

    Private: ``Variable._initializer``. Checked on Keras 3.15.1 (JAX 0.10.2 and 0.12.0.1).
    Public replacement: an ``initializer`` property of ``keras.Variable``, which Keras lacks.
    """
    try:
        return variable._initializer
    except AttributeError as error:
        raise _missing("keras.Variable._initializer", error) from None


def set_deferred_variable_layout(variable, layout):
    """Give a variable not initialised yet (``deferred_initializer(variable)`` is not None)
    the layout it takes when it is initialised (a ``TensorLayout``), whatever the
    distribution's layout map says then: what ``add_weight_with_layout`` does at creation,
    for a variable someone else created (Keras' ``enable_lora`` makes the LoRA factors).

    Private: ``Variable._layout``, read by ``JaxVariable._initialize_layout`` and first by
    ``ModelParallel.get_variable_layout``. Checked on Keras 3.15.1 (JAX 0.10.2). Public
    replacement: a ``layout=`` argument of ``Layer.add_weight`` (or a settable layout).
    """
    if deferred_initializer(variable) is None:
        raise ValueError(f"variable {variable.path!r} is already initialised; its layout cannot change")
    if not hasattr(variable, "_layout"):
        raise _missing("keras.Variable._layout", AttributeError("_layout"))
    variable._layout = layout


def record_int4_input_dim(layer, input_dim):
    """Tell a ``Dense`` built in int4 its float kernel's input dimension, which its
    ``enable_lora`` reads before it falls back to ``layer.kernel.shape[0]``: that property
    unpacks and dequantizes the whole int4 kernel (eagerly, even in an abstract build:
    240 kernels of a Llama-3-70B-shaped model, 3 of the build's 6 minutes on 2 cores).

    Private: ``Dense._orig_input_dim``, which Keras' own int4 ``quantize`` sets and its
    quantized build does not. Checked on Keras 3.15.1. Public replacement: ``enable_lora``
    taking the shape from the int4 build's own record (as ``EinsumDense`` does with
    ``original_kernel_shape``)."""
    layer._orig_input_dim = int(input_dim)


# --- Orbax ---------------------------------------------------------------------------


def einsum_int8_scale_as_kernel(layer, scale):
    """An int8 ``EinsumDense``'s ``kernel_scale`` (stored in the output's shape, e.g. (1, 1, H, D)
    for "btc,chd->bthd") laid out as its kernel, size 1 on the contracted axes ((1, H, D)), so
    ``kernel / scale`` is the float kernel: what its own quantized call does before its
    gradient. Works on one device's slice of the scale (no size is read).

    Private: ``EinsumDense._adjust_scale_for_dequant``. Checked on Keras 3.15.1. Public
    replacement: none (Keras dequantizes an int8 einsum kernel only inside its own call)."""
    try:
        adjust = layer._adjust_scale_for_dequant
    except AttributeError as error:
        raise _missing("EinsumDense._adjust_scale_for_dequant", error) from error
    return adjust(scale)


def dequantize_int4_groups(unpacked, scale, zero, groups):
    """Keras' block-wise int4 dequantization: (w - zero[g]) * scale[g] for the row groups
    ``groups`` (``g_idx``) of an unpacked kernel [rows, columns], scale and zero [groups, columns].

    Private: ``keras.src.quantizers.quantizers.dequantize_with_sz_map``. Checked on Keras
    3.15.1. Public replacement: none (Keras applies it inside its layers' int4 calls)."""
    try:
        from keras.src.quantizers.quantizers import dequantize_with_sz_map
    except ImportError as error:
        raise _missing("keras.src.quantizers.quantizers.dequantize_with_sz_map", error) from error
    return dequantize_with_sz_map(unpacked, scale, zero, groups, group_axis=0)


def standard_handler_with_min_replica_slice(min_slice_bytes):
    """Orbax's ``StandardCheckpointHandler`` that splits the save of a replicated array over
    its replicas (replica-parallel, Orbax's default off GPU) only where each replica's slice
    holds at least ``min_slice_bytes``; a smaller array is written whole from one replica,
    as Orbax does on GPU. Everything else is Orbax's default, the files written included.

    Private: the handler's ``_impl`` (the ``PyTreeCheckpointHandler`` it wraps, built with
    the global type registry), the registry's ``_DEFAULT_TYPE_HANDLERS``, and the default
    array handler's ``_array_metadata_store``. Checked on orbax-checkpoint 0.12.8 (JAX
    0.10.2). Public replacement: ``ocp.type_handlers.register_type_handler``, which changes
    every Orbax user in the process, or a ``type_handler_registry`` argument of
    ``StandardCheckpointHandler``, which it lacks.
    """
    import jax
    import orbax.checkpoint as ocp

    try:
        from orbax.checkpoint._src.serialization import type_handler_registry as registries

        defaults = registries._DEFAULT_TYPE_HANDLERS  # ((type, handler), ...)
        store = dict(defaults)[jax.Array]._array_metadata_store
        arrays = ocp.type_handlers.ArrayHandler(
            array_metadata_store=store, min_slice_bytes_for_replica_parallel=min_slice_bytes
        )
        # built with ours in place (registry.add(override=True) logs a warning on every run)
        registry = registries.create_type_handler_registry(
            *((kind, arrays if kind is jax.Array else handler) for kind, handler in defaults)
        )
        handler = ocp.StandardCheckpointHandler()
        handler._impl = ocp.PyTreeCheckpointHandler(type_handler_registry=registry)
    except (ImportError, AttributeError) as error:
        raise _missing("orbax.checkpoint's StandardCheckpointHandler._impl and type registry", error) from None
    return handler


def reprinted_hlo(hlo_text):
    """``hlo_text`` parsed and printed again by XLA's own HLO printer: the one
    ``jax.stages.Compiled.as_text()`` prints with, which spells an async slice
    ``slice-start`` where XLA's dumps write ``async-start``.

    Private: ``jax._src.lib.xla_client.hlo.hlo_module_from_text``. Checked on JAX 0.10.2
    and 0.12.0.1. Public replacement: none (JAX exports no HLO text parser).
    """
    try:
        from jax._src.lib import xla_client

        parse = xla_client.hlo.hlo_module_from_text
    except (ImportError, AttributeError) as error:
        raise _missing("jax._src.lib.xla_client.hlo.hlo_module_from_text", error) from None
    return parse(hlo_text).to_string()


def hlo_text_with_constants(compiled):
    """``compiled.as_text()`` with every constant's values printed: XLA's printer writes a
    large constant as ``{...}``, and a splash kernel's block mask ([heads, query blocks, key
    blocks] of s8, 64 entries at T = 8,192 in blocks of 1,024) is what ``zoo plan`` reads to
    count the blocks the kernel visits. The text ``as_text()`` prints where the modules are
    not reachable.

    Private: ``jaxlib._hlo.HloPrintOptions`` and the loaded executable's ``hlo_modules()``.
    Checked on JAX 0.10.2 and 0.12.1. Public replacement: none (``as_text`` takes no options)."""
    try:
        from jaxlib._hlo import HloPrintOptions

        modules = compiled.runtime_executable().hlo_modules()
    except (ImportError, AttributeError, NotImplementedError):
        return compiled.as_text()
    options = HloPrintOptions()
    options.print_large_constants = True
    return "\n\n".join(module.to_string(options) for module in modules)


def apply_weight_decay_except(optimizer, variables, skip):
    """Keras' decoupled weight decay (``BaseOptimizer._apply_weight_decay``, private; the hook
    ``apply`` calls before the updates) on ``variables`` but those ``skip(variable)`` is true
    for, whose decay the optimizer's ``update_step`` applies itself (checked on Keras 3.15.1)."""
    import keras

    keras.optimizers.Optimizer._apply_weight_decay(optimizer, [v for v in variables if not skip(v)])


def applies_weight_decay(optimizer, variable):
    """Whether Keras' optimizer decays ``variable`` (its weight decay set, the variable not
    excluded by ``exclude_from_weight_decay``): ``BaseOptimizer._use_weight_decay``, private
    (checked on Keras 3.15.1)."""
    return optimizer.weight_decay is not None and optimizer._use_weight_decay(variable)

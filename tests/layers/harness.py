"""The checks every zoo layer goes through (after Keras' ``run_layer_test`` and keras-hub's
``TestCase``): config round-trip, symbolic call, eager call, weight counts, one ``fit``
step, ``.keras`` round-trip.

Use ``check_layer_contract`` for all of them, or the single ``check_*`` functions. Extra
tensor arguments of ``call`` (a mask, say) are given as numpy arrays in
``call_inputs``; they become extra ``keras.Input``s of the functional models built here.

``check_keras_layer_test`` runs Keras' own ``run_layer_test`` (through ``zoo._compat``),
and ``check_dtype_policies`` the dtype policies (``tests/layers/test_mixed_precision.py``).
"""

import json

import keras
import numpy as np


def check_layer_contract(
    layer_cls,
    *,
    init_kwargs,
    input_shape,
    expected_output_shape,
    expected_num_trainable_weights,
    expected_num_non_trainable_weights=0,
    expected_weight_shapes=None,
    call_inputs=None,
    input_dtype="float32",
    save_dir=None,
    seed=0,
):
    """Runs every check on ``layer_cls(**init_kwargs)`` with inputs of ``input_shape``.

    Args:
        expected_output_shape: output shape for the concrete ``input_shape``; the
            symbolic call expects the same with a None batch dimension.
        expected_weight_shapes: optional ``{path suffix: shape}``, e.g.
            ``{"query/kernel": (16, 4, 8)}``; every weight must be listed.
        call_inputs: ``{argument name: numpy array}`` for extra tensor arguments.
        save_dir: a folder (pytest's ``tmp_path``) for the ``.keras`` round-trip;
            skipped when None.
    """
    call_inputs = call_inputs or {}
    x = random_inputs(input_shape, input_dtype, seed)
    check_config_round_trip(layer_cls, init_kwargs)
    check_symbolic_call(layer_cls, init_kwargs, input_shape, expected_output_shape, call_inputs, input_dtype)
    layer = check_eager_call(layer_cls, init_kwargs, x, expected_output_shape, call_inputs)
    check_weights(layer, expected_num_trainable_weights, expected_num_non_trainable_weights, expected_weight_shapes)
    model = functional_model(layer_cls, init_kwargs, input_shape, call_inputs, input_dtype)
    check_fit_step(model, x, call_inputs, expected_output_shape, seed)
    if save_dir is not None:
        check_saving(model, x, call_inputs, save_dir)


def random_inputs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(0, 8, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def check_config_round_trip(layer_cls, init_kwargs):
    """Every init argument is in ``get_config``; ``from_config`` rebuilds the same config; JSON-safe."""
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    for name, value in init_kwargs.items():
        assert name in config, f"init argument {name!r} missing from get_config()"
        if isinstance(value, (int, float, str, bool, type(None), tuple, list)):
            expected = list(value) if isinstance(value, tuple) else value
            got = list(config[name]) if isinstance(config[name], tuple) else config[name]
            assert got == expected, f"get_config()[{name!r}] = {config[name]!r}, init got {value!r}"
    clone = layer_cls.from_config(config)
    assert clone.get_config() == config
    json.dumps(keras.saving.serialize_keras_object(layer))


def _symbolic_inputs(input_shape, call_inputs, input_dtype):
    x = keras.Input(shape=input_shape[1:], dtype=input_dtype, name="x")
    extra = {
        name: keras.Input(shape=array.shape[1:], dtype=str(array.dtype), name=name)
        for name, array in call_inputs.items()
    }
    return x, extra


def check_symbolic_call(layer_cls, init_kwargs, input_shape, expected_output_shape, call_inputs, input_dtype):
    """A call on ``keras.Input``s (batch None) gives the expected shape, without running."""
    x, extra = _symbolic_inputs(input_shape, call_inputs, input_dtype)
    out = layer_cls(**init_kwargs)(x, **extra)
    assert tuple(out.shape) == (None, *expected_output_shape[1:]), out.shape


def check_eager_call(layer_cls, init_kwargs, x, expected_output_shape, call_inputs):
    """A call on numpy arrays builds the layer and gives finite outputs of the expected shape."""
    layer = layer_cls(**init_kwargs)
    out = np.asarray(layer(x, **call_inputs))
    assert out.shape == tuple(expected_output_shape), out.shape
    assert np.all(np.isfinite(out)), "eager call gave non-finite outputs"
    return layer


def check_weights(layer, num_trainable, num_non_trainable=0, shapes=None):
    """Weight counts, and (if given) every weight's shape by path suffix."""
    assert len(layer.trainable_weights) == num_trainable, [w.path for w in layer.trainable_weights]
    assert len(layer.non_trainable_weights) == num_non_trainable, [w.path for w in layer.non_trainable_weights]
    if shapes is not None:
        got = {w.path.split("/", 1)[1]: tuple(w.shape) for w in layer.weights}
        assert got == {k: tuple(v) for k, v in shapes.items()}, got


def functional_model(layer_cls, init_kwargs, input_shape, call_inputs, input_dtype):
    x, extra = _symbolic_inputs(input_shape, call_inputs, input_dtype)
    out = layer_cls(**init_kwargs)(x, **extra)
    return keras.Model([x, *extra.values()], out)


def check_fit_step(model, x, call_inputs, expected_output_shape, seed=0):
    """One SGD step of ``fit`` on an MSE loss: finite loss, and every trainable weight moves."""
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    before = [np.array(w.numpy()) for w in model.trainable_weights]
    y = random_inputs(expected_output_shape, "float32", seed + 1)
    history = model.fit([x, *call_inputs.values()], y, batch_size=len(x), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    unchanged = [w.path for w, b in zip(model.trainable_weights, before) if np.array_equal(w.numpy(), b)]
    assert not unchanged, f"fit step left these trainable weights unchanged (no gradient?): {unchanged}"


def check_saving(model, x, call_inputs, save_dir):
    """``.keras`` save and load gives a model with the same outputs."""
    path = f"{save_dir}/layer_test.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    inputs = [x, *call_inputs.values()]
    np.testing.assert_allclose(
        np.asarray(loaded.predict(inputs, verbose=0)),
        np.asarray(model.predict(inputs, verbose=0)),
        rtol=1e-6,
        atol=1e-6,
    )


# --- dtype policies ---------------------------------------------------------------------

MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16", "bfloat16")


def check_keras_layer_test(layer_cls, *, init_kwargs, input_shape, call_kwargs=None):
    """Keras' own ``run_layer_test`` (``zoo._compat.keras_layer_test_case``) with its
    mixed-precision check (a ``mixed_float16`` layer's eager outputs have the dtypes of its
    ``compute_output_spec``); without its ``fit`` step (``check_fit_step`` covers that)."""
    from zoo._compat import keras_layer_test_case

    keras_layer_test_case().run_layer_test(
        layer_cls,
        init_kwargs=init_kwargs,
        input_shape=input_shape,
        call_kwargs=call_kwargs,
        run_training_check=False,
        run_mixed_precision_check=True,
    )


def check_dtype_policies(
    layer_cls,
    *,
    init_kwargs,
    input_shape,
    call_inputs=None,
    call_kwargs=None,
    policies=MIXED_POLICIES,
    output_dtype=None,
):
    """Under each dtype policy, every output of an eager call is in the policy's compute
    dtype, and a symbolic call on ``KerasTensor``s of the same shapes gives the same
    structure, shapes and dtypes.

    Args:
        call_inputs: ``{argument name: numpy array}``, tensor arguments of ``call``
            (symbolic in the symbolic call).
        call_kwargs: other arguments of ``call`` (``training``, ``cache_index``, ...).
        output_dtype: the dtype every output has whatever the policy (``LogitSoftcap``'s
            float32 logits), instead of the compute dtype.
    """
    call_inputs, call_kwargs = call_inputs or {}, call_kwargs or {}
    x = random_inputs(input_shape, "float32")
    for policy in policies:
        layer = layer_cls(**init_kwargs, dtype=policy)
        eager = keras.tree.map_structure(np.asarray, layer(x, **call_inputs, **call_kwargs))
        compute = output_dtype or layer.dtype_policy.compute_dtype
        got = [str(out.dtype) for out in keras.tree.flatten(eager)]
        assert got == [compute] * len(got), (
            f"{layer_cls.__name__} under {policy!r}: outputs {got}, compute dtype {compute}"
        )
        symbolic_inputs = {name: keras.KerasTensor(a.shape, dtype=str(a.dtype)) for name, a in call_inputs.items()}
        symbolic = layer(keras.KerasTensor(x.shape, dtype="float32"), **symbolic_inputs, **call_kwargs)
        specs = keras.tree.map_structure(lambda t: (tuple(t.shape), keras.backend.standardize_dtype(t.dtype)), symbolic)
        outputs = keras.tree.map_structure(lambda a: (tuple(a.shape), str(a.dtype)), eager)
        assert specs == outputs, (
            f"{layer_cls.__name__} under {policy!r}: symbolic call gives {specs}, eager call {outputs}"
        )

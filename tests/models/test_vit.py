import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

from tests.models.harness import check_model_contract
from zoo.data import load_shapes
from zoo.distribution import CheckedModelParallel, LayoutError, build_distributed, make_mesh
from zoo.distribution.parity import check_parity
from zoo.models.vit import VIT_CONFIGS, ViTClassifier

IMAGE = 16  # vit_tiny: 16 x 16 images, 4 x 4 patches


def _tiny(**overrides):
    return ViTClassifier.from_config_name("vit_tiny", **overrides)


def _compile_sgd(model):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def _tp(config=None):
    mesh = make_mesh("data=2,model=4")
    return CheckedModelParallel(layout_map=ViTClassifier.get_layout_map(mesh, "tp", config), batch_dim_name="data")


@pytest.fixture(scope="module")
def shapes():
    return load_shapes("train", image_size=IMAGE, num_examples=96, seed=3)


@pytest.mark.parametrize(
    "distribution, overrides",
    [
        (
            lambda: keras.distribution.DataParallel(device_mesh=make_mesh("data=8")),
            dict(pooling="cls", dropout=0.1, seed=3),
        ),
        (lambda: _tp("vit_tiny"), dict(pooling="mean")),
    ],
    ids=["data=8 dropout", "tp data=2,model=4"],
)
def test_three_steps_of_fit_match_one_device(distribution, overrides, shapes):
    x, y = shapes
    report = check_parity(
        lambda: _tiny(num_layers=1, **overrides), _compile_sgd, distribution(), x, y, steps=3, batch_size=32
    )
    assert report.passed, "\n".join(report.format())
    assert len(report.reference_losses) == 3 and report.reference_losses[0] != report.reference_losses[2]


def test_tensor_parallel_shards_the_weights():
    model = build_distributed(_tiny, _tp("vit_tiny"))
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    assert specs["block_0/attention/key/kernel"] == (None, "model", None)
    assert specs["block_1/attention/output/kernel"] == ("model", None, None)
    assert specs["block_1/mlp/down/kernel"] == ("model", None)
    assert specs["classifier_head/kernel"] == (None, "model")  # 8 classes divide the model axis of 4
    for path in ("patch_embedding/kernel", "class_token/token", "position_embedding/embeddings"):
        assert all(entry is None for entry in specs[path]), path
    query = next(v for v in model.weights if v.path == "block_0/attention/query/kernel")
    assert {s.data.shape for s in query.value.addressable_shards} == {(32, 1, 8)}  # 4 heads over 4 devices


def test_fsdp_splits_the_embeddings_over_data():
    mesh = make_mesh("data=8")
    distribution = CheckedModelParallel(
        layout_map=ViTClassifier.get_layout_map(mesh, "fsdp", "vit_tiny"), batch_dim_name="data"
    )
    model = build_distributed(_tiny, distribution)
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    assert specs["patch_embedding/kernel"] == (None, None, None, "data")
    assert specs["position_embedding/embeddings"] == (None, "data")
    assert specs["block_0/mlp/up/kernel"] == ("data", None)
    assert specs["classifier_head/kernel"] == ("data", None)


def test_config_and_keras_file_round_trip(tmp_path, shapes):
    model = ViTClassifier(
        image_size=(16, 8),
        patch_size=(4, 2),
        num_classes=3,
        num_layers=1,
        num_query_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        num_key_value_heads=1,
        mlp="geglu",
        norm="rms",
        pooling="mean",
        dropout=0.1,
        seed=2,
    )
    config = model.get_config()
    assert config == ViTClassifier.from_config(config).get_config()
    assert config["image_size"] == [16, 8] and config["patch_size"] == [4, 2] and model.num_patches == 16
    x = shapes[0][:2, :, :8]
    check_model_contract(model, x, expected_output_shape=(2, 3), save_dir=tmp_path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(image_size=18), "image height 18 is not divisible by patch height 4"),
        (dict(image_size=(16, 10)), "image width 10 is not divisible by patch width 4"),
        (dict(hidden_dim=30), "hidden_dim=30 is not divisible by num_query_heads=4"),
        (dict(patch_size=0), "patch_size must be a positive int or (height, width) of positive ints, got 0"),
        (dict(pooling="max"), "pooling must be one of ['cls', 'mean'], got 'max'"),
        (dict(num_classes=0), "num_classes must be a positive integer, got 0"),
    ],
)
def test_bad_config_names_the_numbers(overrides, message):
    with pytest.raises(ValueError) as error:
        _tiny(**overrides)
    assert message in str(error.value)


def test_unknown_config_name_lists_the_names():
    with pytest.raises(ValueError) as error:
        ViTClassifier.from_config_name("vit_huge")
    assert "'vit_huge'" in str(error.value) and str(list(VIT_CONFIGS)) in str(error.value)


@pytest.mark.parametrize(
    "layout, config, message",
    [
        ("tp", "vit_small", "num_query_heads=6 is not divisible by the 'model' mesh axis of size 4"),
        (
            "tp+sp",
            {**VIT_CONFIGS["vit_tiny"], "megatron_sp": True},
            "token count (patches + class token)=17 is not divisible by the 'model' mesh axis of size 4",
        ),
        ("tp+sp", VIT_CONFIGS["vit_tiny"], "needs the model built with megatron_sp=True"),
    ],
)
def test_layout_map_checks_the_config_up_front(layout, config, message):
    with pytest.raises((LayoutError, ValueError)) as error:
        ViTClassifier.get_layout_map(make_mesh("data=2,model=4"), layout, config)
    assert message in str(error.value)


def test_mean_pooling_fits_sequence_parallel_layout():
    config = {**VIT_CONFIGS["vit_tiny"], "pooling": "mean", "megatron_sp": True}
    layout_map = ViTClassifier.get_layout_map(make_mesh("data=2,model=4"), "tp+sp", config)
    assert layout_map[r".*attention/(query|key|value)/kernel"] is None  # MultiHeadAttention places its own weights


def _reference_vit(weights, images, *, patch, layers, pooling, epsilon=1e-6):
    """The ViT of Dosovitskiy et al. (2021), pre-norm, written out from the paper in jnp:
    images (B, S, S, Ch) -> logits (B, N). ``weights``: {variable path: array}."""

    def norm(x, path):  # LayerNorm over C
        mean = x.mean(-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(variance + epsilon) * weights[f"{path}/gamma"] + weights[f"{path}/beta"]

    batch, side, _, channels = images.shape
    grid = side // patch
    pieces = images.reshape(batch, grid, patch, grid, patch, channels).transpose(0, 1, 3, 2, 4, 5)
    pieces = pieces.reshape(batch, grid * grid, patch * patch * channels)  # (B, P, p p Ch), row-major patches
    kernel = weights["patch_embedding/kernel"]  # (p, p, Ch, C)
    x = pieces @ kernel.reshape(-1, kernel.shape[-1]) + weights["patch_embedding/bias"]  # (B, P, C)
    if pooling == "cls":
        token = jnp.broadcast_to(weights["class_token/token"], (batch, 1, x.shape[-1]))
        x = jnp.concatenate([token, x], axis=1)  # (B, 1 + P, C)
    x = x + weights["position_embedding/embeddings"][None]  # (B, T, C)
    for index in range(layers):
        block = f"block_{index}"
        h = norm(x, f"{block}/attention_norm")
        q, k, v = (
            jnp.einsum("btc,chd->bthd", h, weights[f"{block}/attention/{name}/kernel"])
            + weights[f"{block}/attention/{name}/bias"]
            for name in ("query", "key", "value")
        )  # (B, T, H, D)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1])  # (B, H, T, T): no mask
        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)  # (B, T, H, D)
        x = x + jnp.einsum("bthd,hdc->btc", attended, weights[f"{block}/attention/output/kernel"])
        x = x + weights[f"{block}/attention/output/bias"]
        h = norm(x, f"{block}/mlp_norm")
        h = jax.nn.gelu(h @ weights[f"{block}/mlp/up/kernel"] + weights[f"{block}/mlp/up/bias"], approximate=False)
        x = x + h @ weights[f"{block}/mlp/down/kernel"] + weights[f"{block}/mlp/down/bias"]  # (B, T, C)
    x = norm(x, "final_norm")
    pooled = x[:, 0] if pooling == "cls" else x.mean(axis=1)  # (B, C): the class token's state, or the patches' mean
    return pooled @ weights["classifier_head/kernel"] + weights["classifier_head/bias"]  # (B, N)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_outputs_and_gradients_match_the_papers_vit(pooling, shapes):
    """The model against ``_reference_vit``: logits and the gradient of the cross-entropy
    with respect to every weight. Every weight (class token and biases too, zero at
    initialisation) is drawn at random first, so a weight the model skips, a token pooled
    from the wrong place, or a patch cut in another order shows in the numbers."""
    model = _tiny(image_size=8, num_layers=1, pooling=pooling)  # 4 patches of 4 x 4
    rng = np.random.default_rng(0)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.5, variable.shape).astype("float32"))
    x, y = shapes[0][:2, :8, :8], shapes[1][:2]  # (2, 8, 8, 3), (2,)
    trainable = [variable.value for variable in model.trainable_variables]
    paths = [variable.path for variable in model.trainable_variables]

    def model_loss(values):
        logits, _ = model.stateless_call(values, [], x)
        return _cross_entropy(logits, y), logits

    def reference_loss(values):
        logits = _reference_vit(dict(zip(paths, values)), jnp.asarray(x), patch=4, layers=1, pooling=pooling)
        return _cross_entropy(logits, y), logits

    (loss, logits), grads = jax.jit(jax.value_and_grad(model_loss, has_aux=True))(trainable)
    (expected_loss, expected_logits), expected_grads = jax.jit(jax.value_and_grad(reference_loss, has_aux=True))(
        trainable
    )
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(expected_logits).max()) > 1.0  # not a trivially small output
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    for path, grad, expected in zip(paths, grads, expected_grads):
        np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-5, err_msg=path)
    assert all(float(jnp.abs(expected).max()) > 0 for expected in expected_grads)  # every weight reaches the loss


def _cross_entropy(logits, labels):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), labels[:, None], axis=-1))

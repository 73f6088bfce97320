"""The small CNN: three conv blocks and two dense layers."""

import keras
from keras import layers

from zoo.distribution.axes import MODEL
from zoo.models.zoo_model import ZooModel

MIN_IMAGE_SIZE = 8  # three 2x2 poolings need at least 8 pixels per side


@keras.saving.register_keras_serializable(package="zoo")
class SmallCNN(ZooModel):
    """Image classifier: 3 x (conv 3x3, batch norm, ReLU, max-pool 2x2), dense, dense.

    Channels widen block by block (``filters``); the head is a ReLU dense layer of
    ``hidden_units`` followed by a dense layer giving one logit per class.

    Args:
        num_classes: number of output logits.
        image_size: ``(height, width)`` or one int for square images; each side >= 8.
        channels: input channels (3 for RGB).
        filters: output channels of the three conv blocks.
        hidden_units: width of the first dense layer.
        dropout: dropout rate before the logits layer (0 disables it).
        seed: seed of the dropout layer's random stream.

    Inputs ``(B, H, W, C)`` float images; outputs ``(B, num_classes)`` logits.
    """

    def __init__(
        self,
        num_classes=8,
        image_size=(128, 128),
        channels=3,
        filters=(16, 32, 64),
        hidden_units=128,
        dropout=0.0,
        seed=None,
        name="small_cnn",
        **kwargs,
    ):
        image_size = _as_pair(image_size)
        _check_config(num_classes, image_size, filters, hidden_units, dropout)
        images = keras.Input(shape=(*image_size, channels), name="images")  # (B, H, W, C)
        x = images
        for index, width in enumerate(filters, start=1):
            x = _conv_block(x, width, f"block{index}")  # (B, H/2^i, W/2^i, width)
        x = layers.Flatten(name="flatten")(x)  # (B, H/8 * W/8 * filters[-1])
        x = layers.Dense(hidden_units, activation="relu", name="hidden_dense")(x)  # (B, hidden)
        x = layers.Dropout(dropout, seed=seed, name="dropout")(x)
        logits = layers.Dense(num_classes, name="logits")(x)  # (B, num_classes)
        super().__init__(inputs=images, outputs=logits, name=name, **kwargs)
        self.keep_arguments(
            num_classes=num_classes,
            image_size=image_size,
            channels=channels,
            filters=tuple(filters),
            hidden_units=hidden_units,
            dropout=dropout,
            seed=seed,
        )

    @staticmethod
    def get_layout_map(mesh, model_axis=MODEL):
        """Layout rules splitting conv features and dense features over ``model_axis``.

        Variable paths and shapes covered (defaults: 128x128x3, filters (16, 32, 64),
        hidden 128, 8 classes; ``M`` = model-axis size, ``k`` = 1, 2, 3):

        ===============================================  ==================  ===========
        path                                             shape               layout
        ===============================================  ==================  ===========
        blockk_conv/kernel                               (3, 3, Cin, Cout)   (-, -, -, M)
        blockk_norm/{gamma,beta,moving_mean,moving_var}  (Cout,)             (M,)
        hidden_dense/kernel                              (16384, 128)        (-, M)
        hidden_dense/bias                                (128,)              (M,)
        logits/kernel                                    (128, 8)            (M, -)
        logits/bias                                      (8,)                replicated
        ===============================================  ==================  ===========

        Conv kernels are split on output channels, so each device computes a slice of
        every feature map (with the matching slice of batch-norm statistics); the first
        dense layer is split on its outputs and the logits layer on its inputs, so the
        two dense layers need a single reduction between them (Megatron's pairing).
        Every conv width and ``hidden_units`` must divide by the model-axis size.
        """
        layout_map = keras.distribution.LayoutMap(mesh)
        layout_map[r".*block\d+_conv/kernel"] = (None, None, None, model_axis)
        layout_map[r".*block\d+_norm/(gamma|beta|moving_mean|moving_variance)"] = (model_axis,)
        layout_map[r".*hidden_dense/kernel"] = (None, model_axis)
        layout_map[r".*hidden_dense/bias"] = (model_axis,)
        layout_map[r".*logits/kernel"] = (model_axis, None)
        return layout_map


def _conv_block(x, width, prefix):
    """conv 3x3 (no bias: batch norm follows) -> batch norm -> ReLU -> max-pool 2x2."""
    x = layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"{prefix}_conv")(x)
    x = layers.BatchNormalization(momentum=0.9, name=f"{prefix}_norm")(x)
    x = layers.ReLU(name=f"{prefix}_relu")(x)
    return layers.MaxPooling2D(2, name=f"{prefix}_pool")(x)


def _as_pair(image_size):
    if isinstance(image_size, int):
        return (image_size, image_size)
    return tuple(int(side) for side in image_size)


def _check_config(num_classes, image_size, filters, hidden_units, dropout):
    if len(image_size) != 2 or min(image_size) < MIN_IMAGE_SIZE:
        raise ValueError(f"image_size must be (height, width) with each side >= {MIN_IMAGE_SIZE}, got {image_size}")
    if num_classes < 1 or hidden_units < 1:
        raise ValueError(f"num_classes and hidden_units must be positive, got {num_classes} and {hidden_units}")
    if len(filters) != 3 or min(filters) < 1:
        raise ValueError(f"filters must be three positive conv widths, got {tuple(filters)}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")

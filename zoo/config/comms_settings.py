"""Settings of ``zoo comms`` (``zoo.planning.comms`` does the work, ``zoo.cli.comms`` holds
the flags): pure Python, so ``zoo --help`` answers without loading JAX."""

import dataclasses

from zoo.config.choices import COMMS_MODELS, COMMS_STEPS

__all__ = ["COMMS_MODELS", "COMMS_STEPS", "CommsSettings"]


@dataclasses.dataclass
class CommsSettings:
    """Settings of ``zoo comms``; every default is the CLI's default."""

    model: str = "mlp"  # mlp: a tensor-parallel MLP block; cnn: zoo.models.SmallCNN
    layout: str = "model"  # cnn: single | data | model; mlp: always model (tensor parallel)
    mesh: str | None = None  # e.g. data=2,model=4; None: the layout's default (data=2,model=-1)
    step: str = "train"  # forward | backward (forward + gradients) | train (one SGD step)
    implementation: str = "explicit"  # mlp: explicit (zoo ParallelMLP) | gspmd (Dense + layout map)
    megatron_sp: bool = False  # mlp: input and output split over the sequence (Megatron sequence parallelism)
    collective_matmul: bool = False  # mlp, explicit, sequence-parallel: ring matmuls
    gated: bool = False  # mlp: gated (GLU) MLP
    batch_size: int = 8  # global batch; divides by the data axis
    sequence_length: int = 128  # mlp: T
    dim: int = 256  # mlp: model width C
    hidden: int = 1024  # mlp: hidden features F
    image_size: int = 32  # cnn: square images
    fast_compile: bool = False  # skip LLVM optimisation: the same collectives and memory, compiled sooner

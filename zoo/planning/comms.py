"""What ``zoo comms`` builds, compiles and reports: every collective of a compiled step
(a tensor-parallel MLP block, or ``SmallCNN`` under a layout), with its bytes, and the
step's memory. ``comms_for(CommsSettings(...))`` is the command without its flags
(``zoo.cli.comms`` holds its flags).
"""

from zoo.config.comms_settings import COMMS_MODELS, COMMS_STEPS, CommsSettings

__all__ = ["CommsSettings", "comms_for"]


def comms_for(settings, say=print):
    """Build, compile and report the step ``settings`` describes (a ``CommsReport``)."""
    from zoo.measure.comms_report import (
        FAST_COMPILE,
        comms_report,
        layer_step,
        train_step,
    )

    if settings.step not in COMMS_STEPS:
        raise ValueError(f"step must be one of {list(COMMS_STEPS)}, got {settings.step!r}")
    try:
        if settings.model == "mlp":
            distribution, model, x, y = _mlp(settings)
        elif settings.model == "cnn":
            distribution, model, x, y = _cnn(settings)
        else:
            raise ValueError(f"unknown model {settings.model!r}; choose one of {list(COMMS_MODELS)}")
        mesh = None if distribution is None else distribution.device_mesh
        say(_describe(settings, distribution))
        if settings.step == "train":
            step, args = train_step(model, x, y)
        else:
            step, args = layer_step(model, x, backward=settings.step == "backward")
        return comms_report(step, *args, mesh=mesh, compiler_options=FAST_COMPILE if settings.fast_compile else None)
    finally:
        import keras

        keras.distribution.set_distribution(None)


def _describe(settings, distribution):
    from zoo.distribution import describe_mesh

    mesh = "one device" if distribution is None else f"mesh {describe_mesh(distribution.device_mesh)}"
    if settings.model == "cnn":
        what = f"SmallCNN, layout {settings.layout}, images {settings.image_size}x{settings.image_size}"
    else:
        mode = (
            "sequence-parallel" + (", collective matmul" if settings.collective_matmul else "")
            if settings.megatron_sp
            else "tensor-parallel"
        )
        what = (
            f"{'gated ' if settings.gated else ''}MLP ({settings.implementation}, {mode}), "
            f"T={settings.sequence_length} D={settings.dim} F={settings.hidden}, no biases"
        )
    return f"zoo comms {settings.model}: {what}; {mesh}; global batch {settings.batch_size}; step {settings.step}"


def _mlp(settings):
    import jax

    from zoo.config.bench_settings import TPBenchSettings
    from zoo.distribution import default_mesh_spec
    from zoo.measure.tensor_parallel_mlp import (
        check_settings,
        example_input,
        explicit_model,
        gspmd_model,
    )

    if settings.collective_matmul and settings.implementation != "explicit":
        raise ValueError("--collective-matmul is a feature of the explicit implementation")
    mesh = settings.mesh or default_mesh_spec("model", len(jax.devices()))
    shapes = TPBenchSettings(
        mesh=mesh,
        batch_size=settings.batch_size,
        sequence_length=settings.sequence_length,
        dim=settings.dim,
        hidden=settings.hidden,
    )
    check_settings(shapes)
    if settings.implementation == "explicit":
        distribution, model = explicit_model(
            shapes, settings.gated, settings.megatron_sp, collective=settings.collective_matmul
        )
    else:
        distribution, model = gspmd_model(shapes, settings.gated, settings.megatron_sp)
    import keras

    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.MeanSquaredError())
    x = example_input(shapes, settings.megatron_sp)  # (B, T, C)
    return distribution, model, x, x  # y: any target of the output's shape and layout


def _cnn(settings):
    from zoo import distribution as zd
    from zoo.models import SmallCNN
    from zoo.training.cnn import build_cnn, compile_cnn

    distribution = zd.distribution_for(SmallCNN, settings.layout, settings.mesh)
    model = zd.build_distributed(lambda: build_cnn(settings.image_size, seed=0), distribution)
    compile_cnn(model, optimizer="sgd")
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((settings.batch_size, settings.image_size, settings.image_size, 3), dtype=np.float32)  # (B, S, S, 3)
    y = rng.integers(0, model.num_classes, size=settings.batch_size)  # (B,)
    return distribution, model, x, y

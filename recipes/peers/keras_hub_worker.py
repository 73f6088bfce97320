"""keras-hub's side of ``zoo bench peers``: run with the keras-hub venv's python, the zoo's
repository on ``PYTHONPATH`` (its compile and HLO-reading code serve both sides):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax PYTHONPATH=REPO \\
        VENV/bin/python recipes/peers/keras_hub_worker.py compile SPEC_JSON

SPEC_JSON: ``{"model": {GPTBackbone arguments of a Llama}, "mesh": "data=2,model=4",
"batch": B, "sequence_length": T, "precision": "mixed_bfloat16"}``.

What a keras-hub user writes: ``keras_hub.models.LlamaBackbone`` with the same sizes
(tied embeddings), its own ``get_layout_map`` (every weight split over ``model`` and
``data``, the batch over ``data``: the zoo's fsdp+tp) in a ``keras.distribution.ModelParallel``,
built inside ``keras.RematScope(mode=spec["remat"])`` (None: off; "full" fails inside
keras-hub 0.32's ``LlamaAttention``), its causal-LM head (the token embedding reversed),
compiled with Keras' AdamW and global-norm clipping and the sparse cross-entropy on
logits. The fit step is compiled by ``zoo.measure.compiled_step`` (abstract weights,
never allocated) exactly as the zoo's own; prints one ``PEERS {json}`` line: the
parameter count, ``memory_analysis()``, FLOPs (loop trip counts included) and the bytes
per mesh axis (``zoo.measure``), and keras-hub's version.
"""

import json
import math
import sys
import time


def build(spec):
    """A function building keras-hub's Llama causal LM from ``spec``'s sizes."""
    import keras
    import keras_hub

    sizes = spec["model"]

    def build_model():
        with keras.RematScope(mode=spec.get("remat")):
            backbone = keras_hub.models.LlamaBackbone(
                vocabulary_size=sizes["vocabulary_size"],
                num_layers=sizes["num_layers"],
                num_query_heads=sizes["num_query_heads"],
                hidden_dim=sizes["hidden_dim"],
                intermediate_dim=sizes["intermediate_dim"],
                num_key_value_heads=sizes["num_key_value_heads"],
                rope_max_wavelength=sizes.get("rope_max_wavelength", 10000),
                layer_norm_epsilon=sizes.get("layer_norm_epsilon", 1e-5),
                tie_word_embeddings=True,
            )
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")  # (B, T)
        hidden = backbone({"token_ids": token_ids, "padding_mask": keras.ops.ones_like(token_ids)})  # (B, T, C)
        logits = backbone.token_embedding(hidden, reverse=True)  # (B, T, V): LlamaCausalLM's head
        return keras.Model(token_ids, logits)

    return build_model


def compile_model(model):
    import keras

    optimizer = keras.optimizers.AdamW(learning_rate=1e-4, global_clipnorm=1.0)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def distribution_for(mesh_spec):
    import keras
    import keras_hub

    axes = [part.split("=") for part in mesh_spec.split(",")]
    mesh = keras.distribution.DeviceMesh(
        shape=tuple(int(size) for _, size in axes), axis_names=[name for name, _ in axes], devices=None
    )
    layout_map = keras_hub.models.LlamaBackbone.get_layout_map(
        mesh, model_parallel_dim_name="model", data_parallel_dim_name="data"
    )
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="data")


def compile_only(spec):
    import jax
    import keras
    import keras_hub

    from zoo.measure.comms_report import compiled_report, loop_multiplicities
    from zoo.measure.compiled_step import abstract_build, compile_fit_step
    from zoo.planning.measure import compiled_cost, loop_dot_flops

    start = time.perf_counter()
    keras.config.set_dtype_policy(spec["precision"])
    distribution = distribution_for(spec["mesh"])
    model = abstract_build(build(spec), compile_model, distribution)
    batch = ((spec["batch"], spec["sequence_length"]), "int32")
    compiled, memory = compile_fit_step(model, distribution, batch, batch)
    text = compiled.as_text()
    report = compiled_report(compiled, distribution.device_mesh.backend_mesh, hlo_text=text)
    times, _ = loop_multiplicities(text)
    print(
        "PEERS "
        + json.dumps(
            {
                "parameters": int(sum(math.prod(v.shape) for v in model.trainable_variables)),
                "memory": {part: int(getattr(memory, part)) for part in ("argument", "output", "temp", "alias")},
                "flops": compiled_cost(compiled)[0] + loop_dot_flops(text, times),
                "collectives": report.per_axis(),
                "compile_s": time.perf_counter() - start,
                "jax": jax.__version__,
                "keras_hub": keras_hub.__version__,
            }
        ),
        flush=True,
    )


def main(argv):
    if len(argv) != 2 or argv[0] != "compile":
        print("usage: keras_hub_worker.py compile SPEC_JSON", file=sys.stderr)
        return 2
    compile_only(json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

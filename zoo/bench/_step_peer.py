"""keras-hub's Llama beside the zoo's step in ``zoo bench step --peer keras-hub``.

What a keras-hub user writes for the same sizes: ``keras_hub.models.LlamaBackbone`` (its
own rotary, RMSNorm, SwiGLU, grouped-query attention; tied or untied embeddings as the
zoo's config), its causal-LM head (the token embedding reversed), under the same dtype
policy, compiled with Keras' AdamW and global-norm clipping and the sparse cross-entropy
on logits, trained by ``model.fit`` on the same random tokens. Each run is a fresh
process (``python -m zoo.bench._step_peer SPEC``: the device's peak counter is then the
run's own), once with ``keras.config.enable_flash_attention()`` and once without; the
faster is the row (the other's step time is kept beside it). The parameter count must
equal the zoo's (``ParameterMismatch`` otherwise).
"""

import dataclasses
import json
import re
import statistics
import subprocess
import sys

RESULT = "STEP "


class ParameterMismatch(ValueError):
    """The peer's model and the zoo's do not hold the same number of parameters."""


def _spec(settings):
    from zoo.models.gpt.gpt_configs import at_depth, config_by_name

    config = config_by_name(settings.config_name)
    if settings.num_layers:
        config = at_depth(config, settings.num_layers)
    return {"settings": dataclasses.asdict(settings), "model": config}


def measure_peer(settings, report=print):
    """The keras-hub row (the faster of flash attention off and on), or ``{"error": ...}``."""
    if settings.method != "train":
        return {"model": "keras-hub Llama", "error": f"method {settings.method!r}: the peer runs method train only"}
    runs = []
    for flash in (False, True):
        report(f"keras-hub Llama, flash attention {'on' if flash else 'off'}: compiling and timing ...")
        runs.append(_run(dict(_spec(settings), flash=flash)))
    done = [run for run in runs if "error" not in run]
    if not done:
        return runs[0]
    best = min(done, key=lambda run: run["step_s"])
    best["flash_steps_s"] = {("on" if run["flash"] else "off"): run.get("step_s") for run in runs}
    return best


def check_same_parameters(peer, zoo_row):
    """Raise ``ParameterMismatch`` unless the peer's model holds the zoo's parameter count."""
    if "error" not in peer and peer["parameters"] != zoo_row["parameters"]:
        raise ParameterMismatch(
            f"keras-hub's Llama has {peer['parameters']:,} parameters, the zoo's {zoo_row['parameters']:,}"
        )


def _run(spec):
    done = subprocess.run(
        [sys.executable, "-m", "zoo.bench._step_peer", json.dumps(spec)], capture_output=True, text=True
    )
    lines = [line[len(RESULT) :] for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        return {"model": "keras-hub Llama", "flash": spec["flash"], "error": error_line(done)[-300:]}
    return json.loads(lines[-1])


def error_line(done):
    """The worker's exception line (``ValueError: ...``), the last one its stderr names,
    rather than whatever JAX or Python printed after it; else its last line or exit status."""
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b", line)]
    return (raised or lines or [f"exit {done.returncode}"])[-1]


def build_llama(sizes, precision):
    """keras-hub's Llama causal LM of the zoo config ``sizes`` under ``precision``."""
    import keras
    import keras_hub

    keras.config.set_dtype_policy(precision)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=sizes["vocabulary_size"],
        num_layers=sizes["num_layers"],
        num_query_heads=sizes["num_query_heads"],
        hidden_dim=sizes["hidden_dim"],
        intermediate_dim=sizes["intermediate_dim"],
        num_key_value_heads=sizes["num_key_value_heads"],
        rope_max_wavelength=sizes.get("rope_theta", 10000),
        layer_norm_epsilon=sizes.get("norm_epsilon", 1e-5),
        tie_word_embeddings=sizes.get("tie_word_embeddings", True),
    )
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")  # (B, T)
    hidden = backbone({"token_ids": token_ids, "padding_mask": keras.ops.ones_like(token_ids)})  # (B, T, C)
    logits = backbone.token_embedding(hidden, reverse=True)  # (B, T, V): LlamaCausalLM's head
    model = keras.Model(token_ids, keras.layers.Activation("linear", dtype="float32")(logits))
    optimizer = keras.optimizers.AdamW(learning_rate=1e-4, global_clipnorm=1.0)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main(argv):
    """Worker: build, time and print one ``STEP {json}`` row."""
    import keras

    from zoo.bench._step_timing import device_memory, random_tokens, step_row, time_fits
    from zoo.config.bench_step_settings import StepBenchSettings
    from zoo.measure import mfu

    spec = json.loads(argv[0])
    settings = StepBenchSettings(**spec["settings"])
    keras.config.enable_flash_attention() if spec["flash"] else keras.config.disable_flash_attention()
    keras.utils.set_random_seed(settings.seed)
    model = build_llama(spec["model"], settings.precision)
    x, y = random_tokens(settings, spec["model"]["vocabulary_size"], 2 * settings.steps * settings.batch_size)

    def fit(steps):
        rows = steps * settings.batch_size
        model.fit(x[:rows], y[:rows], batch_size=settings.batch_size, epochs=1, shuffle=False, verbose=0)

    compile_s, steps, fit_overhead = time_fits(fit, settings)
    flops = (
        mfu.gpt_flops_per_token(spec["model"], settings.sequence_length)
        * settings.batch_size
        * settings.sequence_length
    )
    row = step_row("keras-hub Llama", model.count_params(), compile_s, steps, flops, settings)
    row["fit_overhead_s"] = fit_overhead
    row.update(
        device_memory(), flash=spec["flash"], attention=f"keras flash attention {'on' if spec['flash'] else 'off'}"
    )
    row["step_s"] = statistics.median(steps)
    print(RESULT + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

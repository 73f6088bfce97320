"""The zoo's side of ``zoo bench peers``, run as its own process (``zoo.bench._peer_workers``):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax \\
        python -m zoo.bench._peers_zoo compile|serve SPEC_JSON

- ``compile`` SPEC ``{"config": {GPTTrainSettings fields}, "devices": N}``: the step ``zoo
  plan`` compiles (``zoo.planning.plan.plan_in_process`` at ``depth="full"``: the training
  job's own model, optimizer, precision, remat and layout, built abstractly, never run),
  and the exact parameter count of that job's model (built abstractly, no weight
  allocated); one ``PEERS {"plan": Plan.to_dict(), "parameters": n}`` line.
- ``serve`` SPEC ``{"model": {GPTBackbone arguments}, "layout", "mesh", "batch",
  "sequence_length", "precision", "loss_chunk_size"}``: ``GPTCausalLM`` compiled by the
  training job's ``compile_gpt`` (AdamW, global-norm clip), one warm-up ``fit`` step, then
  ``run N`` = one ``model.fit`` epoch of N steps on fixed random tokens
  (``_peer_workers.serve``).
"""

import json
import math
import sys

from zoo.bench._peer_workers import reply, serve


def compile_only(spec):
    import jax

    from zoo.planning.plan import PlanRequest, plan_in_process

    request = PlanRequest(
        job="pretrain_gpt", config=spec["config"], devices=spec["devices"], device="cpu", depth="full", label="peers"
    )
    plan = plan_in_process(request)
    reply({"plan": plan.to_dict(), "parameters": job_parameters(spec["config"]), "jax": jax.__version__})


def job_parameters(config):
    """Trainable parameters of the ``pretrain_gpt`` job's model for ``config``, built
    abstractly (``keras.StatelessScope``: shapes only)."""
    import keras

    from zoo.training.recipes import JOBS

    job = JOBS["pretrain_gpt"]
    module, settings_class, _ = job.load()
    with keras.StatelessScope(initialize_variables=False):
        model = job.build(module, settings_class(**config))
    return int(sum(math.prod(v.shape) for v in model.trainable_variables))


def build(spec):
    """The timing model under its layout, compiled as the training job compiles it."""
    import keras

    from zoo import distribution as zd
    from zoo.models import GPTCausalLM
    from zoo.models.gpt.gpt_backbone import GPTBackbone
    from zoo.training.gpt import compile_gpt

    keras.config.set_dtype_policy(spec["precision"])
    distribution = zd.distribution_for(GPTCausalLM, spec["layout"], spec["mesh"], config=spec["model"])
    with distribution.scope():
        keras.utils.set_random_seed(0)
        model = GPTCausalLM(backbone=GPTBackbone(**spec["model"]))
        compile_gpt(model, learning_rate=1e-4, total_steps=100, loss_chunk_size=spec.get("loss_chunk_size"))
    return distribution, model


def serve_steps(spec):
    import jax
    import numpy as np

    distribution, model = build(spec)
    batch, length = spec["batch"], spec["sequence_length"]
    vocabulary = spec["model"]["vocabulary_size"]

    def run_steps(steps):  # one fit epoch of `steps` steps; fit syncs its logs at the end
        tokens = np.random.default_rng(0).integers(0, vocabulary, (batch * steps, length), np.int32)  # (N B, T)
        with distribution.scope():
            model.fit(tokens, np.roll(tokens, -1, axis=1), batch_size=batch, epochs=1, shuffle=False, verbose=0)

    run_steps(1)  # compile and warm up
    parameters = sum(math.prod(v.shape) for v in model.trainable_variables)
    serve(run_steps, {"parameters": int(parameters), "jax": jax.__version__})


def main(argv):
    if len(argv) != 2 or argv[0] not in ("compile", "serve"):
        print("usage: python -m zoo.bench._peers_zoo compile|serve SPEC_JSON", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    (compile_only if argv[0] == "compile" else serve_steps)(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One process of the multi-host tests: ``python -m tests.distribution._multihost_worker``.

The launcher sets XLA_FLAGS (the simulated device count) before Python starts. The
worker joins the job (``zoo.distribution.multihost.initialize``), checks that the
processes agree, then trains a tiny causal LM for ``STEPS`` steps under each layout of
``LAYOUTS``, feeding only its own slice of every global batch. It prints one JSON line
per step (``{"layout", "step", "loss"}``); only process 0 writes ``--out``.

``train`` is also called in the pytest process (1 process x 8 devices) for the reference
numbers, with ``reference_data()``: the global batches a multi-process run assembles.
"""

import argparse
import json
import sys

import keras
import numpy as np

import zoo  # noqa: F401  (selects the JAX backend before keras is imported)

# The model: swap the builder and layout-map lines to test another causal LM.
MODEL = {
    "vocabulary_size": 32,
    "num_layers": 1,
    "num_query_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 4,
    "hidden_dim": 16,
    "intermediate_dim": 32,
    "max_sequence_length": 8,
}
SEQUENCE_LENGTH = 8  # T
GLOBAL_BATCH = 8  # B: one example per device under data=8
STEPS = 3
LEARNING_RATE = 0.5  # plain SGD: large enough that every step moves the loss visibly
SEED = 0
# layout name -> mesh spec (8 devices in all)
LAYOUTS = {"data": "data=8", "tp": "data=2,model=4"}


def build_model():
    from zoo.models.gpt import GPTBackbone, GPTCausalLM

    return GPTCausalLM(backbone=GPTBackbone(**MODEL))


def tensor_parallel_layout_map(mesh):
    from zoo.models.gpt import GPTCausalLM

    return GPTCausalLM.get_layout_map(mesh, "tp")


def make_distribution(layout):
    from zoo.distribution import CheckedModelParallel, make_mesh
    from zoo.distribution.multihost import feed_process_local_data

    mesh = make_mesh(LAYOUTS[layout])
    if layout == "data":
        distribution = keras.distribution.DataParallel(device_mesh=mesh)
    else:
        distribution = CheckedModelParallel(layout_map=tensor_parallel_layout_map(mesh), batch_dim_name="data")
    return feed_process_local_data(distribution)


def all_tokens():
    """(STEPS * GLOBAL_BATCH, T + 1) token ids: the whole dataset, the same in every process."""
    rng = np.random.default_rng(SEED)
    return rng.integers(0, MODEL["vocabulary_size"], size=(STEPS * GLOBAL_BATCH, SEQUENCE_LENGTH + 1), dtype="int32")


def local_data(process_index, process_count):
    """This process's inputs and labels: its contiguous 1/P of the dataset
    (``zoo.data.process_shard.process_rows``), read in batches of B / P."""
    from zoo.data.process_shard import process_rows

    tokens = all_tokens()[process_rows(STEPS * GLOBAL_BATCH, process_index, process_count)]
    return tokens[:, :-1], tokens[:, 1:]


def reference_data(process_count):
    """The inputs and labels one process must read, in batches of B, to see the global
    batches of a ``process_count``-process run: global batch k is local batch k of
    process 0, then of process 1, ... (``jax.make_array_from_process_local_data`` puts
    process p's rows on its own devices, which the mesh lists p-th)."""
    local = GLOBAL_BATCH // process_count
    parts = [local_data(p, process_count) for p in range(process_count)]
    batches = [(x[k * local : (k + 1) * local], y[k * local : (k + 1) * local]) for k in range(STEPS) for x, y in parts]
    xs, ys = zip(*batches)
    return np.concatenate(xs), np.concatenate(ys)


class _RunningLoss(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.means = []  # Keras' running mean of the loss after each step

    def on_train_batch_end(self, batch, logs=None):
        self.means.append(float(logs["loss"]))


def train(layout, x, y, batch_size):
    """Per-step losses of ``STEPS`` SGD steps of a fresh model under ``layout``."""
    from zoo.distribution import build_distributed

    keras.utils.set_random_seed(SEED)
    model = build_distributed(build_model, make_distribution(layout))
    try:
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        running = _RunningLoss()
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[running])
    finally:
        keras.distribution.set_distribution(None)
    return step_losses(running.means)


def step_losses(running_means):
    """Each step's own loss from Keras' running means (all batches the same size)."""
    return [
        (k + 1) * mean - k * previous for k, (mean, previous) in enumerate(zip(running_means, [0.0] + running_means))
    ]


def main(argv=None):
    args = _parse(argv)
    from zoo.distribution import multihost

    setup = multihost.initialize(
        args.coordinator, args.num_processes, args.process_id, timeout_s=args.timeout, bind_address=args.bind
    )
    facts = multihost.check_processes_agree(config=multihost.fingerprint({**MODEL, "tag": args.config_tag}))
    _emit({"event": "joined", "process": setup.process_id, "of": setup.num_processes, "facts": facts})
    if args.mode == "agree":
        return
    import jax

    x, y = local_data(jax.process_index(), jax.process_count())
    results = {}
    for layout in LAYOUTS:
        results[layout] = train(layout, x, y, GLOBAL_BATCH // jax.process_count())
        for step, loss in enumerate(results[layout]):
            _emit({"layout": layout, "step": step, "loss": loss, "process": setup.process_id})
    if multihost.is_primary():
        with open(args.out, "w") as handle:
            json.dump(results, handle)


def _emit(record):
    print(json.dumps(record), flush=True)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", help="host:port of process 0")
    parser.add_argument("--bind", help="where process 0's coordinator listens")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the coordinator")
    parser.add_argument("--mode", choices=("train", "agree"), default="train")
    parser.add_argument("--config-tag", default="", help="mixed into the config fingerprint")
    parser.add_argument("--out", help="results file (written by process 0 only)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())

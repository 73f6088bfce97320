"""MaxText's side of ``zoo bench peers``: run with the MaxText venv's python (never the zoo's).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        VENV/bin/python recipes/peers/maxtext_worker.py compile|serve SPEC_JSON

SPEC_JSON: ``{"overrides": ["key=value", ...], "hlo": PATH, "compiler_options": {...}}``;
the overrides go onto MaxText's own ``configs/base.yml`` (``zoo.bench.peers`` writes them:
sizes, layout, precision, remat, scan_layers, hardware=cpu, synthetic data).

- ``compile``: MaxText's ahead-of-time path (``train_compile.get_shaped_inputs`` and
  ``jit_and_compile``: abstract state and batch, never allocated) on this process' CPU
  devices; prints one ``PEERS {json}`` line: the exact parameter count (from the abstract
  params), ``memory_analysis()``, ``cost_analysis()`` FLOPs, the mesh (axis names, sizes,
  device ids) and the seconds it took; writes the optimised HLO text to ``hlo``. The zoo
  parses that HLO with its own parser, so both sides' bytes are counted by one code.
- ``serve``: MaxText's own training setup (``train_utils.setup_train_loop``: real state,
  the jitted ``train.train_step``) on a synthetic batch (``train.make_synthetic_batch``),
  compiled and warmed up by one step; prints ``PEERS {"ready": ...}``, then for every
  ``run N`` line on stdin runs N steps, blocks on the result and prints
  ``PEERS {"wall": s, "cpu": s}`` (process CPU time), and every ``profile DIR`` line with
  one step under the JAX profiler (its perfetto trace under DIR) and ``PEERS {"profile":
  DIR}``; ``quit`` or end of input stops it.

Everything else MaxText prints goes to stdout / stderr unprefixed; the driver reads only
``PEERS `` lines.
"""

import json
import math
import os
import sys
import time

PREFIX = "PEERS "


def reply(values):
    print(PREFIX + json.dumps(values), flush=True)


def make_config(overrides):
    """``(config, goodput recorder)`` as ``train.initialize`` makes them: ``base.yml`` + ``overrides``."""
    from maxtext.trainers.pre_train import train

    base = os.path.join(os.path.dirname(__import__("maxtext").__file__), "configs", "base.yml")
    return train.initialize(["maxtext_worker", base, *overrides])


def count_parameters(train_state):
    """Exact parameter count: every ``nnx.Param`` of the train state's model (an abstract
    ``nnx.State`` of ShapeDtypeStructs or a materialised ``TrainStateNNX``)."""
    import jax
    from flax import nnx

    state = nnx.state(train_state) if isinstance(train_state, nnx.Module) else train_state
    leaves = jax.tree_util.tree_leaves(state["model"], is_leaf=lambda x: isinstance(x, nnx.Variable))
    return int(sum(math.prod(leaf.get_value().shape) for leaf in leaves if isinstance(leaf, nnx.Param)))


def mesh_info(mesh):
    return {
        "axis_names": list(mesh.axis_names),
        "axis_sizes": [int(s) for s in mesh.devices.shape],
        "device_ids": [int(d.id) for d in mesh.devices.flat],
    }


def compile_only(spec):
    """train_compile.main's path (no DiLoCo) on this process' devices, compile-only."""
    import jax
    from flax.core.spmd import logical_axis_rules as axis_rules
    from maxtext.trainers.pre_train import train, train_compile
    from maxtext.utils import maxtext_utils, sharding

    start = time.perf_counter()
    config, _ = make_config(spec["overrides"])
    mesh = maxtext_utils.get_mesh_from_config(config)
    args, kwargs, state_shardings, _, model = train_compile.get_shaped_inputs(mesh, config)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
    input_shardings = sharding.build_zero1_input_state_mesh_shardings(config, state_shardings, params_shardings)
    data_sharding = sharding.get_input_data_sharding(config, mesh)
    func, in_shard, out_shard, static, donate = maxtext_utils.get_functional_train_with_signature(
        train.train_step, data_sharding, input_shardings, model, config, params_shardings
    )
    with jax.set_mesh(mesh), axis_rules(config.logical_axis_rules):
        jitted = jax.jit(
            func, in_shardings=in_shard, out_shardings=out_shard, static_argnums=static, donate_argnums=donate
        )
        lowered = jitted.lower(*args, **kwargs)
    compiled = lowered.compile(compiler_options=spec.get("compiler_options") or None)
    with open(spec["hlo"], "w") as handle:
        handle.write(compiled.as_text())
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    reply(
        {
            "parameters": count_parameters(args[0]),  # the abstract train state
            "memory": {
                part: int(getattr(memory, f"{part}_size_in_bytes", 0) or 0)
                for part in ("argument", "output", "temp", "alias")
            },
            "flops": float(cost.get("flops", 0.0)),
            "mesh": mesh_info(mesh),
            "compile_s": time.perf_counter() - start,
            "jax": jax.__version__,
        }
    )


def serve(spec):
    """MaxText's real train step on a synthetic batch; times ``run N`` commands from stdin."""
    import jax
    from flax import nnx
    from flax.linen import partitioning
    from maxtext.trainers.pre_train import train
    from maxtext.utils import maxtext_utils, sharding, train_utils

    config, recorder = make_config(spec["overrides"])
    (_, _, state_shardings, _, mesh, _, _, _, _, _, state) = train_utils.setup_train_loop(config, recorder)
    parameters = count_parameters(state)
    graphdef, state = nnx.split(state)
    params_shardings, state_shardings = sharding.maybe_update_params_sharding_with_opt(config, state_shardings)
    step, _ = train_utils.jit_train_and_eval_step(
        config, graphdef, mesh, state, state_shardings, train.train_step, train.eval_step, None, params_shardings
    )
    with jax.set_mesh(mesh), partitioning.axis_rules(config.logical_axis_rules):
        shaped = maxtext_utils.get_shaped_batch(config, batch_sharding=sharding.get_input_data_sharding(config, mesh))
        batch = train.make_synthetic_batch(config, shaped)
    state = _run(step, state, batch, mesh, config, 1)[0]  # compile and warm up
    reply({"ready": {"parameters": parameters, "mesh": mesh_info(mesh), "jax": jax.__version__}})
    for line in sys.stdin:
        command = line.split(maxsplit=1)
        if not command or command[0] == "quit":
            break
        if command[0] == "profile":
            trace_dir = command[1].strip()
            with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
                state = _run(step, state, batch, mesh, config, 1)[0]
            reply({"profile": trace_dir})
            continue
        cpu, wall = time.process_time(), time.perf_counter()
        state = _run(step, state, batch, mesh, config, int(command[1]))[0]
        reply({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu})


def _run(step, state, batch, mesh, config, steps):
    """``steps`` train steps, blocked on; ``(state, metrics)``."""
    import jax
    from flax.linen import partitioning

    metrics = None
    with jax.set_mesh(mesh), partitioning.axis_rules(config.logical_axis_rules):
        for _ in range(steps):
            state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    return state, metrics


def main(argv):
    if len(argv) != 2 or argv[0] not in ("compile", "serve"):
        print("usage: maxtext_worker.py compile|serve SPEC_JSON", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    (compile_only if argv[0] == "compile" else serve)(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

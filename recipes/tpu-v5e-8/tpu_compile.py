"""A recipe's fit step compiled by the TPU's own compiler for a TPU slice, with no TPU here.

    pip install "jax[tpu]==$(python -c 'import jax; print(jax.__version__)')"   # libtpu: the compiler
    python recipes/tpu-v5e-8/tpu_compile.py v5e:2x4 RECIPE [SECTION.KEY=VALUE ...]

JAX describes a TPU slice by its topology name (``jax.experimental.topologies``, e.g.
``v5e:2x4``: a v5e-8) and compiles for it ahead of time: the devices can compile, not run.
The step is the one ``zoo recipe check`` compiles (``compile_recipe_step``: the model built
abstractly, the exact ``fit`` step lowered), on a mesh of the topology's devices, so its
memory is what the TPU compiler lays out, temporaries included, where ``zoo plan`` on
simulated CPU devices gives XLA:CPU's upper bound. A step that does not fit stops with the
compiler's own ``RESOURCE_EXHAUSTED`` line, printed here. Overrides are as ``--set`` takes
them (``parallel.layout=tp+sp``, ``train.batch_size=2``).
"""

import ast
import sys
import time

GIB = 2**30


def _value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(topology_name, recipe_path, overrides):
    from jax.experimental import topologies

    from zoo.training.recipes import load_recipe
    from zoo.training.recipes._compile import compile_recipe_step

    topology = topologies.get_topology_desc(platform="tpu", topology_name=topology_name)
    recipe = load_recipe(recipe_path, {key: _value(value) for key, value in overrides.items()})
    start = time.perf_counter()
    try:
        step = compile_recipe_step(recipe, devices=list(topology.devices))
    except Exception as error:  # the TPU compiler's verdict on a step that does not fit
        print(f"{recipe_path} on {topology_name}: {str(error).splitlines()[0]}")
        return 1
    memory = step.compiled.memory_analysis()
    kind = topology.devices[0].device_kind
    print(
        f"{recipe_path} on {topology_name} ({len(topology.devices)} x {kind}), mesh {step.mesh}, global batch "
        f"{step.batch_size}: compiled by the TPU compiler in {time.perf_counter() - start:.1f} s"
    )
    print(
        f"per device: arguments {memory.argument_size_in_bytes / GIB:.2f} GiB (aliased to the outputs "
        f"{memory.alias_size_in_bytes / GIB:.2f}), temporaries {memory.temp_size_in_bytes / GIB:.2f} GiB, "
        f"peak {step.memory.peak / GIB:.2f} GiB"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], dict(arg.split("=", 1) for arg in sys.argv[3:])))

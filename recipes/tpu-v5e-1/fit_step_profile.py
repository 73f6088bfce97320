"""One GPT training step on one TPU chip, as a new user runs it: ``model.fit`` of the job's
model (layout single, mixed_bfloat16, zoo train gpt's AdamW), random tokens, the median of
3 fits of 10 steps, then optionally a profiler trace of 3 steps read per HLO op.

    source .device/tpu-env.sh && OUT=/tmp/out python3 recipes/tpu-v5e-1/fit_step_profile.py \\
        '{"tag": "b4", "config": "gpt_1b", "layers": 8, "T": 2048, "B": 4, "profile": 1}'

Keys: tag (names the output), config (a GPT_CONFIGS name), layers (depth override), T, B,
remat (none | full | dots_saveable), chunk (--loss-chunk-size), profile (1: trace). Writes
one JSON line to $OUT/results.jsonl: step times, MFU (zoo.measure.mfu against 197
TFLOP/s), the device's memory counters, and with a profile the 150 slowest device ops
(name, opcode, result type, JAX op path; from the trace and the optimised HLO XLA dumps).
This is the script that measured the "before" rows of docs/performance.md's TPU v5e
section (zoo bench step is the command that measures the step now).
"""

import collections
import glob
import gzip
import json
import os
import shutil
import statistics
import sys
import time
import traceback


def main(cfg):
    out = os.environ["OUT"]
    dump = f"/tmp/hlo_{cfg['tag']}"
    if cfg.get("profile"):
        flags = f" --xla_dump_to={dump} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train.*"
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + flags
    os.environ["KERAS_BACKEND"] = "jax"
    result = dict(cfg)
    try:
        result.update(measure(cfg, out, dump))
    except Exception:
        result["error"] = traceback.format_exc()[-3000:]
    with open(f"{out}/results.jsonl", "a") as handle:
        handle.write(json.dumps(result) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("top_events", "ops", "threads")}))


def measure(cfg, out, dump):
    import jax
    import keras
    import numpy as np

    from zoo.config.settings import GPTTrainSettings
    from zoo.measure import mfu
    from zoo.training.gpt import build_for_training, compile_gpt

    settings = GPTTrainSettings(
        config_name=cfg["config"],
        num_layers=cfg.get("layers"),
        layout="single",
        precision="mixed_bfloat16",
        remat=cfg.get("remat", "none"),
        sequence_length=cfg["T"],
        batch_size=cfg["B"],
        loss_chunk_size=cfg.get("chunk"),
    )
    keras.utils.set_random_seed(0)
    model = build_for_training(settings)
    compile_gpt(model, 1e-4, 1000, loss_chunk_size=cfg.get("chunk"))
    b, t, steps = cfg["B"], cfg["T"], 10
    x = np.random.default_rng(0).integers(0, model.backbone.vocabulary_size, (b * steps, t), np.int32)
    y = np.roll(x, -1, 1)
    result = {"params": model.count_params()}
    fit = lambda rows: model.fit(x[:rows], y[:rows], batch_size=b, epochs=1, verbose=0, shuffle=False)  # noqa: E731
    start = time.perf_counter()
    fit(b)
    result["first_fit_s"] = time.perf_counter() - start
    fit(b * steps)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fit(b * steps)
        times.append((time.perf_counter() - start) / steps)
    result["step_s"], result["steps"] = statistics.median(times), times
    result["mfu"] = mfu.gpt_flops_per_token(model.get_config(), t) * b * t / result["step_s"] / 197e12
    result["tok_s"] = b * t / result["step_s"]
    stats = jax.devices()[0].memory_stats() or {}
    result["peak_gib"] = stats.get("peak_bytes_in_use", 0) / 2**30
    result["limit_gib"] = stats.get("bytes_limit", 0) / 2**30
    if cfg.get("profile"):
        result.update(profile(cfg, out, dump, lambda: fit(3 * b)))
    return result


def profile(cfg, out, dump, fit):
    import jax

    from zoo.bench._step_profile import read_hlo

    folder = f"/tmp/prof_{cfg['tag']}"
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        fit()
    path = glob.glob(f"{folder}/**/perfetto_trace.json.gz", recursive=True)[0]
    trace = json.load(gzip.open(path, "rt"))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    procs = {e["pid"]: e["args"].get("name") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"].get("name")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    totals = collections.defaultdict(lambda: [0.0, 0, None])
    for event in events:
        if event.get("ph") != "X":
            continue
        total = totals[(procs.get(event["pid"]), threads.get((event["pid"], event["tid"])), event["name"])]
        total[0] += event.get("dur", 0)
        total[1] += 1
        if total[2] is None:
            total[2] = event.get("args")
    rows = sorted(((v[0], v[1], k, v[2]) for k, v in totals.items()), key=lambda r: -r[0])
    result = {"procs": procs, "threads": {f"{k[0]}/{k[1]}": v for k, v in threads.items()}}
    result["top_events"] = [
        (us, n, list(key), {a: str(b)[:300] for a, b in (args or {}).items()}) for us, n, key, args in rows[:120]
    ]
    hlos = sorted(glob.glob(f"{dump}/*after_optimizations.txt"), key=os.path.getsize)
    result["hlo_files"] = [os.path.basename(h) for h in hlos]
    if hlos:
        instructions, _ = read_hlo(open(hlos[-1]).read())
        named = []
        for us, n, key, _ in rows:
            inst = instructions.get(key[2])
            if inst is not None:
                named.append((us, n, inst.name, inst.opcode, inst.type[:60], inst.op_name[-160:]))
        result["ops"] = named[:150]
        shutil.copy(hlos[-1], f"{out}/{cfg['tag']}_hlo.txt")
    return result


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

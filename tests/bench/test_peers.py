"""``zoo bench peers``'s own parts, without MaxText and without compiling a model: the
parameter check, the medians and ratios, a peer's HLO read by the zoo's parser and named in
the zoo's words, the worker protocol (two fake workers as real subprocesses, no JAX), a
missing venv, the flags, a profiled step read into categories (a written trace, and a real
JAX profiler trace of one small matmul). The benchmark itself runs MaxText in its own venv: never here."""

import gzip
import json
import sys
import textwrap

import pytest

from tests.bench._cli import parse_bench_args
from zoo.bench import _peer_workers as workers
from zoo.bench import _step_profile as step_profile
from zoo.bench import peers


def test_a_parameter_mismatch_is_an_error_naming_both_counts():
    peers.check_parameters(1_235_814_400, 1_235_814_400, "llama_3_2_1b under fsdp")
    with pytest.raises(peers.ParameterMismatch, match=r"fsdp: .*1,235,814,400.*1,235,816,448.*-2,048"):
        peers.check_parameters(1_235_814_400, 1_235_816_448, "llama_3_2_1b under fsdp")


def test_medians_per_step_and_ratios():
    times = {"zoo": [(9.0, 20.0), (6.0, 12.0), (7.5, 15.0)], "MaxText": [(5.0, 10.0), (3.0, 6.0), (4.0, 9.0)]}
    medians = peers.step_medians(times, steps=3)
    assert medians == pytest.approx(
        {
            "zoo_wall": 2.5,
            "maxtext_wall": 4.0 / 3,
            "zoo_cpu": 5.0,
            "maxtext_cpu": 3.0,
            "wall_ratio": 1.875,
            "cpu_ratio": 5 / 3,
        }
    )
    row = peers.format_time_row({"layout": "tp", "parameters": 32_117_248, **medians})
    assert row == "| tp | 32,117,248 | 2.50 | 1.33 | **1.88** | 5.00 | 3.00 | **1.67** |"


# One all-reduce inside a while loop of 3 trips over {0..3},{4..7} and one all-gather over
# {0,4},{1,5},...: on MaxText's axes (data, fsdp, tensor) the first spans tensor (the zoo's
# model); the second data, or fsdp (also the zoo's data) when fsdp holds the 2.
HLO = textwrap.dedent(
    """\
    HloModule peers_test, num_partitions=8

    %add (a: f32[], b: f32[]) -> f32[] {
      %a = f32[] parameter(0)
      %b = f32[] parameter(1)
      ROOT %s = f32[] add(%a, %b)
    }

    %body (p: (s32[], f32[1024])) -> (s32[], f32[1024]) {
      %p = (s32[], f32[1024]) parameter(0)
      %i = s32[] get-tuple-element(%p), index=0
      %x = f32[1024]{0} get-tuple-element(%p), index=1
      %ar = f32[1024]{0} all-reduce(%x), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
      ROOT %t = (s32[], f32[1024]) tuple(%i, %ar)
    }

    %cond (q: (s32[], f32[1024])) -> pred[] {
      %q = (s32[], f32[1024]) parameter(0)
      ROOT %c = pred[] constant(true)
    }

    ENTRY %main (x: f32[1024]) -> f32[2048] {
      %x = f32[1024]{0} parameter(0)
      %zero = s32[] constant(0)
      %init = (s32[], f32[1024]) tuple(%zero, %x)
      %w = (s32[], f32[1024]) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
      %y = f32[1024]{0} get-tuple-element(%w), index=1
      ROOT %ag = f32[2048]{0} all-gather(%y), replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0}
    }
    """
)


@pytest.mark.parametrize("sizes", [[2, 1, 4], [1, 2, 4]], ids=["data=2,tensor=4", "fsdp=2,tensor=4"])
def test_a_peers_hlo_is_counted_per_axis_in_the_zoos_words(sizes):
    mesh = {"axis_names": ["data", "fsdp", "tensor"], "axis_sizes": sizes}
    sent = peers.sent_per_zoo_axis(HLO, mesh)
    # all-reduce: 2 (n-1)/n x 4 KiB, 3 trips; all-gather: (n-1)/n x 8 KiB
    assert sent == {"model": 3 * 2 * 3 / 4 * 4096, "data": 1 / 2 * 8192}
    assert peers.maxtext_mesh_text(mesh) == ("data=2,tensor=4" if sizes[0] == 2 else "fsdp=2,tensor=4")


FAKE_WORKER = textwrap.dedent(
    """\
    import json, sys
    name, log = sys.argv[1], sys.argv[2]
    print("noise a real peer prints", flush=True)
    if name == "broken":
        print("Traceback: the model did not build", file=sys.stderr)
        sys.exit(3)
    print("PEERS " + json.dumps({"ready": {"parameters": 100}}), flush=True)
    for line in sys.stdin:
        if line.split()[0] == "quit":
            break
        if line.split()[0] == "profile":
            print("PEERS " + json.dumps({"profile": line.split(maxsplit=1)[1].strip()}), flush=True)
            continue
        steps = int(line.split()[1])
        with open(log, "a") as handle:
            handle.write(name + "\\n")
        print("PEERS " + json.dumps({"wall": steps * (2.0 if name == "zoo" else 1.0), "cpu": steps * 3.0}), flush=True)
    """
)


def _fake(tmp_path, name):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    return [sys.executable, str(script), name, str(tmp_path / "order.txt")]


def test_the_driver_alternates_the_workers_and_reads_their_results(tmp_path):
    pair = [workers.Worker("zoo", _fake(tmp_path, "zoo")), workers.Worker("MaxText", _fake(tmp_path, "MaxText"))]
    try:
        assert [w.wait_ready() for w in pair] == [{"parameters": 100}] * 2
        times = workers.interleave(pair, steps=2, repeats=3)
        assert pair[1].profile(str(tmp_path / "a folder")) == str(tmp_path / "a folder")
    finally:
        for worker in pair:
            worker.close()
    assert (tmp_path / "order.txt").read_text().split() == ["zoo", "MaxText"] * 3
    assert times == {"zoo": [(4.0, 6.0)] * 3, "MaxText": [(2.0, 6.0)] * 3}
    assert all(w.process.returncode == 0 for w in pair)


def test_a_failed_worker_is_named_with_its_stderr(tmp_path):
    broken = workers.Worker("MaxText", _fake(tmp_path, "broken"))
    with pytest.raises(workers.WorkerError, match=r"(?s)MaxText worker failed \(exit status 3\).*did not build"):
        broken.wait_ready()
    broken.close()
    with pytest.raises(workers.WorkerError, match="zoo worker failed"):
        workers.run_worker("zoo", _fake(tmp_path, "broken"))
    assert workers.run_worker("zoo", [sys.executable, "-c", "print('PEERS {\"flops\": 2.0}')"]) == {"flops": 2.0}


def test_a_missing_venv_that_cannot_be_created_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHON312", raising=False)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.setattr(peers.shutil, "which", lambda name: None)
    with pytest.raises(peers.PeerSetupError, match=r"no MaxText virtual environment at '.*nowhere'.*no Python 3\.12"):
        peers.maxtext_python(str(tmp_path / "nowhere"))
    monkeypatch.setenv("PYTHON312", sys.executable)  # a Python that runs but is not 3.12 is passed over
    assert peers.find_python312() is None or sys.version_info[:2] == (3, 12)


def test_flags_and_the_overrides_both_sides_get():
    args = parse_bench_args("peers", ["--layouts", "tp", "--per-device-batches", "4", "--loss-chunk-size", "256"])
    settings = peers.PeersBenchSettings(layouts=args.layouts, loss_chunk_size=args.loss_chunk_size)
    assert (args.layouts, args.per_device_batches, args.scan_layers) == (("tp",), (4,), False)
    assert peers.zoo_options(settings) == {"loss_chunk_size": 256}
    assert "zoo options: loss_chunk_size=256" in peers.header(settings)
    overrides = peers.maxtext_overrides(peers.TIMING_MODEL, "tp", 1, 512, "/tmp/x", scan_layers=False)
    for expected in ("base_emb_dim=512", "logits_via_embedding=true", "scan_layers=false", "ici_tensor_parallelism=4"):
        assert expected in overrides


def test_the_memory_table_compares_peaks_and_carries_the_zoos_notes():
    common = dict(layout="fsdp", per_device_batch=1, mesh="data=8", parameters=8, argument=2**30, temp=2**30)
    common.update(sent={"data": 2**30}, flops=1e12, compile_s=1.0)
    note = "this XLA's CPU memory analysis does not show remat='full' (JAX 0.10)"
    rows = [
        dict(common, side="zoo", peak=3 * 2**29, jax="0.10.2", notes=(note,)),
        dict(common, side="MaxText", peak=2**31, jax="0.12.0.1"),
    ]
    rows.append(dict(common, side="keras-hub (no remat)", peak=2**32, jax="0.12.0.1"))
    table = peers.format_memory_table(rows)
    assert "JAX: zoo 0.10.2, MaxText 0.12.0.1, keras-hub 0.12.0.1." in table
    assert "Peak zoo / MaxText: fsdp b=1 0.75; fsdp b=1 0.38 (vs keras-hub (no remat))" in table
    assert table.count(f"zoo note: {note}") == 1
    args = parse_bench_args("peers", ["--keras-hub-venv", "/tmp/kh", "--layouts", "fsdp+tp"])
    assert args.keras_hub_venv == "/tmp/kh" and peers.KERAS_HUB_LAYOUTS == ("fsdp+tp",)


# One program as XLA:CPU writes it: a YNNPACK fusion holding a bf16 dot, a dot on the
# generic emitter, an all-reduce, a loop (its body's thunks carry its time) and an
# elementwise fusion.
PROFILED_HLO = textwrap.dedent(
    """\
    HloModule jit_train_step, num_partitions=2

    %fused_dot (p0: bf16[4,8], p1: bf16[8,4]) -> bf16[4,4] {
      %p0 = bf16[4,8]{1,0} parameter(0)
      %p1 = bf16[8,4]{1,0} parameter(1)
      ROOT %dot.1 = bf16[4,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    }

    %fused_exp (q0: f32[4,4]) -> f32[4,4] {
      %q0 = f32[4,4]{1,0} parameter(0)
      ROOT %e = f32[4,4]{1,0} exponential(%q0)
    }

    ENTRY %main (a: bf16[4,8], b: bf16[8,4], c: f32[4,8], d: f32[8,4]) -> f32[4,4] {
      %a = bf16[4,8]{1,0} parameter(0)
      %b = bf16[8,4]{1,0} parameter(1)
      %c = f32[4,8]{1,0} parameter(2)
      %d = f32[8,4]{1,0} parameter(3)
      %ynn_fusion.3 = bf16[4,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(train_step)/mlp/dot_general"}, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}
      %dot.7 = f32[4,4]{1,0} dot(%c, %d), lhs_contracting_dims={1}, rhs_contracting_dims={0}
      %all-reduce.2 = f32[4,4]{1,0} all-reduce(%dot.7), replica_groups={{0,1}}, to_apply=%fused_exp
      %while.1 = f32[4,4]{1,0} while(%all-reduce.2), condition=%fused_exp, body=%fused_exp
      ROOT %exp_fusion = f32[4,4]{1,0} fusion(%while.1), kind=kLoop, calls=%fused_exp
    }
    """
)


def _trace(folder, events):
    """A perfetto trace as the JAX profiler writes it: complete events (ph X), microseconds."""
    (folder / "plugins").mkdir(parents=True)
    with gzip.open(folder / "plugins" / step_profile.TRACE_FILE, "wt") as handle:
        json.dump({"traceEvents": [{"ph": "M", "name": "process_name"}, *events]}, handle)


def test_a_profiled_step_is_read_into_categories_per_device(tmp_path):
    durations = {"ynn_fusion.3": 6000, "dot.7": 2000, "all-reduce.2": 1000, "while.1": 9999, "exp_fusion": 500}
    events = [{"ph": "X", "name": name, "dur": micros} for name, micros in durations.items() for _device in range(2)]
    events.append({"ph": "X", "name": "$python frame", "dur": 1e6})  # not an instruction: left out
    _trace(tmp_path / "trace", events)
    profile = step_profile.step_profile(step_profile.thunk_times(tmp_path / "trace"), PROFILED_HLO, devices=2)
    assert profile.categories == pytest.approx(
        {"matmul bf16 (YNNPACK)": 6.0, "matmul f32 (generic)": 2.0, "collectives": 1.0, "elementwise and other": 0.5}
    )
    assert [(op[2].name, op[1]) for op in profile.ops] == [
        ("ynn_fusion.3", 1), ("dot.7", 1), ("all-reduce.2", 1), ("exp_fusion", 1)
    ]  # fmt: skip
    table = step_profile.format_profiles("tp", {"zoo": profile, "MaxText": profile}, top=1)
    assert "| matmul bf16 (YNNPACK) | 6 | 63.2% | 6 | 63.2% |" in table
    assert (
        "| 6.0 | 1 | ynn_fusion.3 | bf16[4,4]{1,0} | matmul bf16 (YNNPACK) | jit(train_step)/mlp/dot_general |" in table
    )


def test_the_jax_profiler_trace_names_the_thunks_of_the_hlo(tmp_path):
    """A real trace (``_peer_workers.profile_steps``, as the workers write it) of a jitted
    matmul: its events carry the compiled program's instruction names."""
    import jax
    import jax.numpy as jnp

    matmul = jax.jit(lambda x: x @ x)
    x = jnp.ones((32, 32), jnp.float32)
    matmul(x).block_until_ready()
    workers.profile_steps(lambda steps: matmul(x).block_until_ready(), str(tmp_path / "trace"))
    hlo = matmul.lower(x).compile().as_text()
    profile = step_profile.step_profile(step_profile.thunk_times(tmp_path / "trace"), hlo, devices=1)
    assert [kind for kind in profile.categories if kind.startswith("matmul f32")], (profile.categories, hlo)

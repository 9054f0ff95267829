"""``ipl-jax plan``: the HLO FLOP counter on known answers, the published architectures' sizes, a tiny job planned
on fake CPU devices (sharded arguments and FLOPs per device ~1/N of one device's), the plan lowering the very
program training runs, and one-line errors."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from support.commands import run_ok

from ipl_jax.cli import plan as plan_cli
from ipl_jax.configs.loader import load_settings
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.params import count_params, param_shapes
from ipl_jax.model.sharding import make_mesh
from ipl_jax.planning import programs as plan_lib
from ipl_jax.planning import shapes as plan_shapes
from ipl_jax.planning.hlo_cost import hlo_flops, widened_bytes
from ipl_jax.preference import tdpo

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--config", "synthetic:quick", "--config.ipl.batch_size=4", "--config.sampler.batch_size=4"]


def _scan_matmuls(w, x):
    def body(h, wi):
        return jnp.tanh(h @ wi), None

    return jax.lax.scan(body, x, w)[0].sum()


def test_hlo_flops_counts_every_trip_of_a_loop():
    w = jax.ShapeDtypeStruct((8, 32, 32), jnp.float32)  # 8 layers of [32, 32] weights
    x = jax.ShapeDtypeStruct((16, 32), jnp.float32)
    forward = 8 * 2 * 16 * 32 * 32
    fwd = jax.jit(_scan_matmuls).lower(w, x).compile()
    assert hlo_flops(fwd.as_text()).flops == forward
    grad = jax.jit(jax.grad(_scan_matmuls)).lower(w, x).compile()
    cost = hlo_flops(grad.as_text())
    assert cost.flops == 3 * forward  # forward + the two backward matmuls per layer
    assert cost.unknown_loops == 0
    xla = grad.cost_analysis()
    xla = xla[0] if isinstance(xla, (list, tuple)) else xla
    assert xla["flops"] < forward  # why the counter exists: XLA counts the loop body once


def test_hlo_flops_takes_the_costlier_branch_and_counts_unknown_loops_once():
    def f(pred, a, b):
        y = jax.lax.cond(pred, lambda: a @ b, lambda: a)  # [8, 8] @ [8, 8]: 1024 FLOPs, or none

        def cond(c):
            return jnp.sum(c[1]) < 1e9

        def body(c):
            return c[0] + 1, c[1] @ b

        return jax.lax.while_loop(cond, body, (0, y))[1]

    args = (
        jax.ShapeDtypeStruct((), jnp.bool_),
        jax.ShapeDtypeStruct((8, 8), jnp.float32),
        jax.ShapeDtypeStruct((8, 8), jnp.float32),
    )
    cost = hlo_flops(jax.jit(f).lower(*args).compile().as_text())
    assert cost.flops == 2 * 2 * 8 * 8 * 8
    assert cost.unknown_loops == 1


_TPU_STYLE_HLO = """HloModule m

%cond (c: (s32[], f32[8,8])) -> pred[] {
  %c = (s32[], f32[8,8]{1,0}) parameter(0)
  %n = s32[] constant(5)
  %i = s32[] get-tuple-element(%c), index=0
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (b: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %b = (s32[], f32[8,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %x = f32[8,8]{1,0:T(8,128)} get-tuple-element(%b), index=1
  %y = f32[8,8]{1,0:T(8,128)} convolution(%x, %x), dim_labels=bf_io->bf
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[8,8]{1,0}) tuple(%j, %y)
}

ENTRY %main (a: f32[4,8]) -> f32[8,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %g = f32[8,8]{1,0} dot(%a, %a), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %z = s32[] constant(0)
  %t = (s32[], f32[8,8]{1,0}) tuple(%z, %g)
  %w = (s32[], f32[8,8]{1,0}) while(%t), condition=%cond, body=%body
  ROOT %r = f32[8,8]{1,0} get-tuple-element(%w), index=1
}
"""


def test_hlo_flops_reads_a_loop_bound_from_its_condition():
    # TPU programs carry no known_trip_count: the bound of `counter < 5` is the trip count; matmuls appear as
    # convolutions (bf_io->bf contracts the lhs feature dimension)
    cost = hlo_flops(_TPU_STYLE_HLO)
    assert cost.flops == 2 * 8 * 8 * 4 + 5 * 2 * 8 * 8 * 8
    assert cost.unknown_loops == 0


_TPU_BATCHED_MATMUL_HLO = """HloModule m

ENTRY %main (a: f32[128,4,16], b: f32[128,4,16]) -> f32[4,128,128] {
  %a = f32[128,4,16]{2,1,0} parameter(0)
  %b = f32[128,4,16]{2,1,0} parameter(1)
  ROOT %c = f32[4,128,128]{2,1,0} convolution(%a, %b), window={size=4 stride=3 lhs_dilate=4}, dim_labels=b0f_o0i->0bf
}
"""


def test_hlo_flops_counts_only_real_taps_of_a_tpu_batched_matmul():
    # XLA on TPU writes a batched matmul (4 batches of [128, 16] x [16, 128]) as a convolution whose batch axis is a
    # window of 4 taps over an lhs dilated by 4 with stride 3: each output sees one real element, three holes
    assert hlo_flops(_TPU_BATCHED_MATMUL_HLO).flops == 2 * 4 * 128 * 128 * 16
    padded = _TPU_BATCHED_MATMUL_HLO.replace("window={size=4 stride=3 lhs_dilate=4}", "window={size=3 pad=1_1}")
    # a plain 3-tap convolution padded by one each side: 4 outputs x 3 taps minus the 2 taps on padding
    assert hlo_flops(padded).flops == 2 * 128 * 128 * 16 * (4 * 3 - 2)


_WIDENING_HLO = """HloModule m

%wrapped_convert_computation (p: bf16[4,8]) -> f32[4,8] {
  %p = bf16[4,8]{1,0} parameter(0)
  ROOT %c = f32[4,8]{1,0} convert(%p)
}

%fused_scale (q: bf16[4,8]) -> f32[4,8] {
  %q = bf16[4,8]{1,0} parameter(0)
  %c2 = f32[4,8]{1,0} convert(%q)
  ROOT %m = f32[4,8]{1,0} multiply(%c2, %c2)
}

ENTRY %main (a: bf16[4,8], b: bf16[2,3]) -> f32[4,8] {
  %a = bf16[4,8]{1,0} parameter(0)
  %b = bf16[2,3]{1,0} parameter(1)
  %w = f32[4,8]{1,0} fusion(%a), kind=kLoop, calls=%wrapped_convert_computation
  %s = f32[4,8]{1,0} fusion(%a), kind=kLoop, calls=%fused_scale
  %cb = f32[6]{0} convert(%b)
  %cb2 = f32[2,3]{1,0} convert(%b)
  ROOT %r = f32[4,8]{1,0} add(%w, %s)
}
"""


def test_widened_bytes_counts_whole_argument_copies_to_f32():
    # the convert-only fusion of the bf16 argument a (4 x 8 f32) and the plain convert of b (2 x 3 f32); not the
    # fusion that also computes, nor a convert to another shape, nor the converts inside fusions
    assert widened_bytes(_WIDENING_HLO) == 4 * (4 * 8 + 2 * 3)
    # on the CPU backend a bf16 scan of matmuls widens its [4, 64, 64] weights once, outside the loop; in f32 none
    w, x = jax.ShapeDtypeStruct((4, 64, 64), jnp.bfloat16), jax.ShapeDtypeStruct((8, 64), jnp.bfloat16)
    bf16 = widened_bytes(jax.jit(_scan_matmuls).lower(w, x).compile().as_text())
    if jax.default_backend() == "cpu":
        assert 4 * 4 * 64 * 64 <= bf16 <= 4 * (4 * 64 * 64 + 2 * 8 * 64)
    w, x = (jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in (w, x))
    assert widened_bytes(jax.jit(_scan_matmuls).lower(w, x).compile().as_text()) == 0


def test_plan_table_judges_the_budget_with_and_without_the_cpu_f32_copies():
    def plan(name, temps, widened):
        return plan_lib.ProgramPlan(
            name, "", 30 * GB, 20 * GB, 20 * GB, temps * GB, 1e12, 1e12, 0, 1.0, {}, widened * GB
        )

    GB = plan_shapes.GB
    plans = [plan("sft", 10, 0), plan("decode", 55, 50), plan("tdpo", 55, 1)]  # totals 40, 85, 85 GB
    lines = plan_lib.format_table(plans, "header", budget_gb=80).splitlines()
    verdict = {line.split()[0]: line.split()[-1] for line in lines[2:5]}
    assert verdict == {"sft": "yes", "decode": "yes*", "tdpo": "NO"}
    assert lines[-1].endswith("decode 50.00 (total without: 35.00), tdpo 1.00 (total without: 84.00) GB")


def test_published_architectures_have_their_parameter_counts():
    counts = {
        name: count_params(param_shapes(Qwen2VLConfig.from_hf_dict(d))) for name, d in plan_shapes.ARCHITECTURES.items()
    }
    assert counts == {  # the Hub's model cards
        "qwen2-vl-2b": 2_208_985_600,
        "qwen2-vl-7b": 8_291_375_616,
        "qwen3-vl-2b": 2_127_532_032,
        "qwen3-vl-8b": 8_767_123_696,
        "qwen3-vl-30b-a3b": 31_070_754_032,  # the card's 31.07B (two decimals)
    }


_PLAN_SCRIPT = textwrap.dedent("""
    import json, sys
    from ipl_jax.cli import plan as cli
    status = cli.main(sys.argv[2:])
    assert status == 0, status
    import jax
    from ipl_jax.configs.loader import load_settings
    from ipl_jax.model.sharding import make_mesh
    from ipl_jax.planning import programs as P
    from ipl_jax.planning.shapes import model_config
    settings = load_settings("synthetic:quick", [a for a in sys.argv[2:] if a.startswith("--config.")])
    _, cfg = model_config(settings.model, "synthetic:quick")
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    job = settings.resolved(1)  # the settings the CLI planned with, on one device
    one = P.plan_job(job, cfg, mesh, P.PlanSettings.of(job.model, ("tdpo",)))[0]
    json.dump(one.as_dict(), open(sys.argv[1], "w"))
""")


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["synthetic", "synthetic:gpu"])
def test_plan_plans_the_fresh_model_the_job_builds(tmp_path, name):
    """The plan (no tokenizer) and the model stage (a tokenizer trained on the data) build a fresh model alike:
    the same sizes, so the same parameter count."""
    from ipl_jax.data.tiny_tokenizer import train_tokenizer, write_tokenizer
    from ipl_jax.pipeline.model_stage import tokenizer_corpus

    m = load_settings(name, []).model
    special_ids = write_tokenizer(train_tokenizer(tokenizer_corpus([]), m.text.vocab_size), tmp_path / "tok")
    job = m.fresh_config(special_ids)
    label, planned = plan_shapes.model_config(m, name)
    assert label == "config.model"
    assert count_params(param_shapes(planned)) == count_params(param_shapes(job))
    assert planned.vision == job.vision


def test_tiny_job_planned_on_four_fake_devices(tmp_path):
    out4, out1 = tmp_path / "plan4.json", tmp_path / "plan1.json"
    args = [
        *SMALL,
        "--devices",
        "4",
        "--mesh",
        "data=1,fsdp=4,tensor=1",
        "--programs",
        "tdpo,prefill,decode",
        "--json",
        str(out4),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    proc = run_ok(
        [sys.executable, "-c", _PLAN_SCRIPT, str(out1), *args],
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert "tdpo" in proc.stdout and "decode" in proc.stdout  # the table
    doc = json.loads(out4.read_text())
    assert doc["devices"] == 4 and doc["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    for name in ("tdpo", "prefill", "decode"):
        p = doc["programs"][name]
        for key in ("arguments", "outputs", "temporaries", "total", "flops"):
            assert p[key] > 0, (name, key, p)
        assert p["total"] == p["arguments"] + p["outputs"] + p["temporaries"] - p["aliased"]
    assert doc["programs"]["tdpo"]["aliased"] > 0  # the state is donated
    sharded, single = doc["programs"]["tdpo"], json.loads(out1.read_text())
    # fsdp shards every weight and Adam moment of this model 4 ways (all its widths divide by 4)
    for part in ("trainable", "optimizer"):
        assert sharded["inputs"][part] * 4 == pytest.approx(single["inputs"][part], rel=0.02), part
    assert 0.2 < sharded["arguments"] / single["arguments"] < 0.32
    assert 0.2 < sharded["flops"] / single["flops"] < 0.3  # each device runs a quarter of the rows
    # and holds a quarter of the activations (rows pinned per layer: not the whole batch with the MLP width split)
    for name in ("tdpo",):
        assert sharded["temporaries"] < 0.4 * single["temporaries"], (name, sharded, single)


def test_plan_lowers_the_tdpo_program_that_training_calls(monkeypatch):
    """The plan's T-DPO figures come from ``tdpo.tdpo_update``, the one jitted function ``train_round`` calls: a
    recorder in its place sees the plan lower it and training call it."""
    from support.small_models import tiny_cfg, tiny_params
    from support.tdpo_rounds import ROUND_TDPO, round_batches

    real, seen = tdpo.tdpo_update, []

    class Recorder:
        def __call__(self, *args):
            seen.append("call")
            return real(*args)

        def lower(self, *args):
            seen.append("lower")
            return real.lower(*args)

    monkeypatch.setattr(tdpo, "tdpo_update", Recorder())
    settings = load_settings("synthetic:quick", ["--config.model.text.num_hidden_layers=1"])
    _, cfg = plan_shapes.model_config(settings.model, "synthetic:quick")
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    options = plan_lib.PlanSettings(compute_dtype="float32", remat="none", programs=("tdpo",))
    (plan,) = plan_lib.plan_job(settings, cfg, mesh, options)
    assert seen == ["lower"] and plan.flops > 0 and plan.aliased > 0  # the state is donated, as in training
    small = tiny_cfg()
    config = tdpo.TDPOConfig(model=small, **ROUND_TDPO)
    state = tdpo.init_state(tiny_params(small, 0), config, jax.random.PRNGKey(0))
    _, _, batches = round_batches(small, seed=10)
    tdpo.train_round(state, tiny_params(small, 0), tdpo.RoundData(batches), jax.random.PRNGKey(1), config)
    assert seen == ["lower"] + ["call"] * len(batches)


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--devices", "4", "--mesh", "data=1,fsdp=2,tensor=1"],
            "mesh data=1,fsdp=2,tensor=1 needs 2 devices but there are 4 (valid: sizes whose product is 4",
        ),
        (
            ["--devices", "4", "--mesh", "data=1,fsdp=4,tensor=1", "--config.ipl.batch_size=6"],
            # the job's own check (Settings.check_machine), so the job's wording
            "config.ipl.batch_size=6: not divisible by the mesh's batch axes (data x fsdp = 4 on 4 devices)",
        ),
        (["--devices", "2", "--mesh", "fsdp=two"], "--mesh 'fsdp=two': expected AXIS=SIZE,... with axes data, fsdp"),
        (["--topology", "v9-8"], "--topology 'v9-8' is unknown (valid: v4-N, v5p-N"),
        (["--topology", "v5p-6"], "--topology 'v5p-6': no such slice (valid: v5p-8, v5p-16"),
        (
            ["--devices", "2", "--mesh", "data=2", "--dtype", "float8"],
            "--dtype float8: not available on cpu (valid: float32, bfloat16, float16)",
        ),
        (
            ["--topology", "v5e-16", "--dtype", "float16"],
            "--dtype float16: not available on tpu (valid: float32, bfloat16)",
        ),
        (["--devices", "2", "--mesh", "data=2", "--programs", "tdpo,train"], "--programs train: unknown (valid: sft"),
        (
            ["--devices", "2", "--mesh", "data=2", "--remat", "all"],
            "--remat all: unknown (valid: none, full, dots_saveable, dots_no_batch, offload)",
        ),
        (
            ["--devices", "2", "--mesh", "data=2", "--attention", "cudnn"],
            "--attention cudnn: not available on cpu (valid: auto, reference, xla)",
        ),
        (["--devices", "2", "--topology", "v5p-8"], "not allowed with argument"),
    ],
)
def test_bad_invocations_get_one_line_and_status_2(capsys, extra, message):
    status = plan_cli.main([*SMALL, *extra])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert len(err.splitlines()) == 1 and err.startswith("ipl-jax plan: ")
    assert message in err, err


def test_plan_and_job_resolve_the_same_settings_alike(tmp_path):
    """The plan's settings are the job's own resolution (``Settings.resolved``) and checks (``check_machine``):
    the same dtypes, mesh and precision, and the same one-line error for a batch the mesh cannot split."""
    from ipl_jax.settings import SettingsError

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16", "vision_config": {}}))
    flags = plan_lib.PlanSettings(None, None, None, None)  # no --dtype / --remat / --frozen-dtype / --attention
    for overrides in ([], [f"--config.model.checkpoint={ckpt}"], ["--config.model.param_dtype=bfloat16"]):
        settings = load_settings("synthetic:quick", [*SMALL[2:], "--config.mesh.fsdp=2", *overrides])
        arch, _ = plan_shapes.model_config(settings.model, "synthetic:quick")
        planned = plan_lib.job_settings(settings, flags, None, plan_shapes.architecture_dtype(arch), "cpu", 4)
        job = settings.resolved(4)
        assert planned.model == job.model and planned.mesh == job.mesh, overrides
        assert (job.mesh.data, job.mesh.fsdp, job.mesh.tensor) == (2, 2, 1)
        options = plan_lib.PlanSettings.of(planned.model)
        precision = job.model.precision()
        assert (options.compute_dtype, options.frozen_dtype) == (precision.compute, precision.storage), overrides
    assert job.model.dtype == "float32"  # a fresh model computes in float32, in the plan as in the job
    # a published architecture without its checkpoint on disk: the dtype it ships in, through the same resolution
    assert plan_shapes.architecture_dtype("qwen2-vl-7b") == "bfloat16"
    paper = load_settings("qwen2vl_7b_aitz:gpu")
    arch, _ = plan_shapes.model_config(paper.model, "qwen2vl_7b_aitz:gpu")
    planned = plan_lib.job_settings(paper, flags, None, plan_shapes.architecture_dtype(arch), "gpu", 8)
    assert arch == "qwen2-vl-7b" and planned == paper.resolved(8, "bfloat16")
    assert (planned.model.dtype, planned.model.param_dtype) == ("bfloat16", "bfloat16")
    bad = load_settings("synthetic:quick", ["--config.eval.batch_size=3"])
    with pytest.raises(SettingsError) as job_error:
        bad.check_machine("cpu", 2)
    with pytest.raises(SettingsError) as plan_error:
        plan_lib.job_settings(bad, flags, None, "float32", "cpu", 2)
    assert str(plan_error.value) == str(job_error.value)


def test_plan_samples_with_the_job_sampler(tmp_path):
    """The plan's sampler is the job's ``SamplerSettings.build`` (branching, turn budgets, buckets, temperatures),
    its special ids from the model config instead of a tokenizer."""
    import dataclasses

    from tests.support.rl_setup import make_tokenizer

    settings = load_settings("synthetic:quick", ["--config.sampler.tree.top_k=7", "--config.sampler.temperature=0.5"])
    _, cfg = plan_shapes.model_config(settings.model, "synthetic:quick")
    planned = plan_shapes.sampler_config(cfg, settings)
    job = settings.sampler.build(make_tokenizer(tmp_path).ids, settings.buckets, settings.eval.batch_size)
    ids = ("eos_ids", "pad_id", "suppress_ids")
    fields = [f.name for f in dataclasses.fields(job) if f.name not in ids]
    assert [getattr(planned, f) for f in fields] == [getattr(job, f) for f in fields]
    assert planned.temperature == (0.5, 0.5, 0.5, 0.0) and planned.top_k == 7
    assert planned.eos_ids[0] == cfg.text.eos_token_id[0] and cfg.image_token_id in planned.suppress_ids


def test_topology_names_map_to_libtpu_shapes():
    assert plan_cli.topology_name("v5p-16") == "v5p:2x2x2"  # 16 TensorCores = 8 chips
    assert plan_cli.topology_name("v5p-8") == "v5p:2x2x1"
    assert plan_cli.topology_name("v5e-16") == "v5e:4x4"
    assert plan_cli.topology_name("v6e-8") == "v6e:2x4"
    assert plan_cli.topology_name("v5p:4x4x4") == "v5p:4x4x4"


def test_tiny_job_planned_for_a_tpu_slice_without_tpus(tmp_path):
    """``--topology``: the TPU compiler (libtpu) compiles the job for a v5p-8 slice (4 chips) on a machine with no
    TPU; it has bf16 arithmetic, so unlike XLA:CPU it makes no f32 copy of the bf16 KV cache or weights."""
    pytest.importorskip("libtpu", reason="the tpu-plan extra (libtpu) is not installed")
    out = tmp_path / "tpu.json"
    args = [*SMALL, "--topology", "v5p-8", "--dtype", "bfloat16", "--programs", "decode", "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    run_ok([sys.executable, "-m", "ipl_jax.cli", "plan", *args], cwd=ROOT, env=env, timeout=600)
    doc = json.loads(out.read_text())
    assert (doc["platform"], doc["devices"], doc["topology"]) == ("tpu", 4, "v5p-8")
    decode = doc["programs"]["decode"]
    assert decode["aliased"] >= decode["inputs"]["kv_cache"] > 0  # the donated cache is updated in place
    assert decode["widened"] == 0


# ----------------------------------------------------------------------------------- the shipped paper configs

PAPER_CONFIGS = (
    "qwen2vl_2b_aitz",
    "qwen2vl_7b_aitz",
    "qwen2vl_7b_amex",
    "qwen2vl_7b_androidcontrol",
    "qwen3vl_2b_aitz",
    "qwen3vl_8b_aitz",
    "qwen3vl_30b_a3b_aitz",
)
NAMED_DEVICES = 8  # ':gpu' one host of 8 x 80 GB GPUs; ':tpu' a v5p-16 slice, 8 chips of 95 GB


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_configs_split_their_batches_over_the_named_devices(name):
    """As shipped, both variants shard over every device (FSDP) and every batch divides 8 devices: the job's own
    machine check passes on the hardware the variant names."""
    for variant, platform in (("gpu", "gpu"), ("tpu", "tpu")):
        s = load_settings(f"{name}:{variant}")
        assert (s.mesh.data, s.mesh.fsdp, s.mesh.tensor) == (1, -1, 1)
        s.check_machine(platform, NAMED_DEVICES)


@pytest.mark.slow
def test_paper_configs_plan_within_60_gb_per_device(tmp_path):
    """``ipl-jax plan`` of each shipped paper config with no overrides on its named 8 devices: every program <= 60
    GB per device, less the f32 copies XLA:CPU makes of bf16 arguments (a GPU or TPU makes none; the CPU backend's
    other temporaries are larger than theirs, so this still bounds them). The two variants are the same settings,
    so each config is planned once."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    for name in PAPER_CONFIGS:
        assert load_settings(f"{name}:gpu").to_dict() == load_settings(f"{name}:tpu").to_dict()
        out = tmp_path / f"{name}.json"
        run_ok(
            [
                sys.executable,
                "-m",
                "ipl_jax.cli",
                "plan",
                "--config",
                f"{name}:gpu",
                "--devices",
                "8",
                "--json",
                str(out),
            ],
            cwd=ROOT,
            env=env,
            timeout=900,
        )
        doc = json.loads(out.read_text())
        assert doc["devices"] == NAMED_DEVICES and doc["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
        programs = doc["programs"]
        totals = {p: round((programs[p]["total"] - programs[p]["widened"]) / 1e9, 1) for p in programs}
        assert max(totals.values()) <= 60, (name, totals)


def test_qwen3vl_paper_configs_plan_the_published_architectures():
    """The Qwen3-VL configs plan Qwen3-VL-2B / 8B / 30B-A3B as published (head_dim 128 of the config, not hidden /
    heads) and size their buckets for 16-pixel patches (32 x 32 pixels per image token); the MoE's T-DPO trains
    LoRA adapters (its full-weight state alone is 46 GB per device on 8)."""
    for name, arch, kind, width in (
        ("qwen3vl_2b_aitz", "qwen3-vl-2b", "qwen3_vl", 2048),
        ("qwen3vl_8b_aitz", "qwen3-vl-8b", "qwen3_vl", 4096),
        ("qwen3vl_30b_a3b_aitz", "qwen3-vl-30b-a3b", "qwen3_vl_moe", 2048),
    ):
        s = load_settings(f"{name}:tpu")
        label, cfg = plan_shapes.model_config(s.model, f"{name}:tpu")
        assert (label, cfg.hf_model_type, cfg.text.hidden_size, cfg.text.head_dim) == (arch, kind, width, 128)
        assert plan_shapes.architecture_dtype(arch) == "bfloat16"
        assert s.buckets.patches == (9268,) and max(s.buckets.tokens) == 6144  # 1540^2 / 16^2, rounded up to 4s
    assert s.ipl.lora_rank == 128  # the MoE's

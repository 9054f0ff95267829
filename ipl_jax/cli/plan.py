"""``ipl-jax plan --config NAME [--devices N | --topology v5p-16] [--mesh data=1,fsdp=8,tensor=1] [--json OUT]``:
per-device memory and FLOPs of the job's SFT step, T-DPO step, sampler prefill and decode step, compiled ahead of
time on abstract inputs (nothing allocated, no checkpoint needed).

``--devices N``: N fake CPU devices; ``--topology``: a Cloud TPU slice (needs the ``tpu-plan`` extra);
``--workdir DIR``: the buckets the job in DIR fitted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import jax
from jax._src import xla_bridge
from jax.experimental import topologies

from ipl_jax.cli.common import CommandParser, command, positive_int, write_text
from ipl_jax.configs.loader import parse_args_with_settings
from ipl_jax.model.sharding import make_mesh
from ipl_jax.pipeline import buckets_stage
from ipl_jax.pipeline.paths import UsageError, output_file
from ipl_jax.planning import programs as plan_lib
from ipl_jax.planning import shapes as shapes_lib

PROG = "ipl-jax plan"
_CHILD = "IPL_JAX_PLAN_CHILD"
# compile-only: no TPU to query or lock (another process holding libtpu, a job or a test run, does not stop a plan)
_TPU_ENV = {
    "JAX_PLATFORMS": "cpu",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
# chips -> libtpu topology: 3-D tori (v4, v5p) and 2-D slices (v5e, v6e)
_TORUS = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8", 512: "8x8x8"}
_SLICE = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_KINDS = {"v4": (2, _TORUS), "v5p": (2, _TORUS), "v5e": (1, _SLICE), "v5litepod": (1, _SLICE), "v6e": (1, _SLICE)}


def parser() -> CommandParser:
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--devices", type=positive_int, help="plan for N (fake) CPU devices")
    where.add_argument("--topology", help="plan for a TPU slice: v5p-16, v5e-16, ... or v5p:2x2x2")
    p.add_argument("--mesh", help="axis sizes data=D,fsdp=F,tensor=T (default: the config's mesh section)")
    p.add_argument(
        "--arch",
        default="auto",
        help="auto (checkpoint, config name, config.model) or a published architecture: "
        "qwen2-vl-2b, qwen2-vl-7b, qwen3-vl-2b, qwen3-vl-8b, qwen3-vl-30b-a3b",
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="compute dtype (default: config.model.dtype; its 'auto': the checkpoint's, else a published architecture's"
        " bfloat16, else float32)",
    )
    p.add_argument(
        "--frozen-dtype",
        default=None,
        help="storage of the weights not trained: frozen base / ViT, sampler (default: config.model.param_dtype)",
    )
    p.add_argument(
        "--remat",
        default=None,
        help="training remat: none, full, dots_saveable, dots_no_batch, offload (default: config.model.remat)",
    )
    p.add_argument(
        "--attention", default=None, help="auto, reference, xla or cudnn (default: config.model.attention, else auto)"
    )
    p.add_argument(
        "--moe-dispatch",
        default=None,
        help="auto, grouped, ragged or dense: a sparse MLP's expert dispatch (default: config.model.moe_dispatch)",
    )
    p.add_argument("--programs", default="sft,tdpo,prefill,decode", help="comma-separated subset to plan")
    p.add_argument("--budget-gb", type=float, default=None, help="mark programs whose total exceeds this")
    p.add_argument("--json", default=None, help="also write the plan here as JSON")
    p.add_argument("--workdir", default=None, help="a job's workdir: plan with the buckets it fitted to its data")
    return p


def topology_name(text: str) -> str:
    """A Cloud TPU slice name (v5p-16) -> libtpu's topology name (v5p:2x2x2); 'kind:AxB[xC]' passes through."""
    if ":" in text:
        return text
    kind, _, n = text.partition("-")
    valid = ", ".join(f"{k}-N" for k in _KINDS) + " (e.g. v5p-16, v5e-16) or KIND:AxBxC (e.g. v5p:2x2x2)"
    if kind not in _KINDS or not n.isdigit():
        raise UsageError(f"--topology {text!r} is unknown (valid: {valid})")
    per_chip, table = _KINDS[kind]
    chips = int(n) // per_chip
    if int(n) % per_chip or chips not in table:
        sizes = ", ".join(f"{kind}-{c * per_chip}" for c in table)
        raise UsageError(f"--topology {text!r}: no such slice (valid: {sizes})")
    return f"{'v5e' if kind == 'v5litepod' else kind}:{table[chips]}"


def _xla_flags(flags: str, n: int) -> str:
    kept = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join(kept + [f"--xla_force_host_platform_device_count={n}"])


def _prepare_backend(args, argv) -> int | None:
    """Point JAX at CPU devices (fake ones for --devices, compile-only TPU ones for --topology) before it starts, or
    re-run the command in a child process if it already started; returns the child's status."""
    if args.devices is None and args.topology is None:
        return None
    env = dict(_TPU_ENV) if args.topology else {"JAX_PLATFORMS": "cpu"}
    if xla_bridge.backends_are_initialized():
        if jax.default_backend() == "cpu" and (args.devices is None or jax.device_count() == args.devices):
            os.environ.update(env)
            return None
        if os.environ.get(_CHILD):
            raise UsageError(
                f"--devices {args.devices}: JAX started with {jax.device_count()} "
                f"{jax.default_backend()} devices; set XLA_FLAGS before starting the process"
            )
        child = {**os.environ, **env, _CHILD: "1"}
        if args.devices:
            child["XLA_FLAGS"] = _xla_flags(child.get("XLA_FLAGS", ""), args.devices)
        return subprocess.call([sys.executable, "-m", "ipl_jax.cli", "plan", *argv], env=child)
    os.environ.update(env)
    if args.devices:
        os.environ["XLA_FLAGS"] = _xla_flags(os.environ.get("XLA_FLAGS", ""), args.devices)
        jax.config.update("jax_num_cpu_devices", args.devices)
    jax.config.update("jax_platforms", "cpu")
    return None


def _devices(args):
    if args.topology is None:
        return jax.devices(), jax.default_backend()
    name = topology_name(args.topology)
    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=name)
    except Exception as e:
        text = " ".join(str(e).split())[:200]
        raise UsageError(f"--topology {args.topology} ({name}): {text}") from None
    return list(topo.devices), "tpu"


def _check_early(args, settings, flags, mesh_arg, default_dtype):
    """The checks possible before JAX starts: mesh vs --devices, batches, dtypes, topology name and its compiler;
    with --devices, the settings the planned job runs with (``programs.job_settings``)."""
    if args.devices is not None:
        return plan_lib.job_settings(settings, flags, mesh_arg, default_dtype, "cpu", args.devices)
    if args.topology is not None:
        topology_name(args.topology)
        plan_lib.check_dtype(flags, "tpu")
        if importlib.util.find_spec("libtpu") is None:
            raise UsageError(
                f"--topology {args.topology}: no TPU compiler installed (libtpu); install the tpu-plan "
                "extra: pip install 'ipl-jax[tpu-plan]'"
            )
    return None


@command(PROG)
def main(argv: list[str]) -> int:
    args, settings = parse_args_with_settings(parser(), argv)
    if args.workdir:  # the buckets the job runs with (its buckets stage), not only the configured ones
        settings = buckets_stage.apply(settings, buckets_stage.read_fitted(args.workdir))
    if args.json:
        output_file(args.json, "--json")
    try:
        mesh_arg = shapes_lib.parse_mesh(args.mesh) if args.mesh else None
        arch, cfg = shapes_lib.model_config(settings.model, args.config or "", args.arch)
        default_dtype = shapes_lib.architecture_dtype(arch)
        flags = plan_lib.PlanSettings(
            compute_dtype=args.dtype,
            remat=args.remat,
            frozen_dtype=args.frozen_dtype,
            attention=args.attention,
            programs=tuple(x.strip() for x in args.programs.split(",") if x.strip()),
            moe_dispatch=args.moe_dispatch,
        )
        early = _check_early(args, settings, flags, mesh_arg, default_dtype)
        status = _prepare_backend(args, argv)
        if status is not None:
            return status
        devices, platform = _devices(args)
        # --devices: JAX now runs on that many CPU devices, the machine the early check resolved for
        job = early or plan_lib.job_settings(settings, flags, mesh_arg, default_dtype, platform, len(devices))
        options = plan_lib.PlanSettings.of(job.model, flags.programs)
        dtype, frozen, remat, attention = options.compute_dtype, options.frozen_dtype, options.remat, options.attention
        shape = (job.mesh.data, job.mesh.fsdp, job.mesh.tensor)
        mesh = make_mesh(shape, devices=devices)
        where = f"{len(devices)} {platform} devices" + (f" ({args.topology})" if args.topology else "")
        info = plan_lib.describe(cfg)
        header = (
            f"plan of {args.config} ({arch}, {info['params'] / 1e9:.2f}B params) on {where}, mesh "
            f"data={shape[0]} fsdp={shape[1]} tensor={shape[2]}; compute {dtype}, frozen/sampler weights "
            f"{frozen}, master weights and moments float32, remat {remat}, attention {attention}; per "
            "device (XLA FLOP: cost_analysis, loop bodies counted once)"
        )
        print(header, file=sys.stderr)
        plans = plan_lib.plan_job(
            job,
            cfg,
            mesh,
            options,
            on_program=lambda pl: print(f"  compiled {pl.name} in {pl.compile_s:.1f}s", file=sys.stderr),
        )
    except shapes_lib.PlanError as e:
        raise UsageError(str(e)) from None
    print(plan_lib.format_table(plans, header, args.budget_gb))
    if args.json:
        doc = {
            "config": args.config,
            "arch": arch,
            "model": info,
            "platform": platform,
            "devices": len(devices),
            "topology": args.topology,
            "mesh": dict(zip(("data", "fsdp", "tensor"), shape)),
            "settings": {
                "compute_dtype": dtype,
                "remat": remat,
                "attention": attention,
                "moe_dispatch": options.moe_dispatch,
                "frozen_dtype": frozen,
            },
            "programs": {pl.name: pl.as_dict() for pl in plans},
        }
        write_text(args.json, json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

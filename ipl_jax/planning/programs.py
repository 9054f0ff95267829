"""A memory and FLOP plan of the job's programs (SFT step, T-DPO step, sampler prefill and decode), compiled ahead
of time on sharded abstract inputs. Per device: ``total = arguments + outputs + temporaries - aliased``; FLOPs
from the HLO (``hlo_cost``). The planner sits below the job: it builds the steps' configs from the settings, as the
job does, in the plan's precision.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ipl_jax.model.config import Qwen2VLConfig, backend_dtypes
from ipl_jax.model.decode import KVCache
from ipl_jax.model.experts import resolve_dispatch
from ipl_jax.model.inputs import ModelInputs
from ipl_jax.model.layers import ATTENTION_IMPLS, REMAT_POLICIES, check_remat
from ipl_jax.model.params import count_params, param_shapes
from ipl_jax.model.sharding import AXES, batch_spec, cache_shardings, inputs_shardings, param_shardings
from ipl_jax.planning.hlo_cost import hlo_flops, widened_bytes
from ipl_jax.planning.shapes import (
    _KEY,
    _S,
    GB,
    PROGRAMS,
    JobShapes,
    PlanError,
    _vision,
    check_mesh_arg,
    sampler_config,
    sft_batch,
    tdpo_batch,
)
from ipl_jax.preference import tdpo as tdpo_lib
from ipl_jax.sampling.decoding import prefill_context, sample_turn
from ipl_jax.settings import ModelSettings, Settings
from ipl_jax.training import sft as sft_lib
from ipl_jax.training.lora import lora_of_rank
from ipl_jax.training.optimizer import make_optimizer
from ipl_jax.training.state import VISION_REGEX, create_train_state, state_shardings

# ---------------------------------------------------------------------------------------------- programs


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """The plan's options (``ipl-jax plan``'s flags): compute_dtype, remat policy, attention, frozen_dtype (None:
    compute dtype), programs (of ``PROGRAMS``), moe_dispatch (None: auto). Trainable weights and optimizer moments
    are fp32."""

    compute_dtype: str = "bfloat16"
    remat: str = "full"
    frozen_dtype: str | None = None
    attention: str = "auto"
    programs: tuple = PROGRAMS
    moe_dispatch: str | None = None

    @staticmethod
    def of(model: ModelSettings, programs: tuple = PROGRAMS) -> PlanSettings:
        """The options the job runs with: ``model`` settings resolved (``ModelSettings.resolved``: no 'auto')."""
        return PlanSettings(model.dtype, model.remat, model.param_dtype, model.attention, programs, model.moe_dispatch)


@dataclasses.dataclass
class ProgramPlan:
    """Per-device bytes and FLOPs of one compiled program; ``inputs``: argument bytes per device by part;
    ``widened``: the temporaries' f32 copies of whole bf16 arguments (``hlo_cost.widened_bytes``)."""

    name: str
    shapes: str
    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    flops: float
    xla_flops: float
    unknown_loops: int
    compile_s: float
    inputs: dict
    widened: int = 0

    @property
    def total(self) -> int:
        return total_bytes(self.arguments, self.outputs, self.temporaries, self.aliased)

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total": self.total}


def total_bytes(arguments: int, outputs: int, temporaries: int, aliased: int) -> int:
    """Per-device memory: arguments + outputs + temporaries - aliased outputs."""
    return arguments + outputs + temporaries - aliased


def compiled_bytes(compiled) -> dict:
    """Per-device bytes of a compiled program: arguments, outputs, aliased, temporaries."""
    mem = compiled.memory_analysis()
    return dict(
        arguments=int(mem.argument_size_in_bytes),
        outputs=int(mem.output_size_in_bytes),
        aliased=int(mem.alias_size_in_bytes),
        temporaries=int(mem.temp_size_in_bytes),
    )


def _per_device_bytes(values, shardings) -> int:
    vals, shs = jax.tree.leaves(values), jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    if len(vals) != len(shs):
        raise ValueError(f"{len(vals)} values but {len(shs)} shardings")
    return int(sum(math.prod(sh.shard_shape(v.shape)) * jnp.dtype(v.dtype).itemsize for v, sh in zip(vals, shs)))


def _placed(values, shardings):
    """Abstract ``values`` carrying ``shardings`` (what the job's placed arrays look like to a jitted program)."""
    return jax.tree.map(lambda v, sh: _S(v.shape, v.dtype, sharding=sh), values, shardings)


def _measure(name: str, shapes: str, lower: Callable[[], jax.stages.Lowered], inputs: dict) -> ProgramPlan:
    t0 = time.perf_counter()
    compiled = lower().compile()
    seconds = time.perf_counter() - t0
    xla = compiled.cost_analysis()
    xla = xla[0] if isinstance(xla, (list, tuple)) else (xla or {})
    text = compiled.as_text()
    cost = hlo_flops(text)
    return ProgramPlan(
        name=name,
        shapes=shapes,
        **compiled_bytes(compiled),
        flops=cost.flops,
        xla_flops=float(xla.get("flops", 0.0)),
        unknown_loops=cost.unknown_loops,
        compile_s=round(seconds, 2),
        inputs=inputs,
        widened=widened_bytes(text),
    )


def _state_kwargs(options: PlanSettings, lora_rank: int, freeze_vision: bool) -> dict:
    frozen = options.frozen_dtype or options.compute_dtype
    if lora_rank > 0:
        return dict(lora=lora_of_rank(lora_rank), frozen_dtype=frozen)
    return dict(freeze_regex=VISION_REGEX if freeze_vision else None, frozen_dtype=frozen)


def _placed_step(state, state_sh, batch, batch_sh) -> tuple:
    """(placed state, placed batch, per-device input bytes by part) of a training step's arguments."""
    inputs = {
        "trainable": _per_device_bytes(state.params, state_sh.params),
        "optimizer": _per_device_bytes(state.opt_state, state_sh.opt_state),
        "frozen": _per_device_bytes(state.frozen, state_sh.frozen),
        "batch": _per_device_bytes(batch, batch_sh),
    }
    return _placed(state, state_sh), _placed(batch, batch_sh), inputs


def _weights_note(lora: int, state_kwargs: dict) -> str:
    """What a training step updates, for a plan's shape line."""
    return (f", LoRA r={lora}" if lora else ", full weights") + (
        ", ViT frozen" if state_kwargs.get("freeze_regex") else ""
    )


def _compute(options: PlanSettings) -> str | None:
    return None if options.compute_dtype == "float32" else options.compute_dtype


def plan_tdpo(settings: Settings, cfg: Qwen2VLConfig, s: JobShapes, mesh, options: PlanSettings) -> ProgramPlan:
    """The T-DPO step as training runs it (``tdpo_update``, the round's config, placed state and batch)."""
    mcfg = cfg.replace(dtype=options.compute_dtype, param_dtype="float32", attention=options.attention)
    tcfg = dataclasses.replace(
        settings.ipl.tdpo(mcfg, settings.model.precision(), settings.sft.grad_clip),
        model=mcfg,
        remat=options.remat,
        compute_dtype=_compute(options),
        reference_dtype=options.frozen_dtype,
    )
    lora = settings.ipl.lora_rank
    kw = _state_kwargs(options, lora, settings.ipl.freeze_vision)
    state = jax.eval_shape(lambda p, k: tdpo_lib.init_state(p, tcfg, k, **kw), param_shapes(mcfg), _KEY)
    batch = tdpo_batch(mcfg, s)
    state_sh = state_shardings(state, tcfg.optimizer(), mesh)
    batch_sh = tdpo_lib.batch_shardings(batch, mesh)
    placed_state, placed_batch, inputs = _placed_step(state, state_sh, batch, batch_sh)
    shapes = (
        f"{s.tdpo_rows} rows x {s.tdpo_length} tokens, {s.tdpo_slots} continuation slots/row, "
        f"{s.tdpo_pairs} pair slots, {s.image_patches} patches/row" + _weights_note(lora, kw)
    )
    return _measure("tdpo", shapes, lambda: tdpo_lib.lower_tdpo_step(placed_state, placed_batch, tcfg, mesh), inputs)


def plan_sft(settings: Settings, cfg: Qwen2VLConfig, s: JobShapes, mesh, options: PlanSettings) -> ProgramPlan:
    """Warm-up SFT's step as training runs it (``sft_update`` on a placed state and batch)."""
    mcfg = cfg.replace(dtype=options.compute_dtype, param_dtype="float32", attention=options.attention)
    optimizer_settings = settings.sft.optimizer()
    optimizer = make_optimizer(optimizer_settings)
    lora = settings.sft.lora_rank
    kw = _state_kwargs(options, lora, settings.sft.freeze_vision)
    state = jax.eval_shape(lambda p, k: create_train_state(p, optimizer, k, **kw), param_shapes(mcfg), _KEY)
    batch = sft_batch(mcfg, s)
    accum = s.sft_batch // s.sft_micro
    state_sh = state_shardings(state, optimizer, mesh)
    batch_sh = sft_lib.sft_batch_shardings(batch, mesh, grad_accum=accum > 1)
    step_config = sft_lib.SFTStepConfig(  # the job's step (``sft_stage.sft_step_config``) in the plan's precision
        model=mcfg,
        optimizer=optimizer_settings,
        grad_accum_steps=accum,
        remat=options.remat,
        compute_dtype=_compute(options),
    )
    placed_state, placed_batch, inputs = _placed_step(state, state_sh, batch, batch_sh)
    shapes = (
        f"{s.sft_batch} dialogues x {s.sft_length} tokens as {accum} micro-batches of {s.sft_micro}, "
        f"{s.sft_micro} image slots of {s.image_patches} patches/micro-batch" + _weights_note(lora, kw)
    )
    return _measure(
        "sft", shapes, lambda: sft_lib.lower_sft_step(placed_state, placed_batch, step_config, mesh), inputs
    )


def _row_sharding(mesh, shape) -> NamedSharding:
    return NamedSharding(mesh, batch_spec(mesh, shape))


def _under_mesh(fn, args: tuple, mesh) -> Callable[[], jax.stages.Lowered]:
    def lower():
        with jax.set_mesh(mesh):
            return fn.lower(*args)

    return lower


def plan_prefill(settings: Settings, cfg: Qwen2VLConfig, s: JobShapes, mesh, options: PlanSettings) -> ProgramPlan:
    scfg = cfg.replace(dtype=options.compute_dtype, param_dtype=options.frozen_dtype or options.compute_dtype)
    sampler = sampler_config(scfg, settings)
    b, t = s.sampler_batch, s.prefix_length
    size = sampler.cache_size(t, (s.prompt_length,) * 3, upto_turn=1)
    params = param_shapes(scfg)
    inputs = ModelInputs(
        input_ids=_S((b, t), jnp.int32),
        attention_mask=_S((b, t), jnp.bool_),
        positions=_S((3, b, t), jnp.int32),
        rope_deltas=_S((b,), jnp.int32),
        vision=_vision(scfg, (b,), s.image_patches),  # one screenshot per slot
    )
    p_sh, in_sh = param_shardings(params, mesh), inputs_shardings(inputs, mesh)
    fn = jax.jit(
        lambda p, x: prefill_context(p, scfg, x, size),
        in_shardings=(p_sh, in_sh),
        out_shardings=(cache_shardings(scfg, mesh, b, size), _row_sharding(mesh, (b,))),
    )
    parts = {"weights": _per_device_bytes(params, p_sh), "batch": _per_device_bytes(inputs, in_sh)}
    shapes = f"{b} trees x {t} prefix tokens, {b} image slots of {s.image_patches} patches, cache {size} slots"
    return _measure("prefill", shapes, _under_mesh(fn, (params, inputs), mesh), parts)


def plan_decode(settings: Settings, cfg: Qwen2VLConfig, s: JobShapes, mesh, options: PlanSettings) -> ProgramPlan:
    scfg = cfg.replace(dtype=options.compute_dtype, param_dtype=options.frozen_dtype or options.compute_dtype)
    sampler = sampler_config(scfg, settings)
    rows = s.sampler_batch * math.prod(s.branching)
    size = sampler.cache_size(s.prefix_length, (s.prompt_length,) * 3)
    tc = scfg.text
    kv = _S((tc.num_hidden_layers, rows, size, tc.num_key_value_heads, tc.head_dim), jnp.dtype(scfg.dtype))
    cache = KVCache(k=kv, v=kv, length=_S((rows,), jnp.int32), next_pos=_S((rows,), jnp.int32))
    params = param_shapes(scfg)
    p_sh, c_sh = param_shardings(params, mesh), cache_shardings(scfg, mesh, rows, size)
    row, row2 = _row_sharding(mesh, (rows,)), _row_sharding(mesh, (rows, 2))
    rep = NamedSharding(mesh, PartitionSpec())

    def step(p, c, feed, keys, temperature):
        return sample_turn(
            p,
            scfg,
            c,
            feed,
            keys,
            1,
            temperature,
            sampler.top_k,
            sampler.top_p,
            sampler.eos_ids,
            sampler.pad_id,
            True,
            sampler.suppress_ids,
        )

    fn = jax.jit(
        step,
        in_shardings=(p_sh, c_sh, row, row2, rep),
        donate_argnums=(1,),
        out_shardings=(row2, row, row2, row, c_sh, row),
    )
    args = (params, cache, _S((rows,), jnp.int32), _S((rows, 2), jnp.uint32), _S((), jnp.float32))
    parts = {"weights": _per_device_bytes(params, p_sh), "kv_cache": _per_device_bytes(cache, c_sh)}
    shapes = f"{rows} rows (level 4), cache {size} slots, one token"
    return _measure("decode", shapes, _under_mesh(fn, args, mesh), parts)


_PLANNERS = {"sft": plan_sft, "tdpo": plan_tdpo, "prefill": plan_prefill, "decode": plan_decode}


def check_dtype(options: PlanSettings, platform: str) -> None:
    """PlanError (naming the flag) for a dtype, remat policy or attention the platform cannot run; None: not given."""
    valid = backend_dtypes(platform)
    for flag, value in (("--dtype", options.compute_dtype), ("--frozen-dtype", options.frozen_dtype)):
        if value is not None and value not in valid:
            raise PlanError(f"{flag} {value}: not available on {platform} (valid: {', '.join(valid)})")
    if options.remat is not None and options.remat not in REMAT_POLICIES:
        raise PlanError(f"--remat {options.remat}: unknown (valid: {', '.join(REMAT_POLICIES)})")
    if options.remat == "offload" and platform not in ("tpu", "gpu"):
        try:
            check_remat(options.remat, platform, "--remat")
        except ValueError as e:
            raise PlanError(str(e)) from None
    attention = options.attention
    if attention is not None and (attention not in ATTENTION_IMPLS or (attention == "cudnn" and platform != "gpu")):
        valid = ATTENTION_IMPLS if platform == "gpu" else ("auto", "reference", "xla")
        raise PlanError(f"--attention {attention}: not available on {platform} (valid: {', '.join(valid)})")


def validate(settings: Settings, options: PlanSettings, shape: Sequence[int], platform: str) -> JobShapes:
    """The job's shapes after the device-free checks: the options on ``platform`` (PlanError naming the flag), then
    the job's own machine check (``Settings.check_machine``: batches vs data x fsdp) on a mesh of ``shape``."""
    check_dtype(options, platform)
    unknown = [p for p in options.programs if p not in _PLANNERS]
    if unknown or not options.programs:
        raise PlanError(f"--programs {','.join(unknown) or '(none)'}: unknown (valid: {', '.join(PROGRAMS)})")
    on_mesh = settings.replace({f"mesh.{a}": int(n) for a, n in zip(AXES, shape)})
    on_mesh.check_machine(platform, math.prod(int(n) for n in shape))
    return JobShapes.of(settings)


def job_settings(
    settings: Settings, flags: PlanSettings, mesh_arg: dict | None, default_dtype: str, platform: str, n_devices: int
) -> Settings:
    """The settings the planned job runs with on ``n_devices`` of ``platform``: the flags (``flags``, None where not
    given; ``mesh_arg``: --mesh) checked and applied, then the job's own resolution (``Settings.resolved``, 'auto'
    without a checkpoint: ``default_dtype``) and checks (``validate``)."""
    check_dtype(flags, platform)
    if mesh_arg:
        check_mesh_arg(mesh_arg, n_devices)
    given = {
        "model.dtype": flags.compute_dtype,
        "model.param_dtype": flags.frozen_dtype,
        "model.remat": flags.remat,
        "model.attention": flags.attention,
        "model.moe_dispatch": flags.moe_dispatch,
        **{f"mesh.{a}": n for a, n in (mesh_arg or {}).items()},
    }
    job = settings.replace({k: v for k, v in given.items() if v is not None}).resolved(n_devices, default_dtype)
    validate(job, PlanSettings.of(job.model, flags.programs), [getattr(job.mesh, a) for a in AXES], platform)
    return job


def plan_job(
    settings: Settings,
    cfg: Qwen2VLConfig,
    mesh,
    options: PlanSettings = PlanSettings(),
    on_program=None,
) -> list[ProgramPlan]:
    """Plans of ``options.programs`` on ``mesh`` (``validate`` first); ``on_program(plan)`` is called after each
    compile."""
    platform = mesh.devices.flat[0].platform
    shapes = validate(settings, options, [mesh.shape[a] for a in AXES], platform)
    cfg = cfg.replace(moe_dispatch=resolve_dispatch(options.moe_dispatch or "auto", platform))
    out = []
    for name in options.programs:
        out.append(_PLANNERS[name](settings, cfg, shapes, mesh, options))
        if on_program is not None:
            on_program(out[-1])
    return out


# ------------------------------------------------------------------------------------------------ output


def format_table(plans: Sequence[ProgramPlan], header: str, budget_gb: float | None = None) -> str:
    """The plan as a text table, per device: memory in GB (MB when all below 1 GB) and TFLOP (GFLOP) per step."""
    big = max((p.total for p in plans), default=0) >= GB
    unit, scale = ("GB", GB) if big else ("MB", 1e6)
    funit, fscale = ("TFLOP", 1e12) if max((p.flops for p in plans), default=0) >= 1e12 else ("GFLOP", 1e9)
    cols = ["program", f"args {unit}", "temps", "outputs", "aliased", "total", funit, f"XLA {funit}", "compile s"]
    if budget_gb:
        cols.append(f"<= {budget_gb:g} GB")
    lines = [header, "  ".join(f"{c:>10s}" if i else f"{c:<8s}" for i, c in enumerate(cols))]
    for p in plans:
        cells = [f"{v / scale:10.2f}" for v in (p.arguments, p.temporaries, p.outputs, p.aliased, p.total)]
        cells += [f"{p.flops / fscale:10.2f}", f"{p.xla_flops / fscale:10.2f}", f"{p.compile_s:10.1f}"]
        if budget_gb:  # yes*: fits once the CPU's f32 copies (the note under the table) are left out
            fits = "yes" if p.total <= budget_gb * GB else "yes*" if p.total - p.widened <= budget_gb * GB else "NO"
            cells.append(f"{fits:>10s}")
        lines.append(f"{p.name:<8s}  " + "  ".join(cells))
    lines.append("")
    for p in plans:
        parts = ", ".join(f"{k} {v / scale:.2f}" for k, v in p.inputs.items())
        lines.append(
            f"{p.name}: {p.shapes}; args by part ({unit}): {parts}"
            + (f"; {p.unknown_loops} loop(s) of unknown trip count counted once" if p.unknown_loops else "")
        )
    wide = [p for p in plans if p.widened >= 0.01 * max(p.total, 1)]
    if wide:
        lines.append(
            "temps include the compiler's f32 copies of bf16 arguments (XLA:CPU has no bf16 dot or scatter; a GPU or "
            "TPU makes none; --topology plans with the TPU compiler): "
            + ", ".join(
                f"{p.name} {p.widened / scale:.2f} (total without: {(p.total - p.widened) / scale:.2f})" for p in wide
            )
            + f" {unit}"
        )
    return "\n".join(lines)


def describe(cfg: Qwen2VLConfig) -> dict:
    t, v = cfg.text, cfg.vision
    return {
        "params": count_params(param_shapes(cfg)),
        "layers": t.num_hidden_layers,
        "hidden": t.hidden_size,
        "heads": t.num_attention_heads,
        "kv_heads": t.num_key_value_heads,
        "vocab": t.vocab_size,
        "vision_depth": v.depth,
        "vision_dim": v.embed_dim,
        "tied": cfg.tie_word_embeddings,
    }

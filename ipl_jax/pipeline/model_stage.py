"""Stage 3: the tokenizer and the starting model, and the policy directory format the job passes around (a Hugging
Face checkpoint with tokenizer, preprocessor and generation configs, loadable in transformers as is).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path

import jax

from ipl_jax import distributed, storage
from ipl_jax.coat.actions import format_action, format_grounding
from ipl_jax.data.dialogue import DEFAULT_PROMPTS
from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.records import Step
from ipl_jax.data.tiny_tokenizer import scaffold_texts, train_tokenizer, write_tokenizer
from ipl_jax.data.tokenizer import load_tokenizer
from ipl_jax.model.config import Qwen2VLConfig, checkpoint_dtype
from ipl_jax.model.layers import resolve_attention
from ipl_jax.model.params import count_params, init_params, param_shapes
from ipl_jax.model.sharding import make_mesh, param_shardings
from ipl_jax.model.weights import load_params, save_params
from ipl_jax.pipeline.paths import UsageError
from ipl_jax.pipeline.workdir import Workdir, write_json
from ipl_jax.settings import MeshSettings, ModelSettings, Settings
from ipl_jax.training.state import cast_floating

TOKENIZER_FILES_EXCLUDE = ("config.json", "generation_config.json", "preprocessor_config.json")


@dataclasses.dataclass
class Policy:
    """A loaded policy: params, model config, ``QwenTokenizer``, image config, and its mesh (None: one device)."""

    params: dict
    cfg: object
    tokenizer: object
    image_config: object
    source: str = ""
    mesh: object = None


def job_model_config(cfg: Qwen2VLConfig, model: ModelSettings) -> Qwen2VLConfig:
    """A policy's model config with the job's compute dtype, attention implementation and MoE dispatch."""
    cfg = cfg.replace(dtype=model.precision().compute, attention=model.attention, moe_dispatch=model.moe_dispatch)
    try:  # a 'cudnn' the model cannot run (dtype, head dims, backend) stops here, before anything compiles
        resolve_attention(cfg.attention, cfg.dtype, (cfg.text.head_dim, cfg.vision.head_dim))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return cfg


def inference_policy(policy: Policy, model: ModelSettings, params=None) -> Policy:
    """``policy`` (or ``params``) for sampling and evaluation: weights in the storage dtype, compute (and KV cache)
    in the compute dtype."""
    params = policy.params if params is None else params
    storage = model.precision().storage
    return dataclasses.replace(policy, params=cast_floating(params, storage), cfg=job_model_config(policy.cfg, model))


def tokenizer_corpus(steps: Sequence[Step], qas: Sequence = (), texts: Sequence[str] = ()) -> list[str]:
    """Every text the model reads or writes on this data (CoaT turns, prompts, Q&A, ``texts``) plus the chat
    scaffolding."""
    lines = scaffold_texts() + list(texts)
    for s in steps:
        lines.append(s.instruction)
        lines.append(DEFAULT_PROMPTS.think_text(s.instruction, s.history))
        lines.append(format_action(s.action))
        if s.action.box is not None:
            lines.append(format_grounding(s.action.box))
        if s.coat is not None:
            lines.extend([s.coat.screen_desc, s.coat.action_think, s.coat.action_result])
        lines.extend(e.text for e in s.elements if e.text)
    for qa in qas:
        lines.extend([qa.question, qa.answer])
    return [line for line in lines if line and line.strip()]


def write_policy_dir(out: Path, params, cfg, tokenizer_dir: Path, image_config) -> Path:
    """Write a policy directory; ``generation_config.json`` holds only our end-of-turn ids and pad id. ``out`` and
    ``tokenizer_dir`` may be object-store URIs: the directory is then written in this host's scratch and uploaded
    (``storage.staged_dir``), the tokenizer read from its local copy.

    Multi-process: every process calls it (weights are all-gathered), the main one writes; barrier before reading."""
    out = storage.as_path(out)
    params = distributed.to_host(params)
    if not distributed.is_main():
        return out
    if storage.is_remote(out):
        with storage.staged_dir(out) as local:
            _write_policy_files(local, params, cfg, storage.local_dir(tokenizer_dir), image_config)
        return out
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    _write_policy_files(tmp, params, cfg, storage.local_dir(tokenizer_dir), image_config)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def _write_policy_files(tmp: Path, params, cfg, tokenizer_dir: Path, image_config) -> None:
    """A policy directory's files written into the local directory ``tmp``."""
    save_params(params, cfg, str(tmp))
    for f in Path(tokenizer_dir).iterdir():
        if f.is_file() and f.name not in TOKENIZER_FILES_EXCLUDE and ".safetensors" not in f.name:
            shutil.copy2(f, tmp / f.name)
    image_config.save(tmp)
    ids = load_tokenizer(tokenizer_dir).ids
    write_json(tmp / "generation_config.json", {"eos_token_id": list(ids.eos), "pad_token_id": ids.pad})


def write_round(wd: Workdir, round_index: int, record: dict, params, policy: Policy, start: Path, extra=None) -> dict:
    """``rounds/<r>/policy`` (the round's weights with ``start``'s tokenizer and processor) and ``round.json``;
    ``extra(out_dir)``, where given, writes the round's other files first. Every process calls it; the main one
    writes. Returns ``record`` with the policy's path."""
    out_dir = wd.dir("rounds", str(round_index))
    write_policy_dir(out_dir / "policy", params, policy.cfg, start, policy.image_config)
    if wd.main:
        if extra is not None:
            extra(out_dir)
        write_json(out_dir / "round.json", record)
    distributed.barrier(f"round {round_index} written")
    record["policy"] = str(out_dir / "policy")
    return record


def job_mesh(mesh: MeshSettings):
    """The ('data', 'fsdp', 'tensor') mesh of ``mesh`` over every device (``MeshSettings.shape``), or None on a
    single device."""
    if jax.device_count() == 1:
        return None
    return make_mesh(mesh.shape(jax.device_count()))


def load_policy(directory: Path, mesh=None, dtype: str | None = None) -> Policy:
    """A policy directory, placed by the partition rules when ``mesh`` is given, in ``dtype`` (default param_dtype);
    on an object store read from this host's copy of it (``storage.local_dir``), ``source`` naming the URI."""
    source = str(directory)
    directory = storage.local_dir(directory)
    shardings, cfg = None, Qwen2VLConfig.from_dir(directory)
    image_config = ImageProcessorConfig.load_for_model(directory, cfg)  # checked before any weight loads
    if mesh is not None:
        shardings = param_shardings(param_shapes(cfg), mesh)
    params, cfg = load_params(str(directory), shardings=shardings, dtype=dtype)
    return Policy(
        params=params,
        cfg=cfg,
        tokenizer=load_tokenizer(directory),
        image_config=image_config,
        source=source,
        mesh=mesh,
    )


def build_initial_model(
    settings: Settings, wd: Workdir, train_steps: Sequence[Step], qas: Sequence, texts: Sequence[str] = ()
) -> dict:
    """Stage 3: ``WORKDIR/model/init``, a copy of ``model.checkpoint`` or a new tokenizer (from the data's texts and
    ``texts``) + fresh model (``seed``)."""
    model = settings.model
    out = wd.path("model", "init")
    if model.checkpoint:
        src = storage.local_dir(model.checkpoint_dir())
        if not (src / "config.json").is_file():
            raise FileNotFoundError(f"config.model.checkpoint: {src} is not a Hugging Face checkpoint directory")
        # copied in its own dtype (a bfloat16 checkpoint is not doubled in size); its processor (patches,
        # normalisation) with the job's pixel range
        policy = load_policy(src, dtype=checkpoint_dtype(src))
        write_policy_dir(out, policy.params, policy.cfg, src, model.image_processor(policy.image_config))
        return {
            "source": str(storage.as_path(model.checkpoint_dir())),
            "parameters": count_params(policy.params),
            "vocab": len(policy.tokenizer),
        }

    corpus = tokenizer_corpus(train_steps, qas, texts)
    tok_dir = wd.dir("model", "tokenizer")
    with storage.staged_dir(tok_dir) as local:
        special_ids = write_tokenizer(train_tokenizer(corpus, model.text.vocab_size), local)
    cfg = model.fresh_config(special_ids)
    params = init_params(cfg, jax.random.PRNGKey(settings.seed))
    write_policy_dir(out, params, cfg, tok_dir, model.image_processor(ImageProcessorConfig.for_model(cfg)))
    n = count_params(params)
    wd.echo(
        f"  tokenizer: {max(special_ids.values()) + 1} tokens from {len(corpus)} texts; model: "
        f"{n / 1e6:.2f} M parameters ({cfg.text.num_hidden_layers} layers x {cfg.text.hidden_size}, "
        f"vision {cfg.vision.depth} x {cfg.vision.embed_dim})"
    )
    return {"source": "fresh", "parameters": n, "vocab": max(special_ids.values()) + 1, "corpus_lines": len(corpus)}

"""A toy language model in the Qwen2-VL parameter layout (stacked layers, norms, biases, a 'visual' branch) for
the training-machinery tests: instant to build, a few hundred parameters."""

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax.training.optimizer import OptimizerSettings

V, D, H, L = 32, 16, 24, 2


def toy_params(seed=0):
    """A toy LM in the Qwen2-VL parameter layout: stacked layers, norms, biases, a 'visual' branch."""
    rng = np.random.default_rng(seed)
    n = lambda shape, s=0.3: jnp.asarray(s * rng.standard_normal(shape), jnp.float32)
    return {
        "visual": {"proj": {"kernel": n((4, D)), "bias": jnp.full((D,), 0.1)}},  # weakly typed on purpose
        "model": {
            "embed_tokens": {"embedding": n((V, D), 1.0)},
            "layers": {
                "input_layernorm": {"weight": jnp.ones((L, D))},
                "mlp": {"up_proj": {"kernel": n((L, D, H))}, "down_proj": {"kernel": n((L, H, D))}},
            },
            "norm": {"weight": jnp.ones((D,))},
        },
        "lm_head": {"kernel": n((D, V))},
    }


def rms(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w


def toy_logits(params, batch, rng, dropout=0.0):
    """input_ids int32[B, T], pixels f32[B, 4] -> logits f32[B, T, V]. Causal through a running mean."""
    h = params["model"]["embed_tokens"]["embedding"][batch["input_ids"]]
    vis = batch["pixels"] @ params["visual"]["proj"]["kernel"] + params["visual"]["proj"]["bias"]
    h = h.at[:, 0].add(vis.astype(h.dtype))

    def layer(h, p):
        x = rms(h, p["input_layernorm"]["weight"])
        x = jax.nn.gelu(x @ p["mlp"]["up_proj"]["kernel"]) @ p["mlp"]["down_proj"]["kernel"]
        t = jnp.arange(1, h.shape[1] + 1, dtype=h.dtype)[None, :, None]
        return h + x + jnp.cumsum(x, axis=1) / t, None

    h, _ = jax.lax.scan(layer, h, params["model"]["layers"])
    if dropout:
        keep = jax.random.bernoulli(rng, 1.0 - dropout, h.shape)
        h = jnp.where(keep, h / (1.0 - dropout), 0.0)
    return (rms(h, params["model"]["norm"]["weight"]) @ params["lm_head"]["kernel"]).astype(jnp.float32)


def toy_batch(seed, b=2, t=8, n_masked=None):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, (b, t)).astype(np.int32)
    mask = np.zeros((b, t), np.int32)
    for i in range(b):
        start = rng.integers(1, t - 1) if n_masked is None else t - n_masked[i]
        mask[i, start:] = 1
    return {"input_ids": ids, "loss_mask": mask, "pixels": rng.normal(size=(b, 4)).astype(np.float32)}


def opt_config(**kw) -> OptimizerSettings:
    """The optimizer defaults with a fast toy schedule, updated by ``kw``."""
    return OptimizerSettings(**{"learning_rate": 1e-2, "warmup_steps": 2, "total_steps": 10, **kw})


def toy_sft_step(logits_fn, optimizer, schedule=None, **options):
    """The jitted SFT update of ``training.step.train_step_fn`` for a toy ``logits_fn(params, batch, rng)``: mean
    next-token NLL over ``loss_mask`` (``training.sft.sft_loss``), weighted by tokens, the state donated."""
    from ipl_jax.training.sft import sft_loss
    from ipl_jax.training.step import train_step_fn

    def loss_fn(params, batch, rng):
        return sft_loss(logits_fn(params, batch, rng), batch["input_ids"], batch["loss_mask"])

    step = train_step_fn(loss_fn, optimizer, schedule=schedule, weight_key="tokens", **options)
    return jax.jit(step, donate_argnums=(0,))


def toy_sft_loss(logits_fn):
    """``loss_fn(params, batch, rng)`` of ``toy_sft_step``."""
    from ipl_jax.training.sft import sft_loss

    return lambda params, batch, rng: sft_loss(logits_fn(params, batch, rng), batch["input_ids"], batch["loss_mask"])

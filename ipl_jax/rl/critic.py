"""The PPO critic: a separate copy of the policy's model with a two-stream value head, and GiGPPO's sibling net.

Why a separate critic rather than a value head on the policy [choice, as the seed does: its critic is the SFT
checkpoint with a fresh value head]: (1) critic warm-up trains the critic alone, which a shared trunk could not
do without moving the policy; (2) the two learn at rates two orders of magnitude apart (the seed: 1e-6 policy,
1e-4 critic), which needs two optimizers; (3) the value loss never touches the policy's weights, so the policy
changes only through the clipped objective and its KL leash. The cost is a second set of weights and one forward
per state over a short row (screen, instruction, history: ``rl.sampling.state_row_spec``).

    critic params = {"model": Qwen2-VL params (a copy of the policy's), "head": {kernel f32[H, 2], bias f32[2]},
                     "sibling": {w1 f32[H + 4, S], b1 f32[S], w2 f32[S, 2], b2 f32[2]}}

The value of a state is ``head(h) (+ sibling(h, φ) with GiGPPO)``, h the final hidden state at the state row's
last token, φ the nearest sibling's features (``advantages.sibling_features``). Column 0 estimates the terminal
(success) return, column 1 the dense step-reward return. The head and the sibling net's output layer start at
zero, so a fresh critic predicts 0 and GiGPPO starts equal to PPO.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.rl.advantages import SIBLING_FEATURES
from ipl_jax.rl.rows import Rows, last_hidden

VALUE_STREAMS = 2  # terminal, dense
CRITIC_VISION_REGEX = r"^model/visual/"


def init_critic(policy_params: dict, cfg: Qwen2VLConfig, rng, sibling_width: int = 64) -> dict:
    """Critic params: a copy of ``policy_params`` as the trunk, a zero value head, the sibling net (first layer
    ~N(0, 1/fan_in), output layer zero)."""
    h = cfg.text.hidden_size
    w1 = jax.random.normal(jnp.asarray(rng), (h + SIBLING_FEATURES, sibling_width), jnp.float32)
    return {
        "model": jax.tree.map(lambda x: jnp.array(x, copy=True), policy_params),
        "head": {"kernel": jnp.zeros((h, VALUE_STREAMS), jnp.float32), "bias": jnp.zeros((VALUE_STREAMS,))},
        "sibling": {
            "w1": w1 / jnp.sqrt(h + SIBLING_FEATURES),
            "b1": jnp.zeros((sibling_width,)),
            "w2": jnp.zeros((sibling_width, VALUE_STREAMS)),
            "b2": jnp.zeros((VALUE_STREAMS,)),
        },
    }


def value_from_hidden(critic: dict, h: jax.Array, sibling: jax.Array | None) -> jax.Array:
    """f32[R, 2] from state summaries h f32[R, H] and, with GiGPPO, sibling features f32[R, 4]."""
    v = h @ critic["head"]["kernel"] + critic["head"]["bias"]
    if sibling is not None:
        s = critic["sibling"]
        z = jax.nn.gelu(jnp.concatenate([h, sibling], axis=-1) @ s["w1"] + s["b1"])
        v = v + z @ s["w2"] + s["b2"]
    return v


def critic_values(
    critic: dict, cfg: Qwen2VLConfig, rows: Rows, sibling: jax.Array | None = None, remat: bool = False
) -> jax.Array:
    """Values f32[R, 2] (terminal, dense) of the states in ``rows`` (``rl.sampling.state_row_spec`` rows)."""
    h = last_hidden(critic["model"], cfg, rows, remat)
    return value_from_hidden(critic, h, sibling)


critic_values_jit = jax.jit(
    lambda c, cfg, rows, sib: jax.lax.stop_gradient(critic_values(c, cfg, rows, sib)), static_argnums=(1,)
)

"""The PPO critic: a separate copy of the policy's model (so critic training never moves the policy) with a
two-stream value head (terminal, dense) and GiGPPO's sibling net; output layers start at zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.sharding import param_shardings
from ipl_jax.rl.advantages import SIBLING_FEATURES
from ipl_jax.rl.rows import Rows, last_hidden
from ipl_jax.training.state import TrainState, train_state_shardings

VALUE_STREAMS = 2  # terminal, dense
CRITIC_VISION_REGEX = r"^model/visual/"


def init_critic(policy_params: dict, cfg: Qwen2VLConfig, rng, sibling_width: int = 64) -> dict:
    """Critic params: a copy of ``policy_params``, a zero value head, the sibling net (output layer zero)."""
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


def critic_state_shardings(state: TrainState, optimizer, mesh) -> TrainState:
    """NamedShardings of the critic's TrainState: its model copy (trained and frozen parts) by the model's partition
    rules, as the policy's; the value head and the sibling net replicated; moments follow their params."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def tree(params: dict) -> dict:
        return {
            k: param_shardings(v, mesh) if k == "model" else jax.tree.map(lambda _: replicated, v)
            for k, v in params.items()
        }

    return train_state_shardings(state, optimizer, mesh, tree(state.params), tree(state.frozen))


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

"""ipl-jax: MobileIPL (iterative preference learning for mobile GUI agents) in JAX/Flax."""

__version__ = "0.1.0"

__all__ = ["train_round"]


def __getattr__(name):
    # ``from ipl_jax import train_round`` without importing jax for every ``import ipl_jax`` (PEP 562).
    if name == "train_round":
        from ipl_jax.preference.tdpo import train_round

        return train_round
    raise AttributeError(f"module 'ipl_jax' has no attribute {name!r}")

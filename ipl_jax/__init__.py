"""ipl-jax: MobileIPL (iterative preference learning for mobile GUI agents) in JAX/Flax."""

__version__ = "0.1.0"

"""TensorFlow Datasets for ipl-jax: builders (``ipl_synthetic``, ``ipl_aitz``; importing this package registers
them) and the ``tfds:NAME`` data format (``source``). Needs the ``tfds`` extra: ``pip install 'ipl-jax[tfds]'``."""

from ipl_jax.data.tfds.builders import IplAitz, IplSynthetic

__all__ = ["IplAitz", "IplSynthetic"]

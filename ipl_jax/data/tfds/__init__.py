"""TensorFlow Datasets for ipl-jax: the ``ipl_aitz`` builder (importing this package registers it; the synthetic
world's ``ipl_synthetic`` is ``ipl_jax.envs.synthetic.tfds_builder``) and the ``tfds:NAME`` data format
(``source``), which reads any prepared copy. Needs the ``tfds`` extra: ``pip install 'ipl-jax[tfds]'``."""

from ipl_jax.data.tfds.builders import IplAitz

__all__ = ["IplAitz"]

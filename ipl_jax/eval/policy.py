"""Loading a policy for evaluation and sampling from a Hugging Face checkpoint directory."""

from __future__ import annotations

from pathlib import Path

from ipl_jax.data.image_processing import ImageProcessorConfig
from ipl_jax.data.tokenizer import load_tokenizer
from ipl_jax.model import load_params, param_shapes
from ipl_jax.model.config import Qwen2VLConfig
from ipl_jax.model.sharding import make_mesh, param_shardings


def load_policy(checkpoint: str, mesh: bool = False):
    """(params, cfg, tokenizer, image_config, mesh or None) from a Hugging Face directory; with ``mesh``, weights
    load straight into their shardings on a ('data', 'fsdp', 'tensor') mesh over every device."""

    directory = Path(checkpoint)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
    the_mesh, shardings = None, None
    cfg = Qwen2VLConfig.from_dir(directory)
    image_config = ImageProcessorConfig.load_for_model(directory, cfg)  # checked before any weight loads
    if mesh:
        the_mesh = make_mesh()
        shardings = param_shardings(param_shapes(cfg), the_mesh)
    params, cfg = load_params(str(directory), shardings=shardings)
    tokenizer = load_tokenizer(directory)
    return params, cfg, tokenizer, image_config, the_mesh

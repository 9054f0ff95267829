"""Loading a policy for evaluation and sampling from a Hugging Face checkpoint directory."""

from __future__ import annotations

from pathlib import Path

from ipl_jax.data.image_processing import PREPROCESSOR_CONFIG, ImageProcessorConfig
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
    if mesh:
        the_mesh = make_mesh()
        shardings = param_shardings(param_shapes(Qwen2VLConfig.from_dir(directory)), the_mesh)
    params, cfg = load_params(str(directory), shardings=shardings)
    tokenizer = load_tokenizer(directory)
    image_config = (
        ImageProcessorConfig.load(directory) if (directory / PREPROCESSOR_CONFIG).is_file() else ImageProcessorConfig()
    )
    return params, cfg, tokenizer, image_config, the_mesh

"""A small Qwen2-VL (width 32, 2 layers, patch size 2, vocabulary 64 with the vision ids at its end) for the
training, packing and T-DPO tests, its random weights, and random inputs for it: SFT batches and prefix groups."""

import jax
import jax.numpy as jnp
import numpy as np

from ipl_jax import model as M
from ipl_jax.data.batching import TrainingBatch
from ipl_jax.model import param_shapes
from ipl_jax.model.sizes import Size, SpecialIds, small_config
from ipl_jax.preference import packed_batch as PB
from ipl_jax.preference import packing as PK

IMG, VS, VE = 60, 62, 63
SIZE = Size(32, 2, 4, 2, 64, 64, 16, 1, 2, mlp_ratio=2, patch_size=2)


def tiny_cfg():
    return small_config(SIZE, ids=SpecialIds(IMG, 61, VS, VE, eos=2), bos_token_id=1, pad_token_id=0)


def tiny_params(cfg, seed=0):
    """``init_params`` weights with std 0.3."""
    return M.init_params(cfg, jax.random.PRNGKey(seed), std=0.3)


def numpy_params(cfg, seed=0, std=0.5):
    """Random weights drawn with numpy (instant; jax.random would compile one kernel per leaf shape): norm scales
    1 + N(0, 0.1), the rest N(0, std)."""
    rng = np.random.default_rng(seed)

    def draw(path, shape):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            return jnp.asarray(1.0 + 0.1 * rng.standard_normal(shape.shape), jnp.float32)
        return jnp.asarray(std * rng.standard_normal(shape.shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(draw, param_shapes(cfg))


def tiny_training_batch(cfg, seed, b=4, t=32, patch_bucket=96, empty_rows=0):
    """A collated-style TrainingBatch: each used row = text, <vs>, image pads (grid 1×4×4 or 1×4×6), <ve>, text,
    with the loss on a random tail (the 'assistant' reply)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((b, t), np.int32)
    att = np.zeros((b, t), bool)
    loss = np.zeros((b, t), np.int32)
    grids, pixels = [], []
    for r in range(b - empty_rows):
        h, w = 4, int(rng.choice([4, 6]))
        n_img = h * w // 4
        row = [*rng.integers(3, 59, 3), 62, *[60] * n_img, 63, *rng.integers(3, 59, int(rng.integers(4, 12)))]
        ids[r, : len(row)], att[r, : len(row)] = row, True
        loss[r, len(row) - int(rng.integers(2, 6)) : len(row)] = 1
        grids.append([1, h, w])
        pixels.append(rng.normal(size=(h * w, cfg.vision.patch_dim)).astype(np.float32))
    pv = np.concatenate(pixels)
    padded = np.zeros((patch_bucket, pv.shape[1]), np.float32)
    padded[: len(pv)] = pv
    patch_mask = np.arange(patch_bucket) < len(pv)
    grid_arr = np.zeros((b, 3), np.int64)
    grid_arr[: len(grids)] = grids
    return TrainingBatch(
        input_ids=ids,
        attention_mask=att,
        loss_mask=loss,
        turn_index=loss.copy(),
        pixel_values=padded,
        patch_mask=patch_mask,
        image_grid_thw=grid_arr,
        image_mask=np.arange(b) < len(grids),
    )


def make_groups(cfg, seed=0, n_groups=3, conts=(3, 2, 4), scored_groups=()):
    """Groups with an image prefix (grid 1x4x4 or 1x4x6 -> 4 or 6 image tokens) and random continuations of
    1..4 tokens; groups in ``scored_groups`` score a random subset of their continuation tokens."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(n_groups):
        h, w = 4, int(rng.choice([4, 6]))
        n_img = h * w // 4
        prefix = [*rng.integers(3, 59, 2), VS, *[IMG] * n_img, VE, *rng.integers(3, 59, int(rng.integers(2, 7)))]
        cs = tuple(
            np.asarray(rng.integers(3, 59, int(rng.integers(1, 5))), np.int32) for _ in range(conts[g % len(conts)])
        )
        scored = None
        if g in scored_groups:
            scored = tuple(rng.random(len(c)) < 0.6 for c in cs)
        pv = rng.normal(size=(h * w, cfg.vision.patch_dim)).astype(np.float32)
        groups.append(
            PB.PrefixGroup(
                prefix_ids=np.asarray(prefix, np.int32),
                continuations=cs,
                pixel_values=pv,
                image_grid_thw=np.array([[1, h, w]]),
                scored=scored,
                name=f"g{g}",
            )
        )
    return groups


def packed_round(cfg, groups, pairs):
    """The one packed batch of ``groups`` and ``pairs`` in 4 rows of 64 tokens (32 patches), 4 pairs at most."""
    packing = PB.PackingConfig(rows=4, max_continuations=4, max_pairs=4, text_buckets=(64,), patch_buckets=(32,))
    (batch,) = PK.pack_round(cfg, groups, pairs, packing)
    return batch


def tiny_moe_cfg():
    """``tiny_cfg`` as a Qwen3-VL-MoE: Qwen3's decoder with every MLP 4 experts of width 12, two per token, and
    Qwen3-VL's tower (GELU-tanh, a 4 x 4 position grid, DeepStack from block 0); the same ids and patches."""
    import dataclasses

    cfg = tiny_cfg()
    text = dataclasses.replace(
        cfg.text,
        qk_norm=True,
        qkv_bias=False,
        o_bias=False,
        mrope_interleaved=True,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=12,
    )
    vision = dataclasses.replace(
        cfg.vision, hidden_act="gelu_pytorch_tanh", num_position_embeddings=16, deepstack_visual_indexes=(0,)
    )
    return cfg.replace(model_type="qwen3_vl", text=text, vision=vision)

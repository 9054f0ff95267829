"""The RL baselines as job settings: the ``rl`` section, its checks, the equal budget and the ablation's
online / budget table (no model needed; the end-to-end ablation is in test_pipeline_run.py)."""

from __future__ import annotations

import pytest

from ipl_jax.configs.loader import load_settings
from ipl_jax.pipeline.rl_round import grpo_prompts, round_budget
from ipl_jax.pipeline.sources import check_job
from ipl_jax.settings import SettingsError


def _settings(name="synthetic:quick", **overrides):
    return load_settings(name, [f"--config.{k}={v}" for k, v in overrides.items()])


def test_equal_budget_of_the_shipped_configs():
    """One round of any method spends the T-DPO round's sampled completions: steps_per_round x leaves."""
    quick, default = _settings(), _settings("synthetic")
    assert round_budget(quick.ipl, quick.sampler.tree.branching) == 4 * 8 == 32  # branching (2, 2, 2, 1)
    assert round_budget(default.ipl, default.sampler.tree.branching) == 48 * 27 == 1296  # branching (3, 3, 3, 1)
    assert grpo_prompts(32, quick.rl.grpo.group_size) * 8 == 32
    assert grpo_prompts(1728, 8) == 216 and grpo_prompts(1735, 8) == 216  # whole groups: never over budget
    assert grpo_prompts(5, 8) == 1  # at least one group
    frac = _settings(**{"ipl.round_fraction": 0.5})
    assert round_budget(frac.ipl, frac.sampler.tree.branching, 10) == 5 * 8
    with pytest.raises(ValueError, match="round_fraction"):
        round_budget(frac.ipl, frac.sampler.tree.branching)


def test_rl_variants_are_method_switches():
    from ipl_jax.pipeline.ablate import LABELS, VARIANTS, _ipl_key, variant_settings

    base = _settings()
    keys = set()
    for name in ("tdpo", "grpo", "ppo", "gigppo"):
        vc = variant_settings(base, name)
        assert vc.ipl.method == name and vc.ipl.rounds == base.ablation.rounds and vc.ipl.early_stop is False
        assert vc.seed == base.seed and vc.rl == base.rl  # the same seed, the same RL settings
        check_job(vc, n_devices=1)
        keys.add(_ipl_key(vc))
        assert name in VARIANTS and name in LABELS
    assert len(keys) == 4  # four distinct runs


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"rl.grpo.group_size": 0}, r"^config\.rl\.grpo\.group_size=0: must be >= 1 \(fix it with"),
        ({"rl.grpo.style": "free"}, r"^config\.rl\.grpo\.style='free': must be one of coat, think_answer"),
        ({"rl.ppo.lam": 1.5}, r"^config\.rl\.ppo\.lam=1\.5: must be in \[0, 1\]"),
        ({"rl.ppo.step_reward": "x"}, r"^config\.rl\.ppo\.step_reward='x': must be one of leaf, uir1"),
        ({"rl.ppo.critic_warmup": -1}, r"^config\.rl\.ppo\.critic_warmup=-1: must be >= 0"),
        ({"rl.row_buckets": "()"}, r"^config\.rl\.row_buckets=\(\): must be one or more lengths"),
        ({"eval.online_episodes": -1}, r"^config\.eval\.online_episodes=-1: must be >= 0"),
        (
            {"eval.online_splits": "nope"},
            r"^config\.eval\.online_splits=\('nope',\): must name one or more of train, dev",
        ),
        ({"ipl.method": "ppo", "ipl.lora_rank": 4}, r"^config\.ipl\.lora_rank=4: must be 0 with ipl\.method=ppo"),
        (
            {"ipl.method": "gigppo", "rl.ppo.trajectories_per_task": 1},
            r"^config\.rl\.ppo\.trajectories_per_task=1: must be >= 2 with gigppo",
        ),
        (
            {"ipl.method": "ppo", "data.format": "tfds:x", "eval.online_episodes": 0},
            r"^config\.data\.format='tfds:x': must be synthetic with ipl\.method=ppo",
        ),
        ({"data.format": "tfds:x"}, r"^config\.eval\.online_episodes=4: online evaluation plays the synthetic world"),
    ],
)
def test_bad_rl_settings_are_one_line_errors(overrides, message):
    with pytest.raises(SettingsError, match=message) as e:
        _settings(**overrides)
    assert "\n" not in str(e.value)


def test_grpo_on_another_dataset_is_allowed():
    """GRPO needs no live world: only the online methods are tied to the synthetic format."""
    s = _settings(**{"ipl.method": "grpo", "data.format": "tfds:x", "eval.online_episodes": 0})
    assert s.ipl.method == "grpo" and s.data.format == "tfds:x"


def test_config_files_load_without_jax():
    """A config file builds its sections (``rl`` and ``world`` included) without importing the learners (or
    JAX)."""
    import subprocess
    import sys

    code = "import sys, ipl_jax.configs.synthetic as s; s.get_config(); print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

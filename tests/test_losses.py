import math

import jax.numpy as jnp
import numpy as np
import pytest

from ipl_jax.preference import losses


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_tdpo_matches_direct_formula_with_and_without_sft():
    pp, pn, rp, rn = [-3.0, -1.0, -2.0], [-4.0, -0.5, -9.0], [-3.5, -1.2, -2.0], [-3.8, -0.7, -1.0]
    ntok = [3.0, 2.0, 5.0]
    valid = [True, True, False]
    for lam in (0.0, 1.0):
        cfg = losses.DPOSettings(beta=0.1, sft_weight=lam)
        loss, m = losses.tdpo_loss(*(jnp.array(v) for v in (pp, pn, rp, rn, ntok)), jnp.array(valid), cfg)
        want_pref = np.mean([-math.log(_sig(0.1 * ((pp[i] - rp[i]) - (pn[i] - rn[i])))) for i in (0, 1)])
        want_sft = np.mean([-pp[i] / ntok[i] for i in (0, 1)])
        assert float(loss) == pytest.approx(want_pref + lam * want_sft, rel=1e-6)
        assert float(m["pairs"]) == 2.0
        assert float(m["reward_accuracy"]) == pytest.approx(1.0)


def test_dpo_variants_known_values():
    args = [jnp.array([v]) for v in (-1.0, -2.0, -1.5, -1.5)]  # h = 0.5 - (-0.5) = 1.0
    l, margin = losses.dpo_pair_losses(*args, beta=0.5, kind="sigmoid")
    assert float(margin[0]) == pytest.approx(0.5)
    assert float(l[0]) == pytest.approx(-math.log(_sig(0.5)), rel=1e-6)
    l, _ = losses.dpo_pair_losses(*args, beta=0.5, kind="ipo")
    assert float(l[0]) == pytest.approx((1.0 - 1.0) ** 2)
    l, _ = losses.dpo_pair_losses(*args, beta=0.5, kind="hinge")
    assert float(l[0]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        losses.dpo_pair_losses(*args, beta=0.5, kind="nope")

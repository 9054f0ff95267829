"""The ablation over seeds: each seed's gains and T-DPO's paired differences summed up by hand-checkable numbers
(mean, sample sd, seeds ahead), and the table that prints them; ``--seeds`` names a bad list in one line; variants
of one's own (``--variant``) start from a built-in one and change round settings only."""

import math
import re

import pytest

from ipl_jax.pipeline.ablate import (
    VARIANTS,
    format_ablation,
    format_seeds,
    parse_variant,
    summarize_seeds,
    variant_settings,
)


def _g(gain: float) -> dict:
    return {"gain": gain, "low": gain - 0.03, "high": gain + 0.03, "width": 0.06, "level": 0.95, "n_boot": 10}


def _result(seed: int, start_total: float, tdpo: list[float], control: list[float], minus: list[float]) -> dict:
    rows = [
        {"variant": "start", "label": "starting policy (no IPL)", "mean_total": start_total, "metrics": {}},
        {"variant": "tdpo", "label": "T-DPO (full)", "round_gains": [_g(x) for x in tdpo], "gain": _g(tdpo[-1])},
        {
            "variant": "continued_sft",
            "label": "continued SFT (control)",
            "round_gains": [_g(x) for x in control],
            "gain": _g(control[-1]),
            "tdpo_minus": [_g(x) for x in minus],
        },
    ]
    return {"seed": seed, "splits": ["test"], "rounds": len(tdpo), "rows": rows}


def test_summary_over_seeds_is_the_mean_and_sample_sd_of_each_seeds_gain():
    results = [
        _result(0, 0.20, [0.02, 0.04, 0.05], [0.01, 0.00, 0.01], [0.01, 0.04, 0.04]),
        _result(3, 0.30, [0.00, 0.02, 0.03], [0.02, 0.03, 0.04], [-0.02, -0.01, -0.01]),
    ]
    s = summarize_seeds(results)
    assert s["seeds"] == [0, 3] and s["rounds"] == 3
    assert s["start_total"]["mean"] == pytest.approx(0.25) and s["start_total"]["sd"] == pytest.approx(
        0.1 / math.sqrt(2)
    )
    tdpo, control = s["variants"]
    assert tdpo["variant"] == "tdpo" and "tdpo_minus" not in tdpo
    assert tdpo["gain"]["mean"] == pytest.approx(0.04) and tdpo["gain"]["sd"] == pytest.approx(0.02 / math.sqrt(2))
    assert [m["mean"] for m in tdpo["round_gain"]] == pytest.approx([0.01, 0.03, 0.04])
    assert [m["n"] for m in control["round_gain"]] == [2, 2, 2]
    assert control["tdpo_minus_mean"]["mean"] == pytest.approx(0.015) and control["tdpo_ahead"] == 1
    assert [d["gain"] for d in control["tdpo_minus"]] == [0.04, -0.01]
    table = format_seeds(s)
    assert "+4.0 ± 1.4" in table  # T-DPO: mean +4.0, sd 1.41 points
    control_line = next(line for line in table.splitlines() if "continued SFT" in line and "1/2" in line)
    assert "+1.5 ± 3.5" in control_line and "+4.0 [+1.0, +7.0]" in control_line  # T-DPO minus control
    assert "+5.0 [+2.0, +8.0]" in table and "+3.0 [+0.0, +6.0]" in table  # each seed's interval
    assert "(starting policy 25.0 ± 7.1)" in table
    # a summary written before the starting policy had its own word (seed_total) prints the same table
    older = {("seed_total" if k == "start_total" else k): v for k, v in s.items()}
    assert format_seeds(older) == table


def test_one_seed_has_no_spread_and_the_single_seed_table_shows_each_round():
    one = _result(1, 0.2, [0.01, 0.02], [0.0, 0.01], [0.01, 0.01])
    s = summarize_seeds([one])
    assert s["variants"][0]["gain"] == {"mean": 0.02, "sd": 0.0, "n": 1}
    text = format_ablation({**one, "rows": [{**r, "metrics": {}} for r in one["rows"]]})
    assert "r1 +1.0 [-2.0, +4.0]  r2 +2.0 [-1.0, +5.0]" in text and "T-DPO minus r1 +1.0" in text


def test_no_results_is_an_error():
    with pytest.raises(ValueError, match="no ablation results"):
        summarize_seeds([])


def test_own_variant_starts_from_a_built_in_one_and_changes_round_settings():
    from ipl_jax.configs.loader import load_settings

    base = load_settings("synthetic:quick", ["--config.ablation.rounds=3"])
    name, switches = parse_variant("noneg_b05=no_negatives ipl.dpo.beta=0.5 ipl.pair_turns=3,4 rl.grpo.group_size=4")
    assert name == "noneg_b05" and switches["ipl.method"] == "no_negatives"
    s = variant_settings(base, name, {**VARIANTS, name: switches})
    assert (s.ipl.method, s.ipl.dpo.beta, s.ipl.pair_turns, s.rl.grpo.group_size) == ("no_negatives", 0.5, (3, 4), 4)
    assert (s.ipl.rounds, s.ipl.early_stop, s.eval.every_round) == (3, False, True)  # as every ablation variant
    back = {"ipl.dpo.beta": base.ipl.dpo.beta, "ipl.pair_turns": base.ipl.pair_turns, "rl.grpo.group_size": 8}
    assert s.replace(back) == variant_settings(base, "no_negatives")  # nothing else changed
    _, alone = parse_variant("lr=ipl.later_learning_rate=1e-5")  # no base: the base job's method
    assert variant_settings(base, "lr", {"lr": alone}).ipl.later_learning_rate == 1e-5


@pytest.mark.parametrize(
    "text, message",
    [
        ("nobase", "expected NAME=[BASE] FIELD=VALUE"),
        ("Big=tdpo", "lower-case"),
        ("tdpo=ipl.dpo.beta=1", "'tdpo' is a built-in variant"),
        ("a=k9", "'k9' is neither a variant"),
        ("a=ipl.dpo.beta=1 tdpo", "'tdpo' is neither a variant"),  # a base comes first
        ("a=model.hidden_size=64", "not a round setting"),
        ("a=", "changes nothing"),
    ],
)
def test_own_variant_errors_name_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_variant(text)


def test_cli_runs_own_variants_after_the_named_ones(monkeypatch, tmp_path):
    from ipl_jax.cli import ablate as cli

    seen = {}

    def fake_run_seeds(settings, workdir, names, seeds, extra_variants=None):
        seen.update(names=list(names), seeds=list(seeds), own=extra_variants)
        return {"seeds": list(seeds)}

    monkeypatch.setattr(cli, "run_seeds", fake_run_seeds)
    monkeypatch.setattr(cli, "format_seeds", lambda summary: "table")
    argv = ["--config", "synthetic:quick", "--workdir", str(tmp_path), "--variants", "tdpo", "--seeds", "0,1"]
    assert cli.main([*argv, "--variant", "b05=tdpo ipl.dpo.beta=0.5"]) == 0
    assert seen["names"] == ["tdpo", "b05"] and seen["seeds"] == [0, 1]
    assert seen["own"] == {"b05": {"ipl.method": "tdpo", "ipl.dpo.beta": "0.5"}}

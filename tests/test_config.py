"""Config files + ``--config.a.b=value`` overrides: a file's ``get_config(arg)`` changes the defaults, and the
override text goes straight to the typed settings, parsed once by the field's declared type; a bad override is one
line naming the field."""

import argparse
import textwrap

import ml_collections
import pytest

from ipl_jax.configs.loader import (
    ConfigError,
    load_config,
    load_settings,
    parse_args_with_settings,
    parse_override_args,
)
from ipl_jax.settings import SettingsError

CONFIG_FILE = textwrap.dedent(
    """
    from ipl_jax.configs.loader import default_config

    def get_config(arg=None):
        c = default_config()
        c.sft.steps = 12 if arg == "short" else 34
        c.ipl.beta = 0.5
        return c
    """
)


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text(CONFIG_FILE)
    return path


def test_get_config_arg_and_typed_overrides(config_path):
    s = load_settings(
        f"{config_path}:short",
        [
            "--config.ipl.learning_rate=3e-4",
            "--config.ipl.warmup_steps",
            "7",
            "--config.sft.freeze_vision=true",
            "--config.buckets.tokens=(64, 512, 1_024)",
            "--config.data.test_splits=test,test_app_unseen",
            "--config.buckets.patches=96",
            "--config.model.checkpoint=/some/dir",
            "--config.seed=1_000",
            "--config.world.themes=('rose',)",
        ],
    )
    assert s.sft.steps == 12 and s.ipl.dpo.beta == 0.5  # the file's values (ipl.beta: its old name)
    assert s.ipl.learning_rate == 3e-4 and isinstance(s.ipl.learning_rate, float)
    assert s.ipl.warmup_steps == 7 and isinstance(s.ipl.warmup_steps, int)
    assert s.sft.freeze_vision is True and s.buckets.tokens == (64, 512, 1024) and s.buckets.patches == (96,)
    assert s.data.test_splits == ("test", "test_app_unseen") and s.world.themes == ("rose",)
    assert s.model.checkpoint == "/some/dir" and type(s.model.checkpoint) is str and s.seed == 1000
    assert load_settings(str(config_path)).sft.steps == 34  # no argument: get_config()
    assert load_settings(str(config_path), ["--config.sft.freeze_vision=off"]).sft.freeze_vision is False
    # the file's config is locked against new fields
    config = load_config(str(config_path))
    with pytest.raises(AttributeError):
        config.sft.stepz = 1


@pytest.mark.parametrize(
    "override, error, message",
    [
        ("--config.sft.stepz=1", ConfigError, r"unknown config field 'sft\.stepz' \(fields at sft: .*steps"),
        ("--config.nope.x=1", ConfigError, r"unknown config field 'nope\.x' \(fields at <top level>: ablation"),
        ("--config.seed=1.5", SettingsError, r"^config\.seed='1\.5': must be an integer \(fix it with --config\.seed"),
        ("--config.sft.freeze_vision=maybe", SettingsError, r"^config\.sft\.freeze_vision='maybe': must be true or"),
        ("--config.ipl.learning_rate=fast", SettingsError, r"^config\.ipl\.learning_rate='fast': must be a number"),
        (
            "--config.sampler.tree.branching=(1, 'a', 1, 1)",
            SettingsError,
            r"^config\.sampler\.tree\.branching='a': must be an",
        ),
        ("--config.sft=3", ConfigError, r"field 'sft' is a section, not a value"),
        ("--config.seed.x=3", ConfigError, r"unknown config field 'seed\.x' \(seed is a value, not a section\)"),
        ("garbage", ConfigError, r"expected --config\.FIELD=VALUE"),
    ],
)
def test_bad_overrides_are_one_line_naming_the_field(config_path, override, error, message):
    with pytest.raises(error, match=message) as e:
        load_settings(str(config_path), [override])
    assert "\n" not in str(e.value)


def test_missing_file_and_missing_get_config(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "absent.py"))
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="get_config"):
        load_config(str(bad))


def test_parse_override_args_forms():
    assert parse_override_args(["--config.a.b=1", "--config.c", "x=y", "d.e=2"]) == [
        ("a.b", "1"),
        ("c", "x=y"),
        ("d.e", "2"),
    ]


def test_config_dict_source_is_copied(config_path):
    base = load_config(str(config_path))
    s = load_settings(base, ["--config.sft.steps=2"])
    assert s.sft.steps == 2 and base.sft.steps == 34
    assert load_config(ml_collections.ConfigDict({"a": 1})).a == 1


def test_argparse_glue(config_path):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args, s = parse_args_with_settings(parser, ["--out", "o", "--config", f"{config_path}:short", "--config.seed=3"])
    assert args.out == "o" and s.seed == 3 and s.sft.steps == 12
    with pytest.raises(SystemExit):
        parse_args_with_settings(argparse.ArgumentParser(), ["--config", str(config_path), "--config.zz=1"])


def test_the_starting_policys_former_setting_names_still_work(capsys, monkeypatch):
    """``seed_selection`` is ``start_selection`` now (every field) and ``sft.seed_candidates`` is
    ``sft.start_candidates``: the old flags, a variant's switch and a recorded config.json still set them, each old
    name told once in one line."""
    from ipl_jax.settings import job
    from ipl_jax.settings.job import relocated

    monkeypatch.setattr(job, "_told", set())
    s = load_settings(
        "synthetic:quick",
        [
            "--config.seed_selection.steps=5",
            "--config.seed_selection.embedder=minilm",
            "--config.sft.seed_candidates=3",
        ],
    )
    assert (s.start_selection.steps, s.start_selection.embedder, s.sft.start_candidates) == (5, "minilm", 3)
    assert s.replace({"seed_selection.diversity_weight": 0.5}).start_selection.diversity_weight == 0.5
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "config.seed_selection is config.start_selection now; the old name still works",
        "config.sft.seed_candidates is config.sft.start_candidates now; the old name still works",
    ]
    old = {"seed": 1, "sft": {"steps": 4, "seed_candidates": 2}, "seed_selection": {"steps": 4, "embedder": "tfidf"}}
    assert relocated(old, tell=False) == {
        "seed": 1,
        "sft": {"steps": 4, "start_candidates": 2},
        "start_selection": {"steps": 4, "embedder": "tfidf"},
    }
    assert "seed_selection" in old  # the caller's dict is left as it was
    with pytest.raises(SystemExit):  # a field the section never had is still unknown under the old name
        parse_args_with_settings(
            argparse.ArgumentParser(), ["--config", "synthetic:quick", "--config.seed_selection.x=1"]
        )

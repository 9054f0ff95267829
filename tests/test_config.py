"""Config files + --config.a.b=value overrides."""

import argparse
import textwrap

import ml_collections
import pytest

from ipl_jax.configs.loader import ConfigError, load_config, parse_args_with_config, parse_override_args

CONFIG_FILE = textwrap.dedent(
    """
    import ml_collections

    def get_config(arg=None):
        c = ml_collections.ConfigDict()
        c.name = arg or "default"
        c.seed = 0
        c.optimizer = ml_collections.ConfigDict()
        c.optimizer.learning_rate = 1e-5
        c.optimizer.warmup_steps = 10
        c.optimizer.schedule = "cosine"
        c.optimizer.freeze_vision = False
        c.buckets = (128, 256)
        c.targets = ("q_proj", "v_proj")
        c.init_from = None
        c.size = ml_collections.config_dict.placeholder(int)
        return c
    """
)


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "toy.py"
    path.write_text(CONFIG_FILE)
    return path


def test_get_config_arg_and_typed_overrides(config_path):
    config = load_config(
        f"{config_path}:big",
        [
            "--config.optimizer.learning_rate=3e-4",
            "--config.optimizer.warmup_steps",
            "7",
            "--config.optimizer.freeze_vision=true",
            "--config.buckets=(64, 512, 1024)",
            "--config.targets=q_proj,k_proj",
            "--config.init_from=/some/dir",
            "--config.size=5",
        ],
    )
    assert config.name == "big"
    assert config.optimizer.learning_rate == 3e-4 and isinstance(config.optimizer.learning_rate, float)
    assert config.optimizer.warmup_steps == 7 and isinstance(config.optimizer.warmup_steps, int)
    assert config.optimizer.freeze_vision is True
    assert config.buckets == (64, 512, 1024)
    assert config.targets == ("q_proj", "k_proj")
    assert config.init_from == "/some/dir"
    assert config.size == 5
    # Untouched fields keep their defaults; the result is locked against new fields.
    assert config.optimizer.schedule == "cosine"
    with pytest.raises(AttributeError):
        config.optimizer.learning_rat = 1.0


def test_no_arg_uses_default(config_path):
    assert load_config(str(config_path)).name == "default"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("--config.optimizer.learning_rat=1", "learning_rat"),
        ("--config.nope.x=1", "nope"),
        ("--config.seed=1.5", "not an integer"),
        ("--config.optimizer.freeze_vision=maybe", "not a boolean"),
        ("--config.optimizer.learning_rate=fast", "not a number"),
        ("--config.buckets=(1, 'a')", "elements must be int"),
        ("--config.optimizer=3", "is a section"),
        ("--config.seed.x=3", "is a value"),
        ("garbage", "expected --config.FIELD=VALUE"),
    ],
)
def test_bad_overrides_name_the_field(config_path, override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(str(config_path), [override])


def test_unknown_field_lists_known_fields(config_path):
    with pytest.raises(ConfigError) as e:
        load_config(str(config_path), ["--config.optimizer.lr=1"])
    message = str(e.value)
    assert str(config_path) in message and "learning_rate" in message and "warmup_steps" in message


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


def test_config_dict_source_is_copied():
    base = ml_collections.ConfigDict({"a": 1})
    config = load_config(base, ["--config.a=2"])
    assert config.a == 2 and base.a == 1


def test_argparse_glue(config_path):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args, config = parse_args_with_config(parser, ["--out", "o", "--config", f"{config_path}:x", "--config.seed=3"])
    assert args.out == "o" and config.seed == 3 and config.name == "x"
    with pytest.raises(SystemExit):
        parse_args_with_config(argparse.ArgumentParser(), ["--config", str(config_path), "--config.zz=1"])

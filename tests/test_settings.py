"""The job's typed settings: every shipped config reads into them, a bad value / field / type is one line naming the
dotted field, the machine checks (dtypes, mesh), and no module below the job's edge sees a config dict."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from ipl_jax.configs.loader import CONFIG_DIR, load_config, load_settings
from ipl_jax.settings import IPLSettings, Settings, SettingsError

PACKAGE = Path(__file__).resolve().parent.parent / "ipl_jax"
SHIPPED = sorted(
    p.stem for p in CONFIG_DIR.glob("*.py") if p.stem not in ("__init__", "loader", "sections", "paper_base")
)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_reads_into_settings(name):
    settings = load_settings(name)
    assert (
        isinstance(settings.ipl, IPLSettings) and settings.to_dict() == Settings.from_dict(settings.to_dict()).to_dict()
    )
    # the typed values are the config's own
    assert settings.to_dict()["sft"] == load_config(name).sft.to_dict()


def test_values_are_typed():
    s = load_settings(
        "synthetic:quick", ["--config.ipl.learning_rate=1", "--config.sampler.tree.branching=[2, 2, 2, 1]"]
    )
    assert s.ipl.learning_rate == 1.0 and isinstance(s.ipl.learning_rate, float)
    assert s.sampler.tree.branching == (2, 2, 2, 1) and isinstance(s.sampler.tree.branching, tuple)
    assert s.sft.micro == s.sft.micro_batch_size == 4 and s.data.split_names()[:2] == ["train", "dev"]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ("sft", "steps", "many"),
            r"^config\.sft\.steps='many': must be an integer \(fix it with --config\.sft\.steps",
        ),
        (("sft", "freeze_vision", 1), r"^config\.sft\.freeze_vision=1: must be true or false"),
        (("sampler", "branching", (2, 2)), r"^config\.sampler\.tree\.branching=\(2, 2\): must be four integers >= 1"),
        (("sft", "micro_batch_size", 3), r"^config\.sft\.micro_batch_size=3: must divide sft\.batch_size"),
        (
            ("reward", "v_type", 0.95),
            r"^config\.reward\.shares\.v_format=0\.1: reward\.shares\.v_type \+ reward\.shares\.v_format must be",
        ),
        # fields a library declares (preference/sections.py, coat/sections.py), checked in the job's section too;
        # the ipl ones set by their old names (ipl.beta is ipl.dpo.beta now): the error names where they live
        (("ipl", "loss_kind", "kto"), r"^config\.ipl\.dpo\.loss_kind='kto': must be one of sigmoid, ipo, hinge"),
        (("ipl", "beta", 0.0), r"^config\.ipl\.dpo\.beta=0\.0: must be > 0"),
        (("ipl", "sft_norm", "mean"), r"^config\.ipl\.dpo\.sft_norm='mean': must be one of token, sum"),
        (("ipl", "type_balance", -1.0), r"^config\.ipl\.selection\.type_balance=-1\.0: must be >= 0"),
        (("reward", "v_type", -0.1), r"^config\.reward\.shares\.v_type=-0\.1: must be >= 0"),
        (("sampler", "top_p", 1.5), r"^config\.sampler\.tree\.top_p=1\.5: must be in \(0, 1\]"),  # sampling/sections.py
        (
            ("sampler", "prefix_buckets", ()),
            r"^config\.sampler\.tree\.prefix_buckets=\(\): must be one or more lengths",
        ),
        (("sft", "stepz", 3), r"^config\.sft: unknown field\(s\) stepz \(fields: steps, batch_size, "),
        (("mesh", "data", 0), r"^config\.mesh \(data, fsdp, tensor\) = \(0, 1, 1\): sizes must be >= 1"),
        # a fresh model's shape: the model config's fields (the old flat names name where they live now)
        (("model", "hidden_size", "wide"), r"^config\.model\.text\.hidden_size='wide': must be an integer"),
        (
            ("model", "num_attention_heads", 3),
            r"^config\.model\.text / config\.model\.vision \(a fresh model's shape\): text hidden_size 128 is not "
            r"divisible by heads 3$",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_field(change, message):
    section, field, value = change
    values = load_settings("synthetic:quick").to_dict()
    values[section][field] = value
    with pytest.raises(SettingsError, match=message) as e:
        Settings.from_dict(values)
    assert "\n" not in str(e.value)


def test_the_tree_sampler_checks_its_settings_as_the_job_does():
    """``SamplerConfig`` (the sampler's static config) extends the declaration the job's ``sampler.tree`` is
    (``sampling.sections.TreeSampling``): the same fields, defaults and one-line errors."""
    import dataclasses

    from ipl_jax.sampling.config import SamplerConfig
    from ipl_jax.sampling.sections import TreeSampling

    declared = {f.name: f.default for f in dataclasses.fields(TreeSampling)}
    assert {f.name: f.default for f in dataclasses.fields(SamplerConfig) if f.name in declared} == declared
    assert Settings().sampler.tree == TreeSampling()
    for field, value in (("top_p", 0.0), ("top_k", -1), ("branching", (3, 3, 1)), ("prompt_buckets", (0, 8))):
        values = load_settings("synthetic:quick").to_dict()
        values["sampler"][field] = value
        with pytest.raises(SettingsError) as job:
            Settings.from_dict(values)
        with pytest.raises(SettingsError) as library:
            SamplerConfig(eos_ids=(1,), **{field: value})
        assert str(library.value) == str(job.value) and "\n" not in str(job.value), field


def test_a_missing_field_or_section_is_named():
    values = load_settings("synthetic:quick").to_dict()
    del values["ipl"]["rounds"]
    with pytest.raises(SettingsError, match=r"^config\.ipl: missing field\(s\) rounds$"):
        Settings.from_dict(values)
    del values["ipl"]
    with pytest.raises(SettingsError, match=r"^the config: missing field\(s\) ipl$"):
        Settings.from_dict(values)


def test_replace_checks_again():
    s = load_settings("synthetic:quick")
    t = s.replace({"ipl.method": "naive_dpo", "rl.ppo.max_steps": 3})
    assert (t.ipl.method, t.rl.ppo.max_steps) == ("naive_dpo", 3) and s.ipl.method == "tdpo"
    with pytest.raises(SettingsError, match=r"^config\.ipl\.method='x': must be one of"):
        s.replace({"ipl.method": "x"})
    with pytest.raises(SettingsError, match=r"^config\.ipl\.nope: no such field"):
        s.replace({"ipl.nope": 1})
    assert dataclasses.replace(s.ipl, rounds=3).rounds == 3


def test_machine_checks():
    s = load_settings("synthetic:quick")
    s.check_machine("cpu", 1)
    s.check_machine("cpu", 4)  # every batch of the quick config divides over 4 devices
    with pytest.raises(SettingsError, match=r"^config\.sft\.micro_batch_size=4: not divisible by the mesh's batch"):
        s.check_machine("cpu", 8)
    with pytest.raises(SettingsError, match=r"^config\.mesh \(data, fsdp, tensor\) = \(3, 1, 1\) does not fit 2"):
        s.replace({"mesh.data": 3}).check_machine("cpu", 2)
    assert s.replace({"mesh.data": 2, "mesh.fsdp": -1}).mesh.shape(8) == (2, 4, 1)
    with pytest.raises(SettingsError, match=r"^config\.model\.dtype='float16': not available on tpu"):
        s.replace({"model.dtype": "float16"}).check_machine("tpu", 1)


def test_no_module_below_the_jobs_edge_sees_a_config_dict():
    """Only the config files and their loader (the repository's configs/, the package ipl_jax.configs), the job's
    edge (pipeline/) and the commands (cli/) may know ml_collections; everything below takes typed settings."""
    pattern = re.compile(r"ml_collections|ConfigDict")
    found = sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))
    )
    assert all(f.split("/")[0] in ("pipeline", "cli") for f in found), found
    assert all(
        pattern.search(p.read_text(encoding="utf-8")) for p in (CONFIG_DIR / "loader.py", CONFIG_DIR / "synthetic.py")
    )


def test_sections_build_the_library_objects_they_configure(tmp_path):
    from tests.support.rl_setup import make_tokenizer

    tok = make_tokenizer(tmp_path)
    s = load_settings("synthetic:quick", ["--config.sampler.temperature=0.7", "--config.sampler.tree.top_k=5"])
    sampler = s.sampler.build(tok.ids, s.buckets, eval_batch_size=3)
    assert (
        sampler.temperature == (0.7, 0.7, 0.7, 0.0)
        and sampler.top_k == 5
        and sampler.branching == s.sampler.tree.branching
    )
    assert sampler.max_turn_tokens == s.buckets.max_turn_tokens and sampler.image_patches == max(s.buckets.patches)
    # patch buckets for a sampler batch and for an evaluation batch of 3 screenshots; the placeholders never sampled
    assert set(sampler.patch_buckets) == {p * n for p in s.buckets.patches for n in (s.sampler.batch_size, 3)}
    assert int(tok.ids.image_pad) in sampler.suppress_ids and sampler.eos_ids[0] == int(tok.ids.im_end)
    greedy = s.sampler.build(tok.ids, s.buckets, 3, greedy=True, branching=(2, 1, 1, 1))
    assert greedy.temperature == (0.0,) * 4 and greedy.branching == (1, 1, 1, 1)
    wider = sampler.with_patch_buckets([7 * max(s.buckets.patches)])
    assert wider.patch_buckets == tuple(sorted({*sampler.patch_buckets, 7 * max(s.buckets.patches)}))
    reward = s.reward.build(s.data.rules())
    assert (reward.v_type, reward.v_format, reward.rules) == (s.reward.shares.v_type, s.reward.shares.v_format, "aitz")
    image = s.model.image_processor()
    assert (image.min_pixels, image.max_pixels) == (s.model.min_pixels, s.model.max_pixels)


def test_a_fresh_models_shape_is_the_model_configs_own(capsys, monkeypatch):
    """``model.text`` / ``model.vision`` are model/config.py's ``TextConfig`` / ``VisionConfig``: what the model config
    fills in (the rotary sections, the merger's width) and the tokenizer's ids are left empty; the old flat names
    (``model.hidden_size``, ``model.vision_depth``, ...) still set them, in flags and in a recorded config."""
    from ipl_jax.model.config import TextConfig, VisionConfig
    from ipl_jax.settings import job

    monkeypatch.setattr(job, "_told", set())
    m = load_settings(
        "synthetic:gpu", ["--config.model.vision_num_heads=8", "--config.model.text.rope_theta=1e4"]
    ).model
    assert "config.model.vision_num_heads is config.model.vision.num_heads now" in capsys.readouterr().err
    assert isinstance(m.text, TextConfig) and isinstance(m.vision, VisionConfig)
    cfg, v = m.fresh_config(), m.text.vocab_size
    assert (cfg.text.hidden_size, cfg.text.mrope_section, cfg.text.rope_theta) == (512, (8, 12, 12), 1e4)
    assert (cfg.vision.hidden_size, cfg.vision.num_heads, cfg.vision.mlp_ratio) == (512, 8, 2)
    assert (cfg.text.bos_token_id, cfg.text.eos_token_id, cfg.image_token_id) == (v - 7, (v - 1,), v - 4)
    assert Settings.from_dict(_with_old_model_names(Settings().to_dict())) == Settings()  # a config recorded so
    for field, value, message in (
        (
            "text.bos_token_id",
            "3",
            r"^config\.model\.text\.bos_token_id=3: a fresh model's token ids are its tokenizer",
        ),
        ("vision.in_channels", "4", r"^config\.model\.vision\.in_channels=4: screenshots are RGB: must be 3"),
    ):
        with pytest.raises(SettingsError, match=message):
            load_settings("synthetic:quick", [f"--config.model.{field}={value}"])


def _with_old_model_names(values: dict) -> dict:
    """Settings ``values`` with the fresh model's shape under its old flat names (recorded before ``model.text``)."""
    model = values["model"]
    text, vision = model.pop("text"), model.pop("vision")
    model.update({k: text[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_key_value_heads")})
    model.update(vision_depth=vision["depth"], vision_embed_dim=vision["embed_dim"])
    return values


def test_a_workdir_recorded_with_the_old_model_names_resumes(tmp_path):
    import json

    from ipl_jax.pipeline.paths import UsageError
    from ipl_jax.pipeline.run import check_workdir_config
    from ipl_jax.pipeline.workdir import Workdir

    wd, settings = Workdir(tmp_path, echo=lambda _: None), load_settings("synthetic:quick")
    (tmp_path / "config.json").write_text(json.dumps(_with_old_model_names(settings.to_dict())))
    wd.marker("data").parent.mkdir(parents=True)
    wd.marker("data").touch()
    check_workdir_config(wd, settings)
    with pytest.raises(UsageError, match=r"fields differ: model\.text\.hidden_size\)"):
        check_workdir_config(wd, settings.replace({"model.text.hidden_size": 256}))

"""Every setting declared once (issue 26, item 4): a Config field declares its flag, parser, check,
help and resume rule, and the command line's flags, the config-file keys and the resume allow-lists
are derived from that declaration. Ground truth: the dataclass fields
and argparse's own parse of each spelling."""

import dataclasses

import pytest

from python_algos.experiments.cli import build_parser
from python_algos.experiments.cli.settings import RESUME_FLAGS
from python_algos.experiments.config import (
    RESULT_KEYS,
    SETTINGS,
    Config,
    ConfigError,
    FromFile,
    named_as,
)

# one valid text per setting, for its flag (the tables: one KEY=VALUE entry)
VALID = {"algorithm": "fedavg", "lr": "0.25", "local_steps": "3", "alg_opts": "alpha=0.5", "dataset": "synthetic",
         "data_dir": "/data", "data_opts": "n=50", "standardize": "global", "test_fraction": "0.3",
         "partition": "dirichlet",
         "num_clients": "7", "eta": "0.1", "min_size": "2", "shards_per_client": "2", "samples_per_client": "3",
         "participation": "0.5",
         "clients_per_round": "2", "model": "mlp", "model_opts": "hidden=4", "reg": "mcp", "reg_strength": "0.01",
         "reg_opts": "gamma=3", "regularizers": "*=l1", "rounds": "5", "batch_size": "8", "seed": "3",
         "data_seed": "4", "metrics_every": "2", "metric_step": "0.5", "device": "cpu", "dtype": "float64",
         "checkpoint_every": "3", "time_budget": "30", "state": "ram", "executor": "batched", "threads": "2"}
PARSED = {"alg_opts": [("alpha", 0.5)], "data_opts": [("n", 50)], "model_opts": [("hidden", 4)],
          "reg_opts": [("gamma", 3)], "regularizers": [("*", "l1")]}


def test_every_config_field_is_a_declared_setting():
    assert list(SETTINGS) == [f.name for f in dataclasses.fields(Config)]
    assert set(VALID) == set(SETTINGS)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_each_spelling_of_each_flag_sets_its_field_in_every_command(name):
    s = SETTINGS[name]
    for command, extra in (("run", []), ("compare", []), ("sweep", ["--grid", "lr=0.1"])):
        if s.single_run and command != "run":
            continue
        for spelling in s.flags:
            args = build_parser().parse_args([command, *extra, spelling, VALID[name]])
            want = PARSED.get(name, None)
            got = getattr(args, name)
            if want is None:
                want = s.parse(VALID[name])
            assert got == want, (command, spelling)
            assert args.typed_flags[name] == spelling  # the flag as typed, for its errors
            assert s.check(dict(got) if s.options else got) is None


def test_resume_rules_derive_the_allow_lists_and_the_checkpoint_keys():
    assert [k for k, s in SETTINGS.items() if s.on_resume == "may_change"] == ["rounds"]
    assert "rounds" in RESUME_FLAGS["group"] and "checkpoint_every" not in RESUME_FLAGS["group"]
    assert set(RESUME_FLAGS["run"]) - set(RESUME_FLAGS["group"]) == {"checkpoint_every", "time_budget"}
    assert set(SETTINGS) - set(RESULT_KEYS) == {"rounds", "checkpoint_every", "time_budget", "state", "executor",
                                                "threads"}
    for k in ("executor", "threads"):  # refused on resume with their reason
        assert SETTINGS[k].on_resume == "kept" and "bits of an uninterrupted one" in SETTINGS[k].why_kept


def test_settings_carry_the_checks_of_their_flags():  # what a swept value is checked with (Config.check)
    assert SETTINGS["local_steps"].check(0) == "must be an integer >= 1"
    assert SETTINGS["lr"].check(-0.1).startswith("must be a finite number > 0")
    assert SETTINGS["threads"].check(100_000) == "must be an integer in [1, 1024]"
    assert SETTINGS["partition"].check("weird").startswith("unknown partition; valid: iid")
    assert SETTINGS["lr"].check(0.1) is None


def test_an_error_names_the_setting_as_the_user_gave_it():
    with pytest.raises(ConfigError, match=r"^--local-steps 0: must be an integer >= 1$"):  # Python: the long flag
        Config(local_steps=0).check()
    with named_as({"local_steps": "-K"}):
        with pytest.raises(ConfigError, match=r"^-K 0: must be an integer >= 1$"):
            Config(local_steps=0).check()
    with named_as({"local_steps": FromFile("exp.toml")}):
        with pytest.raises(ConfigError, match=r"^exp.toml: local_steps = 0: must be an integer >= 1$"):
            Config(local_steps=0).check()
    with pytest.raises(ConfigError, match=r"^--local-steps 0"):  # the naming ends with its block
        Config(local_steps=0).check()

"""The command line reads argparse's namespace once, in ``main``: every command function gets its own
frozen, typed options (cli/options.py), so a command runs without argparse, and no command can read a
flag that its options class does not declare."""

import argparse
import dataclasses
import inspect
import json

import pytest

from python_algos.experiments.cli import commands, research, settings
from python_algos.experiments.cli.options import (
    AlgorithmsCommand,
    CompareCommand,
    DemoCommand,
    Figures,
    GivenSettings,
    PlotCommand,
    RunCommand,
    SweepCommand,
)
from python_algos.runfolder.files import read_metrics

SMALL = ["--dataset", "sparse_logistic", "--data-opt", "n=160", "--data-opt", "dim=8", "--data-opt", "nnz=3",
         "-N", "4", "-K", "2", "--lr", "0.1", "-T", "2"]
SMALL_VALUES = {"dataset": "sparse_logistic", "data_opts": [("n", 160), ("dim", 8), ("nnz", 3)], "num_clients": 4,
                "local_steps": 2, "lr": 0.1, "rounds": 2}


@pytest.mark.parametrize("argv, cls", [
    (["run", *SMALL, "--workers", "2", "--replace", "--out", "o"], RunCommand),
    (["compare", "-a", "fedavg", "fedcanon", *SMALL], CompareCommand),
    (["sweep", "-a", "fedcanon", "--grid", "lr=0.1,0.2", "--jobs", "2", *SMALL], SweepCommand),
    (["demo", "-T", "3"], DemoCommand),
    ([], DemoCommand),
    (["plot", "a", "b", "--formats", "svg", "--no-setup"], PlotCommand),
    (["algorithms"], AlgorithmsCommand),
])
def test_main_hands_each_command_its_typed_frozen_options(monkeypatch, argv, cls):
    got = []
    for k in list(commands.COMMANDS):
        monkeypatch.setitem(commands.COMMANDS, k, lambda cmd: got.append(cmd) or 0)
    assert commands.main(argv) == 0
    (cmd,) = got
    assert type(cmd) is cls and not isinstance(cmd, argparse.Namespace)
    assert dataclasses.is_dataclass(cmd)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cmd.out = "elsewhere"
    if isinstance(cmd, RunCommand):  # the values as parsed, and the flags as typed
        assert (cmd.workers, cmd.replace, cmd.out, cmd.argv) == (2, True, "o", tuple(argv))
        assert cmd.settings.get("local_steps") == 2 and cmd.settings.names["local_steps"] == "-K"
        assert {"workers", "replace", "local_steps"} <= set(cmd.given) and "flower" not in cmd.given
    if isinstance(cmd, SweepCommand):
        assert (cmd.algorithms, cmd.jobs, cmd.settings.grid) == (("fedcanon",), 2, (("lr", "0.1,0.2"),))
    if isinstance(cmd, PlotCommand):
        assert (cmd.runs, cmd.formats, cmd.setup) == (("a", "b"), ("svg",), False)
    if argv[:1] == ["demo"]:
        assert cmd.rounds == 3 and cmd.names == {"rounds": "-T"}


def test_the_parser_declares_every_field_and_every_flag_reaches_a_field():
    """options.command_of reads each field from the flag's destination of the same name (the parser is
    the one declaration): a field no flag of its command sets, or a flag that no field, setting or
    config-file key reads, would be silently dropped."""
    from python_algos.experiments.cli.options import CLASSES, FILE_KEYS
    from python_algos.experiments.cli.parser import build_parser
    from python_algos.experiments.config import SETTINGS

    parser = build_parser()
    derived = {"settings", "argv", "given", "names", "setup", "figures"}  # not flags: command_of makes them
    for name, cls in CLASSES.items():
        dests = {a.dest for a in parser.commands[name]._actions} - {"help"}
        every = {f.name for f in dataclasses.fields(cls)}
        own, figures = every - derived, {f.name for f in dataclasses.fields(Figures)} if "figures" in every else set()
        assert figures <= dests, (name, figures - dests)
        assert own <= dests, (name, own - dests)
        read = own | figures | set(SETTINGS) | set(FILE_KEYS) | {"config", "grid_items", "space_items", "no_setup"}
        assert dests <= read, (name, dests - read)


def test_no_command_function_takes_the_namespace():
    """No function of the command's modules has an ``args`` parameter (the namespace's name before)."""
    for module in (commands, research, settings):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and name != "main":
                assert "args" not in inspect.signature(fn).parameters, f"{module.__name__}.{name}"


def test_a_run_called_with_typed_options_equals_the_command_line(tmp_path, capsys):
    """cmd_run with options built by hand (no argparse) gives the bits of the same run through main."""
    assert commands.main(["run", *SMALL, "--no-progress", "--no-plot", "--out", str(tmp_path / "cli")]) == 0
    given = GivenSettings(values={**SMALL_VALUES, "data_opts": SMALL_VALUES["data_opts"]})
    cmd = RunCommand(settings=given, out=str(tmp_path / "typed"), no_progress=True, figures=Figures(no_plot=True))
    assert commands.cmd_run(cmd) == 0
    cli, typed = read_metrics(tmp_path / "cli"), read_metrics(tmp_path / "typed")
    assert len(cli) == 3 and [r["f+h"] for r in cli] == [r["f+h"] for r in typed]
    saved = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("cli", "typed")]
    assert saved[0] == saved[1]


def test_a_resume_check_names_the_flag_as_typed_without_argparse(tmp_path):
    """--resume's refusal, from typed options: the flag as the user typed it (names), the folder."""
    cmd = RunCommand(settings=GivenSettings(values={"local_steps": 3}, names={"local_steps": "-K"}),
                     resume=str(tmp_path), given=("local_steps",))
    with pytest.raises(ValueError, match=rf"--resume takes its settings from {tmp_path}, .* \(got -K\)"):
        commands.cmd_run(cmd)
    # a setting in the options is refused even where `given` (argparse's list) does not hold it
    cmd = dataclasses.replace(cmd, given=())
    with pytest.raises(ValueError, match=r"\(got -K\)"):
        commands.cmd_run(cmd)

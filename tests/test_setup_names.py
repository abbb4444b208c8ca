"""One table names every key of a setup record for both audiences of a refused resume (issue 36
item 7: it replaced four label maps): ``simulate``'s snapshot and a Flower server checkpoint name
each differing key by its Python keyword, the command line by its flag, and every flag it names is
one the command line takes."""

import re

import pytest
import torch
from torch import nn

import fedkernels as fk
from python_algos import simulate
from python_algos.algorithms.registry import make
from python_algos.deploy.flower_server import server_setup
from python_algos.experiments.cli import build_parser
from python_algos.runfolder import setup_record as sr
from python_algos.runfolder.callbacks import Checkpoint


def _problem():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(12, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (12,), generator=g))
            for _ in range(3)]


def _model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)).double()


def _snapshot():
    snaps = []
    simulate(make("fedavg", lr=0.05, local_steps=1), _model(), nn.functional.cross_entropy, _problem(), 1,
             regularizer=fk.L1(0.01), batch_size=4, seed=0,
             callbacks=[Checkpoint(lambda s: snaps.append(s), 1)])
    return snaps[-1]


def test_every_key_simulate_compares_is_named_by_its_keyword():
    """A snapshot whose every recorded value is changed: the refusal has one line per key, and each
    is named from the table's Python column (a key missing from the table would show bare)."""
    snap = _snapshot()
    keys = ["algorithm", "model_buffers", *snap["setup"]]
    snap["setup"] = {k: f"changed {k}" for k in snap["setup"]}
    snap["algorithm"] = "FedMiD"
    snap["buffers"] = {"other": torch.zeros(2)}
    with pytest.raises(sr.SetupMismatch) as e:
        simulate(make("fedavg", lr=0.05, local_steps=1), _model(), nn.functional.cross_entropy, _problem(), 2,
                 regularizer=fk.L1(0.01), batch_size=4, seed=0, resume=snap)
    assert [k for k in keys if k not in sr.NAMES] == []
    named = [line.split(": snapshot ")[0] for line in e.value.lines]
    assert len(named) == len(keys) and set(named) == {sr.NAMES[k][0] for k in keys}


def test_every_key_of_a_setup_record_is_in_the_table_for_both_audiences():
    model = _model()
    x0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    records = {
        "simulate": sr.run_setup(model=model, loss_fn=nn.functional.cross_entropy, clients=_problem(),
                                 regularizer=fk.L1(0.01), batch_size=4, seed=0, clients_per_round=None,
                                 metrics_every=1, metric_step=0.1),
        "flower server": server_setup(make("fedavg", lr=0.05, local_steps=1), fk.L1(0.01), 0, 4, 3, x0),
    }
    for what, record in records.items():
        unnamed = [k for k in record if k not in sr.NAMES]
        assert unnamed == [], f"{what}'s setup keys without a name in setup_record.NAMES: {unnamed}"
    for key, names in sr.NAMES.items():
        assert len(names) == len(sr.AUDIENCES) and all(names), key
        assert [sr.label(key, a) for a in sr.AUDIENCES] == list(names)
    assert sr.label("not a key", "cli") == "not a key"
    with pytest.raises(ValueError, match="audience must be one of python, cli"):
        sr.label("seed", "flags")


def test_every_flag_the_cli_column_names_is_taken_by_the_command_line():
    taken = set()
    parser = build_parser()
    for action in parser._subparsers._group_actions[0].choices.values():  # each command's parser
        for a in action._actions:
            taken.update(a.option_strings)
    for key, (_, cli) in sr.NAMES.items():
        named = re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", cli)
        assert named, f"{key}: {cli!r} names no flag"
        assert set(named) <= taken, f"{key}: {cli!r} names flags no command takes: {set(named) - taken}"

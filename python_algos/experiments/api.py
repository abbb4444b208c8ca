"""A paper's table from Python (issue 38 item 4): algorithms × seeds through :func:`~python_algos.simulate`,
into the folder ``compare --seeds`` writes, by its writers (``seeds.json``, ``seed-<k>/`` comparisons of run
folders, ``aggregate.*``; ``api_run``: no data recipe, so no ``--resume`` continues it).

    res = compare({"FedCanon": FedCanon(...), "FedAvg": make("fedavg", lr=0.05, local_steps=5)},
                  lambda: torch.nn.Linear(8, 2).double(), F.cross_entropy, clients, 50, out="results/paper",
                  seeds=3, test_clients=0.2, regularizer=fk.L1(1e-3))
    res.table, res.final["FedAvg"]["test_acc"], res.histories["FedAvg"][0], res.plot()

A seed means what it means on the command line (:mod:`.seeds`): seed k sets the model's initialization
(``torch.manual_seed(k)``, then ``model()``), the minibatch order and the participation draws (``simulate(seed=k)``).
The data are the same for every seed: the clients as given, and a fractional ``test_clients`` split drawn from
the first seed (``reseed_data=True``: from each seed).
"""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ..algorithms import Algorithm
from ..runfolder.callbacks import ShowProgress, StopOnDivergence
from ..runfolder.files import RunExistsError
from ..runfolder.folder import check_group_start, open_group_folder
from ..runfolder.records import API_MARK, COMPARISON, read_summary, run_folder_name, write_summary
from ..simulate import simulate
from .aggregate import SEED_DIR, counted, final_stats
from .compare import COMPARISON_RECORDS, write_comparison
from .evaluation import eval_mode, make_eval
from .seeds import SEEDS_FILE, SEEDS_RECORDS, aggregate_comparison, seed_list

__all__ = ["compare", "Comparison"]


@dataclasses.dataclass
class Comparison:
    """What :func:`compare` wrote into ``out``; per label, each seed's History and summary."""

    out: str
    table: str  # aggregate.md: the final metrics as mean ± std over the completed seeds
    seeds: list
    histories: dict  # label -> [History of each seed]
    summaries: dict  # label -> [summary.json of each seed]
    final: dict  # label -> metric -> {mean, std, min, max, n} over the completed seeds

    def plot(self, **options) -> list:
        """The overview figure of ``out`` (each label's mean and band over the seeds); ``plot_runs``' options."""
        from .plotting import plot_runs

        return plot_runs([self.out], **{"out_dir": self.out, "per_metric": False, **options})


def _labelled(algorithms) -> dict:
    """label -> Algorithm (a list is labelled by the algorithms' names); one run folder per label."""
    pairs = list(algorithms.items()) if isinstance(algorithms, Mapping) else [(getattr(a, "name", a), a)
                                                                               for a in algorithms]
    out, folders = {}, {}
    for label, a in pairs:
        if not isinstance(a, Algorithm) or not isinstance(label, str):
            raise TypeError(f"algorithms: {label!r}: expected an Algorithm (registry names: python_algos.make(name, "
                            f"lr=, local_steps=)), got {type(a).__name__}")
        if folders.setdefault(run_folder_name(label), label) != label or label in out:
            raise ValueError(f"algorithms: the label {label!r} is given twice (the run folder of "
                             f"{folders[run_folder_name(label)]!r}); name each run in a dict {{label: algorithm}}")
        out[label] = a
    if not out:
        raise ValueError("algorithms: give at least one")
    return out


def _split(clients: Sequence, test_clients, seed: int) -> tuple:
    """(train clients, test clients or None): a fraction held out of each client (drawn from ``seed``), or as given."""
    if test_clients is None or isinstance(test_clients, (list, tuple)):
        if test_clients is not None and len(test_clients) != len(clients):
            raise ValueError(f"test_clients: {len(test_clients)} entries for {len(clients)} clients; give one (X, y) "
                             f"per client, in the clients' order, or the fraction of each client to hold out")
        return list(clients), test_clients
    if isinstance(test_clients, bool) or not isinstance(test_clients, float) or not 0 < test_clients < 1:
        raise ValueError(f"test_clients={test_clients!r}: one (X, y) per client, or a fraction in (0, 1)")
    train, test = [], []
    for i, (X, y) in enumerate(clients):
        k = int(round(len(X) * test_clients))
        if k >= len(X):
            raise ValueError(f"test_clients={test_clients}: client {i} has {len(X)} sample(s), none left to train on")
        perm = torch.from_numpy(np.random.default_rng([seed, 7, i]).permutation(len(X)))
        keep, held = perm[k:].sort().values, perm[:k].sort().values
        train.append((X[keep], y[keep]))
        test.append((X[held], y[held]))
    return train, test


def _test_eval(model, loss_fn, test, extra) -> Optional[Callable]:
    """The command line's test metrics (test_loss, test_acc) on the pooled test rows, and ``extra``'s."""
    if not test:
        return extra
    X, y = torch.cat([t[0] for t in test]), torch.cat([t[1] for t in test])
    with torch.no_grad(), eval_mode(model):  # no BatchNorm statistics change, no dropout draw
        p0 = next(model.parameters())
        out = model(X[:1].to(p0.device, p0.dtype if X.is_floating_point() else X.dtype))
    task = "regression" if y.is_floating_point() else "multiclass" if out.dim() > 1 and out.shape[-1] > 1 else "binary"
    return make_eval(SimpleNamespace(X_test=X, y_test=y, task=task, x_true=None), model, extra, loss_fn=loss_fn)


def _checked(algorithms, model, loss_fn, clients, rounds, seeds, test_clients, reseed_data, out, replace, kw):
    """(label -> Algorithm, seeds), every argument checked, each refusal naming it, before anything is written."""
    if {"seed", "resume"} & set(kw):
        raise TypeError("compare: seed / resume: the seeds set each run's seed, and every run starts fresh")
    if isinstance(model, torch.nn.Module) or not callable(model):
        raise TypeError("model must be a function returning a new model (each seed initializes its own: "
                        "torch.manual_seed(seed), then model()), e.g. lambda: torch.nn.Linear(8, 2).double()")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be an int >= 0, got {rounds!r}")
    if isinstance(seeds, bool) or not isinstance(seeds, (int, list, tuple)) or (isinstance(seeds, int) and seeds < 1):
        raise ValueError(f"seeds={seeds!r}: give the number of seeds (an int >= 1) or a list of distinct ints >= 0")
    seeds = seed_list(None, list(seeds) if isinstance(seeds, (list, tuple)) else seeds)
    listed = list(test_clients) if isinstance(test_clients, (list, tuple)) else []
    if test_clients is not None and not all(isinstance(c, (tuple, list)) and len(c) == 2
                                            and all(map(torch.is_tensor, c)) for c in [*clients, *listed]):
        raise TypeError("test_clients: every client and test client must then be an (X, y) pair of tensors")
    if reseed_data and (test_clients is None or listed):
        raise ValueError("reseed_data=True draws the test_clients split with each seed: give test_clients as a "
                         "fraction (the clients' own data are the same for every seed)")
    algs, (train, _) = _labelled(algorithms), _split(clients, test_clients, seeds[0])
    if os.path.isdir(out) and os.listdir(out) and not replace:
        raise RunExistsError(f"out={out} already holds files; choose another folder, or pass replace=True to "
                             f"replace an earlier comparison there (nothing was changed)")
    check_group_start(out, SEEDS_RECORDS, replace, how_to_resume="")
    probe, rest = model(), {k: v for k, v in kw.items() if k not in ("metrics_every", "callbacks", "eval_fn")}
    for alg in algs.values():  # simulate's own checks (keywords, h, participation, executor, state): 0 rounds
        simulate(alg, probe, loss_fn, train, 0, metrics_every=0, **rest)
    return algs, seeds


def _run_one(alg, label: str, model, loss_fn, data: tuple, rounds: int, seed: int, path: str, progress: bool,
             kw: dict) -> tuple:
    """One algorithm and seed as the command line runs it (the model built from the seed, the divergence
    rule), saved into ``path``; returns (History, summary)."""
    torch.manual_seed(seed)
    net = model()
    rng = torch.get_rng_state()  # the command line's: simulate starts from torch's state right after the model
    eval_fn = _test_eval(net, loss_fn, data[1], kw.pop("eval_fn", None))
    stop = StopOnDivergence()
    cbs = [*kw.pop("callbacks", ()), ShowProgress(f"{label} seed {seed}", enabled=progress), stop]
    torch.set_rng_state(rng)
    hist = simulate(alg, net, loss_fn, data[0], rounds, seed=seed, eval_fn=eval_fn, callbacks=cbs, **kw)
    hist.save(path, label=label, model=net)
    summary = read_summary(path)
    if stop.reason is not None:  # the command line's status: left out of the statistics, named below the table
        summary.update(status="diverged", message=f"{label} diverged at {stop.reason}")
        write_summary(path, summary)
    return hist, summary


def compare(algorithms: Union[Sequence, Mapping], model: Callable[[], torch.nn.Module], loss_fn: Callable,
            clients: Sequence, rounds: int, *, out: str, seeds: Union[int, Sequence[int]] = 3, test_clients=None,
            reseed_data: bool = False, replace: bool = False, progress: bool = False,
            **simulate_options) -> Comparison:
    """Every algorithm with every seed through :func:`~python_algos.simulate` into the new (or empty, or with
    ``replace=True`` an earlier comparison's) folder ``out``, as ``compare -a A B --seeds K`` (module docstring).

    ``algorithms``: Algorithms, or a dict label -> Algorithm. ``model``: a function returning a new model.
    ``seeds``: K (seeds 0..K-1) or a list. ``test_clients``: one ``(X, y)`` per client, or the fraction of each
    client to hold out; test_loss and test_acc (the command line's) are taken on the pooled test rows.
    ``simulate_options``: simulate's keywords; one ``metric_step`` for every run (default: the first algorithm's).
    Every argument is checked before anything is written, simulate's by a run of 0 rounds of each algorithm.
    """
    out = os.fspath(out)
    algs, seeds = _checked(algorithms, model, loss_fn, clients, rounds, seeds, test_clients, reseed_data, out,
                           replace, simulate_options)
    labels, step = list(algs), simulate_options.pop("metric_step", None)
    step = algs[labels[0]].metric_step() if step is None else step
    config = {API_MARK: True, "rounds": rounds, "metric_step": step, "test_clients": test_clients if isinstance(
        test_clients, float) else test_clients and "given", **{k: repr(v) for k, v in simulate_options.items()}}
    open_group_folder(out, SEEDS_FILE, {"kind": "compare", "config": config, "seeds": seeds, "reseed_data": reseed_data,
                                        "algorithms": labels, API_MARK: True}, SEEDS_RECORDS, replace=replace)
    histories, per_seed = {a: [] for a in labels}, []
    for s in seeds:
        data = _split(clients, test_clients, s if reseed_data else seeds[0])
        d, record = os.path.join(out, SEED_DIR.format(s)), {"config": config, "algorithms": labels, API_MARK: True}
        open_group_folder(d, COMPARISON, {**record, "runs": []}, COMPARISON_RECORDS, replace=False)
        runs = [_run_one(alg, a, model, loss_fn, data, rounds, s, os.path.join(d, run_folder_name(a)), progress,
                         {**simulate_options, "metric_step": step}) for a, alg in algs.items()]
        for a, (hist, _) in zip(labels, runs):
            histories[a].append(hist)
        per_seed.append([summary for _, summary in runs])
        write_comparison(d, record, per_seed[-1], step)
    table = aggregate_comparison(out, labels, seeds, per_seed, step)
    summaries = {a: [runs[i] for runs in per_seed] for i, a in enumerate(labels)}
    return Comparison(out, table, seeds, histories, summaries,
                      {a: final_stats([r[i] for i in counted(r)]) for a, r in summaries.items()})

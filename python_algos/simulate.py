"""``simulate``: run an algorithm on in-process clients and record the metrics of docs/algorithms.md §3.

    hist = simulate(FedCanon(alpha=0.1, beta=0.01, local_steps=10), model, F.cross_entropy,
                    clients=[(X1, y1), (X2, y2), ...], rounds=100, regularizer=fk.SCAD(1e-3))
    hist.params            # flat [d] model the algorithm reports
    hist.metrics[-1]       # {"round": 100, "f": ..., "f+h": ..., "grad_map_sq": ..., ...}

``History.metrics[t-1]`` is round t's row (``History.initial``: round 0), as docs/algorithms.md §3 lists:
timings and counts every round (``wall_time``, ``elapsed``, ``prox_time`` / ``prox_evals``, ``grad_time`` /
``grad_evals``, ``fwd_bwd_time``, ``up`` / ``down``; ``sent_bytes`` / ``recv_bytes`` for executors that
move data between processes), and every ``metrics_every`` rounds and after the last, on the reported
model x with one extra full-gradient pass: ``f``, ``h``, ``f+h``, ``grad_map_sq`` at ``grad_map_step``,
``normal_map_sq`` where the algorithm has a normal-map variable, ``sparsity``, ``hoyer``, and what
``eval_fn(params)`` returns.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import nn

import fedkernels as fk

from .algorithms.base import Algorithm
from .algorithms.steps import prox
from .clients import EXECUTORS, ClientSet, resolve_executor
from .clients.base import seeds
from .clients.model_checks import check_group_lasso, check_one_dtype
from .clients.state_plan import StatePlan, snapshot_state
from .runfolder import setup_record
from .runfolder.callbacks import Checkpoint, RunView, as_callbacks, run_rounds
from .runfolder.history import load_history, save_history
from .runfolder.records import RunWarning, metric_round, metrics_row, run_warning
from .system.threads import threads_for_run

__all__ = ["simulate", "History", "objective_metrics", "hoyer", "sparsity", "checked_clients_per_round"]


@dataclasses.dataclass
class History:
    """Result of :func:`simulate`."""

    params: torch.Tensor  # [d] the reported model after the last round
    metrics: list  # one dict per round
    initial: dict  # objective metrics at the starting point (round 0)
    algorithm: str
    hparams: dict
    state: Any = None  # the algorithm's final state (NamedTuple); not kept by :meth:`save`
    executor: str = "sequential"  # the executor that ran the clients (``ClientSet.executor``)
    world_size: int = 1  # processes that shared the clients (executor "distributed": the ranks)
    threads: Optional[int] = None  # torch's and fedkernels' CPU threads during the run (None: the caller's)
    # what else simulate knew about the run (regularizer, rounds, seed, batch_size, num_clients, dim,
    # dtype, metric settings, participation): written to config.json by :meth:`save`
    setup: dict = dataclasses.field(default_factory=dict)

    def series(self, key: str) -> list:
        """``[m.get(key) for m in metrics]``."""
        return [m.get(key) for m in self.metrics]

    @property
    def last(self) -> dict:
        return self.metrics[-1] if self.metrics else self.initial

    def save(self, path: str, *, overwrite: bool = False, label: Optional[str] = None,
             f_star: Optional[float] = None, model: Optional[nn.Module] = None) -> str:
        """Write this run (not its state) as a command-line run folder that ``plot`` draws, built beside
        ``path`` and renamed into place; an existing run folder is replaced only with ``overwrite=True``,
        never one holding other files (``FileExistsError``). ``label``: its legend (default: the
        algorithm); ``f_star``: F*, for f + h − F*; ``model``: its ``state_dict`` into model.pt."""
        return save_history(self, path, overwrite=overwrite, label=label, f_star=f_star, model=model)

    @classmethod
    def load(cls, path: str) -> "History":
        """A run folder of :meth:`save` or the command line as a History (``state`` None; null values
        as NaN); rows past model.pt's round (a resumed run that stopped early) are left out with a
        warning, and a model that cannot be paired with its rows is refused."""
        return cls(**load_history(path), state=None)


def sparsity(x: torch.Tensor) -> float:
    """Fraction of exact zeros (meaningful for prox outputs)."""
    return float((x == 0).sum()) / max(x.numel(), 1)


def hoyer(x: torch.Tensor) -> float:
    """Hoyer sparsity (sqrt(d) − ||x||_1/||x||_2)/(sqrt(d) − 1) in [0, 1] (M6); NaN for x = 0 or d = 1."""
    d = x.numel()
    l2 = float(x.norm())
    if d < 2 or l2 == 0.0:
        return math.nan
    return (math.sqrt(d) - float(x.abs().sum()) / l2) / (math.sqrt(d) - 1)


def objective_metrics(clients: ClientSet, reg: fk.Regularizer, x: torch.Tensor, step: float,
                      normal_map: Optional[tuple] = None) -> dict:
    """f, h, f+h, ||G_s||², ||F_nor||² (if ``normal_map = (z, lam)`` and lam·rho < 1), sparsity, Hoyer."""
    with torch.no_grad():
        x = x.detach()
        g = torch.empty_like(x)
        f = clients.full_objective_(x, g)
        h = float(reg.value(x))
        G = (x - prox(x - step * g, reg, step)) / step
        out = {
            "f": f,
            "h": h,
            "f+h": f + h,
            "grad_map_sq": float(G.dot(G)),
            "grad_map_step": step,
            "sparsity": sparsity(x),
            "hoyer": hoyer(x),
        }
        if normal_map is not None:
            z, lam = normal_map
            if lam > 0 and float(getattr(reg, "rho", 0.0)) * lam < 1:
                xz = prox(z, reg, lam)
                gz = g
                if not torch.equal(xz, x):  # the normal map's model is not the reported one
                    gz = torch.empty_like(x)
                    clients.full_objective_(xz, gz)
                F = gz + (z - xz) / lam
                out["normal_map_sq"] = float(F.dot(F))
                out["normal_map_lam"] = lam
        return out


# what a snapshot must hold ("metrics" is optional: a checkpoint file holds the state, not the history)
_SNAPSHOT_KEYS = ("round", "algorithm", "hparams", "state", "rng", "client_rng", "torch_rng", "buffers", "initial",
                  "elapsed")


def _check_resume(snap, algorithm: Algorithm, model: nn.Module, setup: dict, rounds: int) -> None:
    """Refuse, before anything is changed, a snapshot whose recorded settings (:mod:`.runfolder.setup_record`)
    are not this run's, naming each difference with both values: its rounds would continue one run under
    another's settings, and the History describe neither. Only ``rounds`` and the executor may differ."""
    if not isinstance(snap, Mapping):
        raise TypeError(f"resume must be a snapshot dict (as given to a Checkpoint callback), got "
                        f"{type(snap).__name__}")
    missing = [k for k in _SNAPSHOT_KEYS if k not in snap]
    if missing:
        raise ValueError(f"cannot resume: resume is not a simulate snapshot (it lacks {', '.join(missing)})")
    recorded = snap.get("setup")
    saved = {"algorithm": {"name": snap["algorithm"], "hparams": snap["hparams"]},
             "model_buffers": {n: tuple(b.shape) for n, b in snap["buffers"].items()},
             **(dict(recorded) if isinstance(recorded, Mapping) else {})}
    now = {"algorithm": {"name": algorithm.name, "hparams": algorithm.hparams()},
           "model_buffers": {n: tuple(b.shape) for n, b in model.named_buffers()}, **setup}
    setup_record.check_same_setup(saved, now, what="from the snapshot",
                                  fix="resume with the snapshot's settings (only rounds may differ), or start a new "
                                      "run without resume")
    rows = snap.get("metrics")
    if rows is not None and [m.get("round") if isinstance(m, Mapping) else None
                             for m in list(rows)[:int(snap["round"])]] != list(range(1, int(snap["round"]) + 1)):
        raise ValueError(f"cannot resume: the snapshot's metrics must begin with the rows of rounds 1..{snap['round']} "
                         f"(its round), one each in order; leave them out to get a History of the resumed rounds only")
    if int(snap["round"]) > rounds:
        raise ValueError(f"rounds must be >= the snapshot's round {snap['round']} to resume from it (a run cannot "
                         f"go back), got {rounds}")
    if recorded is None and not isinstance((snap.get("extra") or {}).get("config"), Mapping):
        # an older version's snapshot; the command line's own checkpoints carry the config it compared
        raise ValueError("cannot resume: the snapshot does not record its run's settings (an older version wrote "
                         "it), so nothing shows it belongs to this run: start a new run without resume")


def _restore(snap: dict, model: nn.Module, cs: ClientSet, rng: torch.Generator):
    """Undo a ``Checkpoint`` snapshot that :func:`_check_resume` accepted: returns (state, initial,
    metrics, elapsed, next round)."""
    rng.set_state(snap["rng"])
    cs.set_rng_state(snap["client_rng"])
    torch.set_rng_state(snap["torch_rng"])
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in snap["buffers"].items():
            buffers[name].copy_(value)
    # an in-memory snapshot's metrics is the run's live list: rows past its round were appended after it
    rows = list(snap.get("metrics") or ())[:int(snap["round"])]
    return (snap["state"], dict(snap["initial"]), rows, float(snap["elapsed"]),
            int(snap["round"]) + 1)


def checked_clients_per_round(algorithm: Algorithm, n: int, participation, clients_per_round) -> Optional[int]:
    """k clients per round (None: all), checked against what the algorithm supports."""
    if participation is not None and clients_per_round is not None:
        raise ValueError("give participation (a fraction) or clients_per_round (a count), not both")
    k = None
    if participation is not None:
        if isinstance(participation, bool) or not isinstance(participation, (int, float)) or not 0 < participation <= 1:
            raise ValueError(f"participation must be a fraction in (0, 1], got {participation!r}")
        k = max(1, int(round(participation * n)))
    elif clients_per_round is not None:
        if isinstance(clients_per_round, bool) or not isinstance(clients_per_round, (int, np.integer)) \
                or not 1 <= clients_per_round <= n:
            raise ValueError(f"clients_per_round must be an int in [1, N = {n}], got {clients_per_round!r}")
        k = int(clients_per_round)
    if k is None or k == n:
        return None
    if not algorithm.partial_participation:
        raise ValueError(f"{algorithm.name} does not support partial participation ({k} of {n} clients per round): "
                         f"{algorithm.participation_note}")
    return k


def simulate(
    algorithm: Algorithm,
    model: nn.Module,
    loss_fn: Callable,
    clients: Sequence,
    rounds: int,
    regularizer: "fk.Regularizer | Mapping" = fk.Zero(),
    batch_size: Optional[int] = None,
    seed: int = 0,
    eval_fn: Optional[Callable[[torch.Tensor], dict]] = None,
    callbacks: Sequence[Callable] = (),
    *,
    metrics_every: int = 1,
    metric_step: Optional[float] = None,
    executor: str = "sequential",
    executor_options: Optional[dict] = None,
    backend: Optional[Callable[..., ClientSet]] = None,
    resume: Optional[dict] = None,
    participation: Optional[float] = None,
    clients_per_round: Optional[int] = None,
    state: str = "dense",
    state_folder: Optional[str] = None,
    threads: "str | int | None" = "auto",
) -> History:
    """Run ``rounds`` rounds of ``algorithm`` from the model's current parameters.

    Args:
        algorithm: an :class:`~python_algos.algorithms.Algorithm` (e.g. ``FedCanon(alpha=.., beta=..,
            local_steps=..)``); ``algorithm.validate(h)`` runs first (e.g. FedCanon's alpha * rho < 1).
        model: the ``nn.Module``; its trainable parameters, of one dtype (a mix raises ``ValueError``),
            become views of one flat buffer (``fk.FlatParams``); on return it holds ``History.params``.
        loss_fn: ``loss_fn(model(X_batch), y_batch)`` -> scalar mean loss, probed on every client's
            data before the first round (:mod:`python_algos.clients.probe`: a loss that is not a mean of
            per-sample losses is refused with minibatches).
        clients: one client each: an ``(X, y)`` pair of tensors, a ``Dataset`` or a ``DataLoader``
            (:mod:`python_algos.clients.data`); floating-point data are cast to the model's dtype. Or a
            :class:`~python_algos.clients.population.Population`: client i built on demand (docs/population.md).
        rounds: communication rounds T (DEPOSITUM: iterations).
        regularizer: h (a ``fedkernels`` Regularizer), or a mapping from parameter names or fnmatch
            patterns to Regularizers or None, one penalty per parameter (``fk.PerParameter``'s rules;
            a ``GroupLasso`` is given per parameter only).
        batch_size: minibatch size B; ``None``: full local gradients (a deterministic run).
        seed: seeds the clients' minibatch and participation generators and the server's.
        eval_fn: ``eval_fn(params) -> dict`` merged into the metrics rows of metric rounds.
        callbacks: after every round t, in order: ``cb(t, state, metrics)`` functions or
            :class:`~python_algos.runfolder.callbacks.Callback` objects (``StopOnDivergence()``,
            ``TimeBudget(s)``, ``MetricsFile(path)``, ``ShowProgress()``: the command line's progress
            display); ``True`` stops the run after that round. ``Checkpoint(save, every)``, put last,
            hands ``save`` a snapshot (references to live state: write it out, e.g. with
            :class:`~python_algos.runfolder.checkpoint.Checkpointer`) after round 0 of a fresh run,
            every ``every`` rounds and after the last, once every callback before it accepted the round.
        metrics_every: the objective metrics (module docstring) every this many rounds and after the
            last (0: timings and counts only).
        metric_step: the step s of G_s (default ``algorithm.metric_step()``).
        executor: ``"sequential"``, ``"batched"`` (``torch.func``), ``"distributed"`` (``torchrun``
            ranks) or ``"auto"`` (a fixed rule: :func:`python_algos.clients.registry.resolve_local`);
            the result differs only in floating-point summation order (docs/executors.md).
        executor_options: the executor's keyword arguments (e.g. ``{"memory_budget": 2**30}``).
        backend: ``backend(model, loss_fn, clients, batch_size=, seed=, flat=)`` -> ClientSet, a custom
            executor instead of ``executor``.
        resume: a snapshot a ``Checkpoint`` was given: restore the state, every generator and buffer,
            round 0's metrics and ``elapsed``, and continue from ``snapshot["round"] + 1`` to ``rounds``,
            bit-identical to an uninterrupted run on CPU. Every setting the snapshot records
            (:mod:`python_algos.runfolder.setup_record`) must be this call's, else ``ValueError`` names
            each difference before anything changes; only ``rounds`` (never below the snapshot's) and
            the executor (a warning; ``"auto"`` reuses the snapshot's) may differ. The History holds
            the rounds this call ran, after the rows of rounds 1..round when ``snapshot["metrics"]``
            begins with them (a snapshot kept in memory; a checkpoint file holds none).
        participation: the fraction of clients sampled each round, k = max(1, round(participation·N))
            (docs/algorithms.md §1.4); ``clients_per_round``: k itself (give at most one). Only
            algorithms with ``partial_participation`` accept k < N.
        state: where per-client stacks live: ``"dense"`` [N, d] tensors, ``"ram"`` / ``"disk"`` (a row is
            stored once written; disk: files under ``state_folder``), or ``"auto"`` by the up-front
            estimate; a run that cannot fit is refused (:mod:`python_algos.clients.state_plan`).
        threads: CPU threads for the run, the command line's rule (python_algos/system/threads.py: 1 for a
            model under 10⁶ parameters), an int, or None (torch's settings as they are); the caller's after.
    """
    regularizer, k, step = _checked_inputs(algorithm, model, clients, rounds, regularizer, metrics_every,
                                           metric_step, participation, clients_per_round)
    settings = None  # what a snapshot records of the run (hashes the data once: only when snapshots are used)
    if resume is not None or any(isinstance(cb, Checkpoint) for cb in callbacks):
        settings = setup_record.run_setup(model=model, loss_fn=loss_fn, clients=clients, regularizer=regularizer,
                                          batch_size=batch_size, seed=seed, clients_per_round=k,
                                          metrics_every=metrics_every, metric_step=step)
    if resume is not None:
        _check_resume(resume, algorithm, model, settings, int(rounds))  # before anything is built or changed
    plan = StatePlan.checked(state, state_folder, k, executor, backend, settings is not None and resume is None,
                             resume is not None)
    cbs = as_callbacks(callbacks)
    executor, executor_options = _executor_of_resume(backend, executor, executor_options, resume)
    make = backend if backend is not None else resolve_executor(executor, model)
    flat = fk.FlatParams(model)
    x0 = flat.params.detach().clone()
    with threads_for_run(threads, x0) as n:
        cs = make(model, loss_fn, clients, batch_size=batch_size, seed=seed, flat=flat, **(executor_options or {}))
        cs.set_participation(k, seed)
        run = _Run(algorithm, model, flat, x0, cs, regularizer, step, metrics_every, eval_fn, settings,
                   setup={"regularizer": repr(regularizer), "rounds": int(rounds), "seed": seed,
                          "batch_size": batch_size, "num_clients": len(clients), "clients_per_round": k,
                          "metrics_every": metrics_every, "metric_step": step})
        run.warn_if_other_executor(resume)
        state = run.start(resume, plan)
        state = run_rounds(run.view(), state, run.round, cbs, agree=run.cs.any_rank)
        return run.history(state, n)


def _checked_inputs(algorithm, model, clients, rounds, regularizer, metrics_every, metric_step, participation,
                    clients_per_round) -> tuple:
    """simulate's arguments checked, before anything is built: (h, clients per round k, metric step s)."""
    if not isinstance(algorithm, Algorithm):
        raise TypeError(f"algorithm must be a python_algos Algorithm, got {type(algorithm).__name__}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 0:
        raise ValueError(f"rounds must be an int >= 0, got {rounds!r}")
    if isinstance(metrics_every, bool) or not isinstance(metrics_every, int) or metrics_every < 0:
        raise ValueError(f"metrics_every must be an int >= 0, got {metrics_every!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_one_dtype(model)
    if isinstance(regularizer, Mapping):
        regularizer = fk.PerParameter(model, regularizer)
    check_group_lasso(regularizer, model)
    algorithm.validate(regularizer)
    k = checked_clients_per_round(algorithm, len(clients), participation, clients_per_round)
    step = float(metric_step) if metric_step is not None else float(algorithm.metric_step())
    if not step > 0:
        raise ValueError(f"metric_step must be > 0, got {step}")
    return regularizer, k, step


def _executor_of_resume(backend, executor: str, executor_options: Optional[dict], resume: Optional[dict]) -> tuple:
    """The executor a resume runs on: ``"auto"`` takes the snapshot's. auto's rule reads the memory
    budget (a GPU's free memory), which may differ at resume; the executor the run started with keeps
    the resume bit-identical. The same for the executor of each rank's clients (``inner``)."""
    if backend is not None or resume is None:
        return executor, executor_options
    ran = resume.get("executor")
    if executor == "auto" and ran in EXECUTORS:
        executor = ran
    if executor == "distributed" and ran in ("sequential", "batched") and \
            str((executor_options or {}).get("inner", "auto")).lower() == "auto":
        executor_options = {**(executor_options or {}), "inner": ran}
    return executor, executor_options


class _Run:
    """One simulate call's engine state: the client set, generators, the metrics so far; what
    :func:`run_rounds` steps (:meth:`round`) and what a snapshot captures (:meth:`snapshot`)."""

    def __init__(self, algorithm, model, flat, x0, cs: ClientSet, regularizer, step, metrics_every, eval_fn,
                 settings, setup: dict):
        self.algorithm, self.model, self.flat, self.x0, self.cs = algorithm, model, flat, x0, cs
        self.regularizer, self.step, self.metrics_every, self.eval_fn = regularizer, step, metrics_every, eval_fn
        self.settings = settings  # what a snapshot records (None: no snapshots are taken)
        self.setup = setup  # what History.setup reports
        self.rounds = setup["rounds"]
        self.rng = torch.Generator().manual_seed(seeds(setup["seed"], 1, stream=1)[0])  # server side (SCAFFNEW's coin)
        # the executor that ran the clients (in each process, for the distributed one)
        self.ran_on = getattr(cs, "inner_executor", None) or getattr(cs, "executor", None)
        self.state = None
        self.metrics: list = []
        self.initial: dict = {"round": 0}
        self.elapsed, self.first = 0.0, 1

    def warn_if_other_executor(self, resume) -> None:
        if resume is not None and resume.get("executor") and self.ran_on and resume["executor"] != self.ran_on:
            warnings.warn(f"resume: the snapshot's rounds ran on executor {resume['executor']!r}, these run on "
                          f"{self.ran_on!r}: the same algorithm, but another floating-point summation order, so the "
                          f"result is not bit-identical to an uninterrupted run; pass "
                          f"executor={resume['executor']!r} (or 'auto') for that", UserWarning, stacklevel=3)

    def start(self, resume: Optional[dict], plan: StatePlan):
        """The state before the first round this call runs: ``init`` (and round 0's metrics), or the snapshot's."""
        self.fresh = resume is None
        if resume is None:
            self.state = plan.init(self.algorithm, self.x0, self.cs, self.rounds)
            if self.metrics_every:
                self.initial = {"round": 0, **self.evaluate(self.state)}
        else:
            self.state, self.initial, self.metrics, self.elapsed, self.first = _restore(resume, self.model, self.cs,
                                                                                        self.rng)
            self.state = plan.adopt(self.state)
        return self.state

    def evaluate(self, st) -> dict:
        """The objective metrics of the reported model of state ``st`` (module docstring), plus ``eval_fn``'s."""
        x = self.cs.report(self.algorithm, st, self.regularizer).detach()
        out = objective_metrics(self.cs, self.regularizer, x, self.step, self.algorithm.normal_map_point(st))
        out.update(self.cs.state_metrics(self.algorithm, st))
        if self.eval_fn is not None:
            self.flat.bind_(x.clone())
            out.update(self.eval_fn(x))
        return out

    def round(self, t: int, state):
        """Round t: the algorithm's round, timed and counted, and its metrics row (objective metrics on
        metric rounds). Returns (state, row)."""
        cs = self.cs
        up, down, sent, recv = cs.comm.up, cs.comm.down, cs.comm.sent_bytes, cs.comm.recv_bytes
        g_sec, g_n, fb_sec = cs.grad_seconds, cs.grad_evals, cs.fwd_bwd_seconds
        t0 = time.perf_counter()
        with fk.prox_stats() as stats:
            state = self.algorithm.round(state, cs, self.regularizer, self.rng)
        wall = time.perf_counter() - t0
        self.elapsed += wall
        row = metrics_row(t, wall_time=wall, elapsed=self.elapsed, prox_time=stats.seconds,
                          prox_evals=stats.evaluations,
                          grad_time=cs.grad_seconds - g_sec, grad_evals=cs.grad_evals - g_n,
                          fwd_bwd_time=cs.fwd_bwd_seconds - fb_sec, up=cs.comm.up - up, down=cs.comm.down - down,
                          sent_bytes=cs.comm.sent_bytes - sent if cs.measures_bytes else None,
                          recv_bytes=cs.comm.recv_bytes - recv if cs.measures_bytes else None)
        if metric_round(t, self.rounds, self.metrics_every):
            row.update(self.evaluate(state))
        self.metrics.append(row)
        self.state = state
        return state, row

    def snapshot(self, t: int) -> dict:
        """Everything a resumed run needs (references, not copies). ``metrics`` is the live list of
        rows, for a caller that keeps snapshots in memory; a checkpoint file leaves it out
        (:func:`python_algos.runfolder.checkpoint.save`): the history lives in the metrics file."""
        return {"round": t, "algorithm": self.algorithm.name, "hparams": self.algorithm.hparams(),
                "state": snapshot_state(self.state),
                "rng": self.rng.get_state(), "client_rng": self.cs.rng_state(), "torch_rng": torch.get_rng_state(),
                "buffers": dict(self.model.named_buffers()), "metrics": self.metrics, "initial": self.initial,
                "elapsed": self.elapsed, "executor": self.ran_on,
                "setup": self.settings}  # the run's settings, checked by a resume (python_algos.runfolder.setup_record)

    def view(self) -> RunView:
        main = getattr(self.cs, "rank", 0) == 0  # distributed: rank 0 alone shows progress
        return RunView(rounds=self.rounds, start=self.first, initial=self.initial, main=main,
                       report=lambda st: self.cs.report(self.algorithm, st, self.regularizer), snapshot=self.snapshot,
                       fresh=self.fresh)

    def history(self, state, threads: Optional[int]) -> History:
        cs, alg = self.cs, self.algorithm
        params = cs.report(alg, state, self.regularizer).detach().clone()
        if hasattr(cs, "check_replicas"):  # distributed: every rank must end with the same model
            cs.check_replicas(params)
        self.flat.bind_(params.clone(), torch.zeros_like(params))
        setup = {**self.setup, "dim": int(params.numel()), "dtype": str(params.dtype).replace("torch.", "")}
        setup = {k: setup[k] for k in ("regularizer", "rounds", "seed", "batch_size", "num_clients",
                                       "clients_per_round",
                                       "dim", "dtype", "metrics_every", "metric_step")}  # the order History.save writes
        if getattr(cs, "first_layer", None) is not None:  # the batched executor's first-layer path (issue 40)
            setup["first_layer"] = {"path": cs.first_layer, "source": cs.first_layer_source}
        if (why := run_warning([self.initial, *self.metrics])) is not None:  # the rule of summary.json's "warning"
            warnings.warn(f"{alg.name}: {why}", RunWarning, stacklevel=3)
        return History(params=params, metrics=self.metrics, initial=self.initial, algorithm=alg.name,
                       hparams=alg.hparams(), state=state, executor=getattr(cs, "executor", type(cs).__name__),
                       world_size=getattr(cs, "world_size", 1), threads=threads, setup=setup)

"""Checks a user runs on their own algorithm before trusting its curves: the battery the built-in
algorithms pass, on a small least-squares federation (float64, every gradient exact) of this
module's own making::

    from python_algos.testing import check_algorithm
    check_algorithm(MyMethod(lr=0.05, local_steps=3))

:func:`check_algorithm` runs, and reports every failure with what is wrong and where:

1. **the interface**: an :class:`~python_algos.algorithms.Algorithm` whose ``init`` returns a
   NamedTuple state, whose ``client_fields`` name exactly its per-client ``[N, d]`` stacks (a
   distributed run shards exactly these), and whose ``round`` returns the same type with ``t + 1``,
   updating the client stacks in place;
2. **declared costs**: ``costs(N).up`` / ``.down`` count the messages the algorithm names;
3. **the client/server split** (server–client algorithms): the client program run one client at a
   time on 1-row stacks, as a deployed node runs it, the uploads averaged here and the server program
   called once a round, reproduces ``simulate`` to 1e-12, under full and partial participation;
   what a program sends is exactly the messages it declares;
4. **every executor equal to the sequential one** (``batched``) to 1e-10 in float64;
5. **resume bit for bit**: a run checkpointed mid-way and resumed ends on the same bits as one
   run straight through, minibatches included.

It raises :class:`AlgorithmCheckError` listing the failures, or returns a short report.
"""

from __future__ import annotations

import io
import warnings
from typing import Optional

import torch
from torch import nn

import fedkernels as fk

from .algorithms.base import Algorithm, ServerClientAlgorithm
from .clients.base import seeds
from .clients.sequential import SequentialClients
from .runfolder.callbacks import Checkpoint
from .simulate import simulate

__all__ = ["check_algorithm", "AlgorithmCheckError", "one_client_at_a_time", "ProgramError"]

N_CLIENTS, DIM, SAMPLES, BATCH, SEED, ROUNDS = 6, 10, 15, 5, 11, 4


class AlgorithmCheckError(AssertionError):
    """An algorithm broke what the executors and deployments rely on; ``failures`` lists each."""

    def __init__(self, name: str, failures: list):
        self.failures = failures
        super().__init__(f"{name} failed {len(failures)} check(s):\n" + "\n".join(f"  - {f}" for f in failures))


class _Federation:
    """N clients with least-squares losses and client-specific optima (heterogeneous data)."""

    def __init__(self, seed: int = 5):
        g = torch.Generator().manual_seed(seed)
        x_true = torch.randn(DIM, generator=g, dtype=torch.float64)
        self.data = []
        for _ in range(N_CLIENTS):
            a = torch.randn(SAMPLES, DIM, generator=g, dtype=torch.float64)
            x_i = x_true + 0.5 * torch.randn(DIM, generator=g, dtype=torch.float64)
            self.data.append((a, (a @ x_i + 0.1 * torch.randn(SAMPLES, generator=g, dtype=torch.float64))[:, None]))
        self.x0 = 0.1 * torch.randn(DIM, generator=g, dtype=torch.float64)

    def model(self) -> nn.Module:
        m = nn.Linear(DIM, 1, bias=False).double()
        with torch.no_grad():
            m.weight.copy_(self.x0[None, :])
        return m

    @staticmethod
    def loss(out, y):
        return nn.functional.mse_loss(out, y)

    def run(self, alg, regularizer, **kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return simulate(alg, self.model(), self.loss, self.data, kw.pop("rounds", ROUNDS), regularizer,
                            batch_size=BATCH, seed=SEED, metrics_every=0, **kw)


def check_algorithm(algorithm: Algorithm, *, regularizer: Optional[fk.Regularizer] = None,
                    clients_per_round: Optional[int] = 3) -> str:
    """Check ``algorithm`` (see the module docstring); raise :class:`AlgorithmCheckError` naming
    every failure. ``regularizer``: the h to run with (default L1(0.01) for a composite method,
    none for a smooth one); ``clients_per_round``: the partial participation checked besides full
    participation, where the algorithm allows it (None: full only)."""
    if not isinstance(algorithm, Algorithm):
        raise AlgorithmCheckError(repr(algorithm), [
            f"{type(algorithm).__name__} is not a python_algos Algorithm: subclass "
            "python_algos.algorithms.base.ServerClientAlgorithm (or Algorithm) and define init/round/report"])
    reg = regularizer if regularizer is not None else (fk.L1(0.01) if algorithm.composite else fk.Zero())
    fed, failures = _Federation(), []
    name = type(algorithm).__name__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        algorithm.validate(reg)
    try:
        _check_state(algorithm, fed, reg, failures)
    except Exception as e:  # the user's init/round: report where it broke, then stop
        raise AlgorithmCheckError(name, [f"init or round raised {type(e).__name__}: {e}"]) from e
    if isinstance(algorithm, ServerClientAlgorithm):
        _check_costs(algorithm, failures)
        ks = (None, clients_per_round) if clients_per_round and algorithm.partial_participation else (None,)
        for k in ks:
            _check_programs(algorithm, fed, reg, k, failures)
    _check_executors(algorithm, fed, reg, failures)
    _check_resume(algorithm, fed, reg, failures)
    if failures:
        raise AlgorithmCheckError(name, failures)
    return f"{name}: ok (state contract, costs, client/server programs, batched = sequential, resume bit for bit)"


def _clients(fed) -> SequentialClients:
    return SequentialClients(fed.model(), fed.loss, fed.data, batch_size=BATCH, seed=SEED)


def _check_state(alg, fed, reg, failures) -> None:
    clients = _clients(fed)
    x0 = clients.flat.params.detach().clone()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        state = alg.init(x0, clients)
        if not hasattr(state, "_fields"):
            failures.append(f"init must return a NamedTuple state, got {type(state).__name__}")
            return
        stacks = {f for f, v in state._asdict().items()
                  if isinstance(v, torch.Tensor) and tuple(v.shape) == (N_CLIENTS, DIM)}
        declared = set(getattr(type(state), "client_fields", ()))
        if declared != stacks:
            failures.append(f"{type(state).__name__}.client_fields must name exactly the [N, d] client stacks: "
                            f"declared {sorted(declared)}, found {sorted(stacks)}")
        new = alg.round(state, clients, reg, torch.Generator().manual_seed(0))
    if type(new) is not type(state):
        failures.append(f"round must return a {type(state).__name__}, got {type(new).__name__}")
    elif getattr(new, "t", None) != getattr(state, "t", 0) + 1:
        failures.append(f"round must advance t by one: {getattr(state, 't', None)} -> {getattr(new, 't', None)}")
    else:
        moved = [f for f in stacks & declared if getattr(new, f).data_ptr() != getattr(state, f).data_ptr()]
        if moved:
            failures.append(f"round must update the client stacks in place (a distributed run holds their "
                            f"memory): {', '.join(sorted(moved))} replaced")


def _check_costs(alg, failures) -> None:
    m, c = alg.messages(), alg.costs(N_CLIENTS)
    if (c.up, c.down) != (len(m.up), len(m.down)):
        failures.append(f"costs(N) declares up={c.up}, down={c.down}, but messages() names {len(m.up)} up "
                        f"({', '.join(m.up)}) and {len(m.down)} down ({', '.join(m.down)})")
    if not set(m.up_over_all) <= set(m.up):
        failures.append(f"messages().up_over_all {m.up_over_all} must be among up {m.up}")


def _states_of_simulate(alg, fed, reg, k) -> list:
    states = []

    def keep(t, state, metrics):
        states.append({f: (v.clone() if isinstance(v, torch.Tensor) else v) for f, v in state._asdict().items()})

    fed.run(alg, reg, executor="sequential", clients_per_round=k, callbacks=[keep])
    return states


class ProgramError(AssertionError):
    """The client or server program broke a rule a deployment relies on (what it sends, or the
    clients' copies of replicated state drifting apart)."""


def one_client_at_a_time(alg, clients, reg, rounds: int, *, clients_per_round: Optional[int] = None,
                         seed: int = 0) -> list:
    """The programs of the server–client ``alg`` driven as a deployment drives them: each client on
    its own 1-row stacks and its own copies of replicated state, the uploads averaged here, the
    server program once a round (``simulate``'s participant draw and server generator for ``seed``).
    Returns the state after every round (copies, as dicts); raises :class:`ProgramError` when a
    program sends other messages than it declares or the clients' copies disagree."""
    clients.set_participation(clients_per_round, seed)
    server_rng = torch.Generator().manual_seed(seeds(seed, 1, stream=1)[0])  # simulate's server generator
    msgs, states, n = alg.messages(), [], clients.num_clients
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        alg.validate(reg)
        state = alg.init(clients.flat.params.detach().clone(), clients)
        fields = type(state).client_fields
        copies = [{f: getattr(state, f).clone() for f in getattr(type(state), "client_copies", ())
                   if getattr(state, f) is not None} for _ in range(n)]
        for _ in range(rounds):
            ids = clients.participants() if alg.partial_participation else None
            part = list(range(n)) if ids is None else ids.tolist()

            def node(i, st):
                return st._replace(**{f: getattr(st, f)[i:i + 1] for f in fields}, **copies[i])

            down = alg.download(state, server_rng)
            extra = {m for m, v in down.items() if isinstance(v, torch.Tensor)} - set(msgs.down)
            if extra:
                raise ProgramError(f"download sends {sorted(extra)}, not declared in messages().down {msgs.down}")
            ups = {}
            for i in part:
                up = alg.client_update(node(i, state), down, clients, reg, torch.tensor([i]))
                if set(up) != set(msgs.up):
                    raise ProgramError(f"client_update returns {sorted(up)}, messages().up declares "
                                       f"{sorted(msgs.up)}")
                ups[i] = {m: v.clone() for m, v in up.items()}  # what node i sent
            means = {m: sum(ups[i][m][0] for i in part) / (n if m in msgs.up_over_all or ids is None else len(part))
                     for m in msgs.up}
            state, sent = alg.server_update(state, means, down, reg)
            if set(sent) != set(msgs.down):
                raise ProgramError(f"server_update sends {sorted(sent)}, messages().down declares "
                                   f"{sorted(msgs.down)}")
            for i in part:
                alg.client_receive(node(i, state), sent, ups[i], clients, reg, torch.tensor([i]))
            for f, v in copies[part[0]].items():  # replicated client state: every client holds the same
                if not all(torch.equal(c[f], v) for c in copies if c):
                    raise ProgramError(f"the clients' copies of {f!r} differ after a round: it is not the same "
                                       "on every client, so it is not client_copies state")
            state = state._replace(**copies[part[0]])
            states.append({f: (v.clone() if isinstance(v, torch.Tensor) else v) for f, v in state._asdict().items()})
    return states


def _check_programs(alg, fed, reg, k, failures) -> None:
    who = "all clients" if k is None else f"{k} clients per round"
    try:
        got = one_client_at_a_time(alg, _clients(fed), reg, ROUNDS, clients_per_round=k, seed=SEED)
    except ProgramError as e:
        failures.append(str(e))
        return
    except Exception as e:  # the user's programs: report where it broke
        failures.append(f"the client/server programs, one client at a time ({who}), raised "
                        f"{type(e).__name__}: {e}")
        return
    want = _states_of_simulate(alg, fed, reg, k)
    for t, (a, b) in enumerate(zip(got, want), 1):
        for f, v in b.items():
            if isinstance(v, torch.Tensor):
                err = float((a[f] - v).abs().max()) if a[f].shape == v.shape else float("inf")
                if not err <= 1e-12 * (1.0 + float(v.abs().max())):
                    failures.append(f"the programs run one client at a time ({who}) differ from simulate at "
                                    f"round {t}, field {f!r} (max |diff| {err:.3g}): a client reads another "
                                    "client's rows or state the server does not send")
                    return


def _check_executors(alg, fed, reg, failures) -> None:
    want = fed.run(alg, reg, executor="sequential").params
    try:
        got = fed.run(alg, reg, executor="batched").params
    except Exception as e:
        failures.append(f"the batched executor raised {type(e).__name__}: {e}")
        return
    err = float((got - want).abs().max())
    if not err <= 1e-10 * (1.0 + float(want.abs().max())):
        failures.append(f"the batched executor ends {err:.3g} away from the sequential one (float64): the "
                        "algorithm's result depends on how clients' work is run")


def _check_resume(alg, fed, reg, failures) -> None:
    full = fed.run(alg, reg, rounds=ROUNDS + 2)
    saved = {}

    def keep(snapshot):  # a copy, as a file would hold it: the run goes on updating its tensors
        buf = io.BytesIO()
        torch.save(snapshot, buf)
        saved["snap"] = buf.getvalue()

    try:
        fed.run(alg, reg, rounds=ROUNDS + 2, callbacks=[lambda t, s, m: t == 3, Checkpoint(keep, 2)])
    except Exception as e:  # e.g. a State class defined inside a function cannot be pickled
        failures.append(f"a checkpoint of the state could not be written: {type(e).__name__}: {e} (the State class "
                        "must be importable: defined at a module's top level)")
        return
    if "snap" not in saved:
        failures.append("no checkpoint was taken at round 2")
        return
    snap = torch.load(io.BytesIO(saved["snap"]), weights_only=False)
    try:
        resumed = fed.run(alg, reg, rounds=ROUNDS + 2, resume=snap)
    except Exception as e:
        failures.append(f"resuming from round 2 raised {type(e).__name__}: {e}")
        return
    if not torch.equal(resumed.params, full.params):
        err = float((resumed.params - full.params).abs().max())
        failures.append(f"a run resumed from its round-2 checkpoint ends {err:.3g} away from one run straight "
                        "through: state the checkpoint misses (a field outside the State, a generator)")

"""A python_algos algorithm as a Flower ``Strategy`` (Flower's Message API, ``flwr==1.41.0``).

    strategy = AlgorithmStrategy(FedCanon(...), model_fn, regularizer=fk.L1(1e-3), rounds=50, num_clients=4)
    result = strategy.start(grid, strategy.initial_arrays(), num_rounds=strategy.remaining)
    result.arrays["params"]      # the reported model (numpy); strategy.result() has the server's state too

The program is :class:`~.flower_server.ServerProgram`'s: Flower's ``start`` loop calls its
``configure_train`` (the participants' messages) and ``aggregate_train`` (the uploads' mean and
the server update with the fused kernels, the prox included, then the round's end for the run's
callbacks, as in ``simulate``'s loop: the checkpoint, ``StopOnDivergence``, ...). There is no client-side evaluation
round (``configure_evaluate`` sends nothing). Flower's loop waits ``timeout`` seconds for a round
(``start``'s argument) and pulls replies every 3 s; :func:`~.flower_server.run_server` runs the same
program, pulling every 0.1 s. Importing this module needs Flower.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from .flower_server import ServerProgram
from .wire import encode_vectors

__all__ = ["AlgorithmStrategy"]


class AlgorithmStrategy(ServerProgram, Strategy):
    """:class:`~.flower_server.ServerProgram` as a Flower ``Strategy`` (same arguments)."""

    def initial_arrays(self) -> ArrayRecord:
        """The start of the run's reported model, named "params" (what ``start`` takes; it is not read
        back: the program's State is the model)."""
        return encode_vectors({"params": self.algorithm.report(self.state, self.regularizer).detach()})

    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args, **kwargs):
        """Flower's ``Strategy.start`` with the run's callbacks around it, as ``simulate``'s loop calls
        them: ``on_start`` first, each round's end in :meth:`aggregate_train`, ``on_end`` however it ends."""
        self.begin()
        try:
            return Strategy.start(self, grid, initial_arrays, *args, **kwargs)
        finally:
            self.end()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        return ServerProgram.configure_train(self, server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return ServerProgram.aggregate_train(self, server_round, list(replies), "start()'s timeout")

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> list[Message]:
        return []  # the objective needs every client's data: evaluate the reported model where the data is

    def aggregate_evaluate(self, server_round: int, replies) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        from logging import INFO

        from flwr.common.logger import log

        log(INFO, "\t├── %s %s, h = %r", self.algorithm.name, self.algorithm.hparams(), self.regularizer)
        log(INFO, "\t└── %d clients, %s per round, rounds %d..%d", self.n, self.k or "all", self.t + 1, self.rounds)

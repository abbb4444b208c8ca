"""The Flower apps (python_algos.deploy.flower) reproduce simulate().

The server's loop runs on an in-test Flower ``Grid`` that hands every message to the real
``ClientApp`` (one ``Context`` per node, whose ``state`` persists across rounds as a SuperNode's
does) and returns its reply: every vector crosses as Flower ``Array`` bytes, exactly what goes on
the wire. (Flower's own simulation engine needs Ray; the real-process deployment is
tests/test_flower_deploy.py.) Ground truth: ``simulate`` with the sequential executor, float64.
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch

flwr = pytest.importorskip("flwr", reason='Flower is not installed: pip install ".[flower]"')

from _problems import LeastSquares  # noqa: E402
from flwr.app import Context, Error, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

import fedkernels as fk  # noqa: E402
import python_algos as pa  # noqa: E402
from python_algos.algorithms.registry import make  # noqa: E402
from python_algos.deploy import flower as pf  # noqa: E402

SEED, ROUNDS, BATCH, REG, N = 11, 4, 5, fk.L1(0.05), 4


class LocalGrid(Grid):
    """A Grid whose nodes are ClientApp calls in this process. ``silent``: {node_id: round} from
    which that node answers nothing (a node that died); an exception in the app becomes an error
    reply, as in Flower's runtime."""

    def __init__(self, app, num_nodes, silent=None, state_dir=None):
        self.app, self.silent, self.round = app, dict(silent or {}), 0
        extra = {} if state_dir is None else {"state-dir": str(state_dir)}
        self.contexts = {1000 + 7 * j: Context(run_id=1, node_id=1000 + 7 * j,
                                               node_config={"partition-id": j, "num-partitions": num_nodes, **extra},
                                               state=RecordDict(), run_config={})
                         for j in reversed(range(num_nodes))}  # node ids in another order than clients
        self.sent = []  # every message pushed, for the byte count
        self.replies = {}  # message id -> reply (push_messages / pull_messages)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1

    def set_run(self, run):
        pass

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return flwr.app.Message(content, dst_node_id, message_type, group_id=group_id)

    def get_node_ids(self):
        return list(self.contexts)

    def _deliver(self, m):
        """The node's reply to ``m``, or None if the node is silent."""
        self.sent.append(m)
        nid = m.metadata.dst_node_id
        if m.metadata.group_id.isdigit() and int(m.metadata.group_id) >= self.silent.get(nid, 10 ** 9):
            return None
        try:
            return self.app(m, self.contexts[nid])
        except Exception as e:  # noqa: BLE001 - what Flower's runtime does with a ClientApp's exception
            return flwr.app.Message(Error(code=1, reason=f"{type(e).__name__}: {e}"), reply_to=m)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            ids.append(f"m{len(self.sent)}")
            self.replies[ids[-1]] = self._deliver(m)
        return ids

    def pull_messages(self, message_ids):
        return [r for i in message_ids if (r := self.replies.pop(i, None)) is not None]

    def send_and_receive(self, messages, *, timeout=None):
        return [r for m in messages if (r := self._deliver(m)) is not None]


@pytest.fixture(scope="module")
def problem():
    return LeastSquares(seed=5, n=N, d=10, m=15)


def _alg(name, **ov):
    return make(name, lr=0.03, local_steps=3, **ov)


def _simulate(problem, alg, k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pa.simulate(alg, problem.model(), problem.loss, problem.data, ROUNDS, REG, batch_size=BATCH,
                           seed=SEED, executor="sequential", clients_per_round=k, metrics_every=0)


def _flower(problem, alg, k, silent=None, state_dir=None, **kw):
    app = pf.client_app(alg, problem.model, problem.loss, lambda i, ctx: problem.data[i], regularizer=REG,
                        seed=SEED, batch_size=BATCH)
    grid = LocalGrid(app, N, silent, state_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = pf.run_server(grid, alg, problem.model, regularizer=REG, rounds=ROUNDS, num_clients=N,
                            clients_per_round=k, seed=SEED, batch_size=BATCH, **kw)
    return res, grid


CASES = [("fedcanon", {}, None), ("za1", {}, None), ("fednmap", {}, None), ("fednmap", {"downlink": "z"}, None),
         ("scaffold", {}, 2), ("fedavg", {}, 3), ("feddr", {"init_from": "code"}, 2)]


@pytest.mark.parametrize("name,ov,k", CASES, ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}-k{k}"
                                                  for n, o, k in CASES])
def test_flower_apps_reproduce_simulate(problem, name, ov, k):
    want = _simulate(problem, _alg(name, **ov), k)
    got, _ = _flower(problem, _alg(name, **ov), k)
    assert len(got.metrics) == ROUNDS
    scale = 1.0 + float(want.params.abs().max())
    assert float((got.params - want.params).abs().max()) <= 1e-10 * scale
    assert not torch.equal(got.params, problem.x0)  # it moved
    fields = type(want.state).client_fields + tuple(getattr(type(want.state), "client_copies", ()))
    for f, v in want.state._asdict().items():  # the server's fields too, not only the model
        if f not in fields and isinstance(v, torch.Tensor):
            assert float((getattr(got.state, f) - v).abs().max()) <= 1e-10 * (1 + float(v.abs().max())), f
    if k is not None:  # the participants are simulate's draw
        cs = problem.clients(seed=SEED)
        cs.set_participation(k, SEED)
        assert [m["participants"] for m in got.metrics] == [cs.participants().tolist() for _ in range(ROUNDS)]


@pytest.mark.parametrize("name,ov,k", [("fedcanon", {}, None), ("scaffold", {}, 2), ("za1", {}, None)])
def test_bytes_per_round_are_the_declared_messages(problem, name, ov, k):
    """Per participant and round: |up| vectors up; |down| vectors down (from round 2: round 1 sends
    what ``download`` starts from), each d float64 values plus the .npy header of an Array."""
    alg = _alg(name, **ov)
    got, grid = _flower(problem, alg, k)
    m, d, item = alg.messages(), problem.d, 8
    header = 128  # numpy's .npy header for a 1-D array (format 1.0: padded to 64-byte multiples)
    for rec in got.metrics:
        n = len(rec["participants"])
        assert rec["recv_bytes"] == n * len(m.up) * (d * item + header)
        if rec["round"] > 1:
            assert rec["sent_bytes"] == n * len(m.down) * (d * item + header), rec
    rounds = [msg for msg in grid.sent if msg.metadata.message_type == pf.ROUND]
    assert len(rounds) == sum(len(r["participants"]) for r in got.metrics)


def test_a_node_that_stops_answering_is_named(problem):
    with pytest.raises(pf.NodeFailure, match=r"round 3: client 2 \(node 1014\) did not answer within round_timeout"):
        _flower(problem, _alg("fedcanon"), None, silent={1014: 3}, round_timeout=0.5)


def test_a_node_that_fails_is_named(problem):
    calls = []

    def bad_data(i, ctx):  # client 1's disk goes after the handshake (which probes a few samples)
        calls.append(i)
        if i == 1 and calls.count(1) > 1:
            raise OSError("disk gone")
        return problem.data[i]

    app = pf.client_app(_alg("za1"), problem.model, problem.loss, bad_data, regularizer=REG, seed=SEED,
                        batch_size=BATCH)
    with pytest.raises(pf.NodeFailure, match=r"round 1: client 1 \(node 1007\): OSError: disk gone"):
        pf.run_server(LocalGrid(app, N), _alg("za1"), problem.model, regularizer=REG, rounds=2, num_clients=N,
                      seed=SEED, batch_size=BATCH)


def test_a_node_with_other_settings_is_refused_at_the_handshake(problem):
    app = pf.client_app(_alg("za1"), problem.model, problem.loss, lambda i, c: problem.data[i], regularizer=REG,
                        seed=SEED + 1, batch_size=BATCH)
    with pytest.raises(ValueError,
                       match=r"client \d \(node \d+\) runs other settings than the server: seed: server 11"):
        pf.run_server(LocalGrid(app, N), _alg("za1"), problem.model, regularizer=REG, rounds=2, num_clients=N,
                      seed=SEED, batch_size=BATCH)


def test_bad_settings_are_refused_before_any_message(problem):
    grid = LocalGrid(None, N)
    with pytest.raises(ValueError, match="round_timeout must be a finite number"):
        pf.run_server(grid, _alg("za1"), problem.model, regularizer=REG, rounds=2, num_clients=N, round_timeout=None)
    with pytest.raises(ValueError, match="does not support partial participation"):
        pf.run_server(grid, _alg("za1"), problem.model, regularizer=REG, rounds=2, num_clients=N, clients_per_round=2)
    with pytest.raises(TypeError, match="DEPOSITUM is peer-to-peer"):
        pf.client_app(make("depositum", lr=0.03, local_steps=3), problem.model, problem.loss, None, regularizer=REG)
    with pytest.raises(ValueError, match="FedDR: with init_from='paper' its init takes the clients' gradients"):
        pf.run_server(grid, _alg("feddr"), problem.model, regularizer=REG, rounds=2, num_clients=N)
    assert grid.sent == []


# -- a failed node: the server's checkpoint, the nodes' own state, and an exact resume ---------------
RESUME_CASES = [("scaffold", {}, 2), ("fedcanon", {}, None), ("feddr", {"init_from": "code"}, 3)]


@pytest.mark.parametrize("name,ov,k", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_a_run_stopped_by_a_failed_node_resumes_exactly(problem, tmp_path, name, ov, k):
    """Node 1014 (client 2) dies in round 3: the run stops naming it and the server's checkpoint of
    round 2; the other participants of round 3 have already saved their round-3 state. A fresh
    Flower run (new contexts, as after restarting the nodes) resumes from the checkpoint and ends
    where simulate() ends. SCAFFOLD keeps control variates on the nodes, FedCanon a client_receive
    of the previous download, FedDR duals."""
    want = _simulate(problem, _alg(name, **ov), k)
    path, nodes = str(tmp_path / "server.pt"), tmp_path / "nodes"
    with pytest.raises(pf.NodeFailure, match=r"round 3: client 2 \(node 1014\) did not answer.*checkpoint of "
                                             r"round 2 is .*server\.pt: restart the node and resume"):
        _flower(problem, _alg(name, **ov), k, silent={1014: 3}, state_dir=nodes, round_timeout=0.5, checkpoint=path)
    snap = pf.load_server_checkpoint(path)
    assert snap["round"] == 2 and len(snap["metrics"]) == 2
    got, _ = _flower(problem, _alg(name, **ov), k, state_dir=nodes, resume=snap, checkpoint=path)
    assert [m["round"] for m in got.metrics] == list(range(1, ROUNDS + 1))
    assert float((got.params - want.params).abs().max()) <= 1e-10 * (1.0 + float(want.params.abs().max()))
    if k is not None:
        cs = problem.clients(seed=SEED)
        cs.set_participation(k, SEED)
        assert [m["participants"] for m in got.metrics] == [cs.participants().tolist() for _ in range(ROUNDS)]
    assert pf.load_server_checkpoint(path)["round"] == ROUNDS
    for d in (nodes / snap["run_key"]).iterdir():  # pruned: the newest file at or before the server's last
        assert len(list(d.iterdir())) <= 2, sorted(p.name for p in d.iterdir())  # checkpoint, and the later ones


def test_resume_without_the_nodes_state_is_refused_naming_the_fix(problem, tmp_path):
    path = str(tmp_path / "server.pt")
    with pytest.raises(pf.NodeFailure, match="round 3"):
        _flower(problem, _alg("scaffold"), 2, silent={1014: 3}, round_timeout=0.5, checkpoint=path)
    snap = pf.load_server_checkpoint(path)
    with pytest.raises(pf.NodeFailure, match=r"client \d cannot resume: it took part in round \d, and its state was "
                                             r"kept only in memory; start the node with .*state-dir="):
        _flower(problem, _alg("scaffold"), 2, resume=snap)
    with pytest.raises(ValueError, match=r"cannot resume from the Flower server checkpoint: it was recorded under "
                                         r"other settings.*: seed: snapshot 11, given 12"):
        pf.run_server(LocalGrid(None, N), _alg("scaffold"), problem.model, regularizer=REG, rounds=ROUNDS,
                      num_clients=N, clients_per_round=2, seed=SEED + 1, batch_size=BATCH, resume=snap)


@pytest.mark.parametrize("layer, words", [
    (lambda d: torch.nn.BatchNorm1d(d), r"updates module buffers \('1' \(BatchNorm1d\): 1\.running_mean"),
    (lambda d: torch.nn.Dropout(0.2), r"draws random numbers from torch's global generator \('1': Dropout\)"),
])
def test_a_model_with_node_local_state_is_refused_at_the_handshake(problem, layer, words):
    """In one process every client shares BatchNorm's running statistics and torch's generator in turn;
    a node would keep its own (rebuilt every round): refused, with the fix. In eval mode it is exact."""
    def model_fn(eval_mode=False):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(problem.d, problem.d), layer(problem.d),
                                torch.nn.Linear(problem.d, 1)).double()
        return m.eval() if eval_mode else m

    loss = lambda out, y: torch.nn.functional.mse_loss(out.reshape(-1), y)  # noqa: E731
    alg = _alg("fedavg")
    app = pf.client_app(alg, model_fn, loss, lambda i, c: problem.data[i], regularizer=REG, seed=SEED,
                        batch_size=BATCH)
    grid = LocalGrid(app, N)
    with pytest.raises(pf.NodeFailure,
                       match="the handshake: node \\d+: ValueError: client \\d: a training pass " + words +
                       r".*return it in eval mode from model_fn"):
        pf.run_server(grid, alg, model_fn, regularizer=REG, rounds=2, num_clients=N, seed=SEED, batch_size=BATCH)
    assert [m.metadata.message_type for m in grid.sent] == [pf.HELLO] * N  # no round was sent
    evaluating = lambda: model_fn(True)  # noqa: E731
    app = pf.client_app(alg, evaluating, loss, lambda i, c: problem.data[i], regularizer=REG, seed=SEED,
                        batch_size=BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = pf.run_server(LocalGrid(app, N), alg, evaluating, regularizer=REG, rounds=2, num_clients=N, seed=SEED,
                            batch_size=BATCH)
        want = pa.simulate(alg, evaluating(), loss, problem.data, 2, REG, batch_size=BATCH, seed=SEED,
                           executor="sequential", metrics_every=0)
    assert float((got.params - want.params).abs().max()) <= 1e-10 * (1.0 + float(want.params.abs().max()))


def test_the_handshake_goes_on_without_a_stale_node(problem):
    """A killed node stays listed at the SuperLink for a while beside its restarted self: as soon as one
    node of every client has answered, the run goes on; a client nobody answers for is named."""
    alg = _alg("za1")
    app = pf.client_app(alg, problem.model, problem.loss, lambda i, c: problem.data[i], regularizer=REG, seed=SEED,
                        batch_size=BATCH)
    grid = LocalGrid(app, N, silent={1007: 0})
    grid.contexts[2000] = Context(run_id=1, node_id=2000, node_config={"partition-id": 1, "num-partitions": N},
                                  state=RecordDict(), run_config={})  # client 1's node, restarted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = pf.run_server(grid, alg, problem.model, regularizer=REG, rounds=2, num_clients=N, seed=SEED,
                            batch_size=BATCH, round_timeout=30.0)
    assert got.nodes[1] == 2000
    grid = LocalGrid(app, N, silent={1007: 0})
    with pytest.raises(pf.NodeFailure, match=r"the handshake: no node answered for client\(s\) \[1\] within "
                                             r"0.6 s \(the longer of round_timeout=0.5 s and connect_timeout=0.6 s; "
                                             r"4 nodes listed, 3 answered\)"):
        pf.run_server(grid, alg, problem.model, regularizer=REG, rounds=2, num_clients=N, seed=SEED,
                      batch_size=BATCH, round_timeout=0.5, connect_timeout=0.6)


class LateNodeGrid(LocalGrid):
    """A LocalGrid whose node ``late`` is listed only after the server's first pull of replies: a
    restarted node that registers after a killed node's stale entry made up the N nodes listed."""

    def __init__(self, *a, late, **kw):
        super().__init__(*a, **kw)
        self.late, self.pulls = late, 0

    def get_node_ids(self):
        return [nid for nid in self.contexts if nid != self.late or self.pulls > 0]

    def pull_messages(self, message_ids):
        self.pulls += 1
        return super().pull_messages(message_ids)


def test_the_handshake_asks_a_node_that_registers_while_it_waits(problem):
    """Client 1's node was killed (1007, still listed, silent) and restarted as 2000, which registers
    only after the handshake has started: the node list is read again while the answers are awaited."""
    alg = _alg("za1")
    app = pf.client_app(alg, problem.model, problem.loss, lambda i, c: problem.data[i], regularizer=REG, seed=SEED,
                        batch_size=BATCH)
    grid = LateNodeGrid(app, N, silent={1007: 0}, late=2000)
    grid.contexts[2000] = Context(run_id=1, node_id=2000, node_config={"partition-id": 1, "num-partitions": N},
                                  state=RecordDict(), run_config={})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = pf.run_server(grid, alg, problem.model, regularizer=REG, rounds=ROUNDS, num_clients=N, seed=SEED,
                            batch_size=BATCH, round_timeout=5.0, connect_timeout=5.0)
    assert got.nodes[1] == 2000
    want = _simulate(problem, alg, None)
    assert float((got.params - want.params).abs().max()) <= 1e-10 * (1.0 + float(want.params.abs().max()))


class SlowStartGrid(LocalGrid):
    """A LocalGrid whose nodes' answers to the handshake become available only ``delay`` seconds after
    it is sent, as when each SuperNode starts its first ClientApp process on a loaded machine."""

    def __init__(self, *a, delay, **kw):
        super().__init__(*a, **kw)
        self.delay, self.ready = delay, {}

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        at = time.monotonic() + (self.delay if messages[0].metadata.message_type == pf.HELLO else 0.0)
        self.ready.update(dict.fromkeys(ids, at))
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        return super().pull_messages([i for i in message_ids if self.ready.get(i, 0.0) <= now])


def test_the_handshake_waits_connect_timeout_for_the_nodes_first_start(problem):
    """A round timeout shorter than the nodes' first start must not fail the run before its first round:
    the handshake waits the longer of round_timeout and connect_timeout."""
    alg = _alg("za1")
    app = pf.client_app(alg, problem.model, problem.loss, lambda i, c: problem.data[i], regularizer=REG, seed=SEED,
                        batch_size=BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = pf.run_server(SlowStartGrid(app, N, delay=1.0), alg, problem.model, regularizer=REG, rounds=ROUNDS,
                            num_clients=N, seed=SEED, batch_size=BATCH, round_timeout=0.3, connect_timeout=10.0)
    want = _simulate(problem, alg, None)
    assert float((got.params - want.params).abs().max()) <= 1e-10 * (1.0 + float(want.params.abs().max()))
    with pytest.raises(pf.NodeFailure, match=r"the handshake: no node answered for client\(s\) \[0, 1, 2, 3\] "
                                             r"within 0.4 s"):
        pf.run_server(SlowStartGrid(app, N, delay=1.0), alg, problem.model, regularizer=REG, rounds=2,
                      num_clients=N, seed=SEED, batch_size=BATCH, round_timeout=0.3, connect_timeout=0.4)


# -- a resume under other settings (issue 26, defect 3): one resume check, before anything runs ------
def _checkpoint_of(problem, tmp_path, k):
    """A server checkpoint of round 2 (client 2's node dies in round 3), its nodes' states kept."""
    path, nodes = str(tmp_path / "server.pt"), tmp_path / "nodes"
    with pytest.raises(pf.NodeFailure, match="round 3"):
        _flower(problem, _alg("scaffold"), k, silent={1014: 3}, state_dir=nodes, round_timeout=0.5, checkpoint=path)
    return pf.load_server_checkpoint(path), nodes


@pytest.mark.parametrize("k_then, k_now, words", [
    (2, 3, "participation/clients_per_round: snapshot 2 client(s) per round, given 3 client(s) per round"),
    (2, None, "participation/clients_per_round: snapshot 2 client(s) per round, given all clients"),
    (None, 2, "participation/clients_per_round: snapshot all clients, given 2 client(s) per round"),
])
def test_a_resume_with_other_participation_is_refused_naming_it(problem, tmp_path, k_then, k_now, words):
    """Before: 2 -> 3 clients per round resumed silently (another run under the old name), and 2 -> all
    clients crashed with AttributeError ('participation_rng'). Refused before any message is sent."""
    snap, _ = _checkpoint_of(problem, tmp_path, k_then)
    grid = LocalGrid(None, N)
    with pytest.raises(ValueError, match="cannot resume from the Flower server checkpoint") as e:
        pf.run_server(grid, _alg("scaffold"), problem.model, regularizer=REG, rounds=ROUNDS, num_clients=N,
                      clients_per_round=k_now, seed=SEED, batch_size=BATCH, resume=snap)
    assert words in str(e.value) and grid.sent == []


def test_a_full_participation_run_resumes_exactly(problem, tmp_path):
    """SCAFFOLD with every client each round, stopped by a failed node and resumed: simulate's run."""
    want = _simulate(problem, _alg("scaffold"), None)
    snap, nodes = _checkpoint_of(problem, tmp_path, None)
    got, _ = _flower(problem, _alg("scaffold"), None, state_dir=nodes, resume=snap)
    assert float((got.params - want.params).abs().max()) <= 1e-10 * (1.0 + float(want.params.abs().max()))


def test_regularizers_differing_in_the_8th_digit_are_told_apart(problem, tmp_path):
    """h is recorded at full precision (its class and parameters, floats by repr round-trip), not by
    repr(h), which shows 6 digits: L1(0.05) and L1(0.050000001) print alike and are other runs."""
    other = fk.L1(0.050000001)
    assert repr(other) == repr(REG)  # what the record used to compare
    snap, _ = _checkpoint_of(problem, tmp_path, 2)
    with pytest.raises(ValueError, match=r"regularizer: snapshot L1\(kappa=0\.05\), given L1\(kappa=0\.050000001\)"):
        pf.run_server(LocalGrid(None, N), _alg("scaffold"), problem.model, regularizer=other, rounds=ROUNDS,
                      num_clients=N, clients_per_round=2, seed=SEED, batch_size=BATCH, resume=snap)
    assert pf.fingerprint(_alg("scaffold"), other, SEED, BATCH, N, torch.zeros(3))["regularizer"] != \
        pf.fingerprint(_alg("scaffold"), REG, SEED, BATCH, N, torch.zeros(3))["regularizer"]


# -- the engine loop's callbacks: a run that blows up stops as diverged, at one process's round ------
def test_a_flower_run_that_blows_up_stops_diverged_at_the_one_process_round(problem, tmp_path):
    """The server's loop is simulate's engine loop with its callbacks: given f+h (``evaluate``, here the
    full objective on the test's data, as the run --flower ServerApp computes it), StopOnDivergence
    stops the Flower run at the round at which the one-process run stops, with the same reason, and
    the round it stops on is not checkpointed (the checkpoint keeps the last good round). Ground truth:
    simulate with StopOnDivergence, float64."""
    from python_algos.runfolder.callbacks import StopOnDivergence
    from python_algos.simulate import objective_metrics

    alg, rounds = make("fedavg", lr=0.5, local_steps=3), 12  # a step far above 1/L: f+h grows by orders of magnitude
    one = StopOnDivergence()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = pa.simulate(alg, problem.model(), problem.loss, problem.data, rounds, REG, batch_size=BATCH,
                           seed=SEED, executor="sequential", callbacks=[one], metrics_every=1)
    assert one.reason is not None and len(want.metrics) < rounds, "the reference run must diverge"
    cs, step = problem.clients(batch_size=BATCH, seed=SEED), float(alg.metric_step())

    def evaluate(state):
        return objective_metrics(cs, REG, alg.report(state, REG).detach(), step, alg.normal_map_point(state))

    stop, path = StopOnDivergence(), str(tmp_path / "server.pt")
    app = pf.client_app(alg, problem.model, problem.loss, lambda i, ctx: problem.data[i], regularizer=REG,
                        seed=SEED, batch_size=BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = pf.run_server(LocalGrid(app, N), alg, problem.model, regularizer=REG, rounds=rounds, num_clients=N,
                            seed=SEED, batch_size=BATCH, callbacks=[stop], evaluate=evaluate, checkpoint=path)
    assert stop.reason == one.reason
    assert [m["round"] for m in got.metrics] == [m["round"] for m in want.metrics]
    assert got.metrics[-1]["f+h"] == pytest.approx(want.metrics[-1]["f+h"], rel=1e-10)
    assert pf.load_server_checkpoint(path)["round"] == len(want.metrics) - 1


def test_nonfinite_uploads_end_the_run_diverged_as_in_one_process(problem):
    """Local steps that overflow (lr 1e300) upload Inf/NaN in round 1. One process averages them and
    stops "diverged" (the model has NaN/Inf entries); the Flower run must end the same way at the
    same round, not as a failed node, and a warning names a client and its node. Before: NodeFailure."""
    from python_algos.runfolder.callbacks import StopOnDivergence

    alg, rounds = make("fedavg", lr=1e300, local_steps=3), 4
    one = StopOnDivergence()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = pa.simulate(alg, problem.model(), problem.loss, problem.data, rounds, REG, batch_size=BATCH,
                           seed=SEED, executor="sequential", callbacks=[one], metrics_every=0)
    assert one.reason is not None and "NaN/Inf" in one.reason, "the reference run must overflow"
    stop = StopOnDivergence()
    app = pf.client_app(alg, problem.model, problem.loss, lambda i, ctx: problem.data[i], regularizer=REG,
                        seed=SEED, batch_size=BATCH)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = pf.run_server(LocalGrid(app, N), alg, problem.model, regularizer=REG, rounds=rounds, num_clients=N,
                            seed=SEED, batch_size=BATCH, callbacks=[stop], metrics_every=0)
    assert stop.reason == one.reason
    assert [m["round"] for m in got.metrics] == [m["round"] for m in want.metrics]
    named = [str(w.message) for w in caught if "NaN/Inf entries" in str(w.message)]
    assert named and all(m.startswith("round 1: client ") and "(node " in m for m in named), named


class TamperGrid(LocalGrid):
    """A LocalGrid whose node ``node`` (None: every node) replaces each of its round uploads by
    ``tamper(vector)``: a node running another dtype or model, or a faulty one."""

    def __init__(self, *a, node, tamper, **kw):
        super().__init__(*a, **kw)
        self.node, self.tamper = node, tamper

    def _deliver(self, m):
        r = super()._deliver(m)
        if r is not None and m.metadata.message_type == pf.ROUND and self.node in (None, m.metadata.dst_node_id):
            up = r.content["up"]
            for name in list(up.keys()):
                up[name] = flwr.app.Array(self.tamper(up[name].numpy()))
        return r


@pytest.mark.parametrize("node, tamper, words", [
    (1014, lambda v: v.astype("float32"), r"2 \(node 1014\) uploaded '\w+' as float32 of shape \(10,\), expected "
                                          r"float64 of shape \(10,\)"),
    (None, lambda v: v[:1].copy(), r"0 \(node 1000\) uploaded '\w+' as float64 of shape \(1,\), expected float64 of "
                                   r"shape \(10,\)"),
    (1014, lambda v: v[:7].copy(), r"2 \(node 1014\) uploaded '\w+' as float64 of shape \(7,\), expected float64 of "
                                   r"shape \(10,\)"),
], ids=["float32-widened-before", "length-1-broadcast-before", "short-bare-RuntimeError-before"])
def test_an_upload_other_than_the_declared_vectors_stops_the_run_naming_the_node(problem, node, tamper, words):
    """A node (1014: client 2's; None: every node) uploads something other than the algorithm's d-vectors
    in the run's dtype: the run stops at round 1 naming client and node, before the upload enters the
    server's average. Before: a float32 upload was widened silently, length-1 uploads from every node
    broadcast into the server update, a short one among others raised a bare RuntimeError (torch.stack)."""
    alg = _alg("fedcanon")
    app = pf.client_app(alg, problem.model, problem.loss, lambda i, c: problem.data[i], regularizer=REG, seed=SEED,
                        batch_size=BATCH)
    with pytest.raises(pf.NodeFailure, match=r"^round 1: client " + words):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pf.run_server(TamperGrid(app, N, node=node, tamper=tamper), alg, problem.model, regularizer=REG,
                          rounds=ROUNDS, num_clients=N, seed=SEED, batch_size=BATCH)


@pytest.mark.parametrize("name,ov,k", [("fedcanon", {}, None), ("scaffold", {}, 2), ("fednmap", {}, None)])
def test_later_rounds_take_the_node_state_from_the_saved_one(problem, monkeypatch, name, ov, k):
    """A node runs ``init`` and the data probe in its first round only; later rounds assemble the State
    from the saved one, bit for bit what ``init`` followed by the restore gives (the layout withheld)."""
    from python_algos.clients import sequential
    from python_algos.deploy import flower_client, nodes

    probes, inits = [], []
    real_check = sequential.check_clients
    monkeypatch.setattr(sequential, "check_clients", lambda *a, **kw: (probes.append(a[3:]), real_check(*a, **kw)))
    alg = _alg(name, **ov)
    real_init = type(alg).init
    monkeypatch.setattr(type(alg), "init", lambda self, x0, clients: (inits.append(clients.executor),
                                                                       real_init(self, x0, clients))[1])
    got, grid = _flower(problem, alg, k)
    took_part = {i for m in got.metrics for i in m["participants"]}
    assert inits.count("flower-node") == len(took_part) and len(probes) == len(took_part)
    assert sum(len(m["participants"]) for m in got.metrics) > len(took_part)  # some node took part twice

    monkeypatch.setattr(flower_client, "node_state", lambda *a: nodes.node_state(*a[:4], None))  # init every round
    inits.clear()
    slow, _ = _flower(problem, alg, k)
    assert inits.count("flower-node") == sum(len(m["participants"]) for m in got.metrics)
    assert torch.equal(got.params, slow.params)
    for f, v in got.state._asdict().items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, getattr(slow.state, f)), f


@pytest.mark.parametrize("bad", ["not json", '{"class": "no.such.module:State", "names": [], "own": {}}',
                                 "python_algos.algorithms.scaffold:SCAFFOLDState"])
def test_a_node_layout_that_cannot_be_used_falls_back_to_init(problem, monkeypatch, bad):
    from python_algos.deploy import nodes

    alg = _alg("scaffold")

    def node():
        return nodes.NodeClients(problem.model(), problem.loss, problem.data[1], 1, N, BATCH, SEED)

    with torch.no_grad():
        first, names, layout = nodes.node_state(alg, node(), None, {"t": 3})
        first.c_i.add_(1.5)
        saved = pf.decode_vectors(pf.encode_vectors(nodes.save_node(first, names, node(), None)))
        inits = []
        real_init = type(alg).init
        monkeypatch.setattr(type(alg), "init", lambda self, x0, cs: (inits.append(1), real_init(self, x0, cs))[1])
        fast, _, kept = nodes.node_state(alg, node(), saved, {"t": 4}, layout)
        assert inits == [] and kept == layout
        slow, _, rebuilt = nodes.node_state(alg, node(), saved, {"t": 4}, bad)
        assert inits == [1] and rebuilt == layout
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    assert fast.t == 4 and torch.equal(fast.c_i, first.c_i)

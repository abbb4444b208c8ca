"""What the executors check of the clients' data, the model and the loss before a run starts
(python_algos.clients.probe), and simulate's refusal of a model of several dtypes.

Ground truth: the objective and a FedAvg run recomputed by hand in float64 with plain autograd
(a sum loss on full batches); torch's, NumPy's and Python's random states and the module buffers
read before and after building the clients (the checks must leave no trace).
"""

from __future__ import annotations

import os
import random
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import python_algos as pa
from python_algos.algorithms.registry import make
from python_algos.clients import BatchedClients, SequentialClients
from python_algos.runfolder.callbacks import Checkpoint

FEATURES, CLASSES = 10, 3
SIZES = [20, 30, 25]
EXECUTORS = ["sequential", "batched"]


def net(dtype=torch.float64):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, CLASSES)).to(dtype)


def clients(dtype=torch.float64, sizes=SIZES):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(n, FEATURES, generator=g, dtype=dtype), torch.randint(CLASSES, (n,), generator=g))
            for n in sizes]


def sum_loss(out, y):
    return F.cross_entropy(out, y, reduction="sum")


def run(loss, data, executor="sequential", model=None, rounds=2, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FedAvg is smooth: the zero regularizer is fine
        return pa.simulate(make("fedavg", lr=0.01, local_steps=2), model if model is not None else net(), loss, data,
                           rounds, executor=executor, **kw)


# -- a loss that is not a per-sample mean ----------------------------------------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_sum_loss_on_minibatches_is_refused_before_anything_runs(executor):
    calls = []
    with pytest.raises(ValueError, match=r"loss_fn is not the mean of per-sample losses.*client 0 is trained on "
                                         r"minibatches \(batch_size=4 < its 20 samples\).*reduction='mean'"):
        run(sum_loss, clients(), executor, batch_size=4,
            callbacks=[lambda *a: calls.append(a), Checkpoint(calls.append)])
    assert calls == []  # no round ran, no snapshot was handed out


def test_class_weighted_mean_on_minibatches_is_refused_and_its_per_sample_form_runs():
    """A weighted mean's minibatch gradient is not an unbiased estimate of its full-data one; the
    per-sample mean of weighted losses (the message's fix) is."""
    w = torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="loss_fn is not the mean of per-sample losses"):
        run(lambda o, y: F.cross_entropy(o, y, weight=w), clients(), batch_size=4)
    run(lambda o, y: (w[y] * F.cross_entropy(o, y, reduction="none")).mean(), clients(), batch_size=4)


def test_sum_loss_of_dataloader_clients_is_refused_even_for_full_gradients():
    """A full pass over a loader weights its batches as means of their samples."""
    loaders = [DataLoader(TensorDataset(X, y), batch_size=8) for X, y in clients()]
    with pytest.raises(ValueError, match=r"loss_fn is not the mean.*client 0 is a DataLoader"):
        run(sum_loss, loaders)
    run(F.cross_entropy, loaders)  # a mean: fine


def test_batch_size_at_least_every_client_is_a_full_batch_and_keeps_a_sum_loss():
    run(sum_loss, clients(), batch_size=30)  # >= every client's 20, 30, 25 samples: every batch is whole


@pytest.mark.parametrize("executor", EXECUTORS)
def test_sum_loss_on_full_batches_reports_the_objective_it_trains(executor):
    """Full batches: each gradient is the gradient of the client's sum, and f is the mean over
    clients of those sums; FedAvg's iterates and f, ||grad f||^2 recomputed by hand in float64."""
    data = clients()
    hist = run(sum_loss, data, executor, rounds=2)
    ref = net()
    params = list(ref.parameters())

    def flat_grad(X, y):
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(sum_loss(ref(X), y), params)])

    def set_(v):
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(v, params)

    x = torch.nn.utils.parameters_to_vector(params).detach().clone()
    for _ in range(2):  # FedAvg: K = 2 local steps of lr 0.01 from the server model, then the average
        ends = []
        for X, y in data:
            xi = x.clone()
            for _ in range(2):
                set_(xi)
                xi = xi - 0.01 * flat_grad(X, y)
            ends.append(xi)
        x = torch.stack(ends).mean(0)
    assert float((hist.params - x).norm() / x.norm()) < 1e-12
    set_(x)
    with torch.no_grad():
        f = sum(float(sum_loss(ref(X), y)) for X, y in data) / len(data)
    g = sum(flat_grad(X, y) for X, y in data) / len(data)
    assert hist.metrics[-1]["f"] == pytest.approx(f, rel=1e-12)
    assert hist.metrics[-1]["grad_map_sq"] == pytest.approx(float(g.dot(g)), rel=1e-10)  # h = 0: G_s = grad f


# -- a loss that does not return a scalar ---------------------------------------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_loss_with_reduction_none_is_refused_with_its_shape(executor):
    loss = lambda o, y: F.cross_entropy(o, y, reduction="none")  # noqa: E731
    with pytest.raises(ValueError, match=r"loss_fn must return a scalar mean loss .*got shape \[4\] on client 0"):
        run(loss, clients(), executor)
    with pytest.raises(ValueError, match=r"loss_fn must return a scalar mean loss .*got a float"):
        run(lambda o, y: float(F.cross_entropy(o, y)), clients(), executor)


# -- data the model or the loss cannot take ----------------------------------------------------------

@pytest.mark.parametrize("executor", EXECUTORS)
def test_inputs_the_model_cannot_take_name_the_client_and_its_shape(executor):
    data = clients()
    data[1] = (torch.randn(30, FEATURES + 1, dtype=torch.float64), data[1][1])
    with pytest.raises(ValueError, match=r"client 1: model\(X\) failed on its data \(X of shape \(30, 11\)\): "
                                         r"mat1 and mat2 shapes cannot be multiplied \(30x11 and 10x8\)"):
        run(F.cross_entropy, data, executor)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_labels_the_loss_cannot_take_name_the_client(executor):
    data = clients()
    data[0] = (data[0][0], data[0][1].double())
    with pytest.raises(ValueError, match=r"client 0: loss_fn\(model\(X\), y\) failed on its data \(X of shape "
                                         r"\(20, 10\); y of shape \(20,\) and dtype torch.float64.*Long"):
        run(F.cross_entropy, data, executor)


class Counting(Dataset):
    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return self.X.shape[0]

    def __getitem__(self, j):
        random.random(), np.random.rand(), torch.rand(())  # a random augmentation would draw like this
        return self.X[j], self.y[j]


def test_dataset_and_dataloader_clients_are_checked_and_named():
    bad = [(torch.randn(n, FEATURES + 1, dtype=torch.float64), y) for (_, y), n in zip(clients(), SIZES)]
    with pytest.raises(ValueError, match=r"client 0: model\(X\) failed on its data \(its first 4 samples: X of "
                                         r"shape \(4, 11\)\)"):
        SequentialClients(net(), F.cross_entropy, [Counting(*c) for c in bad], batch_size=4)
    with pytest.raises(ValueError, match=r"client 0: model\(X\) failed on its data \(the first 4 samples of its "
                                         r"DataLoader's dataset: X of shape \(4, 11\)\)"):
        SequentialClients(net(), F.cross_entropy, [DataLoader(TensorDataset(*c), batch_size=8) for c in bad])


def test_a_model_that_needs_a_whole_batch_is_retried_on_it_before_refusing():
    class NeedsFive(nn.Module):
        def forward(self, x):
            if x.shape[0] < 5:
                raise RuntimeError("needs at least 5 samples")
            return x

    model = nn.Sequential(nn.Linear(FEATURES, CLASSES), NeedsFive()).double()
    SequentialClients(model, F.cross_entropy, clients(), batch_size=8)  # its batches have 8 samples: fine
    with pytest.raises(ValueError, match=r"client 0: model\(X\) failed .*\(X of shape \(20, 10\), probed on its "
                                         r"first 4 samples\): needs at least 5"):
        SequentialClients(model, F.cross_entropy, clients(), batch_size=3)


# -- the checks leave no trace ------------------------------------------------------------------

@pytest.mark.parametrize("executor", [SequentialClients, BatchedClients])
def test_the_checks_leave_random_states_and_buffers_as_they_were(executor):
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    model = nn.Sequential(nn.Linear(FEATURES, 8), nn.Dropout(0.3), nn.BatchNorm1d(8, momentum=0.5),
                          nn.Linear(8, CLASSES)).double().eval()  # eval: the batched executor takes it
    model[1].train()  # dropout draws
    model[2].running_mean.normal_()
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    states = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    data = clients()
    if executor is SequentialClients:
        data = [Counting(X, y) for X, y in data]
    executor(model, F.cross_entropy, data, batch_size=4)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert np.array_equal(np.random.get_state()[1], states[1]) and random.getstate() == states[2]
    assert all(torch.equal(v, buffers[k]) for k, v in model.named_buffers())


def test_auto_falling_back_to_sequential_is_the_sequential_run_bit_for_bit():
    """auto builds the batched executor, finds too few clients per pass (a 1-byte budget) and takes
    the sequential one: building the batched one must not have drawn dropout's random numbers."""
    def model():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(FEATURES, 8), nn.Dropout(0.3), nn.Linear(8, CLASSES)).double()

    data = clients(sizes=[6] * 64)
    out = {}
    for executor, opts in (("sequential", {}), ("auto", {"memory_budget": 1})):
        torch.manual_seed(9)
        out[executor] = run(F.cross_entropy, data, executor, model=model(), rounds=1, batch_size=4,
                            executor_options=opts)
    assert out["auto"].executor == "sequential"
    assert torch.equal(out["auto"].params, out["sequential"].params)


# -- a model of several dtypes ---------------------------------------------------------------------

def test_model_with_parameters_of_several_dtypes_is_refused_and_left_alone():
    model = net(torch.float32)
    model[2].double()
    with pytest.raises(ValueError, match=r"model: its trainable parameters have several dtypes: float32 "
                                         r"\('0.weight', '0.bias'\); float64 \('2.weight', '2.bias'\).*"
                                         r"model.to\(torch.float64\)"):
        run(F.cross_entropy, clients(torch.float32), model=model)
    assert model[2].weight.dtype == torch.float64 and model[0].weight.dtype == torch.float32


# -- the distributed executor: each rank's inner executor checks its shard ------------------------------

def rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from python_algos.experiments.launch import finish

    data = clients(sizes=[20, 30, 25, 12])
    bad = list(data)
    bad[3] = (torch.randn(12, FEATURES + 1, dtype=torch.float64), data[3][1])  # held by rank 1
    msgs = []
    for inner, loss, cl, bs in (("sequential", F.cross_entropy, bad, None), ("batched", sum_loss, data, 8)):
        try:
            pa.DistributedClients(net(), loss, cl, batch_size=bs, inner=inner)
            msgs.append("no error")
        except Exception as e:  # noqa: BLE001
            msgs.append(f"{type(e).__name__}: {e}")
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(msgs))
    finish(ok=False)


@pytest.mark.slow
def test_distributed_ranks_check_their_shards_and_name_the_global_client(tmp_path):
    import _dist_cases as C
    import torch.multiprocessing as mp

    mp.start_processes(rank_main, args=(2, C.free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    for r in range(2):
        shape, total = (tmp_path / f"rank{r}.txt").read_text().split("\n")
        assert shape.startswith("ValueError: rank 1 of 2: client 3: model(X) failed on its data (X of shape (12, 11))")
        assert total.startswith("ValueError: rank 0 of 2: loss_fn is not the mean of per-sample losses"), total

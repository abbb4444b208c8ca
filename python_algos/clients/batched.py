"""The batched executor: every client's local step in one vectorized forward/backward pass.

A round of N clients x K local steps is N*K small passes on the sequential executor, each paying
Python, autograd and (on a GPU) kernel-launch overhead. Here the N passes of one local step are one
pass: ``torch.func.vmap`` over ``grad(functional_call(model, row_params, batch))``, where
``row_params`` are *views* of the ``[n, d]`` client stack (no per-client copy of the model), and the
per-client gradients are written straight into the rows of ``G`` (one ``torch.cat`` per chunk).
Models that are a chain of ``Linear`` layers and elementwise activations under the cross-entropy
(logistic regression, MLPs; recognised and checked against the model at construction,
``clients.chain``) skip ``torch.func``: their passes are explicit ``torch.bmm`` products writing each
gradient into its slice of ``G`` (:mod:`.chain`); on CPU the first layer's two products read each
step's random samples straight from the clients' data (``fedkernels.raw.linear_gathered``, with
prefetch) instead of from a gathered copy of them.

Same trajectory as the sequential executor. Each client draws its minibatch from its own
generator, seeded by its global index, with the same call the sequential executor makes
(``randperm(n_i)[:B]`` when ``B < n_i``, the whole client otherwise), so
``executor="batched"`` and ``"sequential"`` give the same iterates up to floating-point
summation order (the tests check 1e-10 relative in float64 for every algorithm).

Unequal clients (pad and mask). Clients are grouped by the length their batch is computed at
(:meth:`BatchedClients.padded_length`) and by whether it is padded: a client with a shorter batch
(full-batch gradients, or ``B`` larger than its data) is padded, up to the next power of two (at
most the call's longest batch), with copies of its own first sample that carry weight zero; its
loss is then the mean of its *own* samples, the loss function applied per sample (``vmap`` over
the batch) and averaged with weights ``1/b_i``. A client whose batch has its group's length is
never in a padded pass: ``loss_fn`` is called on its whole batch exactly as the sequential
executor calls it, whichever clients share its pass (so f's bits do not depend on the chunking).

Padding is exact only when ``loss_fn`` is a mean of per-sample losses and each sample's output
depends on that sample alone. Before any round the constructor checks that
(:func:`~python_algos.clients.separable.separability`: BatchNorm in training mode, a probe of the
model's rows on samples of several clients and labels, the loss's kind from its type, options and
labels, or for another callable a probe against its per-sample mean, :mod:`.losses`; judged on the
run's clients where the executor holds only some, :mod:`.run_kind`);
``clients.coupled`` says why samples are coupled ("" when they are not). Coupled samples (e.g.
``BatchNorm1d(track_running_stats=False)``, a ``x - x.mean(0)`` layer, ``reduction="sum"``) are
never padded nor split: only clients of equal batch length share a pass, so the result is the
sequential one, at the cost of fewer clients per pass (``executor="auto"`` then takes the
sequential executor when too few clients would share one).

Bits independent of the memory budget. A client's gradient depends only on its own batch and
padded length, never on which clients share its pass; passes always hold at least two rows (a
single client's pass is computed on a duplicated row: a lone matrix product may take another
kernel than a batched one); the metric pass adds the clients' losses and gradients in client order
in :mod:`.row_sum`'s blocks, an order no cut of the clients changes (never a sum per chunk).
So ``memory_budget`` / ``chunk_clients`` (and a GPU's free memory) change the speed, not the result.
One exception is known: on the torch.func path a client's gradient can differ in its last bit with
its pass's rows (float64 too: vmap's products pick their code path by the batched shapes; in float32
with its row's position, tests/test_engine_batched_metric.py), so there the split into passes can
show in the last bit (not with the other rows' values: tried with other clients' rows, Conv, LayerNorm and a
custom loss). So a call is laid out as one process's call over all its clients (every client of the run, or
the round's cohort: :meth:`BatchedClients._layout`), cut into windows of :meth:`BatchedClients.pass_window`
consecutive clients, and a streamed chunk, a rank's shard or a population's block runs the passes of the windows
it meets with the other clients' rows filled with copies of its own, their results dropped (pad and mask): the
dense one-process run's bits on any chunk, on any number of ranks and on a population (:mod:`.cohort_batched`).

Memory. Clients are processed in chunks of at most ``chunk_clients`` rows (a group of clients is cut
into as few chunks as that allows, of near-equal sizes), chosen so that a chunk's
estimated peak (activations of ``c * b_max`` samples, measured once by a probe pass, plus ~4
``[c, d]`` gradient-sized buffers and the gathered batch) stays under ``memory_budget`` bytes
(default 64 MiB on CPU, a cache-friendly working set; half the free memory on a GPU), but at
least two clients. A single batch longer than ``chunk`` samples (default 2048, as the sequential
executor's) is split into pieces of ``chunk`` samples whose gradients are accumulated with weights,
exactly as the sequential executor splits it (never when samples are coupled). The ``[N, d]``
stacks of the algorithm are separate (``N * d * itemsize`` each).

Not supported (``BatchedClients.unsupported(model)`` says why; ``executor="auto"`` then uses the
sequential executor): modules that update buffers in the forward pass (BatchNorm / InstanceNorm
with running statistics: per-client statistics would need per-client buffers; use GroupNorm /
LayerNorm, ``track_running_stats=False``, or ``executor="sequential"``), and models ``torch.func``
cannot trace (``.item()`` / data-dependent Python control flow in ``forward``), found by a probe
pass at construction. Randomness in the forward pass (dropout) is drawn independently per client
(``vmap(randomness="different")``): statistically the same as the sequential executor, not the
same random numbers.
"""

from __future__ import annotations

import time
from typing import Callable, ClassVar, Optional, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

import fedkernels as fk

from .base import ClientSet
from .chain import plan_chain
from .cohort_batched import CohortBatched
from .data import TensorData, client_data
from .losses import LossKind
from .population import LazyGenerators, Population
from .probe import check_clients
from .row_sum import RowSum
from .separable import Separability, separability, side_effect_free

__all__ = ["BatchedClients", "default_memory_budget", "STATEFUL_NORMS"]

STATEFUL_NORMS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)

# Bytes of samples and activations per pass of a LinearChain model on CPU. A gathered batch: small
# passes whose data stay in the L2 cache between the gather, the forward and the backward products.
# Samples read in place (rows_in_place): a pass's rows come from DRAM once, for the forward product,
# and should still be in the last-level cache for the gradient's. Measured, 1 thread, 1,000 clients
# x 32 samples of 784 floats: logistic regression 26.8-27.2 ms per step at 50-125 clients per pass
# (5-13 MB), 28.0 at 250, 30.6 at 25; the MLP 239 ms at 55 clients (8 MB), 244 at 13-27, 270 at 110.
CHAIN_CACHE_BYTES = 2 << 20
IN_PLACE_PASS_BYTES = 8 << 20
# Bytes of the clients' samples from which they are put on huge pages (CPU): beyond the caches.
HUGE_PAGES_FROM = 32 << 20


def default_memory_budget(device: torch.device) -> int:
    """Bytes one vectorized pass may use: 64 MiB on CPU, half of the free device memory on a GPU.

    On CPU the budget is a working-set target rather than a memory limit: passes over chunks whose
    batches, activations and gradients stay near the caches measured faster than one pass over
    every client (1 thread, 2-core Xeon: MLP 100 clients 32 vs 46 ms per step, CNN 1.8 s vs 5.4 s),
    while the fixed cost of a pass (~1 ms) is repaid by a few clients already. A GPU wants the
    largest passes that fit."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free // 2)
    return 64 << 20


def _concatenated_samples(Xs: list, device: torch.device) -> torch.Tensor:
    """Every client's samples in one tensor (``torch.cat``). On CPU, once it is at least
    ``HUGE_PAGES_FROM`` bytes, on transparent huge pages where the system allows
    (``fedkernels.raw.huge_page_empty``): every local step reads random rows of it, and on 4 KiB pages
    nearly every row costs a page walk (1,000 clients x 256 samples of 784 floats, 1 thread:
    ``index_select`` of a step's 32,000 rows 18.4 -> 13.8 ms, a logistic-regression step with the rows
    read in place 29.7 -> 26.1 ms)."""
    dtype = Xs[0].dtype
    nbytes = sum(X.numel() for X in Xs) * Xs[0].element_size()
    if device.type != "cpu" or nbytes < HUGE_PAGES_FROM or any(X.dtype != dtype for X in Xs):
        return torch.cat(Xs)
    out = fk.raw.huge_page_empty((sum(X.shape[0] for X in Xs), *Xs[0].shape[1:]), dtype)
    return torch.cat(Xs, out=out)  # the first write: faulted in as huge pages


def _even_parts(members: Sequence, most: int) -> list:
    """``members`` in consecutive passes of at most ``most`` rows, as few as that allows, their
    sizes differing by at most one: 100 clients at 33 per pass are 25+25+25+25, not 33+33+33+1,
    whose lone client would be computed twice (a pass never has one row, see ``_pass``). Any split
    gives the same bits (a client's gradient does not depend on its pass-mates), so this only
    saves work."""
    m = len(members)
    n = -(-m // max(1, most))
    q, r = divmod(m, n)
    out, s = [], 0
    for i in range(n):
        e = s + q + (1 if i < r else 0)
        out.append(members[s:e])
        s = e
    return out


def _even_parts_meeting(m: int, most: int, lo: int, hi: int) -> list:
    """The parts of ``_even_parts(range(m), most)`` that meet ``[lo, hi)``, found by their arithmetic (a shard or a
    block of 10^6 clients lists its few parts, not all of them)."""
    n = -(-m // max(1, most))
    q, r = divmod(m, n)
    i = lo // (q + 1) if lo < r * (q + 1) else r + (lo - r * (q + 1)) // q
    out = []
    while i < n and (s := i * q + min(i, r)) < hi:
        out.append(range(s, s + q + (1 if i < r else 0)))
        i += 1
    return out


class BatchedClients(ClientSet):
    """All clients of this process, their gradients computed in vectorized passes (``torch.func``).

    Args:
        model, loss_fn, data, batch_size, seed, flat, first_client: as for
            :class:`~python_algos.clients.SequentialClients`.
        memory_budget: bytes one chunk of clients may use (default :func:`default_memory_budget`).
        chunk_clients: most clients per vectorized pass (default: as many as fit the budget, at least
            2); a group of clients is split in as few passes as that allows, of near-equal sizes.
        chunk: a batch longer than this many samples is split in weighted pieces (as the
            sequential executor's ``chunk``; never when samples are coupled).
        first_layer: the path of a chain's first-layer products on the CPU (``fedkernels.first_layer``):
            ``"auto"`` (default; ``FEDKERNELS_FIRST_LAYER`` or the faster, by measurement, of the two
            that give the same bits, ``"in_place"`` and ``"gather"``) or one of the paths, ``"gather_bmm"``
            (gather + ``torch.bmm``: other bits) and ``"bf16"`` (bfloat16 products: lower precision, float32
            runs only) only when asked for; ``"auto_bf16"``: as ``"auto"``, taking ``"bf16"`` where faster.
        loss_kind: the loss's kind when decided for every client (a population's cohort: refusing
            minibatches was decided before the run, ``probe.check_population``), not from these clients.
        separable: whether batches may be padded, judged on the run's clients (:mod:`.run_kind`: a
            population's block); None: on these clients.

    Attributes ``grad_seconds`` / ``fwd_bwd_seconds`` / ``grad_evals`` count as in the sequential
    executor (``grad_evals`` per client gradient). ``chain``: the explicit pass of a Linear/activation
    chain (None: ``torch.func``); ``rows_in_place``: its first layer reads each step's samples
    straight from the clients' data (CPU; ``fedkernels.raw.linear_gathered``) instead of a gathered copy.
    """

    executor: ClassVar[str] = "batched"

    def __new__(cls, model=None, loss_fn=None, data=None, *args, **kwargs):
        if isinstance(data, Population):  # clients built on demand: passes over each call's clients
            return CohortBatched(model, loss_fn, data, *args, vectorized=cls, **kwargs)
        return super().__new__(cls)

    def __init__(self, model: nn.Module, loss_fn: Callable, data: Sequence, batch_size: Optional[int] = None,
                 seed: int = 0, flat: Optional[fk.FlatParams] = None, first_client: int = 0,
                 memory_budget: Optional[int] = None, chunk_clients: Optional[int] = None, chunk: int = 2048,
                 loss_kind: Optional[LossKind] = None, first_layer: str = "auto",
                 separable: Optional[Separability] = None):
        super().__init__()
        why = self.unsupported(model)
        if why:
            raise ValueError(f"executor 'batched' cannot run this model: {why}")
        if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1):
            raise ValueError(f"batch_size must be None or a positive int, got {batch_size!r}")
        for name, v in (("memory_budget", memory_budget), ("chunk_clients", chunk_clients)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be None or a positive int, got {v!r}")
        if len(data) == 0:
            raise ValueError("need at least one client")
        self.model = model
        self.loss_fn = loss_fn
        self.flat = flat if flat is not None else fk.FlatParams(model)
        self.dim = self.flat.numel
        self.dtype = self.flat.params.dtype
        self.device = self.flat.params.device
        wrapped = [client_data(c, self.dtype, self.device) for c in data]
        lazy = next((i for i, c in enumerate(wrapped) if not isinstance(c, TensorData)), None)
        if lazy is not None:
            raise ValueError(f"executor 'batched' cannot run these clients: client {lazy} is a "
                             f"{type(data[lazy]).__name__}, read lazily, and vectorized passes need every client's "
                             f"samples in memory as tensors; use executor='sequential' (or give (X, y) tensors)")
        clients = [(c.X, c.y) for c in wrapped]
        self.num_clients = self.rows = len(clients)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.generators = LazyGenerators(seed, self.num_clients, first_client)  # created when first drawn from
        self.first_client = int(first_client)

        # data the model or the loss cannot take, a non-scalar loss, a sum loss on minibatches:
        # refused naming the client, before the checks and the vectorized probe below fail unnamed
        check_clients(model, loss_fn, wrapped, self.batch_size, first_client, kind=loss_kind)

        # All clients' samples concatenated; client i owns rows offsets[i] : offsets[i] + sizes[i].
        self.sizes = [int(X.shape[0]) for X, _ in clients]
        self.offsets = torch.tensor([0, *self.sizes[:-1]]).cumsum(0).tolist()
        feat = {tuple(X.shape[1:]) for X, _ in clients}
        lab = {tuple(y.shape[1:]) for _, y in clients}
        if len(feat) > 1 or len(lab) > 1:
            raise ValueError(f"every client's samples must have the same shape, got inputs {sorted(feat)} "
                             f"and targets {sorted(lab)}")
        self.X_all = _concatenated_samples([X for X, _ in clients], self.device)
        self.y_all = torch.cat([y for _, y in clients])

        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if [p.numel() for _, p in named] != list(self.flat.sizes):
            raise ValueError("flat must be fk.FlatParams(model) of this model")
        self._names = [n for n, _ in named]
        self._shapes = [tuple(p.shape) for _, p in named]
        self._bounds = torch.tensor([0, *self.flat.sizes]).cumsum(0).tolist()
        self._consts = {n: p for n, p in model.named_parameters() if not p.requires_grad}
        self._consts.update(dict(model.named_buffers()))

        self._whole_idx = self._xbuf = self._ybuf = self._perm = None
        self._vgrad_same = vmap(grad_and_value(self._client_loss), in_dims=(0, 0, 0, 0), randomness="different")
        self._vgrad_masked = vmap(grad_and_value(self._client_loss_masked), in_dims=(0, 0, 0, 0),
                                  randomness="different")
        # without side effects: building an executor must not shift the random numbers of the run
        # (dropout), or "auto" falling back to the sequential executor would not be the sequential run
        with side_effect_free(model, self.device):
            self._sample_bytes = self._probe()
        self.memory_budget = int(memory_budget) if memory_budget is not None else default_memory_budget(self.device)
        self.chunk_clients = chunk_clients
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be a positive int, got {chunk!r}")
        self.chunk = chunk
        self._first_layer_request = first_layer
        self.judge(separable if separable is not None else separability(model, loss_fn, wrapped))
        self._gbuf = None

    def labels(self) -> list:
        """Each client's labels (views of ``y_all``)."""
        return [self.y_all[o : o + n] for o, n in zip(self.offsets, self.sizes)]

    def judge(self, sep: Separability) -> None:
        """Pads and splits batches, and plans a chain, by ``sep``: the separability of the run's clients
        (:mod:`.run_kind`: a rank's shard is told it once the ranks agree), not only of the clients held."""
        # coupled: "" when padding and splitting are exact, else why (every batch then whole, unpadded)
        self.coupled, self.loss_kind = sep.coupled, sep.loss
        with side_effect_free(self.model, self.device):
            # a Linear/activation chain under cross-entropy: explicit bmm passes (None: torch.func)
            self.chain = None if self.coupled else plan_chain(self.model, self.loss_fn, sep.loss,
                                                               list(self.flat.sizes), sep.X, sep.y, self.y_all)
        self._choose_first_layer(self._first_layer_request)

    def _choose_first_layer(self, requested: str) -> None:
        """Sets ``first_layer`` (the path of the chain's first-layer products, ``fedkernels.first_layer``:
        ``"in_place"`` and ``"gather"`` give the same bits, ``"gather_bmm"`` and ``"bf16"`` others; None
        without a chain) and ``first_layer_source`` (who chose it). ``rows_in_place``: the gathered
        kernels run, on the rows of ``X_all`` or of a gathered copy. ``_X_bf16``: the samples in bfloat16
        (``"bf16"``: each pass gathers its rows from them), else None."""
        choices = fk.first_layer.REQUESTS
        if not isinstance(requested, str) or requested not in choices:
            raise ValueError(f"first_layer must be one of {', '.join(choices)}, got {requested!r}")
        fk.first_layer.check_precision(requested, self.dtype)
        can = self.chain is not None and self.device.type == "cpu" and self.chain.reads_rows_in_place()
        if not can and requested in ("in_place", "gather", "bf16") or self.chain is None and requested != "auto":
            why = ("the model runs through torch.func, not as a Linear/activation chain under the cross-entropy"
                   if self.chain is None else "the CPU first-layer paths need a chain that starts with a Linear "
                   f"layer, on the CPU (here: {self.device.type})")
            raise ValueError(f"first_layer={requested!r} cannot apply: {why}; use first_layer='auto'")
        self.first_layer, self.first_layer_source = (None, None) if self.chain is None else ("gather_bmm", "only path")
        self.rows_in_place, self._X_bf16 = can, None
        self._X_rows = self.X_all.reshape(self.X_all.shape[0], -1) if can else None
        if can:
            B, longest = self.batch_size, max(self.sizes)
            P = longest if B is None else min(B, longest)
            picked = fk.first_layer.choose(self._X_rows, self.chain.layers[0][3], P, self._chunk_rows(P), requested,
                                           self._bf16_rows)
            self.first_layer, self.first_layer_source = picked.path, picked.source
            self.rows_in_place = picked.path in fk.first_layer.IDENTICAL
            self._X_bf16 = self._bf16_rows().view(self.X_all.shape) if picked.path == "bf16" else None

    def _bf16_rows(self) -> torch.Tensor:
        """The clients' samples in bfloat16, as rows ``[n, in]`` (made once: half the float32 samples' memory)."""
        if self._X_bf16 is None:
            self._X_bf16 = self._X_rows.to(torch.bfloat16)
        return self._X_bf16

    # -- what the model must allow --------------------------------------------------------------
    @classmethod
    def unsupported(cls, model) -> str:
        for name, m in model.named_modules():
            if isinstance(m, STATEFUL_NORMS) and m.track_running_stats and m.training:
                return (f"module {name or 'model'!r} ({type(m).__name__}) updates running statistics in every "
                        f"forward pass, which would need per-client buffers; use GroupNorm / LayerNorm, "
                        f"track_running_stats=False, or executor='sequential'")
        return ""

    # -- the per-client loss, vmapped over clients ------------------------------------------------
    def _params(self, rows: torch.Tensor) -> dict:
        """Per-parameter views ``[c, *shape]`` of a ``[c, d]`` block of client rows (no copy)."""
        c = rows.shape[0]
        return {n: rows[:, a:b].view(c, *s)
                for n, s, a, b in zip(self._names, self._shapes, self._bounds, self._bounds[1:])}

    def _client_loss(self, params, xb, yb, scale):
        out = functional_call(self.model, {**self._consts, **params}, (xb,))
        return self.loss_fn(out, yb) * scale

    def _client_loss_masked(self, params, xb, yb, w):
        out = functional_call(self.model, {**self._consts, **params}, (xb,))
        per_sample = vmap(lambda o, t: self.loss_fn(o.unsqueeze(0), t.unsqueeze(0)))(out, yb)
        return (per_sample * w).sum()

    def _probe(self) -> int:
        """Run one vectorized pass on two samples of client 0 (fails early, with a clear message, for
        models torch.func cannot trace) and return the activation bytes per sample it measured."""
        acts = []

        def hook(_m, _inp, out):
            if isinstance(out, torch.Tensor):
                acts.append(out.numel() * out.element_size())

        handles = [m.register_forward_hook(hook) for m in self.model.modules()]
        try:
            n = min(2, self.sizes[0])
            xb = self.X_all[:n].unsqueeze(0)
            yb = self.y_all[:n].unsqueeze(0)
            row = self.flat.params.detach().unsqueeze(0)
            with torch.enable_grad():
                self._vgrad_same(self._params(row), xb, yb, torch.ones(1, dtype=self.dtype, device=self.device))
        except Exception as e:  # noqa: BLE001 -- re-raised with what to do about it
            raise ValueError(f"executor 'batched' cannot run this model: torch.func.vmap(grad(...)) of its "
                             f"forward pass failed ({type(e).__name__}: {e}); use executor='sequential'") from e
        finally:
            for h in handles:
                h.remove()
        return max(1, sum(acts) // max(1, min(2, self.sizes[0])))

    def _chunk_rows(self, batch: int) -> int:
        """Most clients per vectorized pass for batches of ``batch`` samples (at least 2, see
        :meth:`_gradients`; ``chunk_clients`` when given)."""
        if self.chunk_clients is not None:
            return self.chunk_clients
        if self.chain is not None and self.device.type == "cpu":  # batch and activations kept in cache
            itemsize = self.X_all.element_size()
            per_client = batch * (self.chain.in_features + 2 * self.chain.act_width) * itemsize
            cache = IN_PLACE_PASS_BYTES if self.rows_in_place else CHAIN_CACHE_BYTES
            return max(2, min(self.budget_rows(batch), cache // per_client))
        return max(2, self.budget_rows(batch))

    def budget_rows(self, batch: int) -> int:
        """Clients of ``batch`` samples whose pass the memory budget holds (0: not even one)."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        per_client = (3 * batch * self._sample_bytes + 4 * self.dim * itemsize
                      + batch * self.X_all[:1].numel() * self.X_all.element_size())
        return int(self.memory_budget // per_client)

    pad_to: Optional[int] = None  # the run's longest client, when this process holds a shard of the run's clients

    def longest_client(self) -> int:
        """The most samples of any client here, or of the run's (``pad_to``: the distributed executor sets it
        on a rank): a batch is padded to at most this, so which clients share a process changes no bit."""
        return max(self.sizes) if self.pad_to is None else self.pad_to

    def padded_length(self, length: int, longest: int) -> int:
        """The batch length a client of ``length`` samples is computed at: its own when samples
        are coupled; otherwise the next power of two, at most the call's ``longest`` batch. A
        function of the client's own batch and the call, never of which clients share its pass,
        so that chunking cannot change its bits."""
        if self.coupled or length >= longest:
            return length
        return min(longest, 1 << (length - 1).bit_length())

    def clients_per_pass(self) -> float:
        """Clients per vectorized pass of a typical gradient call: the fewer of the clients the
        memory budget holds in one pass (0 if not even one) and the mean number of clients that
        share a (padded) batch length. What ``executor="auto"`` weighs."""
        B = self.batch_size
        lengths = [n if B is None else min(B, n) for n in self.sizes]
        longest = max(lengths)
        groups = {(P := self.padded_length(n, longest), n < P) for n in lengths}  # as _gradients groups them
        fit = self.chunk_clients if self.chunk_clients is not None else self.budget_rows(longest)
        return min(fit, len(lengths) / len(groups))

    # -- client-local work ------------------------------------------------------------------------
    def _batch_indices(self, clients: list):
        """Per client, the global sample indices of this call's batch (drawing from the client's
        generator exactly as the sequential executor does: ``randperm(n_i)[:B]``). The
        permutations are drawn into client i's slot of one preallocated index vector laid out as
        ``X_all`` (``randperm(..., out=)`` consumes the generator as ``randperm`` does), and the
        ``[:B]`` heads shifted to global indices by one gather for all clients.

        Returns a ``[c, B]`` index block when every client draws ``B`` of its samples (the usual
        minibatch call: no per-client tensors), else a list of ``c`` index vectors."""
        B = self.batch_size
        if B is None or any(B >= self.sizes[i] for i in clients):
            return self._batch_indices_mixed(clients)
        if self._perm is None:
            self._perm = torch.empty(sum(self.sizes), dtype=torch.long)
            self._perm_slots = [self._perm[o : o + n] for o, n in zip(self.offsets, self.sizes)]
            self._heads = {}
        for i in clients:
            torch.randperm(self.sizes[i], generator=self.generators[i], out=self._perm_slots[i])
        key = (clients[0], len(clients)) if clients == list(range(clients[0], clients[0] + len(clients))) else None
        pos = self._heads.get(key) if key is not None else None
        if pos is None:
            start = torch.tensor([self.offsets[i] for i in clients]).unsqueeze(1)
            pos = (start, start + torch.arange(B))  # slot starts [c, 1]; positions of the heads [c, B]
            if key is not None:
                self._heads[key] = pos
        return self._perm[pos[1]].add_(pos[0])

    def _batch_indices_mixed(self, clients: list) -> list:
        """:meth:`_batch_indices` when some clients take their whole data (``B`` None or ``>= n_i``)."""
        out = []
        B = self.batch_size
        for i in clients:
            n = self.sizes[i]
            if B is not None and B < n:
                out.append(torch.randperm(n, generator=self.generators[i])[:B].add_(self.offsets[i]))
            else:
                out.append(self._whole(i))
        return out

    def _whole(self, i: int) -> torch.Tensor:
        """The global indices of all of client i's samples (cached: full-batch runs reuse them)."""
        if self._whole_idx is None:
            self._whole_idx = [torch.arange(o, o + n) for o, n in zip(self.offsets, self.sizes)]
        return self._whole_idx[i]

    def _gather(self, idx: torch.Tensor, c: int, b: int):
        """``(X_all[idx], y_all[idx])`` shaped ``[c, b, ...]``, into buffers reused across calls:
        a fresh multi-MB tensor per step costs page faults that can exceed the gather itself."""
        need = c * b
        src = self.X_all if self._X_bf16 is None else self._X_bf16  # "bf16": the chain's first layer in bfloat16
        if self._xbuf is None or self._xbuf.shape[0] < need or self._xbuf.dtype != src.dtype:
            self._xbuf = torch.empty((need, *self.X_all.shape[1:]), dtype=src.dtype, device=self.device)
        idx = idx.to(self.device)
        xb = torch.index_select(src, 0, idx, out=self._xbuf[:need])
        return xb.view(c, b, *self.X_all.shape[1:]), self._gather_labels(idx, c, b)

    def _gather_labels(self, idx: torch.Tensor, c: int, b: int) -> torch.Tensor:
        """``y_all[idx]`` shaped ``[c, b, ...]``, into a buffer reused across calls (the labels of
        :meth:`_gather`; alone when the samples are read in place)."""
        if self._ybuf is None or self._ybuf.shape[0] < c * b:
            self._ybuf = torch.empty((c * b, *self.y_all.shape[1:]), dtype=self.y_all.dtype, device=self.device)
        yb = torch.index_select(self.y_all, 0, idx.to(self.device), out=self._ybuf[: c * b])
        return yb.view(c, b, *self.y_all.shape[1:])

    def gradients_(self, X, G, ids=None):
        t0 = time.perf_counter()
        clients = list(range(self.rows)) if ids is None else ids.tolist()
        batches = self._batch_indices(clients)
        # padded up to the longest batch of the one-process call the clients belong to: of the run's clients
        # (every client, or a streamed chunk of them: its bits are the dense call's), or of a round's cohort (a
        # population builds a cohort's clients alone, so this is the one rule both can follow)
        cohort = ids is not None and self.cohort is not None
        call, where = self._layout(clients, ids is None) if cohort or self.chain is None else (None, None)
        longest = self._call_longest(call) if cohort else self._batch_longest()
        if self.chain is not None:  # a chain's gradient does not depend on its pass
            fb = self._gradients(X, G, batches, values=None, longest=longest)
        else:
            W, fb = self.pass_window(longest), 0.0
            for s in sorted({p // W * W for p in where}):
                win, a = range(s, min(s + W, len(call))), where.get(s)
                if a is not None and all(where.get(p) == a + k for k, p in enumerate(win)):  # all ours, in order
                    e = a + len(win)  # the same passes, without a Python object per client
                    fb += self._gradients(X[a:e], G[a:e], batches[a:e], values=None, longest=longest)
                else:
                    fb += self._layout_passes(X, G, batches, where, call, win, longest, None)
        self.fwd_bwd_seconds += fb
        self.grad_seconds += time.perf_counter() - t0
        self.grad_evals += len(clients)
        return G

    cohort: Optional[torch.Tensor] = None  # this round's participants, in run ids (None: full participation)
    run_sizes: Optional[list] = None  # every client's samples in the run, set on a rank by the distributed executor

    def participants(self):
        ids = super().participants()
        self.cohort = ids  # the cohort's passes are laid out over it (_layout)
        return ids

    def _layout(self, clients: list, whole: bool) -> tuple:
        """The one-process call ``clients`` belong to and their places in it: ``(call, where)``, ``call[p]`` the
        run id of its p-th client, ``where[p]`` the index in ``clients`` of the client there (this process's).
        The call: every client of the run (``whole``, or a streamed chunk of it), else this round's cohort
        (a rank's share of it); ids outside the cohort make their own call."""
        base = self.first_client if self.run_sizes is not None else 0  # run id of client 0 (a rank's first)
        ids = [base + i for i in clients]
        if whole or self.cohort is None:
            return range(len(self.run_sizes or self.sizes)), {g: j for j, g in enumerate(ids)}
        cohort = self.cohort.to("cpu")
        at = torch.searchsorted(cohort, torch.tensor(ids)).clamp_(max=max(0, cohort.numel() - 1))
        if cohort.numel() == 0 or not torch.equal(cohort[at], torch.tensor(ids)):
            return ids, {p: p for p in range(len(ids))}
        return cohort.tolist(), {p: j for j, p in enumerate(at.tolist())}

    def _call_longest(self, call) -> int:
        """The longest batch of the clients of a cohort's ``call`` (run ids, :meth:`_layout`), which every rank
        knows (``run_sizes``): the pad limit and the passes' window of the cohort's call on any process."""
        sizes = self.run_sizes or self.sizes
        n = max((sizes[i] for i in call), default=1)
        return n if self.batch_size is None else min(self.batch_size, n)

    def _batch_longest(self) -> int:
        """The longest batch any client here draws: its whole data, or ``batch_size`` samples (the pad limit)."""
        return self.longest_client() if self.batch_size is None else min(self.batch_size, self.longest_client())

    def pass_window(self, longest: Optional[int] = None) -> Optional[int]:
        """On the torch.func path, the W consecutive clients of a call (:meth:`_layout`) its passes are cut from
        (each window grouped and passed on its own: W is the most its longest batch allows, so a group is one
        pass); None for a chain, whose gradients do not depend on their pass. ``longest``: the call's longest
        batch (default: the run's, :meth:`_batch_longest`; a cohort's call asks with the cohort's)."""
        if self.chain is not None:
            return None
        return max(1, self._chunk_rows(self._batch_longest() if longest is None else longest))

    def metric_blocks(self, lo: int, hi: int, run: Optional[int] = None, longest: Optional[int] = None) -> list:
        """The blocks of run ids (ranges) of one process's metric pass over the run's ``run`` clients (default:
        ``run_sizes``' or this process's) that meet run ids ``[lo, hi)``: near-equal parts of at most the clients
        one pass of the ``longest`` client holds (default :meth:`longest_client`), whatever holds which clients."""
        run = len(self.run_sizes or self.sizes) if run is None else run
        most = self._chunk_rows(self.longest_client() if longest is None else longest)
        return _even_parts_meeting(run, max(1, min(run, most)), lo, hi)

    def stream_chunks(self, size: int) -> list:
        """``size`` consecutive clients each, cut at multiples of :meth:`pass_window` (at least one window): a
        chunk then computes no window's pass that another chunk computes too (the bits do not need it)."""
        W = self.pass_window()
        return super().stream_chunks(size if W is None else max(1, size // W) * W)

    def _layout_passes(self, X, G, batches: list, where: dict, call, positions, longest: int, values) -> float:
        """The passes one process makes over the clients at ``positions`` of ``call`` (:meth:`_gradients`'
        groups, each in near-equal parts), computed for this process's clients there (``where``: position ->
        row of X / G and index in ``batches``). A torch.func gradient's last bits depend on its row in the vmap
        pass and on the pass's rows (not on the other rows' values), so another client's row is filled with a
        copy of one of ours, its result dropped (pad and mask): a rank's shard, a streamed chunk and the dense
        call give a client the same bits. Returns the seconds spent in the passes."""
        sizes, B = self.run_sizes or self.sizes, (None if values is not None else self.batch_size)
        groups: dict[tuple, list] = {}
        for p in positions:
            n = sizes[call[p]] if B is None else min(B, sizes[call[p]])
            P = -1 if n > self.chunk and not self.coupled else self.padded_length(n, longest)
            groups.setdefault((P, n < P), []).append(p)
        fb = 0.0
        for (P, _), members in groups.items():
            if P < 0:  # split in pieces, one client at a time
                fb += sum(self._one_client_in_pieces(X, G, where[p], batches[where[p]], values)
                          for p in members if p in where)
                continue
            for part in _even_parts(members, self._chunk_rows(P)):
                real = [k for k, p in enumerate(part) if p in where]
                if real:
                    at = [where.get(p, where[part[real[0]]]) for p in part]
                    fb += self._pass(X, G, at, [batches[j] for j in at], P, values,
                                     keep=None if len(real) == len(part) else real)
        return fb

    def _gradients(self, X: torch.Tensor, G: torch.Tensor, batches, values: Optional[torch.Tensor],
                   longest: Optional[int] = None) -> float:
        """``G[j] <- gradient of client j's loss over batches[j]`` at ``X[j]`` (``X`` may be a
        stride-0 expanded vector); ``values[j]`` <- that loss if given. Returns the seconds spent in
        the vectorized passes.

        Bits independent of the chunking: clients are grouped by :meth:`padded_length` (a
        function of each client's own batch), and a group runs in passes of at least two rows (a
        pass of one client is computed on a duplicated row: a lone matrix product may take a
        different kernel than a batched one). A batch longer than ``chunk`` samples (when samples
        are not coupled) is split in pieces of ``chunk``, as the sequential executor splits it.

        ``batches``: a list of index vectors, or a ``[c, P]`` block (every batch ``P`` samples): the
        same passes as its rows as a list would make (one group, never padded), without a Python
        object per client."""
        if isinstance(batches, torch.Tensor):
            P = batches.shape[1]
            if P <= self.chunk or self.coupled:
                fb = 0.0
                for part in _even_parts(range(batches.shape[0]), self._chunk_rows(P)):
                    fb += self._pass(X, G, list(part), batches[part[0] : part[-1] + 1], P, values)
                return fb
            batches = list(batches.unbind(0))
        lengths = [int(b.numel()) for b in batches]
        longest = max(lengths) if longest is None else longest
        # a pass holds either clients whose batches all have its length P (their loss is loss_fn on
        # the batch) or clients padded up to P (a weighted sum of per-sample losses): which of the
        # two computes a client's loss depends on its own batch, never on its pass-mates (f's bits)
        groups: dict[tuple, list] = {}
        for j, n in enumerate(lengths):
            if n > self.chunk and not self.coupled:
                groups.setdefault((-1, False), []).append(j)  # split in pieces, one client at a time
            else:
                P = self.padded_length(n, longest)
                groups.setdefault((P, n < P), []).append(j)
        fb = 0.0
        for (P, _), members in groups.items():
            if P < 0:
                for j in members:
                    fb += self._one_client_in_pieces(X, G, j, batches[j], values)
                continue
            for part in _even_parts(members, self._chunk_rows(P)):
                fb += self._pass(X, G, part, [batches[j] for j in part], P, values)
        return fb

    def _pass(self, X, G, rows_at: list, batches, P: int, values, keep: Optional[list] = None) -> float:
        """One vectorized pass: clients ``rows_at`` (rows of X / G), each batch padded to ``P``
        samples with zero-weight copies of its first sample (only ever when samples are not coupled).
        ``batches``: a list of index vectors, or a ``[c, P]`` block of them. ``keep``: the pass's rows
        whose results are written (None: all; the others are copies, :meth:`_layout_passes`)."""
        c = len(batches)
        block = isinstance(batches, torch.Tensor)
        if c == 1:  # see _gradients: never a one-row pass
            # repeat, not expand: a [2, P] view with stride 0 stays one when flattened for P = 1, and
            # the in-place first layer takes only a contiguous index
            rows_at, batches = rows_at * 2, (batches.repeat(2, 1) if block else batches * 2)
        k = len(batches)
        lengths = [P] * k if block else [int(b.numel()) for b in batches]
        R = self._rows_per_client(P)  # >= P: samples P.. R are gathered only to align the next client's
        if block:
            idx = (batches if R == P else torch.cat([batches, batches[:, :1].expand(k, R - P)], 1)).reshape(-1)
        elif all(b == P for b in lengths) and R == P:
            idx = torch.cat(batches)
        else:
            idx = torch.cat([torch.cat([b, b[:1].expand(R - b.numel())]) for b in batches])
        w = None
        if any(b != P for b in lengths):
            assert not self.coupled, "padding a coupled batch"
            w = torch.zeros(k, P, dtype=self.dtype)
            for r, b in enumerate(lengths):
                w[r, :b] = 1.0 / b
            w = w.to(self.device)
        if self.first_layer == "gather":  # the gathered kernels on a copy of the rows (R == P)
            xb, yb = self._gather(idx, k, P)
            xb, in_place = xb.view(k * P, -1), self._local_rows(k, P)
        elif self.rows_in_place:  # R == P: only the labels are gathered
            xb, yb, in_place = self._X_rows, self._gather_labels(idx, k, P), idx.to(self.device).view(k, P)
        else:
            xb, yb = self._gather(idx, k, R)
            xb, yb, in_place = xb[:, :P], yb[:, :P], None
        a = rows_at[0]
        contiguous = c > 1 and keep is None and rows_at == list(range(a, a + c))
        pos = None if contiguous else torch.tensor(rows_at, device=self.device)
        rows = X[a : a + c] if contiguous else X.index_select(0, pos)
        # the usual case: straight into G's rows (a [c, d] temporary costs its page faults)
        out = G[a : a + c] if contiguous else self._scratch(k)
        t1 = time.perf_counter()
        vals = self._fwd_bwd(rows, xb, yb, w, out, idx=in_place)
        fb = time.perf_counter() - t1
        if contiguous:
            if values is not None:
                values[a : a + c] = vals.detach()
        else:
            sel = torch.arange(c, device=self.device) if keep is None else torch.tensor(keep, device=self.device)
            G.index_copy_(0, pos[sel], out[sel])
            if values is not None:
                values.index_copy_(0, pos[sel], vals.detach()[sel].to(values.dtype))  # a loss may promote
        return fb

    def _local_rows(self, k: int, P: int) -> torch.Tensor:
        """``arange(k * P)`` as ``[k, P]``: each client's rows of a gathered copy (cached)."""
        if getattr(self, "_local", None) is None or self._local.numel() < k * P:
            self._local = torch.arange(k * P)
        return self._local[: k * P].view(k, P)

    def _rows_per_client(self, P: int) -> int:
        """Rows a client's batch of ``P`` samples takes in the gathered block: ``P``, or for an
        explicit chain (:mod:`.chain`) the least ``R >= P`` whose ``R`` samples fill whole 64-byte
        lines, so that each client's samples start on one (see :func:`.chain.aligned`)."""
        if self.chain is None or self.rows_in_place:
            return P
        row = self.X_all[0].numel() * (self.X_all if self._X_bf16 is None else self._X_bf16).element_size()
        R = P
        while (R * row) % 64:
            R += 1
        return R

    def _scratch(self, k: int) -> torch.Tensor:
        """A reused ``[k, d]`` block for passes whose rows are not consecutive rows of G."""
        if self._gbuf is None or self._gbuf.shape[0] < k:
            self._gbuf = torch.empty(k, self.dim, dtype=self.dtype, device=self.device)
        return self._gbuf[:k]

    def _fwd_bwd(self, rows, xb, yb, w, out, scale: float = 1.0, idx=None) -> torch.Tensor:
        """``out[j] <- gradient of client j's loss`` at ``rows[j]`` over its batch ``xb[j], yb[j]``
        (weighted mean with sample weights ``w[j]``, or the plain mean when ``w`` is None), times
        ``scale``; returns the losses ``[k]``. The one place a pass's forward/backward runs. With
        ``idx`` (``[k, P]``, a chain reading its samples in place), ``xb`` is all clients' samples
        as rows and client j's batch is its rows ``idx[j]``."""
        k, P = yb.shape[0], yb.shape[1]
        if self.chain is not None:
            if w is None:
                w = torch.full((k, P), scale / P, dtype=self.dtype, device=self.device)
            return self.chain.grads_(rows, xb, yb, w, out, idx)
        with torch.enable_grad():
            if w is None:
                s = torch.full((k,), scale, dtype=self.dtype, device=self.device)
                grads, vals = self._vgrad_same(self._params(rows), xb, yb, s)
            else:
                grads, vals = self._vgrad_masked(self._params(rows), xb, yb, w)
        torch.cat([grads[n].reshape(k, -1) for n in self._names], dim=1, out=out)
        return vals

    def _one_client_in_pieces(self, X, G, j, batch, values) -> float:
        """One client's batch longer than ``chunk`` samples: pieces of ``chunk`` samples (a fixed
        size, not the memory budget's, so the bits do not depend on it), gradients accumulated
        with weights (piece length / batch length), as the sequential executor accumulates them."""
        b = int(batch.numel())
        step = self.chunk
        g = torch.zeros(self.dim, dtype=self.dtype, device=self.device)
        total = 0.0
        fb = 0.0
        out = self._scratch(1)
        for s in range(0, b, step):
            piece = batch[s : s + step]
            xb, yb = self._gather(piece, 1, int(piece.numel()))
            t1 = time.perf_counter()
            val = self._fwd_bwd(X[j : j + 1], xb, yb, None, out, scale=piece.numel() / b)
            fb += time.perf_counter() - t1
            g += out[0]
            total += float(val)
        G[j].copy_(g)
        if values is not None:
            values[j] = total
        return fb

    def _aligned_rows(self, k: int) -> torch.Tensor:
        """An uninitialised ``[k, d]`` block whose rows all start on a 64-byte boundary (row
        stride rounded up), so a row's alignment is the same at every position of the block."""
        per_line = max(1, 64 // torch.empty((), dtype=self.dtype).element_size())
        stride = -(-self.dim // per_line) * per_line
        return torch.empty(k, stride, dtype=self.dtype, device=self.device)[:, : self.dim]

    # -- aggregation ------------------------------------------------------------------------------
    def _broadcast(self, v):
        return v

    # -- evaluation -------------------------------------------------------------------------------
    def full_objective_(self, x, grad_out, *, start: Optional[tuple] = None, total: Optional[int] = None):
        """f(x) = (1/N) sum_i f_i(x) and its gradient, all clients' full data in vectorized passes.
        The clients' gradients and losses (float64) are added in client order in :mod:`.row_sum`'s blocks,
        an order that any cut of the clients keeps: neither ``chunk_clients`` nor ``memory_budget``
        changes a bit of f or of the gradient, and a shard of ``total`` clients continues the sums of
        the clients before it, ``start = (losses, gradients)`` (two :class:`~.row_sum.RowSum`, continued
        in place: the distributed executor's metric pass, added as one process adds it).
        No side effects (see :meth:`ClientSet.full_objective_`)."""
        x = x.detach()
        n, N = self.num_clients, self.num_clients if total is None else int(total)
        losses, grads = start if start is not None else (RowSum(1, torch.float64, self.device),
                                                         RowSum(self.dim, self.dtype, self.device))
        # one process's blocks of the run's clients (a rank's: those that hold some of its, laid out as one process's)
        longest = self.longest_client()  # of the whole run, not of a block: padding must not depend on the blocks
        base = self.first_client if self.run_sizes is not None else 0
        blocks = self.metric_blocks(base, base + n)
        block = max(len(b) for b in blocks)
        G = self._aligned_rows(block)
        values = torch.empty(block, dtype=self.dtype, device=self.device)  # a block's losses f_i(x)
        rows = self._aligned_rows(block).copy_(x.expand(block, -1))  # real rows, as a stack's (a stride-0
        # batch may take other kernels), each starting on a cache line: a strided matrix product's
        # bits can depend on its operands' alignment, which must not change with a row's position
        with side_effect_free(self.model, self.device):
            for ids in blocks:
                mine = [p for p, g in enumerate(ids) if base <= g < base + n]
                c = len(mine)
                self._layout_passes(rows, G, [self._whole(ids[p] - base) for p in mine],
                                    {p: j for j, p in enumerate(mine)}, ids, range(len(ids)), longest, values)
                grads.add_(G[:c])
                losses.add_(values[:c, None].to(torch.float64))
        grad_out.copy_(grads.sum().div_(N))
        return float(losses.sum()) / N

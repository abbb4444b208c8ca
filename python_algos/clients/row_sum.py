"""The sum of a stack's rows in one fixed order, whatever chunks the rows arrive in.

``clients.mean`` of every executor sums its rows with :class:`RowSum` (``(1/n) Σ_i S[i]`` is that sum
over n), and a round that streams its clients in chunks (``simulate``'s ``state="ram"|"disk"`` under
full participation: python_algos/algorithms/streamed.py) feeds the same accumulator chunk after chunk.
torch's ``S.sum(0)`` cannot be split so: its order depends on the stack's length (blocked cascades),
so the sum of a chunk's partial sums is another number than the dense stack's sum.

The order: rows in blocks of :data:`BLOCK` consecutive rows (row 0's block first), each block summed
row after row from its first row, the block sums added row after row to a running total from zero.
Every step is an elementwise IEEE addition, so the bits depend on the rows and their order only:
never on the chunks, the device, the threads or the layout (a stride-0 view sums as its dense copy).
A chunk's whole blocks are summed in ``BLOCK`` vectorized additions over all of them; a block cut by
a chunk's end is carried (its running sum, one ``[d]`` vector) into the next chunk.
"""

from __future__ import annotations

import torch

__all__ = ["RowSum", "sum_rows", "block_sums", "BLOCK"]

BLOCK = 64  # rows per block: BLOCK + n / BLOCK additions for n rows (64: ~2,000 at n = 10^5)


class RowSum:
    """A running sum of ``[c, d]`` stacks' rows (:meth:`add_`), in the module's fixed order."""

    def __init__(self, dim: int, dtype: torch.dtype, device="cpu"):
        self.total = torch.zeros(dim, dtype=dtype, device=device)  # the finished blocks
        self.part = torch.zeros(dim, dtype=dtype, device=device)  # the open block's rows so far
        self.open = 0  # rows in the open block
        self.rows = 0  # rows added

    def add_(self, S: torch.Tensor) -> "RowSum":
        """Add the rows of ``S`` (``[c, d]``), the rows that follow those added so far."""
        n, i = S.shape[0], 0
        while self.open and i < n:  # finish the block the previous chunk left open
            self._add_row(S[i])
            i += 1
        whole = (n - i) // BLOCK * BLOCK
        if whole:
            for s in block_sums(S[i : i + whole]):
                self.total.add_(s)
            i += whole
        while i < n:  # the start of a block the next chunk (or finish) closes
            self._add_row(S[i])
            i += 1
        self.rows += n
        return self

    def _add_row(self, r: torch.Tensor) -> None:
        if self.open:
            self.part.add_(r)
        else:
            self.part.copy_(r)
        self.open += 1
        if self.open == BLOCK:
            self.total.add_(self.part)
            self.open = 0

    def state(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The accumulator as 2d + 1 numbers: the finished blocks' total, the open block's sum and its row
        count (< BLOCK, so exact in any float dtype), written into ``out`` (a float dtype that holds the
        sums exactly: this one or a wider) or a new tensor. Another process continues it with :meth:`load`
        (:attr:`rows` is not carried: the sum does not read it)."""
        d = self.total.numel()
        if out is None:
            out = torch.empty(2 * d + 1, dtype=self.total.dtype, device=self.total.device)
        out[:d].copy_(self.total)
        out[d : 2 * d].copy_(self.part)
        out[2 * d] = self.open
        return out

    def load(self, buf: torch.Tensor) -> "RowSum":
        """Continue the running sum whose :meth:`state` is ``buf``: the rows added next follow its rows."""
        d = self.total.numel()
        self.total.copy_(buf[:d])
        self.part.copy_(buf[d : 2 * d])
        self.open = int(buf[2 * d])
        return self

    def sum(self) -> torch.Tensor:
        """The sum of every row added (a new ``[d]`` tensor)."""
        out = self.total.clone()
        return out.add_(self.part) if self.open else out


def block_sums(S: torch.Tensor) -> torch.Tensor:
    """The sums ``[b, d]`` of a ``[b * BLOCK, d]`` stack's blocks of BLOCK rows, each row after row from
    its first: BLOCK vectorized additions over all the blocks."""
    blocks = S.unflatten(0, (-1, BLOCK))  # [b, BLOCK, d]
    sums = blocks[:, 0].clone()
    for j in range(1, BLOCK):
        sums.add_(blocks[:, j])
    return sums


def sum_rows(S: torch.Tensor) -> torch.Tensor:
    """``Σ_i S[i]`` of an ``[n, d]`` stack in the module's fixed order (a new ``[d]`` tensor)."""
    return RowSum(S.shape[1], S.dtype, S.device).add_(S).sum()

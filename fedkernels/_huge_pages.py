"""A copy of a CPU tensor in memory backed by transparent huge pages (Linux).

Kernels that read rows at random from a large sample matrix (``fedkernels.raw.linear_gathered``)
take a TLB miss, and a page walk, for nearly every row on 4 KiB pages; on 2 MiB pages the rows of
a whole client's data share a few translations. ``huge_page_copy`` copies the matrix once into an
anonymous mapping advised with ``MADV_HUGEPAGE`` (which takes effect when the system's setting,
``/sys/kernel/mm/transparent_hugepage/enabled``, is ``always`` or ``madvise``): the memory is then
faulted in as huge pages by the copy itself. Elsewhere it is a plain contiguous copy.
"""

from __future__ import annotations

import mmap

import torch

__all__ = ["huge_page_copy"]

HUGE_PAGE = 2 << 20  # bytes: the x86-64 and arm64 (4 KiB base page) transparent huge page


def huge_page_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of the CPU tensor ``t``, on transparent huge pages where the system allows.

    Same shape, dtype and values as ``t``; it shares no memory with ``t``. The memory is freed with
    the returned tensor (and every view of it). Without ``MADV_HUGEPAGE`` (not Linux) it is
    ``t.contiguous()`` copied.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise ValueError(f"t is on {t.device}: huge_page_copy copies CPU tensors only")
    nbytes = t.numel() * t.element_size()
    if nbytes == 0 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return t.clone(memory_format=torch.contiguous_format)
    # One huge page more than needed, so that the data can start on a huge-page boundary.
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: the copy below faults huge pages in
    raw = torch.frombuffer(m, dtype=torch.uint8)  # keeps the mapping alive as long as it is used
    start = -raw.data_ptr() % HUGE_PAGE
    out = raw[start:start + nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out

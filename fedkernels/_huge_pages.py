"""A copy of a CPU tensor in memory backed by transparent huge pages (Linux).

Kernels that read rows at random from a large sample matrix (``fedkernels.raw.linear_gathered``)
take a TLB miss, and a page walk, for nearly every row on 4 KiB pages; on 2 MiB pages the rows of
a whole client's data share a few translations. ``huge_page_empty`` gives an uninitialised tensor in
an anonymous mapping advised with ``MADV_HUGEPAGE`` (which takes effect when the system's setting,
``/sys/kernel/mm/transparent_hugepage/enabled``, is ``always`` or ``madvise``): the memory is then
faulted in as huge pages by whatever first writes it (``torch.cat(..., out=)``, a copy).
``huge_page_copy`` is that plus a copy. Elsewhere (no ``MADV_HUGEPAGE``) they are ``torch.empty`` and
a plain contiguous copy.

Where the kernel refuses huge pages (built without transparent huge pages, so ``madvise`` fails with
``EINVAL``; the setting ``never``; an ``mmap`` that fails) they fall back to ``torch.empty``, ordinary
pages with the same values and layout, and say so once at ``logging.DEBUG`` (logger
``fedkernels.huge_pages``): huge pages only make the gathered kernels faster, never different.
"""

from __future__ import annotations

import logging
import mmap

import torch

__all__ = ["huge_page_empty", "huge_page_copy"]

HUGE_PAGE = 2 << 20  # bytes: the x86-64 and arm64 (4 KiB base page) transparent huge page
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"

log = logging.getLogger("fedkernels.huge_pages")
_told = False  # the fallback is reported once per process


def _fallback(shape, dtype, why: str) -> torch.Tensor:
    global _told
    if not _told:
        _told = True
        log.debug("transparent huge pages unavailable (%s): using ordinary pages", why)
    return torch.empty(shape, dtype=dtype)


def _thp_never() -> bool:
    """True where the system setting turns transparent huge pages off (an advice would do nothing)."""
    try:
        with open(THP_SETTING) as f:
            return "[never]" in f.read()
    except OSError:
        return False  # no such file: let madvise answer


def huge_page_empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype``, on transparent huge pages where
    the system allows (its first 2 MiB boundary aligned with the data's start), else on ordinary pages.
    The memory is freed with the returned tensor (and every view of it)."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"shape must have sizes >= 0, got {shape}")
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return _fallback(shape, dtype, "no MADV_HUGEPAGE on this platform")
    if _thp_never():
        return _fallback(shape, dtype, f"{THP_SETTING} is 'never'")
    try:
        # One huge page more than needed, so that the data can start on a huge-page boundary.
        m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: the first write faults huge pages in
    except OSError as e:  # EINVAL: a kernel built without transparent huge pages
        return _fallback(shape, dtype, f"mmap/madvise(MADV_HUGEPAGE) failed: {e}")
    raw = torch.frombuffer(m, dtype=torch.uint8)  # keeps the mapping alive as long as it is used
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start:start + nbytes].view(dtype).view(shape)


def huge_page_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of the CPU tensor ``t``, on transparent huge pages where the system allows
    (:func:`huge_page_empty`, then the copy). Same shape, dtype and values as ``t``; it shares no
    memory with ``t``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise ValueError(f"t is on {t.device}: huge_page_copy copies CPU tensors only")
    return huge_page_empty(t.shape, t.dtype).copy_(t)

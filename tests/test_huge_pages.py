"""fk.raw.huge_page_copy: the same values in fresh memory, and that memory on transparent huge pages
where the system allows them (read back from /proc/self/smaps, the kernel's own account)."""

import re
import sys

import pytest
import torch

import fedkernels as fk


def _thp_setting():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None


def _anon_huge_kb(address):
    """AnonHugePages of the mapping holding `address` in this process."""
    span = None
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                span = (int(m.group(1), 16), int(m.group(2), 16))
            elif span and span[0] <= address < span[1] and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_copy_has_the_values_and_shares_no_memory(dtype):
    t = torch.arange(3 * 5 * 7, dtype=dtype).reshape(3, 5, 7).transpose(0, 2)  # not contiguous
    c = fk.raw.huge_page_copy(t)
    assert c.shape == t.shape and c.dtype == t.dtype and c.is_contiguous()
    assert torch.equal(c, t)
    c.zero_()
    assert t.sum() == sum(range(3 * 5 * 7))
    assert fk.raw.huge_page_copy(torch.empty(0, 4)).shape == (0, 4)


@pytest.mark.skipif(not sys.platform.startswith("linux") or _thp_setting() not in ("always", "madvise"),
                    reason="transparent huge pages unavailable")
def test_copy_is_on_huge_pages():
    X = torch.randn(2_000, 784)  # 6.3 MB: at least two whole 2 MiB pages wherever it starts
    c = fk.raw.huge_page_copy(X)
    assert torch.equal(c, X)
    assert _anon_huge_kb(c.data_ptr()) >= 2 * 2048


def test_refuses_what_it_cannot_copy():
    with pytest.raises(TypeError, match="t must be a torch.Tensor"):
        fk.raw.huge_page_copy([1.0])
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="CPU tensors only"):
            fk.raw.huge_page_copy(torch.ones(2, device="cuda"))

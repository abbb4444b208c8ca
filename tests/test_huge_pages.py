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


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_empty_has_the_shape_and_dtype_and_is_writable(dtype):
    t = fk.raw.huge_page_empty((3, 4, 5), dtype)
    assert t.shape == (3, 4, 5) and t.dtype == dtype and t.is_contiguous() and t.is_cpu
    t.copy_(torch.arange(60, dtype=dtype).view(3, 4, 5))
    assert int(t.sum()) == sum(range(60))
    assert fk.raw.huge_page_empty((0, 7), dtype).shape == (0, 7)


def test_empty_refuses_bad_arguments():
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        fk.raw.huge_page_empty((2,), "float32")
    with pytest.raises(ValueError, match="shape must have sizes >= 0"):
        fk.raw.huge_page_empty((2, -1), torch.float32)


@pytest.mark.skipif(not sys.platform.startswith("linux") or _thp_setting() not in ("always", "madvise"),
                    reason="transparent huge pages unavailable")
def test_batched_executor_keeps_large_sample_matrices_on_huge_pages():
    """Every local step reads random rows of the clients' samples: beyond 32 MB they are held on
    huge pages, with the same values as the clients' own tensors."""
    import torch.nn.functional as F

    from python_algos.clients import BatchedClients

    g = torch.Generator().manual_seed(0)
    clients = [(torch.randn(5_400, 784, generator=g), torch.randint(10, (5_400,), generator=g)) for _ in range(2)]
    bc = BatchedClients(torch.nn.Linear(784, 10), F.cross_entropy, clients, batch_size=8)
    assert torch.equal(bc.X_all, torch.cat([X for X, _ in clients]))
    assert _anon_huge_kb(bc.X_all.data_ptr()) >= 8 * 2048


class _RefusingMap:
    """An anonymous mapping whose MADV_HUGEPAGE advice fails as on a kernel without transparent huge pages."""

    def __init__(self, *args, **kwargs):
        pass

    def madvise(self, *args):
        import errno
        raise OSError(errno.EINVAL, "Invalid argument")


def test_refused_huge_pages_fall_back_to_ordinary_pages(monkeypatch, caplog):
    # defect 9 of issue 35: the OSError of madvise used to reach BatchedClients' callers
    import mmap

    from fedkernels import _huge_pages

    monkeypatch.setattr(mmap, "mmap", _RefusingMap)
    monkeypatch.setattr(_huge_pages, "_thp_never", lambda: False)
    monkeypatch.setattr(_huge_pages, "_told", False)
    X = torch.randn(300, 7, dtype=torch.float64)
    with caplog.at_level("DEBUG", logger="fedkernels.huge_pages"):
        a = fk.raw.huge_page_copy(X)
        b = fk.raw.huge_page_empty((5, 2), torch.float32)
    assert torch.equal(a, X) and a.is_contiguous() and a.data_ptr() != X.data_ptr()
    assert b.shape == (5, 2) and b.dtype == torch.float32
    said = [r for r in caplog.records if r.name == "fedkernels.huge_pages"]
    assert len(said) == 1 and said[0].levelname == "DEBUG"  # once, however many calls
    assert "Invalid argument" in said[0].getMessage()


def test_thp_never_uses_ordinary_pages_without_mapping(monkeypatch, tmp_path, caplog):
    import mmap

    from fedkernels import _huge_pages

    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(_huge_pages, "THP_SETTING", str(setting))
    monkeypatch.setattr(_huge_pages, "_told", False)

    def no_mapping(*args, **kwargs):
        raise AssertionError("mmap called although huge pages are off")
    monkeypatch.setattr(mmap, "mmap", no_mapping)
    with caplog.at_level("DEBUG", logger="fedkernels.huge_pages"):
        t = fk.raw.huge_page_empty((3, 4), torch.float64)
    assert t.shape == (3, 4) and t.is_contiguous()
    assert any("never" in r.getMessage() for r in caplog.records if r.name == "fedkernels.huge_pages")

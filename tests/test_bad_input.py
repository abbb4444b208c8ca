"""Bad input gets a clear exception naming the argument and the rule, and leaves buffers untouched."""

import math

import numpy as np
import pytest
import torch

import fedkernels as fk


def f64(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def raises_untouched(exc, match, fn, *buffers):
    before = [b.clone() for b in buffers]
    with pytest.raises(exc, match=match):
        fn()
    for b, b0 in zip(buffers, before):
        assert torch.equal(b, b0), "a rejected call modified a buffer"


def test_integer_and_non_tensor_inputs():
    x = torch.arange(10)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        fk.raw.prox_(x, "l1", 1.0, 1.0)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fk.raw.prox([1.0, 2.0], "l1", 1.0, 1.0)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        fk.L1(1.0).prox_(torch.zeros(3, dtype=torch.complex64), 1.0)


def test_mixed_dtypes():
    x, g = f64(10), torch.randn(10)
    raises_untouched(TypeError, "g has dtype torch.float32 but x has torch.float64",
                     lambda: fk.raw.cv_step_(x, g, f64(10), 0.1), x)


def test_mixed_devices():
    x = f64(10)
    g = torch.empty(10, dtype=torch.float64, device="meta")
    raises_untouched(ValueError, "g is on meta but x is on cpu",
                     lambda: fk.raw.prox_grad_step_(x, g, 0.1, "l1", 0.1, 1.0), x)


def test_unsupported_device():
    x = torch.empty(10, device="meta")
    with pytest.raises(ValueError, match="CPU and CUDA"):
        fk.raw.prox_(x, "l1", 1.0, 1.0)


def test_shape_mismatch_leaves_buffers_untouched():
    z, x, g = f64(4, 10), f64(4, 10), f64(4, 10)
    bad_c = f64(4, 9)
    raises_untouched(ValueError, r"c has shape \(4, 9\), expected \(4, 10\) or \(10,\)",
                     lambda: fk.raw.normal_map_step_(z, x, g, bad_c, 0.1, 1.0, "l1", 1.0, 0.1), z, x)
    raises_untouched(ValueError, r"d has shape", lambda: fk.raw.control_update_(z, f64(10), f64(10)), z)


def test_non_contiguous_in_place_rejected_out_of_place_handled():
    x = f64(10, 4).t()
    assert not x.is_contiguous()
    raises_untouched(ValueError, "x must be contiguous", lambda: fk.raw.prox_(x, "l1", 1.0, 1.0), x)
    out = fk.raw.prox(x, "l1", 1.0, 1.0)
    torch.testing.assert_close(out, torch.sign(x) * torch.clamp(x.abs() - 1.0, min=0))
    # read-only operands may be non-contiguous: they are copied
    y = f64(4, 10)
    g = f64(10, 4).t()
    want = y - 0.1 * (g + 1.0)
    fk.raw.cv_step_(y, g, torch.ones(4, 10, dtype=torch.float64), 0.1)
    torch.testing.assert_close(y, want)


@pytest.mark.parametrize("step", [-0.1, math.nan, math.inf])
def test_bad_step(step):
    x = f64(10)
    raises_untouched(ValueError, "step must be", lambda: fk.raw.prox_(x, "l1", step, 1.0), x)
    raises_untouched(ValueError, "step must be", lambda: fk.L1(1.0).prox_(x, step), x)


def test_bad_step_type():
    with pytest.raises(TypeError, match="step must be a real number"):
        fk.raw.prox_(f64(3), "l1", "0.1", 1.0)
    with pytest.raises(TypeError, match="step must be a real number"):
        fk.raw.prox_(f64(3), "l1", True, 1.0)


@pytest.mark.parametrize("make,match", [
    (lambda: fk.L1(-1.0), "kappa must be >= 0"),
    (lambda: fk.L1(math.nan), "kappa must be finite"),
    (lambda: fk.ElasticNet(0.1, -1.0), "l2 must be >= 0"),
    (lambda: fk.MCP(1.0, 0.0), "gamma must be > 0"),
    (lambda: fk.MCP(1.0, -2.0), "gamma must be > 0"),
    (lambda: fk.MCP(-1.0, 3.0), "lam must be > 0"),
    (lambda: fk.SCAD(1.0, 2.0), "a must be > 2"),
    (lambda: fk.SCAD(1.0, 1.5), "a must be > 2"),
    (lambda: fk.SCAD(math.inf, 3.7), "lam must be finite"),
    (lambda: fk.Box(1.0, 0.0), "lo must be <= hi"),
    (lambda: fk.Box(math.nan, 0.0), "lo must not be NaN"),
    (lambda: fk.Box(torch.ones(3), torch.zeros(3)), "lo must be <= hi elementwise"),
    (lambda: fk.L2Ball(-1.0), "radius must be >= 0"),
    (lambda: 0.5 * 3, None),
])
def test_bad_regularizer_parameters(make, match):
    if match is None:
        return
    with pytest.raises(ValueError, match=match):
        make()


def test_raw_penalty_parameters_checked():
    x = f64(10)
    raises_untouched(ValueError, "gamma must be > 0", lambda: fk.raw.prox_(x, "mcp", 1.0, 1.0, 0.0), x)
    raises_untouched(ValueError, "a must be > 2",
                     lambda: fk.raw.prox_grad_step_(x, x.clone(), 0.1, "scad", 1.0, 1.0, 2.0), x)
    raises_untouched(ValueError, "lo must be <= hi", lambda: fk.raw.prox_(x, "box", 1.0, 1.0, -1.0), x)
    raises_untouched(ValueError, "kind must be one of", lambda: fk.raw.prox_(x, "lasso", 1.0, 1.0), x)


def test_fused_scalar_rules():
    x, z = f64(10), f64(10)
    raises_untouched(ValueError, "beta must be > 0", lambda: fk.raw.normalized_delta_(x, z, 0.0, 5), x)
    raises_untouched(ValueError, "K must be >= 1", lambda: fk.raw.normalized_delta_(x, z, 0.1, 0), x)
    raises_untouched(TypeError, "K must be an int", lambda: fk.raw.normalized_delta_(x, z, 0.1, 2.5), x)
    raises_untouched(ValueError, "lam must be > 0",
                     lambda: fk.raw.normal_map_step_(x, z, f64(10), f64(10), 0.1, 0.0, "l1", 0.0, 0.1), x, z)
    m = f64(10)
    raises_untouched(ValueError, r"beta must be in \[0, 1\)",
                     lambda: fk.raw.depositum_step_(x, m, f64(10), 0.1, 1.0, "l1", 0.1, 0.1), x, m)
    raises_untouched(ValueError, "momentum must be one of",
                     lambda: fk.raw.depositum_step_(x, m, f64(10), 0.1, 0.5, "l1", 0.1, 0.1, momentum="adam"), x, m)


def test_aliasing_written_buffers_rejected():
    z = f64(10)
    raises_untouched(ValueError, "z and x share memory",
                     lambda: fk.raw.normal_map_step_(z, z, f64(10), f64(10), 0.1, 1.0, "l1", 1.0, 0.1), z)
    buf = f64(20)
    raises_untouched(ValueError, "zhat and z share memory",
                     lambda: fk.raw.za1_step_(buf[:10], buf[5:15], f64(10), f64(10), 0.1, "l1", 0.1, 0.1), buf)


def test_requires_grad_in_place_is_an_error():
    p = torch.nn.Parameter(f64(10))
    with pytest.raises(RuntimeError, match="x requires grad"):
        fk.raw.prox_(p, "l1", 1.0, 1.0)
    with pytest.raises(RuntimeError, match="x requires grad"):
        fk.L1(1.0).prox_(p, 1.0)
    with torch.no_grad():  # the optimizer-style use is fine
        fk.L1(1.0).prox_(p, 1.0)


def test_read_only_memory(tmp_path):
    path = tmp_path / "weights.bin"
    np.arange(16, dtype=np.float32).tofile(path)
    arr = np.memmap(path, dtype=np.float32, mode="r")
    with pytest.warns(UserWarning):
        x = torch.from_numpy(arr)
    with pytest.raises(ValueError, match="x is backed by read-only memory"):
        fk.raw.prox_(x, "l1", 1.0, 1.0)
    with pytest.raises(ValueError, match="c is backed by read-only memory"):
        fk.raw.control_update_(x, torch.zeros(16), torch.zeros(16))
    # reading it is fine
    out = fk.raw.prox(x, "l1", 1.0, 1.0)
    assert out[3] == 2.0


def test_cuda_tensor_without_cuda_runtime_is_a_clear_error():
    info = fk.backend_info()
    if info["cuda_available"]:
        pytest.skip("a GPU is present")
    assert info["cuda_error"]

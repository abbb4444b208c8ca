"""Aliasing rules of every in-place op, on both entry points (fk.raw and the registered fk.ops):

* an input is either the written buffer itself or shares no memory with it (as torch requires of
  its own in-place ops); a partial overlap (one row of a stack written as a whole, a shifted view)
  is rejected before anything is written;
* every written tensor's autograd version counter moves, so a tensor saved for backward and then
  changed makes backward() raise instead of returning wrong gradients.
"""

import pytest
import torch

import fedkernels as fk

PATHS = {"raw": fk.raw, "ops": fk.ops}


def f64(*shape):
    return torch.randn(*shape, dtype=torch.float64)


# (op name, call(mod, written, operand_for_overlap_test)): the written buffer is a [4, 6] stack or,
# for the shifted-view case, a 1-D buffer; `other` is passed in the position of one read input.
def _calls():
    L1 = ("l1", 0.1, 1.0)
    return {
        "box_tensor_/lo": lambda m, x, o: m.box_tensor_(x, o, torch.full_like(o, 9.0)),
        "box_tensor_/hi": lambda m, x, o: m.box_tensor_(x, torch.full_like(o, -9.0), o),
        "l2_ball_/center": lambda m, x, o: m.l2_ball_(x, 0.5, o),
        "cv_step_/g": lambda m, x, o: m.cv_step_(x, o, torch.zeros_like(o), 0.1),
        "cv_step_/c": lambda m, x, o: m.cv_step_(x, torch.zeros_like(o), o, 0.1),
        "normalized_delta_/z": lambda m, x, o: m.normalized_delta_(x, o, 0.1, 2),
        "control_update_/dbar": lambda m, x, o: m.control_update_(x, o, torch.zeros_like(x)),
        "prox_grad_step_/g": lambda m, x, o: m.prox_grad_step_(x, o, 0.1, *L1),
        "normal_map_step_/g": lambda m, x, o: m.normal_map_step_(x, torch.zeros_like(x), o, torch.zeros_like(o),
                                                                 0.1, 0.5, *L1),
        "normal_map_step_/c(x)": lambda m, x, o: m.normal_map_step_(torch.zeros_like(x), x, torch.zeros_like(o), o,
                                                                    0.1, 0.5, *L1),
        "za1_step_/g": lambda m, x, o: m.za1_step_(x, torch.zeros_like(x), o, torch.zeros_like(o), 0.1, *L1),
        "za1_step_/c(z)": lambda m, x, o: m.za1_step_(torch.zeros_like(x), x, torch.zeros_like(o), o, 0.1, *L1),
        "depositum_step_/y(x)": lambda m, x, o: m.depositum_step_(x, torch.zeros_like(x), o, 0.1, 0.5, *L1),
        "depositum_step_/y(m)": lambda m, x, o: m.depositum_step_(torch.zeros_like(x), x, o, 0.1, 0.5, *L1),
    }


CALLS = _calls()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CALLS)
def test_a_row_of_the_written_stack_is_rejected(name, path):
    X = f64(4, 6)
    before = X.clone()
    with pytest.raises(ValueError, match="overlaps .* in memory"):
        CALLS[name](PATHS[path], X, X[1])
    assert torch.equal(X, before)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CALLS)
def test_a_shifted_view_is_rejected(name, path):
    buf = f64(13)
    x, shifted = buf[0:12], buf[1:13]
    before = buf.clone()
    with pytest.raises(ValueError, match="overlaps .* in memory"):
        CALLS[name](PATHS[path], x, shifted)
    assert torch.equal(buf, before)


def test_control_update_d_overlapping_c_is_rejected():
    buf = f64(13)
    with pytest.raises(ValueError, match="d overlaps c"):
        fk.raw.control_update_(buf[:12], torch.zeros(12, dtype=torch.float64), buf[1:])


@pytest.mark.parametrize("path", PATHS)
def test_the_written_buffer_itself_is_allowed(path):
    m = PATHS[path]
    x = f64(4, 6)
    want = x - 0.1 * (x + 2 * x)
    m.cv_step_(x, x, 2 * x, 0.1)
    torch.testing.assert_close(x, want, rtol=0, atol=1e-15)
    x = f64(6)
    want = (x - 0.0) * 0  # z = x: (x - x) / (beta K) = 0
    m.normalized_delta_(x, x, 0.1, 2)
    assert torch.equal(x, want)


@pytest.mark.parametrize("path", PATHS)
def test_disjoint_rows_of_one_storage_are_allowed(path):
    m = PATHS[path]
    S = f64(3, 6)
    x, g = S[0], S[2]
    want = x - 0.5 * g
    m.cv_step_(x, g, torch.zeros(6, dtype=torch.float64), 0.5)
    torch.testing.assert_close(S[0], want, rtol=0, atol=1e-15)


# --- autograd version counters -----------------------------------------------------------------


def _saved_for_backward(shape=(4, 6)):
    """x does not require grad but is saved by mul for w's gradient."""
    w = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    x = f64(*shape)
    loss = (x * w).sum()
    return x, loss


INPLACE = {
    "prox_": lambda m, x: m.prox_(x, "l1", 0.1, 1.0),
    "box_tensor_": lambda m, x: m.box_tensor_(x, torch.full_like(x, -0.1), torch.full_like(x, 0.1)),
    "l2_ball_": lambda m, x: m.l2_ball_(x, 0.1),
    "group_lasso_": lambda m, x: m.group_lasso_(x, 0.1, 1.0, "cols"),
    "cv_step_": lambda m, x: m.cv_step_(x, torch.ones_like(x), torch.ones_like(x), 0.1),
    "normalized_delta_": lambda m, x: m.normalized_delta_(x, torch.ones_like(x), 0.1, 2),
    "control_update_": lambda m, x: m.control_update_(x, torch.ones_like(x), torch.zeros_like(x)),
    "prox_grad_step_": lambda m, x: m.prox_grad_step_(x, torch.ones_like(x), 0.1, "l1", 0.1, 1.0),
    "normal_map_step_(z)": lambda m, x: m.normal_map_step_(x, torch.zeros_like(x), torch.ones_like(x),
                                                           torch.ones_like(x), 0.1, 0.5, "l1", 0.1, 1.0),
    "normal_map_step_(x)": lambda m, x: m.normal_map_step_(torch.zeros_like(x), x, torch.ones_like(x),
                                                           torch.ones_like(x), 0.1, 0.5, "l1", 0.1, 1.0),
    "za1_step_(zhat)": lambda m, x: m.za1_step_(x, torch.zeros_like(x), torch.ones_like(x), torch.ones_like(x),
                                                0.1, "l1", 0.1, 1.0),
    "za1_step_(z)": lambda m, x: m.za1_step_(torch.zeros_like(x), x, torch.ones_like(x), torch.ones_like(x),
                                             0.1, "l1", 0.1, 1.0),
    "depositum_step_(x)": lambda m, x: m.depositum_step_(x, torch.zeros_like(x), torch.ones_like(x),
                                                         0.1, 0.5, "l1", 0.1, 1.0),
    "depositum_step_(m)": lambda m, x: m.depositum_step_(torch.zeros_like(x), x, torch.ones_like(x),
                                                         0.1, 0.5, "l1", 0.1, 1.0),
    "prox(out=)": lambda m, x: fk.raw.prox(torch.ones_like(x), "l1", 0.1, 1.0, out=x),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", INPLACE)
def test_writing_a_tensor_saved_for_backward_makes_backward_raise(name, path):
    x, loss = _saved_for_backward()
    INPLACE[name](PATHS[path], x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_inference_tensors_have_no_counter_and_still_work():
    with torch.inference_mode():
        x = f64(8)
        want = torch.sign(x) * torch.clamp(x.abs() - 0.1, min=0)
        fk.raw.prox_(x, "l1", 0.1, 1.0)
    assert torch.equal(x, want)

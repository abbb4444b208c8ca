"""FlatParams: parameters and gradients as views into one buffer; zero-copy binding to stack rows."""

import pytest
import torch
from torch import nn

import fedkernels as fk


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def test_params_are_views_and_values_preserved():
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    flat = fk.FlatParams(model)
    assert flat.numel == sum(p.numel() for p in before) == flat.params.numel()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)
    with torch.no_grad():
        flat.params.fill_(0.5)
    assert all(bool((p == 0.5).all()) for p in model.parameters())


def test_backward_accumulates_into_flat_grad():
    model = small_model()
    flat = fk.FlatParams(model)
    x = torch.randn(7, 5)
    ref = small_model()
    ref.zero_grad()
    ref(x).square().sum().backward()
    want = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    flat.zero_grad()
    model(x).square().sum().backward()
    torch.testing.assert_close(flat.grad, want)
    model(x).square().sum().backward()  # accumulates, still in the same buffer
    torch.testing.assert_close(flat.grad, 2 * want)
    flat.zero_grad()
    assert bool((flat.grad == 0).all())


def test_bind_rows_of_a_client_stack():
    model = small_model()
    flat = fk.FlatParams(model)
    X = flat.params.detach().repeat(3, 1).contiguous()
    G = torch.zeros_like(X)
    X[1] += 1.0
    x = torch.randn(2, 5)
    flat.bind_(X[1], G[1])
    out = model(x)
    ref = small_model()
    with torch.no_grad():
        for p in ref.parameters():
            p += 1.0
    torch.testing.assert_close(out, ref(x))
    out.sum().backward()
    assert G[1].abs().sum() > 0 and G[0].abs().sum() == 0 and G[2].abs().sum() == 0
    with torch.no_grad():
        fk.raw.prox_(X, "l1", 1.0, 0.1)  # one kernel over every client's model
    assert X.data_ptr() == flat.params.data_ptr() - flat.numel * X.element_size()


def test_errors():
    with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
        fk.FlatParams("model")
    flat = fk.FlatParams(small_model())
    with pytest.raises(ValueError, match="vector must have shape"):
        flat.bind_(torch.zeros(3))
    with pytest.raises(ValueError, match="grad must be"):
        flat.bind_(torch.zeros(flat.numel), torch.zeros(flat.numel + 1))


def test_row_binder_matches_bind():
    model = small_model()
    flat = fk.FlatParams(model)
    X = torch.randn(4, flat.numel)
    G = torch.zeros_like(X)
    bind = flat.row_binder(X, G)
    x = torch.randn(2, 5)
    for i in (2, 0, 3):
        bind(i)
        out = model(x)
        flat.bind_(X[i])
        torch.testing.assert_close(out, model(x))
        bind(i)
        model(x).sum().backward()
        assert G[i].abs().sum() > 0
        assert flat.params.data_ptr() == X[i].data_ptr()
    with pytest.raises(ValueError, match="params_stack must be a contiguous"):
        flat.row_binder(torch.zeros(3, flat.numel + 1))


def _grads_of(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("set_to_none", [True, False])
def test_module_zero_grad_then_backward_reaches_flat_grad(set_to_none):
    """module.zero_grad() (set_to_none=True by default) used to detach .grad from the buffer:
    flat.grad then silently kept the previous step's gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    flat = fk.FlatParams(model)
    x = torch.randn(5, 4)
    model(x).pow(2).sum().backward()
    first = flat.grad.clone()
    model.zero_grad(set_to_none=set_to_none)
    model(2 * x).sum().backward()
    want = _grads_of(model)
    assert not torch.equal(want, first)
    assert torch.equal(flat.grad, want)
    # and .grad views the buffer again: the next backward accumulates into it
    model(x).sum().backward()
    assert torch.equal(flat.grad, _grads_of(model))
    assert flat.views(flat.grad)[0].data_ptr() == model[0].weight.grad.data_ptr()


def test_module_zero_grad_without_backward_reads_zero():
    model = nn.Linear(3, 2)
    flat = fk.FlatParams(model)
    model(torch.randn(2, 3)).sum().backward()
    model.zero_grad()
    assert torch.equal(flat.grad, torch.zeros(flat.numel))


def test_optimizer_zero_grad_between_steps():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    flat = fk.FlatParams(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 3)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        assert torch.equal(flat.grad, _grads_of(model))
        opt.step()

"""live.tap without vLLM: the custom op writes layer k's residual stream (out[0] + out[1]) of every
row into the static buffer, eager and under torch.compile (the op stays in the traced graph)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(not importlib.util.find_spec("torch"), reason="needs torch")


def _model():
    import torch

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, residual):
            residual = x if residual is None else x + residual
            return torch.tanh(self.lin(residual)), residual

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Layer() for _ in range(3))

        def forward(self, x):
            residual = None
            for layer in self.layers:
                x, residual = layer(x, residual)
            return x + residual

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()
            self.config = type("Config", (), {"hidden_size": 8})()

    torch.manual_seed(0)
    return Outer()


@pytest.mark.parametrize("compiled", [False, True])
def test_tap_writes_the_layers_residual_stream(compiled):
    import torch

    from live.tap import install_tap, tapped_layer

    outer = _model()
    seen = {}
    outer.model.layers[1].register_forward_hook(lambda m, a, out: seen.update(want=(out[0] + out[1]).detach()))
    reference = outer.model(torch.randn(5, 8))          # the hook's view, before any tap
    buf = install_tap(outer, 1, rows=16)
    assert install_tap(outer, 1, rows=16) is buf and tapped_layer(outer) == (1, buf)
    forward = torch.compile(outer.model, backend="aot_eager", fullgraph=True) if compiled else outer.model
    for n in (5, 3):                                    # a second, shorter step overwrites the first rows
        x = torch.randn(n, 8)
        with torch.no_grad():
            eager_y = outer.model(x)                    # the hook records what the tap must hold
            buf.data.zero_()
            y = forward(x)                              # compiled: only the op in the graph writes
        torch.testing.assert_close(y, eager_y)          # the tap changes nothing the model returns
        torch.testing.assert_close(buf.rows(list(range(n))), seen["want"].float())
    assert reference.shape == (5, 8)
    with pytest.raises(ValueError, match="beyond the buffer's 16 rows"):
        buf.rows([16])


def test_tap_refuses_a_layer_out_of_range():
    from live.tap import install_tap

    with pytest.raises(ValueError, match="layer 3 out of range: the model has 3 decoder layers"):
        install_tap(_model(), 3, rows=4)

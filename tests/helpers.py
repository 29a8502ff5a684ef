"""Small helpers shared by the tests (importable because pytest puts tests/ on sys.path)."""

import torch


def randomize(module, seed, std=0.3):
    """Random values for every parameter, LayerNorm gains and biases included, so that all of them matter
    when a module is compared with PyTorch's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(std * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module

"""Shared pytest setup for tests/."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests use tiny tensors: one intra-op thread. `make test` runs two xdist workers on two cores, and two
    OpenMP threads per worker make every small kernel wait on spinning threads (measured: 10x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

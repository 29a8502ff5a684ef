"""Shared pytest setup for tests/."""

import socket

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


@pytest.fixture(scope="module")
def no_network():
    """Any attempt to open a connection fails: the tests build Hugging Face models from configs only."""
    def refuse(*args, **kwargs):
        raise RuntimeError("network access attempted")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        try:                                     # read once at import: set the constant too
            import huggingface_hub.constants
            mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
        except ImportError:
            pass
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket.socket, "connect_ex", refuse)
        mp.setattr(socket, "create_connection", refuse)
        mp.setattr(socket, "getaddrinfo", refuse)
        yield

"""transformer_lib.utils (exported by Chapter 1): seeding, device choice, attention plots."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from transformer_lib.utils import plot_attention, plot_attention_heads, seed_everything  # noqa: E402


def test_seed_everything_repeats_every_generator():
    import random

    seed_everything(123)
    first = (random.random(), np.random.rand(), torch.rand(3))
    seed_everything(123)
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == second[0] and first[1] == second[1] and torch.equal(first[2], second[2])


def test_plot_attention_draws_the_weights_with_labels():
    w = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.5, 0.5]])
    ax = plot_attention(w, ["a", "b"], ["x", "y", "z"], title="t")
    assert np.allclose(ax.images[0].get_array(), w.numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y", "z"]
    assert ax.get_title() == "t"
    plt.close("all")


def test_plot_attention_heads_one_panel_per_head():
    fig = plot_attention_heads(torch.rand(6, 3, 4), ncols=4)
    drawn = [ax for ax in fig.axes if ax.images]
    assert len(drawn) == 6 and len(fig.axes) == 8      # 2 rows x 4 columns, two panels switched off
    plt.close("all")


@pytest.mark.parametrize("fn, shape", [(plot_attention, (2, 3, 4)), (plot_attention, (4,)),
                                       (plot_attention_heads, (3, 4))])
def test_plots_reject_wrong_shapes(fn, shape):
    with pytest.raises(ValueError, match="weights must be"):
        fn(torch.rand(*shape))


@pytest.mark.parametrize("call, match", [
    (lambda: seed_everything(True), "seed must be an int >= 0, got bool True"),
    (lambda: seed_everything("0"), "seed must be an int >= 0, got str"),
    (lambda: seed_everything(1.5), "seed must be an int >= 0, got float"),
    (lambda: seed_everything(-1), "seed must be an int >= 0, got -1"),
    (lambda: plot_attention_heads(torch.rand(2, 3, 3), ncols=0), "ncols must be an int >= 1, got 0"),
])
def test_bad_arguments_raise_value_errors_naming_them(call, match):
    with pytest.raises(ValueError, match=match):
        call()
    plt.close("all")

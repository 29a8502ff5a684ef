"""transformer_lib.utils (exported by the appendix chapters/appendix_tools.ipynb): seeding, device choice, attention plots, the map of the model."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from transformer_lib.utils import (  # noqa: E402
    ARCHITECTURE_PARTS,
    plot_architecture,
    plot_attention,
    plot_attention_heads,
    seed_everything,
)


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
    assert len(drawn) == 6 and len(fig.axes) == 9      # 2 rows x 4 columns (two switched off) + one colour bar
    plt.close("all")


def test_plot_attention_uses_a_fixed_zero_one_scale_with_a_colour_bar():
    w = torch.tensor([[0.3, 0.2], [0.1, 0.4]])         # diffuse: the largest weight is 0.4
    ax = plot_attention(w)
    assert ax.images[0].get_clim() == (0.0, 1.0)       # not stretched to look sharp
    assert len(ax.figure.axes) == 2                    # the map and its colour bar
    assert plot_attention(w, vmax=None).images[0].get_clim() == (0.0, pytest.approx(0.4))
    assert len(plot_attention(w, colorbar=False).figure.axes) == 1
    plt.close("all")


def test_plot_attention_heads_share_one_scale_and_one_colour_bar():
    w = torch.rand(3, 2, 2) * torch.tensor([0.2, 0.5, 0.9])[:, None, None]
    fig = plot_attention_heads(w, ncols=3)
    maps = [ax for ax in fig.axes if ax.images]
    assert len(fig.axes) - len(maps) == 1                                      # one colour bar for all
    assert {ax.images[0].get_clim() for ax in maps} == {(0.0, 1.0)}
    fig = plot_attention_heads(w, ncols=3, vmax=None)
    assert [ax.images[0].get_clim() for ax in fig.axes if ax.images] == [(0.0, pytest.approx(w.max().item()))] * 3
    plt.close("all")


def _box_colours(ax):
    """{part: set of face colours} of the blocks of plot_architecture (each block's gid is its part)."""
    colours = {}
    for patch in ax.patches:
        if patch.get_gid():
            colours.setdefault(patch.get_gid(), set()).add(to_hex(patch.get_facecolor()))
    return colours


def test_plot_architecture_draws_every_block_and_highlights_the_named_parts():
    full = _box_colours(plot_architecture())
    assert set(full) == {"attention", "add-norm", "feed-forward", "embedding", "positional", "output"}
    assert all(len(c) == 1 for c in full.values())                   # each kind in its own colour
    assert len({next(iter(c)) for c in full.values()}) == 6
    ax = plot_architecture(highlight="feed-forward", scale=0.5, shapes=False)
    part = _box_colours(ax)
    assert part["feed-forward"] == full["feed-forward"]               # the chapter's part keeps its colour
    grey = part["attention"]
    assert grey != full["attention"] and all(part[k] == grey for k in part if k != "feed-forward")
    assert ax.get_title().startswith("You are here")
    assert ax.figure.get_size_inches() == pytest.approx((6.25, 5.5))
    both = _box_colours(plot_architecture(highlight=["multi-head", "add-norm"]))
    assert both["attention"] == full["attention"] and both["add-norm"] == full["add-norm"]
    assert both["feed-forward"] == grey
    fig, ax = plt.subplots()
    assert plot_architecture(ax=ax) is ax                             # draws on a given Axes
    plt.close("all")


@pytest.mark.parametrize("highlight", ["attn", ["attention", "FFN"], [], 3])
def test_plot_architecture_rejects_unknown_parts_and_lists_the_valid_ones(highlight):
    with pytest.raises(ValueError, match="highlight must be None or names from attention, multi-head") as e:
        plot_architecture(highlight)
    assert all(name in str(e.value) for name in ARCHITECTURE_PARTS)
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
    (lambda: plot_attention(torch.rand(2, 3), vmax=0), "vmax must lie in"),
    (lambda: plot_attention(torch.rand(2, 3), colorbar="yes"), "colorbar must be True or False"),
    (lambda: plot_attention_heads(torch.rand(2, 3, 3), vmax=-1.0), "vmax must lie in"),
    (lambda: plot_architecture(scale=0), "scale must lie in"),
    (lambda: plot_architecture(shapes=1), "shapes must be True or False"),
])
def test_bad_arguments_raise_value_errors_naming_them(call, match):
    with pytest.raises(ValueError, match=match):
        call()
    plt.close("all")


@pytest.mark.parametrize("family, present, absent", [
    ("encoder-decoder", {"Multi-head cross-attention", "Masked multi-head self-attention", "final LayerNorm *"},
     {"Pooling: [CLS] or mean"}),
    ("encoder-only", {"Multi-head self-attention", "Pooling: [CLS] or mean", "Linear (classifier)"},
     {"Multi-head cross-attention", "Masked multi-head self-attention", "Linear (output layer)"}),
    ("decoder-only", {"Masked multi-head self-attention", "LayerNorm", "Linear (output layer)"},
     {"Multi-head cross-attention", "Add & LayerNorm", "Multi-head self-attention"}),
    ("llama", {"Masked GQA attention + RoPE", "RMSNorm", "SwiGLU feed-forward", "final RMSNorm",
               "no position added (RoPE)", "ch. 14"},
     {"LayerNorm", "+ learned positions", "Multi-head cross-attention", "Feed-forward"}),
])
def test_the_map_draws_each_family(family, present, absent):
    """Chapters 10 and 11 open with their own family's map (issue 20): the encoder pooled into a classifier;
    GPT-2's pre-norm decoder without cross-attention. Each block carries the chapter that builds it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ax = plot_architecture(family=family, scale=0.5)
    texts = {t.get_text() for t in ax.texts}
    plt.close(ax.figure)
    assert present <= texts and not (absent & texts), (present - texts, absent & texts)
    assert {"ch. 3"} <= texts and ({"ch. 1-2", "ch. 4", "ch. 5"} <= texts or {"ch. 2, 14", "ch. 4, 14", "ch. 12"} <= texts)


def test_the_map_refuses_an_unknown_family():
    with pytest.raises(ValueError, match="family must be"):
        plot_architecture(family="decoder")

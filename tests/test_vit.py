"""transformer_lib.vit (Chapter 12): patchify / unpatchify, the Vision Transformer against Hugging Face's
ViTForImageClassification and ViTModel in float64, built from configs only (never downloaded); loading, shapes,
gradients and attention weights; the shift augmentation and the image batches."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_download_fails, import_hf, max_diff, noisy, randomize

from transformer_lib.multi_head import attention_maps
from transformer_lib.vit import ViT, ViTConfig, image_batches, load_hf_vit, patchify, shifted, unpatchify

DT = torch.float64
ATOL = 1e-12


def small_config(**kw) -> ViTConfig:
    return ViTConfig(**{"image_size": 8, "patch_size": 4, "num_channels": 2, "d_model": 16, "num_layers": 2,
                        "num_heads": 2, "d_ff": 32, "num_classes": 5, **kw})


def random_vit(seed=0, **kw) -> ViT:
    """A small ViT in float64, eval mode, with every parameter (LayerNorm gains and biases too) random."""
    return randomize(ViT(small_config(**kw)).double(), seed=seed, std=0.3).eval()


def pixels(*shape, seed=0, dtype=DT):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)



# ---------------------------------------------------------------- no network, ever

pytestmark = pytest.mark.usefixtures("no_network")   # tests/conftest.py: any connection fails


def test_network_guard_makes_from_pretrained_fail(tmp_path):
    assert_download_fails("ViTModel", "google/vit-base-patch16-224", tmp_path)


# ---------------------------------------------------------------- patchify, unpatchify

SHAPES = [(1, 1, 8, 8, 4), (2, 3, 12, 8, 4), (3, 2, 6, 9, 3), (1, 1, 5, 5, 5), (2, 3, 4, 6, 1), (2, 4, 8, 8, 2)]


@pytest.mark.parametrize("B, C, H, W, p", SHAPES)
def test_patchify_unpatchify_round_trip(B, C, H, W, p):
    x = pixels(B, C, H, W, seed=H * W + C)
    patches = patchify(x, p)
    assert patches.shape == (B, (H // p) * (W // p), C * p * p) and patches.dtype == DT
    assert torch.equal(unpatchify(patches, p, H, W), x)
    y = pixels(B, (H // p) * (W // p), C * p * p, seed=1)
    assert torch.equal(patchify(unpatchify(y, p, H, W), p), y)             # and the other way round


@pytest.mark.parametrize("B, C, H, W, p", SHAPES)
def test_patches_come_row_by_row_channel_first(B, C, H, W, p):
    x = pixels(B, C, H, W, seed=2)
    patches = patchify(x, p)
    cols = W // p
    for r in range(H // p):
        for c in range(cols):
            block = x[:, :, r * p:(r + 1) * p, c * p:(c + 1) * p]          # (B, C, p, p)
            assert torch.equal(patches[:, r * cols + c], block.reshape(B, C * p * p)), (r, c)
            assert torch.equal(patches[:, r * cols + c, :p * p], block[:, 0].reshape(B, p * p))


def test_patch_one_is_the_top_right_block():
    x = torch.arange(64.0).view(1, 1, 8, 8)
    patches = patchify(x, 4)
    assert patches[0, 1].tolist() == [4.0, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31]
    assert torch.equal(patches[0, 2], x[0, 0, 4:, :4].flatten())            # patch 2: bottom left
    assert patchify(torch.arange(16).view(1, 1, 4, 4), 2).dtype == torch.long   # any dtype


@pytest.mark.parametrize("C, p", [(1, 4), (3, 2), (2, 3)])
def test_linear_on_patches_equals_a_strided_conv2d(C, p):
    """Hugging Face's patch embedding, Conv2d(kernel = stride = p), is our Linear with the reshaped weight."""
    torch.manual_seed(C * 10 + p)
    conv = nn.Conv2d(C, 7, kernel_size=p, stride=p).double()
    linear = nn.Linear(C * p * p, 7).double()
    with torch.no_grad():
        linear.weight.copy_(conv.weight.reshape(7, C * p * p))
        linear.bias.copy_(conv.bias)
    x = pixels(2, C, 4 * p, 2 * p, seed=3)
    want = conv(x).flatten(2).transpose(1, 2)                               # (B, N, 7), patches row by row
    assert max_diff(linear(patchify(x, p)), want) < ATOL
    wrong = nn.Linear(C * p * p, 7).double()                                # an (h, w, C) flattening disagrees
    with torch.no_grad():
        wrong.weight.copy_(conv.weight.permute(0, 2, 3, 1).reshape(7, -1))
        wrong.bias.copy_(conv.bias)
    if C > 1:
        assert max_diff(wrong(patchify(x, p)), want) > 1e-3


def test_patchify_and_unpatchify_refuse_bad_shapes():
    with pytest.raises(ValueError, match=r"(?s)7×8.*patch_size"):
        patchify(pixels(1, 1, 7, 8), 4)
    with pytest.raises(ValueError, match=r"\bimages\b"):
        patchify(pixels(1, 8, 8), 4)
    with pytest.raises(ValueError, match=r"\bpatch_size\b"):
        patchify(pixels(1, 1, 8, 8), 0)
    with pytest.raises(ValueError, match=r"\bpatches\b.*expected N = 4"):
        unpatchify(pixels(1, 5, 16), 4, 8, 8)
    with pytest.raises(ValueError, match=r"\bpatches\b"):
        unpatchify(pixels(1, 4, 15), 4, 8, 8)                               # not C·p·p
    with pytest.raises(ValueError, match=r"\bpatches\b"):
        unpatchify(pixels(1, 4, 16), 4, 8, 10)                              # 10 is no multiple of 4
    with pytest.raises(ValueError, match=r"\bheight\b"):
        unpatchify(pixels(1, 4, 16), 4, 0, 8)


# ---------------------------------------------------------------- equality with Hugging Face

def hf_config(**kw):
    transformers = import_hf("transformers")
    return transformers.ViTConfig(**{"image_size": 8, "patch_size": 2, "num_channels": 3, "hidden_size": 32,
                                     "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
                                     "num_labels": 10, "attn_implementation": "sdpa", **kw})


def hf_pair(hf_class_name, num_classes, seed=0, **kw):
    transformers = import_hf("transformers")
    cfg = hf_config(**kw)
    hf = noisy(getattr(transformers, hf_class_name)(cfg), seed)
    ours = load_hf_vit(ViT(ViTConfig.from_hf(cfg, num_classes)).double().eval(), hf)
    return ours, hf


def test_from_hf_reads_every_size():
    cfg = ViTConfig.from_hf(hf_config(layer_norm_eps=1e-6, hidden_dropout_prob=0.2,
                                      attention_probs_dropout_prob=0.2), num_classes=10)
    assert cfg == ViTConfig(image_size=8, patch_size=2, num_channels=3, d_model=32, num_layers=2, num_heads=4,
                            d_ff=64, num_classes=10, dropout=0.2, eps=1e-6)
    assert ViTConfig.from_hf(hf_config(image_size=[8, 8], patch_size=(2, 2))).image_size == 8
    assert ViTConfig.from_hf(hf_config()).num_classes == 0


@pytest.mark.parametrize("channels, patch", [(3, 2), (1, 4)])
def test_vit_equals_vit_for_image_classification(channels, patch):
    # attn_implementation="sdpa": their "eager" attention takes the softmax in float32, even for float64
    ours, hf = hf_pair("ViTForImageClassification", 10, seed=1, num_channels=channels, patch_size=patch)
    images = pixels(5, channels, 8, 8, seed=4)
    with torch.no_grad():
        logits = ours(images)
        want = hf(pixel_values=images).logits
    assert logits.shape == (5, 10) and logits.dtype == DT
    assert max_diff(logits, want) < 1e-10
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("channels, patch", [(3, 2), (1, 4)])
def test_vit_features_equal_vit_model(channels, patch):
    ours, hf = hf_pair("ViTModel", 0, seed=2, num_channels=channels, patch_size=patch)
    images = pixels(4, channels, 8, 8, seed=5)
    with torch.no_grad():
        features = ours.features(images)
        want = hf(pixel_values=images).last_hidden_state
    assert features.shape == (4, 1 + (8 // patch) ** 2, 32)
    assert max_diff(features, want) < 1e-10


def test_load_hf_vit_copies_the_weights():
    ours, hf = hf_pair("ViTForImageClassification", 10, seed=3)
    conv = hf.vit.embeddings.patch_embeddings.projection
    torch.testing.assert_close(ours.patch_embedding.weight, conv.weight.flatten(1), rtol=0, atol=0)
    torch.testing.assert_close(ours.patch_embedding.bias, conv.bias, rtol=0, atol=0)
    torch.testing.assert_close(ours.cls_token, hf.vit.embeddings.cls_token, rtol=0, atol=0)
    torch.testing.assert_close(ours.position, hf.vit.embeddings.position_embeddings, rtol=0, atol=0)
    torch.testing.assert_close(ours.head.weight, hf.classifier.weight, rtol=0, atol=0)
    torch.testing.assert_close(ours.encoder.norm.weight, hf.vit.layernorm.weight, rtol=0, atol=0)
    assert hf.vit.embeddings.patch_embeddings.projection.weight.dim() == 4  # theirs is left as it was


def test_load_hf_vit_refuses_a_model_of_the_other_kind():
    transformers = import_hf("transformers")
    cfg = hf_config()
    with pytest.raises(ValueError, match=r"(?s)ViTModel into one with num_classes=0.*got ViTModel and num_classes=10"):
        load_hf_vit(ViT(ViTConfig.from_hf(cfg, 10)), transformers.ViTModel(cfg))
    with pytest.raises(ValueError, match=r"got ViTForImageClassification and num_classes=0"):
        load_hf_vit(ViT(ViTConfig.from_hf(cfg, 0)), transformers.ViTForImageClassification(cfg))
    with pytest.raises(ValueError, match=r"model must be a ViT"):
        load_hf_vit(nn.Linear(2, 2), transformers.ViTModel(cfg))
    ours = load_hf_vit(ViT(ViTConfig.from_hf(cfg, 0)), transformers.ViTModel(cfg, add_pooling_layer=False))
    assert ours.head is None


@pytest.mark.parametrize("field, value", [("hidden_size", 48), ("intermediate_size", 32), ("patch_size", 4),
                                          ("num_channels", 1), ("num_labels", 7), ("image_size", 16),
                                          ("num_hidden_layers", 3)])
def test_load_hf_vit_refuses_other_sizes(field, value):
    transformers = import_hf("transformers")
    hf = transformers.ViTForImageClassification(hf_config(**{field: value}))
    with pytest.raises(ValueError, match=r"(?s)hf_model.*ViTConfig\.from_hf"):
        load_hf_vit(ViT(ViTConfig.from_hf(hf_config(), 10)), hf)


def test_load_hf_vit_refuses_fewer_layers_than_ours():
    transformers = import_hf("transformers")
    with pytest.raises(ValueError, match=r"hf_model has no"):
        load_hf_vit(ViT(ViTConfig.from_hf(hf_config(num_hidden_layers=3), 0)), transformers.ViTModel(hf_config()))


def test_from_hf_refuses_what_we_do_not_implement():
    with pytest.raises(ValueError, match=r"hf_config.image_size must be square"):
        ViTConfig.from_hf(hf_config(image_size=(8, 16)))
    with pytest.raises(ValueError, match=r"hf_config.patch_size must be square"):
        ViTConfig.from_hf(hf_config(patch_size=[2, 4]))
    with pytest.raises(ValueError, match=r"hidden_act='gelu'"):
        ViTConfig.from_hf(hf_config(hidden_act="relu"))
    with pytest.raises(ValueError, match=r"qkv_bias=True"):
        ViTConfig.from_hf(hf_config(qkv_bias=False))
    with pytest.raises(ValueError, match=r"one dropout rate"):
        ViTConfig.from_hf(hf_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0))


# ---------------------------------------------------------------- the model itself

def test_logits_come_from_the_cls_position():
    model = random_vit(seed=6)
    images = pixels(3, 2, 8, 8, seed=7)
    with torch.no_grad():
        features = model.features(images)
        assert features.shape == (3, 5, 16)
        assert max_diff(model(images), model.head(features[:, 0])) < ATOL
        model.cls_token.add_(torch.randn(1, 1, 16, dtype=DT))               # the learned [CLS] vector is used
        assert max_diff(model(images), model.head(features[:, 0])) > 1e-6


def test_positions_make_the_patch_order_matter():
    model = random_vit(seed=8, num_channels=1)
    image = pixels(1, 1, 8, 8, seed=9)
    swapped = image.clone()
    swapped[..., :4, :4], swapped[..., :4, 4:] = image[..., :4, 4:], image[..., :4, :4]   # patches 0 and 1
    with torch.no_grad():
        assert max_diff(model(image), model(swapped)) > 1e-6
        model.position.zero_()                                              # without positions: a set of patches
        assert max_diff(model(image), model(swapped)) < ATOL


def test_eps_reaches_every_layer_norm_and_the_init():
    torch.manual_seed(0)
    model = ViT(small_config(eps=1e-7))
    norms = [m for m in model.modules() if type(m).__name__ == "LayerNorm"]
    assert len(norms) == 2 * 2 + 1 and all(m.eps == 1e-7 for m in norms)
    assert all(torch.all(m.bias == 0) for m in model.modules() if isinstance(m, nn.Linear))
    big = ViT(ViTConfig(d_model=256, d_ff=512, num_layers=1))
    for p in (big.patch_embedding.weight, big.position, big.encoder.layers[0].feed_forward.linear1.weight):
        assert p.std().item() == pytest.approx(0.02, rel=0.1)              # ViT's (and transformers') init


def test_forward_without_a_head_is_refused():
    model = ViT(small_config(num_classes=0))
    assert model.head is None
    with pytest.raises(ValueError, match=r"no classification head \(num_classes=0\).*features"):
        model(pixels(2, 2, 8, 8, dtype=torch.float32))
    assert model.features(pixels(2, 2, 8, 8, dtype=torch.float32)).shape == (2, 5, 16)


def test_wrong_images_are_refused_by_name():
    model = ViT(small_config())
    for bad in (pixels(2, 1, 8, 8, dtype=torch.float32), pixels(2, 2, 8, 4, dtype=torch.float32),
                pixels(2, 2, 12, 12, dtype=torch.float32)):
        with pytest.raises(ValueError, match=r"images must have shape \(B, 2, 8, 8\)"):
            model(bad)
    with pytest.raises(ValueError, match=r"\bimages\b"):
        model(pixels(2, 8, 8, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"\bimages\b.*floating"):
        model(torch.ones(2, 2, 8, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\bimages\b.*float64"):
        model(pixels(2, 2, 8, 8))
    with pytest.raises(ValueError, match=r"config must be a ViTConfig"):
        ViT({"image_size": 8})


@pytest.mark.parametrize("kwargs, names", [
    (dict(image_size=10), r"image_size|patch_size"),
    (dict(d_model=15), r"d_model|num_heads"),
    (dict(num_layers=0), r"num_layers"),
    (dict(num_classes=-1), r"num_classes"),
    (dict(dropout=1.0), r"dropout"),
    (dict(eps=0.0), r"eps"),
    (dict(patch_size=True), r"patch_size"),
])
def test_config_value_errors_name_the_field(kwargs, names):
    with pytest.raises(ValueError, match=rf"\b({names})\b"):
        small_config(**kwargs)


def test_gradients_reach_every_parameter():
    torch.manual_seed(0)
    model = ViT(small_config())
    images = pixels(6, 2, 8, 8, seed=10, dtype=torch.float32)
    F.cross_entropy(model(images), torch.arange(6) % 5).backward()
    params = dict(model.named_parameters())
    assert len(params) == 4 + 2 * 16 + 2 + 2                                # embeddings, 2 layers, norm, head
    for name, p in params.items():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


def test_attention_maps_of_features():
    model = random_vit(seed=11)
    images = pixels(3, 2, 8, 8, seed=12)
    with torch.no_grad():
        plain = model.features(images)
        with attention_maps(model) as maps:
            assert max_diff(model.features(images), plain) < ATOL
    weights = list(maps.values())
    assert len(weights) == 2
    for w in weights:
        assert w.shape == (3, 2, 5, 5)                                      # every patch sees every patch
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 5, dtype=DT), rtol=0, atol=ATOL)
        assert torch.all(w > 0)
    assert not torch.equal(weights[0], weights[1])


def test_dropout_only_in_training():
    model = random_vit(seed=13, dropout=0.3)
    images = pixels(2, 2, 8, 8, seed=14)
    model.train()
    assert max_diff(model(images), model(images)) > 1e-6
    model.eval()
    torch.testing.assert_close(model(images), model(images), rtol=0, atol=0)


# ---------------------------------------------------------------- shifted

def shift_table(x, y, s):
    """For images x, y (N, C, H, W): the shifts (a, b), |a|, |b| <= s, and a bool table (N, shifts) saying
    whether y[n, :, i, j] = x[n, :, i + a, j + b] (0 outside x)."""
    H, W = x.shape[-2:]
    padded = F.pad(x, (s, s, s, s))
    shifts = [(a, b) for a in range(-s, s + 1) for b in range(-s, s + 1)]
    table = torch.stack([(y == padded[..., s + a:s + a + H, s + b:s + b + W]).flatten(1).all(1)
                         for a, b in shifts], dim=1)
    return shifts, table


def shifts_of(x, y, s):
    """The shifts that explain y (C, H, W) as x (C, H, W) moved."""
    shifts, table = shift_table(x[None], y[None], s)
    return [shift for shift, hit in zip(shifts, table[0], strict=True) if hit]


@pytest.mark.parametrize("s", [1, 2, 3])
def test_shifted_moves_each_image_by_at_most_max_shift(s):
    x = 0.1 + pixels(2000, 2, 7, 9, seed=15)                                # no zeros: the filled border shows
    before = x.clone()
    y = shifted(x, s, torch.Generator().manual_seed(16))
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.equal(x, before)                                           # the input is left alone
    shifts, table = shift_table(x, y, s)
    assert torch.all(table.sum(1) == 1)                                     # exactly one shift explains each
    counts = table.sum(0)
    assert torch.all(counts > 0), [sh for sh, n in zip(shifts, counts, strict=True) if n == 0]   # and every shift occurs
    assert counts.max() < 3 * counts.float().mean()                        # roughly uniformly


def test_shifted_fills_the_border_with_zeros_by_hand():
    x = torch.arange(1.0, 17).view(1, 1, 4, 4)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        y = shifted(x, 1, g)[0, 0]
        (a, b), = shifts_of(x[0], y[None], 1)
        zero_rows = {1: [3], -1: [0], 0: []}[a]
        zero_cols = {1: [3], -1: [0], 0: []}[b]
        for r in zero_rows:
            assert torch.all(y[r] == 0)
        for c in zero_cols:
            assert torch.all(y[:, c] == 0)
        assert (y == 0).sum() == 4 * (len(zero_rows) + len(zero_cols)) - len(zero_rows) * len(zero_cols)


def test_shifted_by_zero_is_the_identity_and_the_generator_makes_it_reproducible():
    x = pixels(20, 1, 8, 8, seed=17)
    assert torch.equal(shifted(x, 0), x)
    assert torch.equal(shifted(x, 0, torch.Generator().manual_seed(1)), x)
    a = shifted(x, 2, torch.Generator().manual_seed(5))
    b = shifted(x, 2, torch.Generator().manual_seed(5))
    c = shifted(x, 2, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    g = torch.Generator().manual_seed(5)
    first, second = shifted(x, 2, g), shifted(x, 2, g)                       # the generator advances
    assert torch.equal(first, a) and not torch.equal(second, a)


def test_shifted_refuses_bad_inputs():
    with pytest.raises(ValueError, match=r"\bmax_shift\b"):
        shifted(pixels(2, 1, 4, 4), -1)
    with pytest.raises(ValueError, match=r"\bimages\b"):
        shifted(pixels(1, 4, 4), 1)
    with pytest.raises(ValueError, match=r"\bimages\b.*floating"):
        shifted(torch.ones(2, 1, 4, 4, dtype=torch.long), 1)


# ---------------------------------------------------------------- image_batches

def numbered_images(n, C=1, H=6, W=6):
    """n distinct images (values in [0.1, 1.1): no zeros) and labels that are a permutation of 0 .. n-1, so
    that a label tells which image it came with."""
    images = 0.1 + pixels(n, C, H, W, seed=18, dtype=torch.float32)
    labels = (7 * torch.arange(n) + 3) % n
    return images, labels


def test_image_batches_pair_each_image_with_its_label():
    images, labels = numbered_images(10)
    owner = {int(label): i for i, label in enumerate(labels)}
    batches = image_batches(images, labels, batch_size=3, max_shift=0, seed=1)
    for epoch in range(3):
        seen = []
        for _ in range(3):                                                  # 10 // 3 full batches an epoch
            x, y = next(batches)
            assert x.shape == (3, 1, 6, 6) and y.shape == (3,) and y.dtype == labels.dtype
            for image, label in zip(x, y, strict=True):
                assert torch.equal(image, images[owner[int(label)]])
            seen += y.tolist()
        assert len(set(seen)) == 9, epoch                                   # no image twice in an epoch


def test_image_batches_shift_the_right_image():
    images, labels = numbered_images(12, C=2)
    owner = {int(label): i for i, label in enumerate(labels)}
    batches = image_batches(images, labels, batch_size=4, max_shift=1, seed=2)
    used = set()
    for _ in range(12):
        x, y = next(batches)
        for image, label in zip(x, y, strict=True):
            found = shifts_of(images[owner[int(label)]], image, 1)
            assert len(found) == 1
            used.add(found[0])
    assert len(used) > 3                                                    # shifted, and not all alike


def test_image_batches_are_shuffled_and_reproducible():
    images, labels = numbered_images(16)
    take = lambda seed: [next(b)[1].tolist() for b in [image_batches(images, labels, 4, 0, seed)] for _ in range(8)]  # noqa: E731
    a, b, c = take(3), take(3), take(4)
    assert a == b and a != c
    assert sorted(sum(a[:4], [])) == list(range(16))                        # the first epoch: every image once
    assert a[:4] != a[4:]                                                   # each epoch in a new order
    assert sum(a[:4], []) != sorted(sum(a[:4], []))


def test_image_batches_with_a_batch_larger_than_the_data():
    images, labels = numbered_images(5)
    x, y = next(image_batches(images, labels, batch_size=64, max_shift=0))
    assert x.shape == (5, 1, 6, 6) and sorted(y.tolist()) == list(range(5))


def test_image_batches_refuse_bad_inputs():
    images, labels = numbered_images(6)
    with pytest.raises(ValueError, match=r"labels must have shape \(N,\) = \(6,\)"):
        next(image_batches(images, labels[:5]))
    with pytest.raises(ValueError, match=r"\blabels\b"):
        next(image_batches(images, labels.tolist()))
    with pytest.raises(ValueError, match=r"\bbatch_size\b"):
        next(image_batches(images, labels, batch_size=0))
    with pytest.raises(ValueError, match=r"\bseed\b"):
        next(image_batches(images, labels, seed=-1))
    with pytest.raises(ValueError, match=r"\bimages\b"):
        next(image_batches(images[:, 0], labels))
    with pytest.raises(ValueError, match=r"\bmax_shift\b"):
        next(image_batches(images, labels, max_shift=-2))


def test_image_batches_refuses_no_images():
    with pytest.raises(ValueError, match=r"images must hold at least one image"):
        next(image_batches(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long)))

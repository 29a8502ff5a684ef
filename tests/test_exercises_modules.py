"""The graders of a reader's own module classes (issue 21): check_multi_head_attention (chapter 2),
check_encoder_layer_module (chapter 6) and their weight copy, copy_weights (chapter 1). Each accepts the book's
class, a float32 one and one with other parameter names; each wrong class is named by its mistake."""

import math

import pytest
import torch
import torch.nn as nn
from helpers import grader_row

from transformer_lib.encoder import EncoderLayer
from transformer_lib.exercises.attention import copy_weights
from transformer_lib.exercises.encoder import check_encoder_layer_module
from transformer_lib.exercises.multi_head import check_multi_head_attention
from transformer_lib.multi_head import MultiHeadAttention

# --- multi-head attention


class BookMHA(MultiHeadAttention):
    """The book's module with a reader's constructor."""

    def __init__(self, d_model, num_heads, dropout=0.1):
        super().__init__(d_model, num_heads, dropout)


class Float32MHA(BookMHA):
    """Computes in float32 whatever it is given."""

    def forward(self, query, key, value, mask=None):
        return super().forward(query.float(), key.float(), value.float(), mask)


class Float32WeightsMHA(BookMHA):
    """A float64 module holding float32-rounded weights (the mixed-precision slip)."""

    def forward(self, query, key, value, mask=None):
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(p.float())
        return super().forward(query, key, value, mask)


class Float32InputsMHA(BookMHA):
    """A float64 module whose inputs go through float32 first."""

    def forward(self, query, key, value, mask=None):
        return super().forward(*(x.float().double() for x in (query, key, value)), mask)


class AnnotatedMHA(nn.Module):
    """The Annotated Transformer's layout: four nn.Linear in a ModuleList (W_q, W_k, W_v, W_o), no dropout
    argument, the book's mask convention. The wrong classes below change one method each."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.linears = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(4))

    def scale(self):
        return 1 / math.sqrt(self.d_k)

    def masked(self, scores, mask):
        return scores.masked_fill(~mask, float("-inf"))

    def output(self, merged):
        return self.linears[3](merged)

    def heads(self, query, key, value, mask=None):                     # (B, h, n_q, d_k)
        Q, K, V = (lin(x).view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)
                   for lin, x in zip(self.linears, (query, key, value), strict=False))
        scores = Q @ K.transpose(-2, -1) * self.scale()
        if mask is not None:
            scores = self.masked(scores, mask)
        return scores.softmax(-1).nan_to_num(0.0) @ V

    def forward(self, query, key, value, mask=None):
        out = self.heads(query, key, value, mask)
        return self.output(out.transpose(1, 2).reshape(query.size(0), -1, self.h * self.d_k))


class MaskIgnored(AnnotatedMHA):
    def masked(self, scores, mask):
        return scores


class InvertedMask(AnnotatedMHA):
    def masked(self, scores, mask):
        return scores.masked_fill(mask, float("-inf"))


class SqrtDModelScaling(AnnotatedMHA):
    def scale(self):
        return 1 / math.sqrt(self.h * self.d_k)


class Unscaled(AnnotatedMHA):
    def scale(self):
        return 1.0


class MissingWo(AnnotatedMHA):
    def output(self, merged):
        return merged


class HeadsNotMerged(AnnotatedMHA):
    forward = AnnotatedMHA.heads


def test_the_grader_leaves_the_global_rng_alone():
    torch.manual_seed(1)
    want = torch.rand(3)
    torch.manual_seed(1)
    check_multi_head_attention(BookMHA)
    assert torch.equal(torch.rand(3), want)


# --- the encoder layer


class BookLayer(EncoderLayer):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.1, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, dropout=dropout, norm_first=norm_first)


class Float32Layer(BookLayer):
    def forward(self, x, mask=None, attn_bias=None):             # EncoderLayer.forward calls itself with attn_bias
        return super().forward(x.float(), mask, attn_bias)


class NanoBlock(nn.Module):
    """nanoGPT's names (ln_1, attn, ln_2, mlp), the parameters in another order than the book's; the wrong
    classes below change one method each."""

    def __init__(self, d_model, num_heads, d_ff, norm_first=False):
        super().__init__()
        self.norm_first = norm_first
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = AnnotatedMHA(d_model, num_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def sublayer(self, x, f, norm, residual=True):
        if self.norm_first:
            return (x if residual else 0) + f(norm(x))
        return norm((x if residual else 0) + f(x))

    def forward(self, x, mask=None):
        x = self.sublayer(x, lambda y: self.attn(y, y, y, mask), self.ln_1)
        return self.sublayer(x, self.mlp, self.ln_2)


class AlwaysPreNorm(NanoBlock):
    def __init__(self, d_model, num_heads, d_ff, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, norm_first=True)       # norm_first ignored


class PreNormWithoutOption(NanoBlock):
    def __init__(self, d_model, num_heads, d_ff):
        super().__init__(d_model, num_heads, d_ff, norm_first=True)


class NoAttentionResidual(NanoBlock):
    def forward(self, x, mask=None):
        x = self.sublayer(x, lambda y: self.attn(y, y, y, mask), self.ln_1, residual=False)
        return self.sublayer(x, self.mlp, self.ln_2)


class NoFeedForward(NanoBlock):
    def forward(self, x, mask=None):
        return self.sublayer(x, lambda y: self.attn(y, y, y, mask), self.ln_1)


class LayerMaskIgnored(NanoBlock):
    def forward(self, x, mask=None):
        return super().forward(x, None)


# --- copy_weights


def test_copy_weights_by_name_by_order_and_by_sub_module():
    book = EncoderLayer(8, 2, 16).double()
    assert all(a == b for a, b in copy_weights(book, BookLayer(8, 2, 16).double()).items())
    mapping = copy_weights(MultiHeadAttention(8, 2), AnnotatedMHA(8, 2))
    assert mapping["linears.0.weight"] == "W_q.weight" and mapping["linears.3.bias"] == "W_o.bias"
    block = NanoBlock(8, 2, 16).double()
    mapping = copy_weights(book, block)
    assert mapping["ln_1.weight"] == "self_attn_residual.norm.weight"
    assert mapping["ln_2.bias"] == "feed_forward_residual.norm.bias"
    assert mapping["attn.linears.2.weight"] == "self_attn.W_v.weight"
    assert mapping["mlp.2.weight"] == "feed_forward.linear2.weight"
    assert torch.equal(block.mlp[0].weight, book.feed_forward.linear1.weight)


def test_copy_weights_names_both_parameter_lists():
    class ThreeProjections(nn.Module):                                 # W_o forgotten
        def __init__(self, d_model, num_heads):
            super().__init__()
            self.linears = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(3))

    with pytest.raises(AssertionError, match=r"Yours: linears\.0\.weight \(8, 8\).*The book's: W_q\.weight \(8, 8\)"):
        copy_weights(MultiHeadAttention(8, 2), ThreeProjections(8, 2))
    with pytest.raises(AssertionError, match="cannot match your module's parameters"):
        check_multi_head_attention(ThreeProjections)


GRADERS = [
    grader_row(check_multi_head_attention, correct=[BookMHA, Float32MHA, AnnotatedMHA], mistakes=[
        (MaskIgnored, "causal mask.*the mask is ignored"),
        (InvertedMask, "the mask is inverted"),
        (SqrtDModelScaling, r"divided by sqrt\(d_model\)"),
        (Unscaled, "the scores are not scaled"),
        (MissingWo, "W_o is missing"),
        (HeadsNotMerged, r"\(B, h, n_q, d_k\), the heads not merged"),
        (Float32WeightsMHA, r"your weights \(or inputs\) went through float32: the difference is at float32's "
                            r"rounding.*\(first at \[.*: -?\d\.\d{10}, expected -?\d\.\d{10}; largest difference"),
        (Float32InputsMHA, "went through float32"),
    ], prints='matches MultiHeadAttention in all 3 cases'),
    grader_row(check_encoder_layer_module, correct=[BookLayer, Float32Layer, NanoBlock], mistakes=[
        (AlwaysPreNorm, "other norm placement, pre-norm .* as norm_first=False asks"),
        (PreNormWithoutOption, "give the constructor a norm_first argument"),
        (NoAttentionResidual, "without the residual connection around self-attention"),
        (NoFeedForward, "the feed-forward sub-layer is missing"),
        (LayerMaskIgnored, "ignores the padding mask"),
    ], prints='post-norm and pre-norm, with and without padding'),
]

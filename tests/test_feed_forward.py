"""Tests for transformer_lib.feed_forward (Chapter 4): equality with the feed-forward block of
torch.nn.TransformerEncoderLayer in float64 (through its public forward), the three meanings of "position-wise",
parameter counts, gradients, every ValueError, and the exercise checker (transformer_lib.exercises)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.exercises.feed_forward import check_feed_forward
from transformer_lib.feed_forward import PositionwiseFeedForward
from transformer_lib.multi_head import MultiHeadAttention

F64 = dict(dtype=torch.float64)
D, D_FF = 16, 64
TOL = 1e-12


def torch_pair(seed=0):
    """A pre-norm nn.TransformerEncoderLayer whose attention adds zeros (out_proj = 0) and whose norm2 is the
    identity, and our FFN holding its linear1/linear2 weights. Through PyTorch's public forward alone,
    ref(x) = x + FFN(x), so no private method (such as _ff_block) is needed."""
    torch.manual_seed(seed)
    ref = nn.TransformerEncoderLayer(D, 4, D_FF, dropout=0.0, activation="relu", batch_first=True,
                                     norm_first=True, **F64)
    with torch.no_grad():
        ref.self_attn.out_proj.weight.zero_()
        ref.self_attn.out_proj.bias.zero_()
    ref.norm2 = nn.Identity()
    ffn = PositionwiseFeedForward(D, D_FF, dropout=0.0).to(**F64)
    ffn.load_state_dict({k: v for k, v in ref.state_dict().items() if k.startswith("linear")})
    return ffn, ref


def n_params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("shape", [(1, D), (7, D), (3, 7, D)])
def test_equals_torch_feed_forward_block(shape):
    ffn, ref = torch_pair()
    x = torch.randn(shape, **F64)
    assert (x + ffn(x) - ref(x)).abs().max().item() <= TOL
    assert ffn(x).shape == shape


def test_gradients_equal_torch():
    ffn, ref = torch_pair()
    x = torch.randn(3, 7, D, **F64)
    (x + ffn(x)).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for name in ["linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"]:
        ours, theirs = ffn.get_parameter(name).grad, ref.get_parameter(name).grad
        assert (ours - theirs).abs().max().item() <= TOL, name


def test_formula_and_names():
    ffn, _ = torch_pair()
    x = torch.randn(5, D, **F64)
    W_1, b_1 = ffn.linear1.weight.T, ffn.linear1.bias
    W_2, b_2 = ffn.linear2.weight.T, ffn.linear2.bias
    assert torch.allclose(ffn(x), torch.clamp(x @ W_1 + b_1, min=0) @ W_2 + b_2, rtol=0, atol=TOL)
    assert (ffn.d_model, ffn.d_ff) == (D, D_FF)
    assert isinstance(ffn.dropout, nn.Dropout)
    assert sorted(ffn.state_dict()) == ["linear1.bias", "linear1.weight", "linear2.bias", "linear2.weight"]


def test_gradcheck():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(4, 6, dropout=0.0).to(**F64)
    x = torch.randn(2, 3, 4, **F64, requires_grad=True)
    assert torch.autograd.gradcheck(ffn, (x,))


def test_same_mlp_at_every_position():
    ffn, _ = torch_pair()
    x = torch.randn(2, 6, D, **F64)
    loop = torch.stack([torch.stack([ffn(x[b, i]) for i in range(6)]) for b in range(2)])
    assert (ffn(x) - loop).abs().max().item() <= TOL


def test_equals_two_conv1d_with_kernel_size_1():
    ffn, _ = torch_pair()
    conv1, conv2 = nn.Conv1d(D, D_FF, 1, **F64), nn.Conv1d(D_FF, D, 1, **F64)
    with torch.no_grad():
        conv1.weight.copy_(ffn.linear1.weight[:, :, None])
        conv1.bias.copy_(ffn.linear1.bias)
        conv2.weight.copy_(ffn.linear2.weight[:, :, None])
        conv2.bias.copy_(ffn.linear2.bias)
    x = torch.randn(2, 9, D, **F64)
    conv = conv2(F.relu(conv1(x.transpose(1, 2)))).transpose(1, 2)
    assert (ffn(x) - conv).abs().max().item() <= TOL


def test_jacobian_is_block_diagonal_and_permutation_equivariant():
    torch.manual_seed(0)
    n, d = 5, 4
    ffn = PositionwiseFeedForward(d, 8, dropout=0.0).to(**F64)
    x = torch.randn(n, d, **F64)
    J = torch.autograd.functional.jacobian(ffn, x)          # (n, d, n, d)
    off_diagonal = ~torch.eye(n, dtype=torch.bool)
    assert (J.permute(0, 2, 1, 3)[off_diagonal] == 0).all()
    assert (J.permute(0, 2, 1, 3)[~off_diagonal].abs().sum() > 0)
    perm = torch.randperm(n)
    assert torch.equal(ffn(x[perm]), ffn(x)[perm])


def test_key_value_memory_reading():
    ffn, _ = torch_pair()
    x = torch.randn(D, **F64)
    memory = sum(F.relu(x @ ffn.linear1.weight[r] + ffn.linear1.bias[r]) * ffn.linear2.weight[:, r]
                 for r in range(D_FF)) + ffn.linear2.bias
    assert (ffn(x) - memory).abs().max().item() <= TOL


def test_dropout_train_and_eval():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(D, D_FF, dropout=0.5).to(**F64)
    x = torch.randn(4, 7, D, **F64)
    assert not torch.equal(ffn(x), ffn(x))
    ffn.eval()
    assert torch.equal(ffn(x), ffn(x))
    no_dropout = PositionwiseFeedForward(D, D_FF, dropout=0.0).to(**F64)
    no_dropout.load_state_dict(ffn.state_dict())
    assert torch.equal(ffn(x), no_dropout(x))


@pytest.mark.parametrize("d, d_ff", [(512, 2048), (1024, 4096), (64, 256), (10, 3), (1, 1)])
def test_parameter_count(d, d_ff):
    assert n_params(PositionwiseFeedForward(d, d_ff)) == 2 * d * d_ff + d_ff + d


@pytest.mark.parametrize("d, h", [(64, 4), (512, 8)])
def test_two_thirds_of_an_encoder_layer(d, h):
    ffn = n_params(PositionwiseFeedForward(d, 4 * d))
    total = n_params(MultiHeadAttention(d, h)) + ffn + 4 * d
    assert total == n_params(nn.TransformerEncoderLayer(d, h, 4 * d, batch_first=True)) == 12 * d * d + 13 * d
    assert abs(ffn / total - 2 / 3) < 0.01


def test_base_model_numbers():
    assert n_params(PositionwiseFeedForward(512, 2048)) == 2_099_712
    assert n_params(nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)) == 3_152_384


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=0, d_ff=8), "d_model must be an int >= 1, got 0"),
    (dict(d_model=-4, d_ff=8), "d_model must be an int >= 1"),
    (dict(d_model=8.0, d_ff=8), "d_model must be an int >= 1, got float 8.0"),
    (dict(d_model=True, d_ff=8), "d_model must be an int >= 1, got bool True"),
    (dict(d_model=8, d_ff=0), "d_ff must be an int >= 1, got 0"),
    (dict(d_model=8, d_ff="32"), "d_ff must be an int >= 1"),
    (dict(d_model=8, d_ff=32, dropout=1.0), r"dropout must lie in \[0, 1\), got 1.0"),
    (dict(d_model=8, d_ff=32, dropout=-0.1), r"dropout must lie in \[0, 1\), got -0.1"),
    (dict(d_model=8, d_ff=32, dropout="0.1"), "dropout must be a number"),
    (dict(d_model=8, d_ff=32, dropout=None), "dropout must be a number"),
    (dict(d_model=8, d_ff=32, dropout=True), "dropout must be a number, got bool"),
])
def test_constructor_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PositionwiseFeedForward(**kwargs)


@pytest.mark.parametrize("x, match", [
    (torch.randn(2, 5, 7), r"x must be a tensor of shape \(\.\.\., d_model=8\), got float32 tensor of shape \(2, 5, 7\)"),
    (torch.tensor(1.0), r"shape \(\)"),
    ([[1.0] * 8], "got list"),
    (torch.ones(2, 8, dtype=torch.long), "x must be a floating-point tensor, got int64"),
    (torch.randn(2, 5, 8, dtype=torch.float64), "x is torch.float64 but the module is torch.float32"),
])
def test_forward_value_errors(x, match):
    with pytest.raises(ValueError, match=match):
        PositionwiseFeedForward(8, 32)(x)


def test_default_dropout_is_the_papers_and_edge_values_work():
    torch.manual_seed(0)
    x = torch.randn(200, 8)
    ffn = PositionwiseFeedForward(8, 32)                    # default 0.1: training output varies ...
    assert not torch.equal(ffn(x), ffn(x))
    assert torch.equal(ffn.eval()(x), ffn(x))              # ... evaluation output does not
    still = PositionwiseFeedForward(8, 32, dropout=0)
    assert torch.equal(still(x), still(x))                  # dropout=0 in training: deterministic
    nearly_all = PositionwiseFeedForward(8, 32, dropout=0.999)
    hidden = []
    nearly_all.linear2.register_forward_hook(lambda m, inp, out: hidden.append(inp[0]))
    nearly_all(x)
    assert (hidden[0] == 0).float().mean() > 0.99          # 0.999 accepted, and nearly every unit dropped


def test_empty_batch():
    assert PositionwiseFeedForward(8, 32)(torch.randn(0, 5, 8)).shape == (0, 5, 8)


# ---- the exercise checker -------------------------------------------------------------------------------

def right(x, W_1, b_1, W_2, b_2):
    return torch.relu(x @ W_1 + b_1) @ W_2 + b_2


def test_check_accepts_correct_solutions(capsys):
    check_feed_forward(right)
    check_feed_forward(lambda x, W_1, b_1, W_2, b_2: F.linear(F.relu(F.linear(x, W_1.T, b_1)), W_2.T, b_2))
    check_feed_forward(right, seed=3)
    assert "check_feed_forward: correct" in capsys.readouterr().out


def _in_place(x, W_1, b_1, W_2, b_2):
    out = right(x, W_1, b_1, W_2, b_2)
    x.zero_()
    return out


def _mixes_positions(x, W_1, b_1, W_2, b_2):
    return right(x, W_1, b_1, W_2, b_2) + x.mean(-2, keepdim=True) @ W_1 @ W_2


MISTAKES = {
    "ReLU missing": lambda x, W_1, b_1, W_2, b_2: (x @ W_1 + b_1) @ W_2 + b_2,
    "ReLU applied before adding b_1": lambda x, W_1, b_1, W_2, b_2: (torch.relu(x @ W_1) + b_1) @ W_2 + b_2,
    "ReLU applied after the second layer": lambda x, W_1, b_1, W_2, b_2: torch.relu((x @ W_1 + b_1) @ W_2 + b_2),
    "ReLU applied to the output as well": lambda x, W_1, b_1, W_2, b_2: torch.relu(right(x, W_1, b_1, W_2, b_2)),
    "b_1 missing": lambda x, W_1, b_1, W_2, b_2: torch.relu(x @ W_1) @ W_2 + b_2,
    "b_2 missing": lambda x, W_1, b_1, W_2, b_2: torch.relu(x @ W_1 + b_1) @ W_2,
    "GELU used instead of ReLU": lambda x, W_1, b_1, W_2, b_2: F.gelu(x @ W_1 + b_1) @ W_2 + b_2,
    r"on x of shape \(2, 5, 6\): output shape \(2, 5, 10\), expected \(2, 5, 6\)":
        lambda x, W_1, b_1, W_2, b_2: torch.relu(x @ W_1 + b_1),
    "got tuple": lambda x, W_1, b_1, W_2, b_2: (right(x, W_1, b_1, W_2, b_2),),
    "raised RuntimeError.*Hint: W_1 has the paper's shape": lambda x, W_1, b_1, W_2, b_2: x @ W_1.T,
    "changed x in place": _in_place,
    "positions are mixed": _mixes_positions,
    "on x of shape .*differs from the reference by up to": lambda x, W_1, b_1, W_2, b_2: right(x, W_1, b_1, W_2, b_2) * 1.01,
}


@pytest.mark.parametrize("message", list(MISTAKES))
def test_check_names_each_mistake(message):
    with pytest.raises(AssertionError, match=message):
        check_feed_forward(MISTAKES[message])


def test_check_catches_a_2d_only_failure():
    def only_3d(x, W_1, b_1, W_2, b_2):
        return torch.relu(torch.bmm(x, W_1.expand(x.size(0), *W_1.shape)) + b_1) @ W_2 + b_2

    with pytest.raises(AssertionError, match=r"on x of shape \(7, 6\): your function raised"):
        check_feed_forward(only_3d)


@pytest.mark.parametrize("activation, reference", [
    ("relu", torch.relu),
    ("gelu", lambda z: z * 0.5 * (1 + torch.erf(z / 2 ** 0.5))),                          # x Φ(x), exactly
    ("gelu_tanh", lambda z: 0.5 * z * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (z + 0.044715 * z ** 3)))),
])
def test_activation_option_follows_its_formula(activation, reference):
    ffn = PositionwiseFeedForward(D, D_FF, dropout=0.0, activation=activation).to(**F64)
    x = torch.randn(3, 7, D, **F64)
    expected = ffn.linear2(reference(ffn.linear1(x)))
    assert (ffn(x) - expected).abs().max().item() <= TOL
    assert ffn.activation == activation


def test_gelu_equals_torch_encoder_layer_with_gelu():
    ffn, ref = torch_pair()
    ref.activation = F.gelu                      # PyTorch's layer with activation="gelu" calls F.gelu
    ffn.activation = "gelu"
    x = torch.randn(3, 7, D, **F64)
    assert (x + ffn(x) - ref(x)).abs().max().item() <= TOL


@pytest.mark.parametrize("activation", ["swish", "GELU", None, F.gelu])
def test_unknown_activation_is_rejected(activation):
    with pytest.raises(ValueError, match="activation must be one of 'relu', 'gelu', 'gelu_tanh'"):
        PositionwiseFeedForward(D, D_FF, activation=activation)

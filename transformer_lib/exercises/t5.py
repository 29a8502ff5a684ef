"""The graders of Chapter 12's exercises (T5 and the Vision Transformer), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_buckets', 'check_alibi', 'check_alibi_reach', 'gelu_tanh', 'check_gated_ffn', 'check_new_buckets',
           'check_overlapping_patches']

import math

import torch
import torch.nn.functional as F

from ..t5 import relative_position_bucket
from .grading import close_to, grade


def check_buckets(fn) -> None:
    """Test fn(relative_position, bidirectional, num_buckets, max_distance) -> buckets against T5's bucketing
    (relative_position_bucket) for offsets -300..300 and several sizes. Raises AssertionError naming the first
    offset where they differ and what that offset should get; prints a verdict."""
    offsets = torch.arange(-300, 301)
    for bidirectional in (True, False):
        for num_buckets, max_distance in ((32, 128), (16, 64), (8, 20)):
            want = relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
            got = fn(offsets.clone(), bidirectional, num_buckets, max_distance)
            assert isinstance(got, torch.Tensor) and got.shape == offsets.shape, \
                f"return one bucket per offset, shape {tuple(offsets.shape)}, got {getattr(got, 'shape', type(got))}"
            wrong = (got != want).nonzero()
            if len(wrong):
                i = int(wrong[0])
                o = int(offsets[i])
                hint = ("keys after the query belong in the upper half of the buckets" if bidirectional and o > 0
                        else "distances below the exact range get a bucket each" if abs(o) < num_buckets // 4
                        else "farther distances share log-spaced buckets, capped at the last bucket")
                raise AssertionError(f"bidirectional={bidirectional}, num_buckets={num_buckets}, "
                                     f"max_distance={max_distance}: offset {o} got bucket {int(got[i])}, "
                                     f"expected {int(want[i])} ({hint})")
    print("check_buckets: correct for both directions and three sizes")


# --- Exercise 1: ALiBi, a position bias without buckets or parameters --------------------------------------

def _alibi(num_heads, n_q, n_k, slopes=None, offset=None, sign=-1.0, signed=False, causal=False):
    """ALiBi's bias (H, n_q, n_k): head h (1..H) adds sign * m_h * |i - j| for the query at position i and the key
    at j, m_h = 2^(-8h/H); the queries are the last n_q of the n_k positions (offset n_k - n_q). Its keyword
    arguments make the graders' slips."""
    h = torch.arange(1, num_heads + 1, dtype=torch.float64)
    m = 2.0 ** (-8.0 * h / num_heads) if slopes is None else slopes(h, num_heads)
    i = torch.arange(n_q, dtype=torch.float64)[:, None] + (n_k - n_q if offset is None else offset)
    j = torch.arange(n_k, dtype=torch.float64)[None, :]
    distance = (i - j) if signed else (i - j).clamp(min=0) if causal else (i - j).abs()   # (n_q, n_k)
    return sign * m[:, None, None] * distance


def _alibi_slips():
    return {
        "your slopes start at h = 0 (head 1 gets slope 1): ALiBi's heads are h = 1..H, m_h = 2^(-8h/H), so the "
        "first head's slope is 2^(-8/H)":
            lambda H, n_q, n_k: _alibi(H, n_q, n_k, slopes=lambda h, H: 2.0 ** (-8.0 * (h - 1) / H)),
        "your slopes are 2^(-h), not 2^(-8h/H): with H heads the exponents run from 8/H to 8":
            lambda H, n_q, n_k: _alibi(H, n_q, n_k, slopes=lambda h, H: 2.0 ** -h),
        "your heads are in reverse order: head 1 has the steepest slope, 2^(-8/H), head H the gentlest, 2^(-8)":
            lambda H, n_q, n_k: _alibi(H, n_q, n_k, slopes=lambda h, H: 2.0 ** (-8.0 * (H + 1 - h) / H)),
        "your bias rewards distance: it must be -m_h |i - j|, zero at the query's own position and lower farther away":
            lambda H, n_q, n_k: _alibi(H, n_q, n_k, sign=1.0),
        "your distance has a sign: keys after the query get a positive bias; use |i - j|":
            [lambda H, n_q, n_k: _alibi(H, n_q, n_k, signed=True),
             lambda H, n_q, n_k: -_alibi(H, n_q, n_k, signed=True)],
        "your bias is 0 for the keys after the query: that is the paper's causal form (a decoder masks those keys "
        "anyway); the exercise asks for -m_h |i - j| on both sides, the usual extension to an encoder":
            lambda H, n_q, n_k: _alibi(H, n_q, n_k, causal=True) if n_q == n_k else None,
        "your queries start at position 0: with n_q < n_k (decoding with a cache) they are the last n_q of the n_k "
        "positions, so query i sits at n_k - n_q + i":
            lambda H, n_q, n_k: _alibi(H, n_q, n_k, offset=0) if n_q < n_k else None,
        "your heads are on the last axis: the bias is (num_heads, n_q, n_k), to add to scores (B, h, n_q, n_k)":
            lambda H, n_q, n_k: torch.Size((n_q, n_k, H)),
        "one head's bias for all: every head needs its own slope (num_heads, n_q, n_k)":
            lambda H, n_q, n_k: torch.Size((n_q, n_k)),
    }


def check_alibi(fn) -> None:
    """Test fn(num_heads, n_q, n_k) -> ALiBi's bias (num_heads, n_q, n_k) (Press et al., 2022): head h = 1..H adds
    -m_h |i - j|, m_h = 2^(-8h/H), for queries that are the last n_q of n_k positions. Raises AssertionError naming
    the mistake; prints a verdict."""
    cases = {f"alibi({H}, {n_q}, {n_k})": (H, n_q, n_k)
             for H, n_q, n_k in ((8, 5, 5), (4, 6, 6), (16, 3, 7), (2, 1, 9), (8, 2, 6))}
    grade(fn, _alibi, cases, _alibi_slips(), name="your function", against="ALiBi's bias",
          shape="(num_heads, n_q, n_k) = ")
    print("check_alibi: one slope per head, 2^(-8h/H), times the distance, for queries at the end of the keys")


def _alibi_reach(num_heads, gap, slopes=None, at_most=False, multiply=False):
    """For heads h = 1..H: the smallest whole distance d with -m_h d < -gap, i.e. floor(gap / m_h) + 1 (m_h =
    2^(-8h/H)). Its keyword arguments make the graders' slips."""
    reach = []
    for h in range(1, num_heads + 1):
        m = 2.0 ** (-8.0 * h / num_heads) if slopes is None else slopes(h, num_heads)
        x = gap * m if multiply else gap / m
        reach.append(math.ceil(x) if at_most else math.floor(x) + 1)
    return reach


def check_alibi_reach(fn) -> None:
    """Test fn(num_heads, gap) -> for ALiBi's heads h = 1..H in order, the smallest whole distance at which the
    head's bias -m_h d (m_h = 2^(-8h/H)) is below -gap. Names: a bias equal to -gap counted as below, slopes
    from h = 0, heads in reverse order, the slope multiplied instead of divided."""
    slips = {
        "at that distance the bias is exactly -gap, not below it: the first distance below is one farther":
            dict(at_most=True),
        "your head 1 has slope 1: the heads are h = 1..H, m_h = 2^(-8h/H)":
            dict(slopes=lambda h, H: 2.0 ** (-8.0 * (h - 1) / H)),
        "your heads are in reverse order: head 1 has the steepest slope and the shortest reach":
            dict(slopes=lambda h, H: 2.0 ** (-8.0 * (H + 1 - h) / H)),
        "your reaches shrink as the slope shrinks: a gentler slope needs a longer distance to lose gap":
            dict(multiply=True),
    }
    for H, gap in ((8, 10.0), (4, 3.0), (16, 1.5), (2, 0.7), (8, 2.5)):
        want = _alibi_reach(H, gap)
        got = fn(H, gap)
        try:
            got = [int(d) for d in (got.tolist() if isinstance(got, torch.Tensor) else got)]
        except (TypeError, ValueError):
            raise AssertionError(f"return a list of {H} whole distances, one per head, got {type(got).__name__}") \
                from None
        if got == want:
            continue
        where = f"alibi_reach({H}, {gap})"
        if len(got) != H:
            raise AssertionError(f"{where}: {len(got)} distances, expected one per head ({H})")
        for message, slip in slips.items():
            if got == _alibi_reach(H, gap, **slip):
                raise AssertionError(f"{where}: {message}")
        wrong = next(h for h in range(H) if got[h] != want[h])
        raise AssertionError(f"{where}: head {wrong + 1}'s distance is not the first one whose bias is below -{gap}")
    print("check_alibi_reach: the first distance below -gap, for every head, in five cases")


# --- Exercise 2: T5 v1.1's gated-GELU feed-forward network -------------------------------------------------

def gelu_tanh(x):
    """The tanh approximation of GELU, which T5 v1.1 uses (Hugging Face's "gelu_new", Mesh TensorFlow's gelu)."""
    return F.gelu(x, approximate="tanh")


def _gated_ffn(x, W_0, W_1, W_2, act=gelu_tanh):
    """FFN(x) = (act(x W_0ᵀ) ⊙ x W_1ᵀ) W_2ᵀ, weights in nn.Linear's (out, in) layout. x (..., d) -> (..., d)."""
    return (act(x @ W_0.T) * (x @ W_1.T)) @ W_2.T


def check_gated_ffn(module, d_model: int = 8, d_ff: int = 12, seed: int = 0) -> None:
    """Test a reader's T5 v1.1 feed-forward module: FFN(x) = (GELU_tanh(x W_0) ⊙ x W_1) W_2 with three bias-free
    nn.Linear layers named linear0 (W_0, the GELU branch), linear1 (W_1, the linear branch) and linear2 (W_2),
    which are Hugging Face's T5DenseGatedActDense wi_0, wi_1 and wo. module: the class (built as
    module(d_model, d_ff)) or an instance. Random float64 weights are copied in (float32 modules are accepted)
    and the output compared with the formula, in eval mode. Names the usual mistakes: GELU on the wrong branch,
    the exact GELU instead of the tanh approximation, ReLU, no gate, biases."""
    ffn = module(d_model, d_ff) if isinstance(module, type) else module
    if not isinstance(ffn, torch.nn.Module):
        raise AssertionError(f"pass your module's class (built as cls(d_model, d_ff)) or an instance, got "
                             f"{type(ffn).__name__}")
    names = ("linear0", "linear1", "linear2")
    missing = [n for n in names if not isinstance(getattr(ffn, n, None), torch.nn.Linear)]
    if missing:
        raise AssertionError(f"your module has no nn.Linear {missing}: name W_0 (the GELU branch) linear0, W_1 (the "
                             f"linear branch) linear1 and W_2 (the output) linear2, like wi_0, wi_1, wo in "
                             f"Hugging Face's T5DenseGatedActDense")
    d_model, d_ff = ffn.linear0.in_features, ffn.linear0.out_features
    want = {"linear0": (d_ff, d_model), "linear1": (d_ff, d_model), "linear2": (d_model, d_ff)}
    for n in names:
        layer = getattr(ffn, n)
        if tuple(layer.weight.shape) != want[n]:
            raise AssertionError(f"{n}.weight has shape {tuple(layer.weight.shape)}, expected {want[n]}: linear0 and "
                                 f"linear1 map d_model={d_model} to d_ff={d_ff}, linear2 maps d_ff back")
        if layer.bias is not None:
            raise AssertionError(f"{n} has a bias: T5 has no biases anywhere (nn.Linear(..., bias=False))")
    g = torch.Generator().manual_seed(seed)
    W = [torch.randn(*want[n], generator=g, dtype=torch.float64) for n in names]
    dtype = ffn.linear0.weight.dtype
    with torch.no_grad():
        for n, w in zip(names, W, strict=True):
            getattr(ffn, n).weight.copy_(w.to(dtype))
    W = [getattr(ffn, n).weight.detach().double() for n in names]     # the weights as the module holds them
    x = torch.randn(2, 5, d_model, generator=g, dtype=torch.float64)
    W_0, W_1, W_2 = W
    mistakes = {
        "GELU on the wrong branch: it acts on linear0 (W_0, Hugging Face's wi_0), and linear1's output is the "
        "linear gate": lambda x: _gated_ffn(x, W_1, W_0, W_2),
        "the exact (erf) GELU: T5 v1.1 uses the tanh approximation, F.gelu(x, approximate='tanh') "
        "(Hugging Face's 'gelu_new')": lambda x: _gated_ffn(x, W_0, W_1, W_2, F.gelu),
        "GELU on the wrong branch and the exact (erf) GELU instead of the tanh approximation":
            lambda x: _gated_ffn(x, W_1, W_0, W_2, F.gelu),
        "ReLU instead of GELU: T5 v1.1's gate uses GELU (tanh approximation)":
            lambda x: _gated_ffn(x, W_0, W_1, W_2, torch.relu),
        "no gate: the GELU branch must be multiplied elementwise by linear1's output":
            lambda x: gelu_tanh(x @ W_0.T) @ W_2.T,
        "GELU applied after the product: GELU(x W_0) ⊙ x W_1, not GELU(x W_0 ⊙ x W_1)":
            lambda x: gelu_tanh((x @ W_0.T) * (x @ W_1.T)) @ W_2.T,
        "the gate is added instead of multiplied: GELU(x W_0) ⊙ x W_1 is an elementwise product":
            lambda x: (gelu_tanh(x @ W_0.T) + x @ W_1.T) @ W_2.T,
    }
    ffn.eval()
    with torch.no_grad():
        grade(lambda x: ffn(x.to(dtype)), lambda x: _gated_ffn(x, *W), {f"on x of shape {tuple(x.shape)}": (x,)},
              mistakes, name="your module", against="(GELU_tanh(x W_0) ⊙ x W_1) W_2", shape="the input's shape, ",
              case_in_mistakes=False)
    print(f"check_gated_ffn: equals (GELU_tanh(x W_0) ⊙ x W_1) W_2 (Hugging Face's T5DenseGatedActDense) "
          f"for d_model={d_model}, d_ff={d_ff}")


# --- Exercise 3: which position biases longer inputs use untrained ---------------------------------------------

def _buckets_of_length(n, bidirectional, num_buckets, max_distance):
    """The set of buckets the offsets key - query of an n-token sequence fall into: offsets -(n-1) .. n-1, or
    -(n-1) .. 0 in the decoder (its causal mask hides the keys after the query)."""
    offsets = torch.arange(-(n - 1), n if bidirectional else 1)
    return set(relative_position_bucket(offsets, bidirectional, num_buckets, max_distance).tolist())


def check_new_buckets(fn) -> None:
    """Test fn(train_length, test_length, bidirectional, num_buckets, max_distance) -> the sorted list of the
    relative-position buckets that a test_length-token sequence uses and a train_length-token one never does (their
    bias entries were never trained). A sequence of n tokens has offsets key - query from -(n-1) to n-1 (the
    decoder, causal, only -(n-1) to 0). Several sizes; names off-by-one lengths, a forgotten direction, and
    answers that list every bucket of the test sequence or new distances instead of buckets."""
    cases = [(40, 52, True, 16, 64), (29, 39, False, 16, 64), (10, 30, True, 32, 128), (16, 17, False, 32, 128),
             (9, 10, True, 32, 128), (100, 400, True, 32, 128), (5, 9, False, 8, 20)]
    for train, test, bidirectional, num_buckets, max_distance in cases:
        args = (bidirectional, num_buckets, max_distance)
        want = sorted(_buckets_of_length(test, *args) - _buckets_of_length(train, *args))
        got = fn(train, test, *args)
        try:
            got = sorted(int(b) for b in (got.tolist() if isinstance(got, torch.Tensor) else got))
        except (TypeError, ValueError):
            raise AssertionError(f"return a list of bucket numbers (ints), got {type(got).__name__}") from None
        if got == want:
            continue
        where = (f"train_length={train}, test_length={test}, bidirectional={bidirectional}, "
                 f"num_buckets={num_buckets}, max_distance={max_distance}: you return {got}, expected {want}")
        past = (False, num_buckets, max_distance)
        suspects = {
            "off by one: a sequence of n tokens has offsets up to n - 1, not n":
                sorted(_buckets_of_length(test + 1, *args) - _buckets_of_length(train + 1, *args)),
            "the keys after the query are forgotten: the encoder (bidirectional) also uses the upper half of the "
            "buckets": sorted(set(relative_position_bucket(torch.arange(-(test - 1), 1), *args).tolist())
                              - set(relative_position_bucket(torch.arange(-(train - 1), 1), *args).tolist())),
            "these are all the buckets the test sequence uses: keep only those the training length never reaches":
                sorted(_buckets_of_length(test, *args)),
            "these are the new distances (offsets), not their buckets: map them with relative_position_bucket; "
            "many distances share a bucket": sorted(range(train, test)),
        }
        if not bidirectional:
            suspects["the decoder sees only the past: offsets after the query are masked and must not count"] = \
                sorted(_buckets_of_length(test, True, num_buckets, max_distance)
                       - _buckets_of_length(train, True, num_buckets, max_distance))
        else:
            suspects["the encoder is bidirectional: use bidirectional=True buckets (half per direction)"] = \
                sorted(_buckets_of_length(test, *past) - _buckets_of_length(train, *past))
        for message, wrong in suspects.items():
            if got == wrong and wrong != want:
                raise AssertionError(f"{where}; {message}")
        raise AssertionError(where)
    print(f"check_new_buckets: correct in all {len(cases)} cases (encoder and decoder, three bucket sizes)")


# --- Exercise 4: overlapping patches ------------------------------------------------------------------------

def _overlapping_patches(images, p, s):
    """images (B, C, H, W) -> (B, N, C·p·p): every p×p window at stride s, row by row, flattened channel-first."""
    return F.unfold(images, p, stride=s).transpose(1, 2)


def check_overlapping_patches(fn, seed: int = 0) -> None:
    """Test fn(images (B, C, H, W), patch_size, stride) -> (B, N, C·p·p): the p×p windows at the given stride,
    in rows from the top left (left to right, then down), each flattened channel-first like patchify (so that
    stride = patch_size gives patchify's output). Compared with torch's F.unfold on images with 3 channels,
    square and not, float64 or float32. Names: stride equal to the patch size, patches in the wrong order,
    channels last, windows flattened column by column."""
    g = torch.Generator().manual_seed(seed)
    for shape, p, s in (((2, 3, 8, 8), 4, 2), ((1, 2, 8, 10), 4, 2), ((2, 1, 7, 7), 3, 2), ((1, 3, 6, 9), 2, 1)):
        images = torch.randn(*shape, generator=g, dtype=torch.float64)
        before = images.clone()
        B, C, H, W = shape
        rows, cols = (H - p) // s + 1, (W - p) // s + 1
        want = _overlapping_patches(images, p, s)                            # (B, rows·cols, C·p·p)
        got = fn(images, p, s)
        where = f"images {shape}, patch {p}, stride {s}"
        if not torch.equal(images, before):
            raise AssertionError(f"{where}: your function changed the images in place")
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"{where}: return a tensor (B, N, C·p·p), got {type(got).__name__}")
        if got.dim() != 3 or got.shape[0] != B or got.shape[2] != C * p * p:
            raise AssertionError(f"{where}: shape {tuple(got.shape)}, expected (B, N, C·p·p) = {tuple(want.shape)}")
        n_disjoint = (H // p) * (W // p)
        if got.shape[1] == n_disjoint and got.shape[1] != rows * cols:
            raise AssertionError(f"{where}: {n_disjoint} patches, the non-overlapping ones (stride equals patch "
                                 f"size); windows every {s} pixels give ({H} - {p}) / {s} + 1 = {rows} rows and "
                                 f"{cols} columns, {rows * cols} patches")
        if got.shape[1] != rows * cols:
            raise AssertionError(f"{where}: {got.shape[1]} patches, expected {rows} rows × {cols} columns = "
                                 f"{rows * cols} (windows start every {s} pixels while they fit)")
        if close_to(got, want):
            continue
        grid = want.reshape(B, rows, cols, C, p, p)
        suspects = {
            "channels last: flatten each patch channel-first, (C, p, p), as patchify does":
                grid.permute(0, 1, 2, 4, 5, 3).reshape(B, rows * cols, C * p * p),
            "wrong patch order: column by column; go along each row of patches first (left to right, then down)":
                grid.transpose(1, 2).reshape(B, rows * cols, C * p * p),
            "each patch is flattened column by column (transposed): flatten its pixels row by row":
                grid.transpose(-2, -1).reshape(B, rows * cols, C * p * p),
        }
        for message, wrong in suspects.items():
            if close_to(got, wrong):
                raise AssertionError(f"{where}: {message}")
        got_rows, want_rows = got.detach().double().reshape(-1, C * p * p), want.reshape(-1, C * p * p)
        if torch.cdist(got_rows, want_rows).min(1).values.max() < 1e-4:
            raise AssertionError(f"{where}: the right patches, in the wrong order: row by row from the top left "
                                 f"(left to right, then down)")
        diff = (got.double() - want).abs().max().item()
        raise AssertionError(f"{where}: your patches differ from torch's F.unfold windows by up to {diff:.2g}")
    print("check_overlapping_patches: equal to F.unfold's windows for 4 image shapes, patch sizes and strides")

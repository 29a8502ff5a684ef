"""The graders of Chapter 6's exercises (the encoder), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_encoder_layer', 'check_left_pad_positions', 'check_packing', 'check_reach', 'check_encoder_layer_module']

import functools

import torch

from ..encoder import Encoder, EncoderLayer
from ..positional import sinusoidal_encoding
from ..validation import describe
from .grading import Verdict, grade, module_answer, reader_module


def _encoder_layer_variant(layer, x, mask, norm_first, residual=(True, True), ffn=True):
    """The layer's computation with deliberate changes, used to name a reader's mistake."""
    def attention(y):
        return layer.self_attn(y, y, y, mask)[0]
    subs = [(attention, layer.self_attn_residual.norm),
            (layer.feed_forward, layer.feed_forward_residual.norm)][: 2 if ffn else 1]
    for (f, norm), res in zip(subs, residual[:len(subs)], strict=True):
        if norm_first:
            x = (x if res else 0) + f(norm(x))
        else:
            x = norm((x if res else 0) + f(x))
    return x


def _encoder_layer_mistakes(layer, norm_first, other_placement: str) -> dict:
    """The usual wrong encoder layers, computed with the book's layer: grade's {message: mutant(x, mask)}."""
    def variant(**change):
        return lambda x, mask: _encoder_layer_variant(layer, x, mask, **{"norm_first": norm_first, **change})
    return {f"your output equals {what}": mutant for what, mutant in {
        other_placement: variant(norm_first=not norm_first),
        "a layer without the residual connection around self-attention": variant(residual=(False, True)),
        "a layer without the residual connection around the feed-forward network": variant(residual=(True, False)),
        "self-attention alone: the feed-forward sub-layer is missing": variant(ffn=False),
        "a layer that ignores the padding mask (padded keys were attended to)":
            lambda x, mask: None if mask is None else layer(x, None)}.items()}


def _call_without_shortcuts(fn, layer, x, mask):
    """fn(layer, x, mask), refusing the calls the exercise forbids: layer(...),
    layer.self_attn_residual(...), layer.feed_forward_residual(...) (each would compute the answer for the reader).
    The instances' forward is replaced for
    the call only (nn.Module.__call__ looks it up on the instance first)."""
    used = []
    for name, module in (("layer", layer), ("layer.self_attn_residual", layer.self_attn_residual),
                         ("layer.feed_forward_residual", layer.feed_forward_residual)):
        def refuse(*args, _name=name, **kwargs):
            used.append(_name)
            raise RuntimeError(f"{_name}(...) is not allowed in this exercise")
        module.forward = refuse
    try:
        return fn(layer, x, mask)
    except RuntimeError:
        if not used:
            raise
    finally:
        for module in (layer, layer.self_attn_residual, layer.feed_forward_residual):
            del module.forward                                   # the class's forward again
        if used:                                                 # also when fn caught the error itself
            raise Verdict(f"you called {used[0]}(...): the exercise asks you to compute the layer from "
                                 f"layer.self_attn, layer.feed_forward and the two norms, without calling it")


def check_encoder_layer(fn, trials: int = 4) -> None:
    """Test fn(layer, x, mask) -> (B, S, d_model) against EncoderLayer.forward on random post-norm and pre-norm
    layers, with and without a padding mask (calling layer, layer.self_attn_residual or
    layer.feed_forward_residual is refused, as
    the exercise asks). Raises AssertionError naming the mistake; prints a verdict."""
    gen = torch.Generator().manual_seed(0)
    for norm_first in (False, True):
        for trial in range(trials):
            d_model, d_ff = 8 * int(torch.randint(1, 4, (1,), generator=gen)), 16
            B, S = 3, int(torch.randint(2, 8, (1,), generator=gen))
            layer = EncoderLayer(d_model, 2, d_ff, dropout=0.0, norm_first=norm_first).double().eval()
            with torch.no_grad():
                for p in layer.parameters():
                    p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            x = torch.randn(B, S, d_model, generator=gen, dtype=torch.float64)
            lengths = torch.randint(1, S + 1, (B,), generator=gen)
            mask = None if trial == 0 else (torch.arange(S) < lengths[:, None])[:, None, None, :]
            where = f"(norm_first={norm_first}, x {tuple(x.shape)}, mask {'None' if mask is None else 'padding'})"
            mistakes = _encoder_layer_mistakes(
                layer, norm_first,
                "the other norm placement (post-norm vs pre-norm): check layer.self_attn_residual.norm_first")
            with torch.no_grad():
                grade(lambda x, mask, layer=layer: _call_without_shortcuts(fn, layer, x, mask), layer, {where: (x, mask)},
                      mistakes, against="EncoderLayer.forward", shape="(B, S, d_model) = ")
    print(f"check_encoder_layer: all {2 * trials} random layers match (post-norm and pre-norm, with and "
          "without padding)")

def check_left_pad_positions(fn) -> None:
    """Test fn(tokens (B, n) ids, pad_id) -> (B, n) integer position ids that count from each sentence's first
    real token (0, 1, 2, ...), for left-padded, right-padded and unpadded rows. Padded slots may hold any
    position (their keys are masked). Raises AssertionError naming the mistake; prints a verdict."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(12):
        B, n = 4, int(torch.randint(3, 10, (1,), generator=gen))
        pad_id = int(torch.randint(0, 3, (1,), generator=gen))
        tokens = torch.randint(3, 20, (B, n), generator=gen)
        lengths = torch.randint(1, n + 1, (B,), generator=gen)
        lengths[0] = n                                                      # row 0: no padding
        real = torch.arange(n) < lengths[:, None]                           # rows 0, 2: right padding
        real[1::2] = real[1::2].flip(1)                                     # rows 1, 3: left padding
        tokens[~real] = pad_id
        start, expected = [], torch.full((B, n), -1)                        # -1: padded slots, any value
        for b, row in enumerate(real.tolist()):                             # row by row, token by token
            first = row.index(True)                                         # the sentence's first real token
            start.append(first)
            for k, is_real in enumerate(row):
                if is_real:
                    expected[b, k] = k - first
        got = fn(tokens.clone(), pad_id)
        where = f"tokens {tokens.tolist()}, pad_id={pad_id}"
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"expected a tensor of position ids, got {type(got).__name__}")
        if got.is_floating_point() or got.dtype == torch.bool:
            raise AssertionError(f"position ids must be an integer tensor (they index the table pos.pe), "
                                 f"got {got.dtype}")
        if tuple(got.shape) != (B, n):
            raise AssertionError(f"{where}: expected shape (B, n) = {(B, n)}, one position per token, "
                                 f"got {tuple(got.shape)}")
        got = got.long()
        if torch.equal(got[real], expected[real]):                         # padded slots: any value
            continue
        b = int(((got != expected) & real).any(1).float().argmax())        # the first sentence that is wrong
        first, row = start[b], got[b][real[b]].tolist()
        if torch.equal(got[real], expected[real] + 1):
            raise AssertionError(f"{where}: the real tokens of sentence {b} get positions {row}: they start at "
                                 f"1, not 0 (a running count of real tokens needs - 1)")
        if torch.equal(got[real], torch.arange(n).expand(B, n)[real]):
            raise AssertionError(f"{where}: sentence {b} starts at index {first}, but its first real token gets "
                                 f"position {int(got[b, first])}: your positions count from the start of the "
                                 f"row, padding included (torch.arange), so left padding shifts them")
        n_pad = (~real).sum(1, keepdim=True)
        if torch.equal(got[real], (torch.arange(n) - n_pad)[real]):
            raise AssertionError(f"{where}: the real tokens of sentence {b} get positions {row}: you subtract "
                                 f"the number of pads, which is right only when all padding is on the left")
        raise AssertionError(f"{where}: the real tokens of sentence {b} (first at index {first}) get positions "
                             f"{row}, expected {list(range(int(real[b].sum())))}")
    print("check_left_pad_positions: correct on 12 random batches (left, right and no padding)")


# --- exercise 1: sequence packing (segment ids -> a block-diagonal mask and per-sentence positions)
def _packed_rows(lengths_per_row, S):
    """Segment ids (B, S): 1, 2, ... for the sentences of each row in order, 0 for the padding at its end."""
    segments = torch.zeros(len(lengths_per_row), S, dtype=torch.long)
    for b, lengths in enumerate(lengths_per_row):
        start = 0
        for k, n in enumerate(lengths, start=1):
            segments[b, start:start + n] = k
            start += n
    return segments


def _sentences(segments):
    """[(row, start, length)] of every packed sentence, read token by token (the grader's own bookkeeping)."""
    found = []
    for b, row in enumerate(segments.tolist()):
        for i, s in enumerate(row):
            if s and (i == 0 or row[i - 1] != s):
                found.append([b, i, 0])
            if s:
                found[-1][2] += 1
    return [tuple(f) for f in found]


def _pair_rule(segments, rule):
    """(B, 1, S, S) bool: entry [b, 0, i, j] = rule(i, j, start of i's sentence, start of j's, real i, real j), pair
    by pair over the sentences of each row (slow and plain: the grader's reference and its named slips)."""
    B, S = segments.shape
    start = torch.full((B, S), -1)
    for b, i, n in _sentences(segments):
        start[b, i:i + n] = i
    out = torch.zeros(B, 1, S, S, dtype=torch.bool)
    for b in range(B):
        for i in range(S):
            for j in range(S):
                out[b, 0, i, j] = rule(i, j, int(start[b, i]), int(start[b, j]), bool(segments[b, i]),
                                       bool(segments[b, j]))
    return out


def _position_rule(segments, rule):
    """(B, S) positions: rule(i, start of i's sentence) for real tokens, -1 (any value) at the padding."""
    out = torch.full(segments.shape, -1)
    for b, i, n in _sentences(segments):
        for k in range(i, i + n):
            out[b, k] = rule(k, i)
    return out


def _packing_answers(packing_mask, packed_positions):
    """The reader's two functions as grade answers: their types and shapes checked (a Verdict names a wrong one),
    the rows of padded queries and the padded slots' positions (read by no one) set to any value."""
    def mask(segments):
        got = packing_mask(segments.clone())
        B, S = segments.shape
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            raise Verdict(f"packing_mask must return a bool tensor, True = may attend, got {describe(got)}")
        if got.dim() == 3 and tuple(got.shape) == (B, S, S):
            raise Verdict(f"packing_mask returns shape {tuple(got.shape)}: a mask has the rank of the attention "
                          f"scores (B, h, S, S), so give it a head axis of size 1: (B, 1, S, S) = {(B, 1, S, S)}")
        if got.dim() != 4 or got.size(0) not in (1, B) or got.size(1) != 1 or tuple(got.shape[2:]) != (S, S):
            raise Verdict(f"packing_mask returns shape {tuple(got.shape)}, expected (B, 1, S, S) = {(B, 1, S, S)}")
        return got.cpu().expand(B, 1, S, S) & (segments > 0)[:, None, :, None]     # padded queries: any value

    def positions(segments):
        got = packed_positions(segments.clone())
        if not isinstance(got, torch.Tensor) or got.is_floating_point() or got.dtype == torch.bool:
            raise Verdict(f"packed_positions must return an integer tensor of position ids (they index the table "
                          f"pe), got {describe(got)}")
        if tuple(got.shape) != tuple(segments.shape):
            raise Verdict(f"packed_positions returns shape {tuple(got.shape)}, expected (B, S) = "
                          f"{tuple(segments.shape)}, one position per token")
        return torch.where(segments > 0, got.cpu().long(), -1)
    return mask, positions


def check_packing(packing_mask, packed_positions, seed: int = 0) -> None:
    """Test packing_mask(segments) -> (B, 1, S, S) bool (True = may attend) and packed_positions(segments) -> (B, S)
    integer positions, for rows that pack several sentences: segments (B, S) holds 1, 2, ... for the sentences of
    each row and 0 for the padding at its end. Each token must attend to the tokens of its own sentence only, and
    each sentence's positions must be those it has alone; padded queries and padded slots may hold anything. Then
    a 2-layer Encoder (float64) encodes random packed rows with the reader's mask and positions, and every sentence
    must equal its encoding alone. Raises AssertionError naming the mistake; prints a verdict."""
    describe_cases = {"rows of lengths [3, 4, 2], [5, 1] and [2, 2, 2, 3], S = 9":
                      _packed_rows([[3, 4, 2], [5, 1], [2, 2, 2, 3]], 9)}
    g = torch.Generator().manual_seed(seed)
    for _ in range(3):
        S, rows = 12, []
        for _ in range(3):
            lengths, left = [], S - int(torch.randint(0, 3, (1,), generator=g))
            while left > 0:
                lengths.append(min(left, int(torch.randint(1, 6, (1,), generator=g))))
                left -= lengths[-1]
            rows.append(lengths)
        describe_cases[f"random rows of lengths {rows}, S = {S}"] = _packed_rows(rows, S)
    mask, positions = _packing_answers(packing_mask, packed_positions)
    cases = {where: (segments,) for where, segments in describe_cases.items()}

    def real_rows(m, segments):                                    # as the reader's answer is read
        return m & (segments > 0)[:, None, :, None]
    def own(i, j, si, sj, ri, rj):                                 # the same sentence, real tokens only
        return ri and rj and si == sj
    mask_slips = {
        "your mask lets a token attend to the other sentences packed into its row (a padding mask): each sentence "
        "must stay alone, as if encoded in a row of its own":
            lambda s: real_rows(_pair_rule(s, lambda i, j, si, sj, ri, rj: rj), s),
        "your mask is causal inside each sentence (key j <= query i): an encoder reads its sentence in both "
        "directions": lambda s: real_rows(_pair_rule(s, lambda i, j, si, sj, ri, rj: own(i, j, si, sj, ri, rj)
                                                     and j <= i), s),
        "your mask is inverted: True must mean 'may attend'":
            lambda s: real_rows(~_pair_rule(s, own), s),
        "your mask lets a token see the padding keys (segment id 0) as well as its own sentence":
            lambda s: real_rows(_pair_rule(s, lambda i, j, si, sj, ri, rj: ri and (not rj or si == sj)), s),
    }
    grade(mask, lambda s: real_rows(_pair_rule(s, own), s), cases, mask_slips, name="packing_mask",
          against="a block-diagonal mask, one block per sentence")
    position_slips = {
        "your positions count from the start of the row (torch.arange), so every sentence after the first starts "
        "where the previous one stopped; each sentence must start again at 0, as it does alone":
            lambda s: _position_rule(s, lambda k, start: k),
        "your positions start at 1 in each sentence, not at 0": lambda s: _position_rule(s, lambda k, start: k - start + 1),
        "all your positions are 0: each token needs its place inside its sentence (0, 1, 2, ...)":
            lambda s: _position_rule(s, lambda k, start: 0),
    }
    grade(positions, lambda s: _position_rule(s, lambda k, start: k - start), cases, position_slips,
          name="packed_positions", against="each sentence's own positions 0, 1, 2, ...")
    # Encoded: each packed sentence equals its encoding alone (what packing is for)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = Encoder(2, 16, 2, 32, dropout=0.0).double().eval()
    embed = torch.randn(30, 16, generator=g, dtype=torch.float64)            # a token embedding table
    pe = sinusoidal_encoding(64, 16).double()
    worst, count = 0.0, 0
    with torch.no_grad():
        for segments in describe_cases.values():
            tokens = torch.randint(1, 30, segments.shape, generator=g) * (segments > 0)
            where = torch.where(segments > 0, packed_positions(segments.clone()).cpu().long(), 0)
            packed = encoder(embed[tokens] + pe[where], packing_mask(segments.clone()).cpu())
            for b, i, n in _sentences(segments):
                alone = encoder(embed[tokens[b:b + 1, i:i + n]] + pe[:n])
                worst = max(worst, (packed[b, i:i + n] - alone[0]).abs().max().item())
                count += 1
    if worst > 1e-9:
        raise AssertionError(f"a packed sentence's encodings differ from its encodings alone by up to {worst:.2g}")
    print(f"check_packing: mask and positions right; all {count} packed sentences encode exactly as they do alone "
          f"(2-layer Encoder, float64)")


# --- exercise 3: how far information travels through L layers of restricted self-attention
@functools.lru_cache(maxsize=64)
def _reach_by_autograd(S: int, r: int, L: int, seed: int = 0) -> torch.Tensor:
    """(S, S) bool: [i, j] True when output i of an L-layer Encoder (float64, random weights) whose self-attention
    may only look at keys with |i - j| <= r has a nonzero derivative with respect to input j (autograd)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        encoder = Encoder(L, 8, 2, 16, dropout=0.0).double().eval()
        x = torch.randn(1, S, 8, dtype=torch.float64)
        probe = torch.randn(S, 8, dtype=torch.float64)                  # a random direction for each output
    near = torch.tensor([[abs(i - j) <= r for j in range(S)] for i in range(S)])[None, None]   # (1, 1, S, S)
    x.requires_grad_()
    rows = []
    with torch.enable_grad():
        out = encoder(x, near)[0]                                       # (S, 8)
        for i in range(S):                                              # d (out_i . probe_i) / d x_j, for every j
            grad, = torch.autograd.grad(out[i] @ probe[i], x, retain_graph=True)
            rows.append(grad[0].abs().amax(-1) > 1e-12)                 # (S,): which inputs reach output i
    return torch.stack(rows).clone()


def check_reach(fn) -> None:
    """Test fn(S, r, L) -> (S, S) bool: [i, j] True when the input at position j can change the output at
    position i of L encoder layers whose self-attention is restricted to keys j with |i - j| <= r. The reference is
    autograd on a real Encoder (a nonzero derivative). Raises AssertionError naming the mistake; prints a verdict."""
    def answer(S, r, L):
        got = fn(S, r, L)
        if not isinstance(got, torch.Tensor) or got.is_complex():
            raise Verdict(f"fn(S, r, L) must return an (S, S) tensor of True/False, got {describe(got)}")
        return got.cpu() != 0 if got.dtype != torch.bool else got.cpu()

    def distance(S):                                               # (S, S): |i - j|
        return (torch.arange(S)[:, None] - torch.arange(S)[None, :]).abs()

    def one_short(S, r, L):                                        # autograd's reach without its farthest inputs
        reached = _reach_by_autograd(S, r, L)
        return reached & (distance(S) < distance(S)[reached].max())
    mistakes = {   # the wrong reaches are computed from autograd's (other r or L), not from a formula
        "that is one layer's reach, |i - j| <= r: the next layer's attention reads outputs that have already mixed "
        "in their own neighbours": lambda S, r, L: _reach_by_autograd(S, r, 1),
        "your reach is one layer short: all L layers attend, the first one included, so count L steps of r":
            lambda S, r, L: None if L < 2 else _reach_by_autograd(S, r, L - 1),
        "your reach stops one position short: the farthest inputs your layers can carry reach output i too":
            one_short,
        "your reach is one layer too far: the embeddings and positional encodings mix no positions, only the L "
        "attentions do": lambda S, r, L: _reach_by_autograd(S, r, L + 1),
        "your reach is L(2r + 1) each way: 2r + 1 is the size of one layer's window (r keys on each side and the "
        "token itself), not how far that window reaches on one side":
            lambda S, r, L: _reach_by_autograd(S, 2 * r + 1, L),
        "your reach is 2Lr each way: that is the width of the window without the token itself, both sides "
        "together, used as the reach on one side": lambda S, r, L: _reach_by_autograd(S, 2 * r, L),
        "your reach grows like r to the power L: the layers' reaches do not multiply":
            lambda S, r, L: distance(S) <= r ** L,
        "your reach looks only backwards (j <= i): restricted self-attention in an encoder sees keys on each side":
            lambda S, r, L: _reach_by_autograd(S, r, L).tril(),
    }
    # the first case tells the usual slips apart: each gives another reach there, none the whole sentence (L r = 9;
    # the slips 3, 6, 8, 12, 18, 21 (L(2r + 1)), 27 (r^L), all < S - 1 = 39), so it decides the slip's name; the
    # others test the edges (a reach that covers the whole sentence, r = 0, one layer)
    cases = {f"S={S}, r={r}, L={L}": (S, r, L) for S, r, L in
             ((40, 3, 3), (12, 2, 2), (8, 1, 1), (10, 1, 3), (16, 2, 3), (9, 3, 4), (6, 0, 3))}
    grade(answer, lambda S, r, L: _reach_by_autograd(S, r, L), cases, mistakes, name="your reach",
          against="autograd's", shape="(S, S) = ")
    print(f"check_reach: right in all {len(cases)} cases (checked against autograd on a real Encoder)")


# --- a reader's own EncoderLayer class (for `python -m transformer_lib.check` and readers who write modules)
def check_encoder_layer_module(cls, seed: int = 0) -> None:
    """Test a reader's encoder layer class: cls(d_model, num_heads, d_ff) (dropout=0.0 and norm_first passed when
    the constructor takes them) with forward(x, mask=None) -> (B, S, d_model) (or a tuple whose first element it
    is); mask bool (B, 1, 1, S), True = may attend. The weights of the book's EncoderLayer are copied in
    (copy_weights: by name, by order, or by sub-module, so a nanoGPT-style ln_1, attn, ln_2, mlp fits) and the
    outputs compared in float64 (a float32 module is accepted), with and without padding: post-norm (the paper)
    always, pre-norm too when the constructor takes norm_first. Names the mistake: the other norm placement, a
    missing residual connection, a missing feed-forward sub-layer, the mask ignored."""
    B, S, d_model, h, d_ff = 3, 5, 16, 2, 32
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, d_model, generator=g, dtype=torch.float64)
    mask = (torch.arange(S) < torch.tensor([S, 3, 1])[:, None])[:, None, None, :]       # (B, 1, 1, S) padding
    checked = []
    forms = {"post-norm": "LayerNorm(x + f(x))", "pre-norm": "x + f(LayerNorm(x))"}
    for norm_first in (False, True):
        with torch.random.fork_rng(devices=[]):                        # leave the caller's random state alone
            torch.manual_seed(seed)
            ref = EncoderLayer(d_model, h, d_ff, dropout=0.0, norm_first=norm_first).to(torch.float64).eval()
            with torch.no_grad():
                for p in ref.parameters():
                    p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            model, took, hint = reader_module(cls, ref, d_model, h, d_ff, dropout=0.0, norm_first=norm_first)
        if norm_first and "norm_first" not in took:
            break                                                      # a post-norm class only
        placement, other = ("pre-norm", "post-norm") if norm_first else ("post-norm", "pre-norm")
        why = (f", as norm_first={norm_first} asks" if "norm_first" in took else
               " (the paper's; give the constructor a norm_first argument to have a pre-norm layer checked as one)")
        mistakes = _encoder_layer_mistakes(ref, norm_first, f"the other norm placement, {other} {forms[other]}, "
                                                            f"where {placement} {forms[placement]} is expected{why}")
        cases = {f"{placement}, no mask": (x, None), f"{placement}, padding mask": (x, mask)}
        with torch.no_grad():
            grade(module_answer(model), ref, cases, mistakes, name="your forward", against="EncoderLayer",
                  shape="(B, S, d_model) = ", hint=hint)
        checked.append(placement)
    print(f"check_encoder_layer_module: {cls.__name__} matches EncoderLayer ({' and '.join(checked)}, with and "
          "without padding)")

"""The graders of Chapter 7's exercises (the decoder and the full model), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_tgt_mask', 'check_parameter_count', 'check_future_mask', 'check_first_leak', 'check_prefix_lm_mask',
           'check_two_way_tying']

import torch

from ..attention import causal_mask, padding_mask
from ..model import Transformer, TransformerConfig
from ..validation import describe
from .grading import Verdict, call_reader, close_to, grade


def check_tgt_mask(fn, trials: int = 30) -> None:
    """Test fn(tgt (B, T) ids, pad_id) -> bool mask (B|1, 1, 1|T, T): query i may attend key j
    iff j <= i and tgt[b, j] != pad_id. Random right- and left-padded batches. Raises AssertionError."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(trials):
        B, T = int(torch.randint(1, 5, (1,), generator=gen)), int(torch.randint(2, 9, (1,), generator=gen))
        pad_id = int(torch.randint(0, 3, (1,), generator=gen))
        tgt = torch.randint(3, 20, (B, T), generator=gen)
        lengths = torch.randint(1, T + 1, (B,), generator=gen)
        real = torch.arange(T) < lengths[:, None]                           # right padding
        if trial % 2:
            real = real.flip(1)                                             # left padding
        tgt[~real] = pad_id
        expected = (padding_mask(tgt, pad_id) & causal_mask(T)).expand(B, 1, T, T)
        got = fn(tgt.clone(), pad_id)
        where = f"tgt {tuple(tgt.shape)} = {tgt.tolist()}, pad_id={pad_id}"
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"expected a tensor, got {type(got).__name__}")
        if got.dtype != torch.bool:
            raise AssertionError(f"the mask must be a bool tensor (True = may attend), got {got.dtype}")
        fits = got.dim() == 4 and all(g in (1, s) for g, s in zip(got.shape, (B, 1, T, T), strict=True))
        if not fits:
            raise AssertionError(f"{where}: a mask of shape {tuple(got.shape)} does not fit (B, 1, T, T) = "
                                 f"{(B, 1, T, T)}: masks have the rank of the attention scores (4 axes, each of "
                                 f"that size or 1); put the batch first and a head axis of size 1")
        got = got.expand(B, 1, T, T)
        if torch.equal(got, expected):
            continue
        if torch.equal(got, ~expected):
            raise AssertionError("the mask is inverted: True must mean 'may attend'")
        future = got & ~causal_mask(T)
        if future.any():
            b, _, i, j = future.nonzero()[0].tolist()
            raise AssertionError(f"{where}: in sentence {b}, query {i} may attend to the future position {j}")
        pad_leak = got & ~expected
        if pad_leak.any():
            b, _, i, j = pad_leak.nonzero()[0].tolist()
            raise AssertionError(f"{where}: in sentence {b}, query {i} may attend to key {j}, which is padding")
        b, _, i, j = (expected & ~got).nonzero()[0].tolist()
        raise AssertionError(f"{where}: in sentence {b}, query {i} cannot attend to key {j}, a real token "
                             f"at or before it")
    print(f"check_tgt_mask: correct on {trials} random batches (right and left padding)")

def _call_without_modules(fn, config, **kwargs):
    """fn(config), refusing to build any nn.Module during the call (Transformer(config), or any layer of it, would
    count the parameters for the reader): nn.Module.__init__ is replaced for the call only."""
    built, original = [], torch.nn.Module.__init__

    def refuse(self, *args, **kwargs):
        built.append(type(self).__name__)
        raise Verdict(f"you built a {type(self).__name__}")
    torch.nn.Module.__init__ = refuse
    try:
        return fn(config, **kwargs)
    except Verdict:
        if not built:
            raise
    finally:
        torch.nn.Module.__init__ = original                       # the real constructor again
        if built:                                                 # also when fn caught the refusal itself
            raise Verdict(f"your function builds a {built[0]} (an nn.Module) to count its parameters: the exercise "
                          f"asks for the count from the fields of config alone, without building the model or "
                          f"any of its layers")


def _count_slips(c):
    """The differences (reader's count - true count) that single slips cause on config c, with their names: a
    slip is named only when it explains the reader's difference on every configuration (two slips can give the
    same difference on one configuration, as -4*d_model for both 'no final norms' and 'two LayerNorms per decoder
    layer' when there are two decoder layers)."""
    d, f, Ne, Nd, Vs, Vt = (c.d_model, c.d_ff, c.num_encoder_layers, c.num_decoder_layers, c.src_vocab_size,
                            c.tgt_vocab_size)
    tie, final = c.tie_embeddings, c.final_norm
    return [
        (-(4 * d * Ne + 6 * d * Nd), "the LayerNorms inside the layers (2*d_model each, 2 per encoder layer, 3 per "
                                     "decoder layer)"),
        (-2 * d * Nd, "the decoder layer's LayerNorms: it has three (after self-attention, cross-attention and the "
                      "feed-forward network), one more than an encoder layer"),
        (-(Ne + 2 * Nd) * 4 * d - (Ne + Nd) * (f + d), "the biases of the linear layers"),
        (-Nd * (4 * d * d + 4 * d + 2 * d), "the decoder's cross-attention (4d^2 + 4d) and its LayerNorm (2d)"),
        (-Nd * (4 * d * d + 4 * d), "the decoder's cross-attention (4d^2 + 4d per decoder layer)"),
        ((Ne - Nd) * (4 * d * d + 4 * d + 2 * d), "the layer counts: num_encoder_layers and num_decoder_layers may "
                                                  "differ and seem to be swapped"),
        (-4 * d if final else 0, "the two final LayerNorms (final_norm=True: 2*d_model each, one per stack)"),
        (-2 * d if final else 0, "the final LayerNorms: final_norm=True gives one per stack, two in all"),
        (0 if final else 4 * d, "final_norm=False: there are no final LayerNorms"),
        (2 * Vs * d if tie else 0, "tie_embeddings=True: one V x d_model matrix, counted once, not three"),
        (Vs * d if tie else 0, "tie_embeddings=True: one V x d_model matrix, counted once"),
        (0 if tie else -(Vs + Vt) * d, "tie_embeddings=False: three matrices, source V_src x d_model, target "
                                       "V_tgt x d_model and output layer V_tgt x d_model"),
        (0 if tie else -Vt * d, "tie_embeddings=False: the output layer has its own V_tgt x d_model matrix"),
        (0 if tie else (Vs - Vt) * d, "the vocabularies: source uses src_vocab_size, target and output layer "
                                      "tgt_vocab_size"),
    ]


def _bias_free_slips(c):
    """The differences (reader's count - true count) that single slips cause on config c for biases=False (every
    bias removed, linear layers and LayerNorms alike), with their names."""
    d, Ne, Nd = c.d_model, c.num_encoder_layers, c.num_decoder_layers
    norms = 2 * Ne + 3 * Nd + (2 if c.final_norm else 0)          # LayerNorms in the model
    return [
        (norms * d, "the LayerNorms' biases: with biases=False a LayerNorm keeps its gain (d_model) and loses its "
                    "bias (d_model)"),
        (-norms * d, "the LayerNorms' gains: with biases=False only the biases go; each LayerNorm keeps its gain, "
                     "d_model parameters"),
        ((Ne + 2 * Nd) * 4 * d, "the attention projections' biases (4 d_model per attention: W_q, W_k, W_v, W_o)"),
        ((Ne + Nd) * (c.d_ff + d), "the feed-forward network's biases (d_ff + d_model per layer)"),
    ]


def _as_int(got):
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if not isinstance(got, int) or isinstance(got, bool):
        raise AssertionError(f"expected an int, got {type(got).__name__} {got!r}")
    return got


def _name_gap(results, slips, trials, what):
    wrong = [(c, expected, got) for c, expected, got in results if got != expected]
    if wrong:
        names = [name for k, (_, name) in enumerate(slips(results[0][0]))
                 if all(slips(c)[k][0] == got - expected for c, expected, got in results)]
        c, expected, got = wrong[0]
        raise AssertionError(f"{what}{c}: expected {expected:,}, got {got:,} (difference {got - expected:+,}; wrong "
                             f"on {len(wrong)} of {trials} configurations)" + (f"; check {names[0]}" if names else ""))


def check_parameter_count(fn, trials: int = 16) -> None:
    """Test fn(config, biases=True) -> int against the parameters of Transformer(config), on random configurations
    (tied and untied, with and without final norms, different stack depths), and fn(config, biases=False) against
    the same model with every bias removed (linear layers and LayerNorms; a variant the chapter does not count);
    building any nn.Module during the call (Transformer(config) itself, or a layer) is refused. Raises
    AssertionError naming the gap: a slip is named when it explains the difference on every configuration."""
    gen = torch.Generator().manual_seed(0)

    def rand(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))
    results, bias_free = [], []                                   # (config, expected, got) of every trial
    for trial in range(trials):
        tie = trial % 2 == 0
        V_src = rand(10, 99)
        V_tgt = V_src if tie else rand(10, 99)
        c = TransformerConfig(V_src, V_tgt, d_model=8 * rand(1, 4), num_heads=2, d_ff=rand(8, 40),
                              num_encoder_layers=rand(1, 3), num_decoder_layers=rand(1, 3),
                              tie_embeddings=tie, final_norm=trial % 4 < 2)
        with torch.device("meta"):
            named = list(Transformer(c).named_parameters())
        expected = sum(p.numel() for _, p in named)
        results.append((c, expected, _as_int(_call_without_modules(fn, c))))
        try:
            got = _call_without_modules(fn, c, biases=False)
        except TypeError as err:
            if "biases" not in str(err):
                raise
            raise AssertionError("my_parameter_count must take a second argument, biases=True: called as "
                                 "my_parameter_count(config, biases=False) it returns the count of the model with "
                                 f"every bias removed ({err})") from err
        bias_free.append((c, sum(p.numel() for n, p in named if not n.endswith(".bias")), _as_int(got)))
    _name_gap(results, _count_slips, trials, "")
    _name_gap(bias_free, _bias_free_slips, trials, "biases=False, ")
    print(f"check_parameter_count: exact on {trials} random configurations, with and without biases")


def check_future_mask(fn) -> None:
    """Test fn(T) -> bool mask (1, 1, T, T) or (T, T), True = may attend, for a decoder's self-attention: query
    i may attend to key j exactly when j <= i. Names an off-by-one diagonal (a position that sees the next
    token, or cannot see itself) and an inverted mask. Raises AssertionError; prints a verdict."""
    for T in (6, 8, 1, 2, 3, 4, 5, 7):
        got = fn(T)
        if not isinstance(got, torch.Tensor):
            raise AssertionError(f"fn({T}) must return a tensor, got {type(got).__name__}")
        if got.dtype != torch.bool:
            raise AssertionError(f"fn({T}) returns {got.dtype}: the mask must be bool, True = may attend")
        if got.dim() not in (2, 4) or tuple(got.shape[-2:]) != (T, T) or any(s != 1 for s in got.shape[:-2]):
            raise AssertionError(f"fn({T}) has shape {tuple(got.shape)}: expected (1, 1, T, T) = (1, 1, {T}, {T})")
        got, want = got.reshape(T, T), causal_mask(T)                      # (T, T)
        if torch.equal(got, want):
            continue
        if T > 1 and torch.equal(got, ~want):
            raise AssertionError(f"T={T}: your mask is inverted, True must mean 'may attend' (nn.Transformer's "
                                 f"masks use True = forbidden)")
        if T > 1 and torch.equal(got, want.T):
            raise AssertionError(f"T={T}: your mask is transposed: it lets every position see itself and its "
                                 f"future, never its past. Rows are queries i, columns keys j: keep j <= i, the "
                                 f"lower triangle (tril), not the upper one (triu)")
        leak = got & ~want                                                  # keys after their query
        if leak.any():
            ii, jj = leak.nonzero().T                                       # report the farthest leak
            k = int((jj - ii).argmax())
            i, j = int(ii[k]), int(jj[k])
            ahead = "the next token" if j == i + 1 else f"the token {j - i} positions ahead"
            raise AssertionError(f"T={T}: position {i} sees position {j}: your mask leaks {ahead} (changing "
                                 f"token {j} would change the output at position {i}); check the diagonal")
        blind = want & ~got
        i, j = blind.nonzero()[0].tolist()
        if i == j:
            nothing = "; position 0 then attends to nothing" if not got[0].any() else ""
            raise AssertionError(f"T={T}: position {i} cannot see itself: the diagonal (j = i) must be True "
                                 f"(off by one: check the diagonal){nothing}")
        raise AssertionError(f"T={T}: position {i} cannot see the earlier position {j}: every key j <= i must "
                             f"be True")
    print("check_future_mask: correct for T = 1 to 8: each position sees itself and its past, never its future")


def _leaky_layers(T: int = 7, d_model: int = 16):
    """(name, layer, leaks) cases for check_first_leak: layer maps y (B, T, d_model) to (B, T, d_model) through one
    float64 MultiHeadAttention; leaks is the set of (t, i), i < t, whose input t reaches output i."""
    from ..multi_head import MultiHeadAttention
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        attn = MultiHeadAttention(d_model, 4, dropout=0.0).double().eval()

    def through(mask, tiny=None):
        def layer(y):
            y = y.to(torch.float64)
            out = attn(y, y, y, mask[None, None])[0]
            if tiny is not None:                                # a leak outside the attention weights, 1e-9 small
                t, i = tiny
                out = out.clone()
                out[:, i] = out[:, i] + 1e-9 * y[:, t]
            return out
        return layer

    causal = causal_mask(T)

    def plus(*pairs):
        mask = causal.clone()
        for t, i in pairs:
            mask[i, t] = True                                   # query i may attend to the later key t
        return mask
    ahead = ~torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=2)
    return [("a causal layer", through(causal), set()),
            ("a mask built with diagonal=2", through(ahead), {(i + 1, i) for i in range(T - 1)}),
            ("a layer in which position 3 sees position 5", through(plus((5, 3))), {(5, 3)}),
            ("a layer in which positions 1 and 4 see position 5, and 2 sees 6", through(plus((5, 4), (5, 1), (6, 2))),
             {(5, 4), (5, 1), (6, 2)}),
            ("a causal attention plus a 1e-9 leak from input 4 to output 2", through(causal, tiny=(4, 2)), {(4, 2)})]


def check_first_leak(fn) -> None:
    """Test the reader's causality probe fn(layer, T, d_model) -> None or (t, i): run layer (a callable from
    (B, T, d_model) to (B, T, d_model)), change one input position t at a time, and report the first leak, the
    smallest t whose change moves an output at an earlier position i < t (and for that t the smallest such i), or
    None for a causal layer. The grader hands layers the reader has not seen (masks with leaks, and a leak of
    1e-9 outside the attention). Raises AssertionError naming the probe's mistake; prints a verdict."""
    T, d_model = 7, 16
    for name, layer, leaks in _leaky_layers(T, d_model):
        want = min(leaks) if leaks else None
        got = call_reader(fn, "first_leak(layer, T, d_model)", layer, T, d_model)
        if got is not None:
            try:
                t, i = (int(v) for v in got)
            except (TypeError, ValueError) as err:
                raise AssertionError(f"on {name}: first_leak must return None or a pair (t, i) of ints, got "
                                     f"{describe(got)}") from err
            got = (t, i)
        if got == want:
            continue
        if got is None:
            if name.endswith("1e-9 leak from input 4 to output 2"):
                raise AssertionError(f"on {name}: your probe found no leak, but output 2 moves by about 1e-9 when "
                                     "input 4 changes: run the layer on float64 inputs and compare with a tolerance near "
                                     "float64's round-off (1e-12); a tolerance above 1e-9 (torch.allclose's "
                                     "defaults, or float32's round-off) calls this leak equal")
            raise AssertionError(f"on {name}: your probe found no leak, but there is one ({want}); change each "
                                 "input position t in turn and compare every output at a position i < t")
        t, i = got
        if t == i:
            raise AssertionError(f"on {name}: you report ({t}, {i}): changing input {t} may move output {t} itself, "
                                 "that is allowed; a leak is an output at an EARLIER position i < t")
        if t < i:
            if want is not None and (i, t) == want:
                raise AssertionError(f"on {name}: you return ({t}, {i}); the pair is (t, i), the changed input first "
                                     "and the earlier output that moved second: swapped")
            raise AssertionError(f"on {name}: you report ({t}, {i}): an output at a later position moving when an "
                                 "earlier input changes is what attention should do; a leak is i < t")
        if want is None:
            raise AssertionError(f"on {name}: you report a leak ({t}, {i}) in a causal layer: input {t} does not "
                                 f"reach output {i}; compare the outputs before and after the change at positions "
                                 "i < t only")
        if (t, i) in leaks:
            raise AssertionError(f"on {name}: ({t}, {i}) is a leak, but not the first: return the smallest t, and "
                                 "for that t the smallest i")
        raise AssertionError(f"on {name}: you report ({t}, {i}), but input {t} does not reach output {i}; change one "
                             "input position at a time (changing every position after t together, as the chapter's "
                             "check does, tells that something leaks, not from where)")
    print(f"check_first_leak: your probe finds the first leak in each of {len(_leaky_layers(T, d_model))} layers it "
          "had not seen (a causal one among them), including a leak of 1e-9")


# --- exercise 1: a prefix LM's mask; exercise 3: two-way tying
def _prefix_rule(tokens, prefix_len, pad_id, rule):
    """(B, 1, T, T) bool, pair by pair: rule(i, j, P, real key j) for row b's prefix length P (slow and plain: the
    grader's reference and its named slips); the rows of padded queries are False (read by no one)."""
    B, T = tokens.shape
    out = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        P = int(prefix_len[b])
        for i in range(T):
            if tokens[b, i] == pad_id:
                continue
            for j in range(T):
                out[b, 0, i, j] = rule(i, j, P, bool(tokens[b, j] != pad_id))
    return out


def check_prefix_lm_mask(fn, seed: int = 0) -> None:
    """Test fn(tokens (B, T) ids, prefix_len (B,) ints, pad_id) -> bool mask (B, 1, T, T), True = may attend: query
    i may attend key j when key j is not padding and either j < prefix_len[b] (the prefix, read in both directions)
    or j <= i (causal after it). Rows right-padded, prefixes from 0 to the whole row (its padding included); the rows of padded queries may
    hold anything. Raises AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(seed)
    cases = {}
    for trial in range(6):
        B, T = 3, int(torch.randint(4, 9, (1,), generator=g))
        pad_id = int(torch.randint(0, 3, (1,), generator=g))
        tokens = torch.randint(3, 20, (B, T), generator=g)
        lengths = torch.randint(2, T + 1, (B,), generator=g)
        lengths[0], lengths[1] = T, T - 2                                  # row 1: two pads at its end
        tokens[torch.arange(T) >= lengths[:, None]] = pad_id
        prefix_len = (torch.rand(B, generator=g) * (lengths + 1)).long()   # 0 .. length
        prefix_len[0] = (0, T)[trial % 2] if trial < 2 else prefix_len[0]
        prefix_len[1] = T if trial % 2 else prefix_len[1]                  # a prefix over the padding too
        cases[f"tokens {tokens.tolist()}, prefix_len {prefix_len.tolist()}, pad_id={pad_id}"] = (tokens, prefix_len,
                                                                                               pad_id)

    def answer(tokens, prefix_len, pad_id):
        got = fn(tokens.clone(), prefix_len.clone(), pad_id)
        B, T = tokens.shape
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
            raise Verdict(f"your mask must be a bool tensor, True = may attend, got {describe(got)}")
        if got.dim() == 3 and tuple(got.shape) == (B, T, T):
            raise Verdict(f"your mask has shape {tuple(got.shape)}: a mask has the rank of the attention scores "
                          f"(B, h, T, T), so give it a head axis of size 1: (B, 1, T, T) = {(B, 1, T, T)}")
        if got.dim() != 4 or got.size(0) not in (1, B) or got.size(1) != 1 or tuple(got.shape[2:]) != (T, T):
            raise Verdict(f"your mask has shape {tuple(got.shape)}, expected (B, 1, T, T) = {(B, 1, T, T)}")
        return got.cpu().expand(B, 1, T, T) & (tokens != pad_id)[:, None, :, None]   # padded queries: any value

    def rule(r):
        return lambda tokens, prefix_len, pad_id: _prefix_rule(tokens, prefix_len, pad_id, r)
    mistakes = {
        "your mask is causal in the prefix too: the prefix's tokens must see each other in both directions (every "
        "query may see every key j < prefix_len[b])": rule(lambda i, j, P, real: real and j <= i),
        "your mask lets the positions after the prefix see their future: after the prefix it must be causal":
            rule(lambda i, j, P, real: real),
        "your prefix is one token too long: key prefix_len[b] is the first token after the prefix, hidden from the "
        "queries before it": rule(lambda i, j, P, real: real and (j <= P or j <= i)),
        "your prefix is one token too short: key prefix_len[b] - 1 is the prefix's last token, visible to every query":
            rule(lambda i, j, P, real: real and (j < P - 1 or j <= i)),
        "your mask lets the prefix's queries see every key, the future included: it is the prefix's keys that every "
        "query may see, while a query inside the prefix sees only the prefix":
            rule(lambda i, j, P, real: real and (i < P or j <= i)),
        "your mask lets queries attend to padding keys": rule(lambda i, j, P, real: j < P or j <= i),
        "your mask is inverted: True must mean 'may attend'":
            lambda tokens, prefix_len, pad_id: ~_prefix_rule(tokens, prefix_len, pad_id,
                                                             lambda i, j, P, real: real and (j < P or j <= i))
            & (tokens != pad_id)[:, None, :, None],
    }
    grade(answer, rule(lambda i, j, P, real: real and (j < P or j <= i)), cases, mistakes, name="your mask",
          against="the prefix-LM rule, pair by pair")
    print(f"check_prefix_lm_mask: correct on {len(cases)} batches (prefixes from none to the whole row, padding)")


def _parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())         # a shared Parameter is listed once


def check_two_way_tying(fn) -> None:
    """Test fn(state_dict, config) -> a Transformer(config) (config.tie_embeddings=False) loaded from state_dict, an
    untied model's checkpoint, whose output layer shares the target embedding's matrix (one nn.Parameter) while the
    source embedding keeps its own: two-way tying. The shared matrix must hold the checkpoint's target embedding
    (its output layer matrix is dropped), every other weight the checkpoint's. Counts the parameters against the
    untied model's minus one (V_tgt, d_model) matrix, checks what is shared and what was loaded, and that the
    logits are the decoder's output times the target embedding matrix. Names the mistake (a copy instead of a
    shared matrix, three-way tying, the source embedding tied instead, the output layer's values in the shared
    matrix: tied before loading, or tied the other way); prints a verdict."""
    small = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=2, dropout=0.0,
                 tie_embeddings=False)
    configs = {"separate vocabularies (50 source, 70 target tokens)": TransformerConfig(50, 70, **small),
               "vocabularies of one size (60 tokens each)": TransformerConfig(60, 60, **small),
               "60 and 40 tokens, no final norms": TransformerConfig(60, 40, final_norm=False, **small)}

    def untied(config, *_):
        with torch.device("meta"):                                 # shapes only
            return _parameter_count(Transformer(config))
    for n, (where, config) in enumerate(configs.items()):
        with torch.random.fork_rng(devices=[]):                    # a "trained" untied checkpoint
            torch.manual_seed(100 + n)
            checkpoint = {k: v.clone() for k, v in Transformer(config).state_dict().items()}
            model = call_reader(fn, f"{where}: fn(state_dict, config)",
                                {k: v.clone() for k, v in checkpoint.items()}, config)
        if not isinstance(model, Transformer):
            raise AssertionError(f"{where}: fn(state_dict, config) must return this book's Transformer, got "
                                 f"{describe(model)}")
        V_src, V_tgt, d = config.src_vocab_size, config.tgt_vocab_size, config.d_model
        mistakes = {
            "nothing is shared: your output layer has a matrix of its own. Equal values copied in (or a second "
            "Parameter over the same storage) are two matrices to the optimizer; the output layer's weight must be the "
            "target embedding's nn.Parameter itself": untied,
            "all three matrices are one: with tying of the source embedding as well, this is the paper's three-way "
            "tying; the source embedding must keep its own matrix":
                lambda c, *_, V_src=V_src, V_tgt=V_tgt, d=d: None if V_src != V_tgt else untied(c) - 2 * V_tgt * d,
        }
        grade(lambda c, model=model: _parameter_count(model), lambda c, n=V_tgt * d: untied(c) - n, {where: (config,)},
              mistakes,
              name="your model's parameter count", says="your model has {got:,.0f} parameters, expected {want:,.0f}")
        head, src, tgt = model.lm_head.weight, model.src_embed.weight, model.tgt_embed.weight
        if head is src and src is not tgt:
            raise AssertionError(f"{where}: your output layer shares the SOURCE embedding's matrix; it scores target "
                                 f"tokens, so it must share the target embedding's")
        if src is tgt:
            raise AssertionError(f"{where}: your source and target embeddings are one matrix; two-way tying shares "
                                 f"the target embedding with the output layer and leaves the source embedding alone")
        if head is not tgt:
            raise AssertionError(f"{where}: your output layer's weight is not the target embedding's nn.Parameter")
        shared = tgt.detach().cpu().double()
        if torch.equal(shared, checkpoint["lm_head.weight"].double()):
            raise AssertionError(
                f"{where}: your shared matrix holds the checkpoint's lm_head.weight, not its "
                f"tgt_embed.embedding.weight. Either the model was tied before load_state_dict, which then wrote "
                f"both keys into the one matrix, the output layer's last (silently, without an error), or the "
                f"embedding was tied to the output layer's Parameter instead of the other way round")
        if not torch.equal(shared, checkpoint["tgt_embed.embedding.weight"].double()):
            raise AssertionError(f"{where}: your shared matrix is not the checkpoint's tgt_embed.embedding.weight "
                                 f"(was the checkpoint loaded?)")
        for key, value in model.state_dict().items():
            if key != "lm_head.weight" and not torch.equal(value.detach().cpu().double(), checkpoint[key].double()):
                raise AssertionError(f"{where}: your model's {key} is not the checkpoint's: load every weight of "
                                     f"the state_dict")
        g = torch.Generator().manual_seed(1)
        source, target = torch.randint(1, V_src, (2, 5), generator=g), torch.randint(1, V_tgt, (2, 4), generator=g)
        model = model.eval()
        with torch.no_grad():
            logits = model(source, target)
            hidden = model.decode(target, model.encode(source), model.make_src_mask(source))
        if not close_to(logits, hidden @ tgt.T):
            raise AssertionError(f"{where}: your logits are not the decoder's output times the target embedding "
                                 f"matrix (transposed)")
    print(f"check_two_way_tying: the output layer shares the target embedding's matrix, loaded from the checkpoint's "
          f"target embedding, and the source keeps its own ({len(configs)} configurations, counted, loaded and run)")

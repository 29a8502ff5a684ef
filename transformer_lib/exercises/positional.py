"""The graders of Chapter 3's exercises (positional encoding), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_sinusoidal_encoding', 'check_learned_positions', 'check_rotary', 'check_pe_recurrence', 'check_smallest_base']

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..positional import sinusoidal_encoding
from .grading import call_reader, close_to, first_difference, grade, number


def _first_mismatch(got, want, tol):
    p, j = (int(i) for i in ((got - want).abs() > tol).nonzero()[0])
    return p, j, got[p, j].item(), want[p, j].item()


def _sinusoid(max_len, d_model, base=10000.0, first_position=0):
    p = torch.arange(first_position, first_position + max_len, dtype=torch.float64)[:, None]
    angles = p * base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)     # sin, cos, sin, cos, ...


def _known_mistakes(max_len, d_model):
    """(table, explanation) for the usual ways to get the sinusoidal table wrong."""
    p = torch.arange(max_len, dtype=torch.float64)[:, None]
    angles = p * 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    j = torch.arange(d_model, dtype=torch.float64)
    per_column = p * 10000.0 ** (-j / d_model)
    i = torch.arange(d_model // 2, dtype=torch.float64)
    return [
        (torch.stack([angles.cos(), angles.sin()], -1).flatten(1),
         "sin and cos are swapped: column 2i must hold sin(p w_i) and column 2i+1 cos(p w_i)"),
        (torch.cat([angles.sin(), angles.cos()], dim=1),
         "you put all the sines in the first half and all the cosines in the second half; the paper "
         "interleaves them: column 2i is sin(p w_i), column 2i+1 is cos(p w_i)"),
        (torch.stack([(p * 10000.0 ** (-i / d_model)).sin(), (p * 10000.0 ** (-i / d_model)).cos()], -1).flatten(1),
         "the exponent must be 2i/d_model for the column pair (2i, 2i+1); you used i/d_model (the pair "
         "index without the factor 2), so your frequencies fall too slowly"),
        (torch.where(j % 2 == 0, per_column.sin(), per_column.cos()),
         "the cosine in column 2i+1 must use the same frequency as the sine in column 2i, "
         "w_i = 1/10000^(2i/d_model); yours uses 1/10000^((2i+1)/d_model)"),
        (_sinusoid(max_len, d_model, base=1 / 10000.0),
         "you multiplied the position by 10000^(2i/d_model); divide by it: sin(p / 10000^(2i/d_model))"),
        (_sinusoid(max_len, d_model, first_position=1),
         "positions start at 0: row 0 must be (sin 0, cos 0, ...) = (0, 1, 0, 1, ...); your table is "
         "shifted by one position"),
    ]


# --- section 3.2's table, written as a function of your own: graded by the check command
# (python -m transformer_lib.check finds a function named sinusoidal_encoding); not an exercise of this page

def check_sinusoidal_encoding(fn, tol: float = 1e-5):
    """Test a reader's fn(max_len, d_model) -> (max_len, d_model) table against sinusoidal_encoding on several
    sizes. Raises an AssertionError that names the mistake; prints a one-line report when it is right."""
    sizes = ((50, 16), (7, 6), (200, 64))
    for max_len, d_model in sizes:
        call = f"fn(max_len={max_len}, d_model={d_model})"
        try:
            got = fn(max_len, d_model)
        except Exception as error:
            raise AssertionError(f"{call} raised {type(error).__name__}: {error}") from error
        if not isinstance(got, torch.Tensor) or not got.is_floating_point():
            kind = got.dtype if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(f"{call} must return a floating-point tensor, got {kind}")
        if got.shape != (max_len, d_model):
            hint = ": that is (d_model, max_len), transpose it" if got.shape == (d_model, max_len) else ""
            raise AssertionError(f"{call} must have shape (max_len, d_model) = {(max_len, d_model)}, "
                                 f"got {tuple(got.shape)}{hint}")
        got = got.detach().to("cpu", torch.float64)
        want = sinusoidal_encoding(max_len, d_model, dtype=torch.float64)
        if torch.allclose(got, want, rtol=0, atol=tol):
            continue
        for table, explanation in _known_mistakes(max_len, d_model):
            if torch.allclose(got, table, rtol=0, atol=tol):
                raise AssertionError(f"{call}: {explanation}")
        w_1 = math.atan2(got[1, 2].item(), got[1, 3].item())                  # pair 1's frequency
        if 0 < w_1 < 1:
            base = w_1 ** (-d_model / 2)                                        # w_1 = base^(-2/d_model)
            if torch.allclose(got, _sinusoid(max_len, d_model, base=base), rtol=0, atol=tol):
                raise AssertionError(f"{call}: the base must be 10000; your frequencies are those of base "
                                     f"{base:.6g}")
        p, j, g, w = _first_mismatch(got, want, tol)
        kind = "sin" if j % 2 == 0 else "cos"
        raise AssertionError(f"{call}: PE[{p}, {j}] should be {kind}({p} / 10000^({j - j % 2}/{d_model})) = "
                             f"{w:.6f}, got {g:.6f}")
    print(f"check_sinusoidal_encoding: your table matches for all {len(sizes)} sizes")


# --- exercise 3: learned positions

def check_learned_positions(cls) -> None:
    """Test a reader's cls(d_model, max_len): x (B, n, d_model) -> x + P[:n], where P is a learned
    (max_len, d_model) table, one trainable row per position and nothing else. Checks the parameter count, the
    output shape, that row p is added to position p of every sequence, that the rows are trained (gradients
    reach them), and that n = max_len works while n = max_len + 1 raises an error."""
    d_model, max_len, B = 8, 12, 3
    with torch.random.fork_rng(devices=[]):                              # leave the caller's random state alone
        torch.manual_seed(0)                                             # the module's initial table
        try:
            module = cls(d_model, max_len)
        except Exception as error:
            raise AssertionError(f"{cls.__name__}(d_model, max_len) raised {type(error).__name__}: {error}") from error
    params = [p for p in module.parameters() if p.requires_grad]
    count = sum(p.numel() for p in params)
    if count == 0:
        raise AssertionError(f"{cls.__name__}({d_model}, {max_len}) has no trainable parameters: the table must "
                             "be learned (nn.Embedding(max_len, d_model) or an nn.Parameter), not a buffer")
    if count != max_len * d_model:
        hint = ""
        if count == (max_len + 1) * d_model:
            hint = ": one row too many (max_len + 1 rows?)"
        elif count > max_len * d_model:
            hint = ": only the table is learned, no extra layer or bias"
        raise AssertionError(f"{cls.__name__}({d_model}, {max_len}) has {count} trainable parameters, expected "
                             f"max_len * d_model = {max_len * d_model} (one row of d_model per position){hint}")
    table = params[0]
    g = torch.Generator().manual_seed(0)
    for n in (5, max_len):
        x = torch.randn(B, n, d_model, generator=g).to(table.dtype)
        try:
            out = module(x)
        except Exception as error:
            hint = (f"n = max_len = {max_len} positions fit the table (rows 0 ... {max_len - 1})" if n == max_len else
                    "the positions run along axis 1 of x (B, n, d_model), n = x.size(1), the batch along axis 0")
            raise AssertionError(f"input of n = {n} positions (max_len = {max_len}) raised "
                                 f"{type(error).__name__}: {error}; {hint}") from error
        if isinstance(out, tuple):
            out = out[0]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B, n, d_model):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise AssertionError(f"input (B, n, d_model) = {(B, n, d_model)} must give the same shape, got {shape} "
                                 "(concatenated instead of added?)")
        added = (out - x).detach()                                        # (B, n, d_model) what was added
        rows = table.detach().reshape(max_len, d_model)
        moved = module(2 * x + 1)
        moved = (moved[0] if isinstance(moved, tuple) else moved).detach() - (2 * x + 1)
        if close_to(added, rows[:n].expand(B, n, d_model)):
            pass
        elif close_to(out.detach(), rows[:n].expand(B, n, d_model)):
            raise AssertionError("your output is the position vectors alone: add them to the input, x + P[:n]")
        elif not close_to(moved, added):
            raise AssertionError("out - x depends on x: add the position's vector to x (not multiply, not replace)")
        elif n < max_len and close_to(added, rows[-n:].expand(B, n, d_model)):
            raise AssertionError(f"position 0 of a sequence of n = {n} gets row {max_len - n} of the table: take rows "
                                 "0 ... n-1 (table[:n]), not the last n rows (table[-n:])")
        elif close_to(added, rows[:B, None].expand(B, n, d_model)):
            raise AssertionError("row b of the table is added to every position of sequence b: the positions run "
                                 "along axis 1 (torch.arange(x.size(1))), not along the batch axis")
        elif close_to(added, rows[:1].expand(B, n, d_model)):
            raise AssertionError("every position gets row 0 of the table: position p must get row p")
        elif not close_to(added, added[:1].expand(B, n, d_model)):
            raise AssertionError("different sequences of the batch get different vectors at the same position: "
                                 "the vector added at position p must depend on p only")
        else:
            raise AssertionError("the vector added at position p is not row p of your learned table (max diff "
                                 f"{(added[0] - rows[:n]).abs().max().item():.2g})")
    module.zero_grad()
    out = module(torch.zeros(B, 5, d_model, dtype=table.dtype))
    out = out[0] if isinstance(out, tuple) else out
    if not out.requires_grad:
        raise AssertionError("no gradient reaches the table: compute the output from the parameter itself, not from "
                             "a detached copy (or under torch.no_grad())")
    out.sum().backward()
    grad = table.grad.reshape(max_len, d_model) if table.grad is not None else None
    if grad is None or not (grad[:5] != 0).all():
        raise AssertionError("no gradient reaches rows 0..n-1 of the table: the rows must be learned")
    if (grad[5:] != 0).any():
        raise AssertionError("rows beyond the input's length get gradients: use rows 0 ... n-1 only")
    try:
        module(torch.zeros(1, max_len + 1, d_model, dtype=table.dtype))
    except Exception:
        pass
    else:
        raise AssertionError(f"an input of max_len + 1 = {max_len + 1} positions returned an output, but position "
                             f"{max_len} has no learned row: raise an error (nn.Embedding raises IndexError) "
                             "instead of clamping or wrapping positions")
    print(f"check_learned_positions: {max_len} x {d_model} learned rows, added per position; "
          f"position max_len = {max_len} raises, as it should")


def _stretched(table, new_len, scale=None, how="linear"):
    """The reference (how="linear"): row q of the result is table read at the real position
    q (max_len - 1) / (new_len - 1), linearly interpolated between its two neighbouring rows; with a reader's
    slip: scale max_len / new_len, how="nearest" or "floor" (no interpolation), how="swapped" (the two weights of
    the interpolation exchanged)."""
    table = table.detach().to("cpu", torch.float64)
    max_len = table.size(0)
    scale = (max_len - 1) / (new_len - 1) if scale is None else scale
    t = torch.arange(new_len, dtype=torch.float64) * scale
    if how == "nearest":
        return table[t.round().long().clamp(max=max_len - 1)]
    low = t.floor().long().clamp(max=max_len - 1)
    if how == "floor":
        return table[low]
    high = (low + 1).clamp(max=max_len - 1)
    frac = (t - low)[:, None]
    if how == "swapped":
        frac = 1 - frac
    return (1 - frac) * table[low] + frac * table[high]


def check_stretch_table(fn) -> None:
    """Test a reader's fn(table, new_len) -> (new_len, d_model): a learned (max_len, d_model) table of positions
    stretched to new_len rows by linear interpolation, row q being the table at the real position
    q (max_len - 1) / (new_len - 1) (the first and last rows kept), on tables in float64 and float32 and for
    longer and shorter new lengths. Names the usual slips: the scale max_len / new_len, the nearest or the lower
    row instead of interpolating, the two weights exchanged, the old rows kept with new rows appended, the table
    changed in place."""
    g = torch.Generator().manual_seed(0)
    cases = {}
    for max_len, d_model, new_len, dtype in ((12, 8, 30, torch.float64), (100, 16, 257, torch.float32),
                                             (7, 4, 13, torch.float64), (20, 6, 9, torch.float64)):
        cases[f"table ({max_len}, {d_model}) {str(dtype)[6:]} stretched to new_len = {new_len}"] = (
            torch.randn(max_len, d_model, generator=g, dtype=dtype), new_len)

    def appended(table, new_len):
        if new_len <= len(table):
            return None
        return torch.cat([table.double(), table[-1:].double().expand(new_len - len(table), -1)])

    mistakes = {
        "the last new row must read the last old row: position q maps to q (max_len - 1) / (new_len - 1); you "
        "scaled by max_len / new_len, which leaves the last rows short of the table's end":
            lambda table, new_len: _stretched(table, new_len, scale=len(table) / new_len),
        "you take the nearest old row: interpolate linearly between the two rows around the real position":
            lambda table, new_len: _stretched(table, new_len, how="nearest"),
        "you take the row below the real position (floor): interpolate linearly between the two rows around it":
            lambda table, new_len: _stretched(table, new_len, how="floor"),
        "the two interpolation weights are exchanged: at real position t between rows i and i + 1, row i gets "
        "weight (i + 1) - t and row i + 1 gets t - i":
            lambda table, new_len: _stretched(table, new_len, how="swapped"),
        "you kept the old rows and appended copies of the last one: stretching spreads the old rows over the new "
        "length, every new row an interpolation":
            appended,
        "you map cell centres (F.interpolate with align_corners=False): the first and last new rows must equal the "
        "first and last old rows, so use align_corners=True, or read row q at q (max_len - 1) / (new_len - 1)":
            lambda table, new_len: torch.nn.functional.interpolate(
                table.detach().double().T[None], size=new_len, mode="linear", align_corners=False)[0].T}

    def answer(table, new_len):                # float32 interpolation weights on a float64 table: float32-accurate
        got = torch.as_tensor(fn(table, new_len))
        want = _stretched(table, new_len)
        if (got.dtype == torch.float64 and tuple(got.shape) == tuple(want.shape) and not close_to(got, want)
                and close_to(got.float(), want)):
            return got.float()
        return got
    grade(answer, _stretched, cases, mistakes,
          name="fn(table, new_len)", against="the interpolated table", shape="(new_len, d_model) = ",
          pure="the table")
    print(f"check_stretch_table: right for {len(cases)} tables (float64 and float32, longer and shorter), "
          "first and last rows kept")


# --- exercise 4: rotary positions

def _rotation(p, d_model):
    """M_p (d_model, d_model), block i = [[cos p w_i, sin p w_i], [-sin p w_i, cos p w_i]] (section 3.4's M_k)."""
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    c, s = torch.cos(p * omega), torch.sin(p * omega)
    return torch.block_diag(*torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2))


class _WidestTensors(TorchDispatchMode):
    """Watches every torch operation run inside it and keeps the shape of the first tensor (argument or result)
    with two axes of at least `width`: a d_model x d_model matrix, or a stack of them."""

    def __init__(self, width):
        super().__init__()
        self.width, self.found = width, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.found is None:
            for t in tree_leaves((args, kwargs, out)):
                if isinstance(t, torch.Tensor) and sum(size >= self.width for size in t.shape) >= 2:
                    self.found = (tuple(t.shape), func.__name__.split(".")[0])
                    break
        return out


def check_rotary(fn) -> None:
    """Test a reader's fn(x, positions) -> x's shape: row t of x (..., n, d_model) rotated by M_{positions[t]}
    (section 3.4's offset_matrix), against the reference, on (n, d_model) and on (B, h, n, d_model); then checks,
    with the reader's own function, that the scores fn(q, p) . fn(k, p') do not change when p and p' shift
    together; then watches the torch operations of one call at d_model = 768 and fails an answer that builds a
    d_model x d_model matrix (a tensor with two axes of 768 or more), the exercise's one constraint. Names the
    usual slips: rotating by -p, pairing features i and i + d/2 (the rotate-half layout),
    exponent i/d_model, adding PE instead of rotating, ignoring the positions, rotating along the wrong axis."""
    g = torch.Generator().manual_seed(0)
    n, d_model = 6, 16
    x = torch.randn(n, d_model, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 3, 7, 1, 50, 1000])

    def call(inputs, pos):
        try:
            return torch.as_tensor(fn(inputs.clone(), pos.clone()))
        except Exception as error:
            axes = ("" if inputs.dim() <= 2 else ": x may have a batch and heads in front, (B, h, n, d_model); the "
                    "positions run along axis -2 and the features along the last axis (x[..., 0::2], not x[:, 0::2]), "
                    "whatever axes come before them")
            raise AssertionError(f"fn(x {tuple(inputs.shape)}, positions {pos.tolist()}) raised "
                                 f"{type(error).__name__}: {error}{axes}") from error

    half = d_model // 2
    paired = torch.stack([torch.arange(half), torch.arange(half) + half], -1).flatten()   # i and i + d/2 side by side

    def rotated(x, positions, by=lambda p: _rotation(int(p), d_model)):
        return torch.stack([by(p) @ row for p, row in zip(positions, x, strict=True)])

    def halves(x, positions, sign):                     # the rotate-half layout: M_p on the pairs (i, i + d/2)
        out = torch.empty_like(x)
        out[:, paired] = rotated(x[:, paired], sign * positions, lambda p: _rotation(int(p), d_model))
        return out
    mistakes = {
        "you rotate by -p (M_p transposed). The scores still depend only on p' - p, but the book's M_p turns each "
        "pair the other way: its block [[cos, sin], [-sin, cos]] multiplies the column (x_2i, x_2i+1)":
            lambda x, pos: rotated(x, pos, lambda p: _rotation(-int(p), d_model)),
        "you rotate features i and i + d_model/2 together (the rotate-half layout of GPT-NeoX and LLaMA); this "
        "book's M_p pairs columns 2i and 2i+1": [lambda x, pos: halves(x, pos, 1), lambda x, pos: halves(x, pos, -1)],
        "the exponent must be 2i/d_model for pair i; you used i/d_model": lambda x, pos: rotated(
            x, pos, lambda p: torch.block_diag(*[_rotation(int(p) * 10000.0 ** (-i / d_model), 2) for i in range(half)])),
        "you added PE(p) to x; rotary embeddings multiply: x_p -> M_p x_p": lambda x, pos: x + rotated(
            torch.tensor([[0.0, 1.0] * half] * len(pos), dtype=torch.float64), pos),
        "x comes back unrotated: row t must be multiplied by M_{positions[t]}": lambda x, pos: x,
        "you rotate row t by its index t; use the given positions[t]": lambda x, pos: rotated(x, range(len(x)))}
    # Angles p w_i computed in float32 (the usual Hugging Face / LLaMA code: inv_freq in float32, times the
    # positions) round p w_i by up to ~1e-4 rad at p = 1000; promoted to float64 x, such an answer is float64 but
    # only float32-accurate. It is right: grade it at float32's tolerance (tolerance by the precision it used).
    got, want = call(x, positions), rotated(x, positions)
    in_float32 = (tuple(got.shape) == tuple(want.shape) and got.is_floating_point() and not close_to(got, want)
                  and close_to(got.float(), want))
    if (tuple(got.shape) == tuple(want.shape) and got.is_floating_point() and not close_to(got.float(), want)
            and not got.isnan().any() and (got.double() - want).abs().max().item() < 1e-2):
        index, value, expected = first_difference(got.float(), want)
        raise AssertionError(
            f"fn(x, positions) differs from M_p x by up to {(got.double() - want).abs().max().item():.2e} (first at "
            f"{list(index)}: {value:.8f}, expected {expected:.8f}, position {positions[index[0]].item()}): more than "
            "float32's rounding allows, yet small; an angle p w_i that is slightly off (e.g. computed in float16 or "
            "bfloat16, or w_i from a rounded base) does this. Compute the angles in float32 or float64")
    answer = (lambda x, pos: torch.as_tensor(fn(x, pos)).float()) if in_float32 else \
        (lambda x, pos: torch.as_tensor(fn(x, pos)))
    grade(answer, rotated, {"": (x, positions)}, mistakes,
          name="fn(x, positions)", against="M_p x", shape="one rotated row per row of x, ")
    batched = torch.randn(2, 3, n, d_model, generator=g, dtype=torch.float64)       # (B, h, n, d_model)
    got = call(batched, positions)
    want = torch.stack([rotated(rows, positions) for rows in batched.reshape(-1, n, d_model)]).reshape(batched.shape)
    if tuple(got.shape) != tuple(batched.shape) or not close_to(got.float() if in_float32 else got, want):
        raise AssertionError(f"on x of shape (B, h, n, d_model) = {tuple(batched.shape)} your rotation differs from "
                             "M_p x" + (f" (shape {tuple(got.shape)})" if tuple(got.shape) != tuple(batched.shape)
                                        else "") + ": the positions run along axis -2 and the features along the "
                             "last axis, whatever axes come before them")
    got = call(x, positions)
    q, k = torch.randn(2, d_model, generator=g, dtype=torch.float64)
    scores = []
    for shift in (0, 1, 100, 4000):
        pos = torch.tensor([3, 10]) + shift                               # offset 7 at every shift
        rq, rk = call(torch.stack([q, q]), pos)[0], call(torch.stack([k, k]), pos)[1]
        scores.append((rq.double() @ rk.double()).item())
    spread = max(scores) - min(scores)
    if spread > 1e-6 * max(1.0, abs(scores[0])) + (1e-3 if got.dtype != torch.float64 or in_float32 else 0):
        raise AssertionError(f"your rotated scores for offset 7 change with the position: "
                             f"{[round(s, 4) for s in scores]} at p = 3, 4, 103, 4003")
    wide, rows = 768, torch.tensor([0, 3, 7, 100, 2000])               # the constraint: no d_model x d_model matrix
    x_wide = torch.randn(len(rows), wide, generator=g, dtype=torch.float64)
    call(x_wide, rows)                                                  # once unwatched (first-call set-ups)
    with _WidestTensors(wide) as watch:
        got = call(x_wide, rows)
    if watch.found is not None:
        shape, op = watch.found
        raise AssertionError(f"fn(x {tuple(x_wide.shape)}, positions {rows.tolist()}) works with a tensor of shape "
                             f"{shape} (in torch's {op}): that is a d_model x d_model matrix (M_p built whole), "
                             "O(n d_model^2) work. M_p is block-diagonal: turn each pair (x_2i, x_2i+1) by its own "
                             "angle p w_i, with one cosine and one sine per pair, on x[..., 0::2] and x[..., 1::2]")
    print(f"check_rotary: M_p x right, also on (B, h, n, d_model); q~_p . k~_p' = {scores[0]:.4f} for p' - p = 7 "
          "at p = 3, 4, 103, 4003; no d_model x d_model matrix built (d_model = 768)"
          + ("; your float64 output is float32-accurate (angles p w_i computed in float32, as in most code: "
             "graded at float32's tolerance)" if in_float32 else ""))

# --- exercise 1: the table by recurrence, and its float32 drift

def _slipped_table(max_len, d_model, sign=1.0, exponent=2, first=0):
    """The table of positions first ... first + max_len - 1 from the formula, with a reader's slip (sign=-1: the
    sines of PE(-p); exponent=1: frequencies 10000^(-i/d_model))."""
    p = torch.arange(first, first + max_len, dtype=torch.float64)[:, None]
    angle = p * 10000.0 ** (-exponent * torch.arange(d_model // 2, dtype=torch.float64) / d_model)
    return torch.stack([sign * angle.sin(), angle.cos()], -1).flatten(1)


def _first_drift(table, tol):
    """The first position p whose row differs from the formula by more than tol in some entry, row by row with
    Python's math (None if none does)."""
    table = table.detach().to("cpu", torch.float64)
    d_model = table.size(1)
    for p, row in enumerate(table.tolist()):
        for j, value in enumerate(row):
            angle = p / 10000.0 ** ((j - j % 2) / d_model)
            if abs(value - (math.sin(angle) if j % 2 == 0 else math.cos(angle))) > tol:
                return p
    return None


def check_pe_recurrence(fn, first_drift) -> None:
    """Test a reader's fn(max_len, d_model, dtype) -> (max_len, d_model), the sinusoidal table built by recurrence
    (PE(0) = (0, 1, 0, 1, ...), PE(p + 1) = M_1 PE(p), every operation in dtype), and first_drift(table, tol) ->
    the first position p whose row differs from the float64 formula by more than tol in some entry (None if
    none). fn must equal the formula in float64 and drift in float32 (a table that does not drift, or whose pair 0
    does not, was not built by rotation in float32: the direct formula in float32 drifts in the other pairs, from
    rounding p w_i, but not in pair 0, where w_0 = 1); first_drift is graded on the reader's own float32 table and on two tables with a
    known answer. Names the usual slips; prints the reader's own float32 drift."""
    mistakes = {
        "you rotate backwards (M_1 transposed, that is M_-1): your row p is PE(-p), whose sines have the wrong "
        "sign. M_1's block is [[cos w, sin w], [-sin w, cos w]] acting on (sin, cos)":
            lambda n, d, dtype: _slipped_table(n, d, sign=-1.0),
        "PE(0) = (sin 0, cos 0, ...) = (0, 1, 0, 1, ...); you started from (1, 0, 1, 0, ...)":
            lambda n, d, dtype: _slipped_table(n, d)[:, [i + 1 - 2 * (i % 2) for i in range(d)]]
            * torch.tensor([1.0, -1.0] * (d // 2), dtype=torch.float64),
        "your even and odd columns are swapped: PE(p, 2i) is the sine, sin(p w_i), and PE(p, 2i + 1) the cosine, "
        "so row 0 is (0, 1, 0, 1, ...)":
            lambda n, d, dtype: _slipped_table(n, d)[:, [i + 1 - 2 * (i % 2) for i in range(d)]],
        "the exponent must be 2i/d_model for pair i; you used i/d_model":
            lambda n, d, dtype: _slipped_table(n, d, exponent=1),
        "your table starts at PE(1): row 0 must be PE(0) itself, before any rotation":
            lambda n, d, dtype: _slipped_table(n, d, first=1),
        "one row per position, max_len rows": lambda n, d, dtype: torch.Size((n - 1, d)),
        "your rows are column vectors turned the wrong way: the table has one row per position, (max_len, d_model)":
            lambda n, d, dtype: torch.Size((d, n))}
    grade(lambda *inputs: torch.as_tensor(fn(*inputs)), lambda n, d, dtype: sinusoidal_encoding(n, d, dtype=dtype),
          {f"fn(max_len={n}, d_model={d}, dtype=torch.float64)": (n, d, torch.float64) for n, d in ((50, 16), (300, 64))},
          mistakes, name="your table", against="the formula", shape="(max_len, d_model) = ", scale=100.0)
    table = call_reader(fn, "fn(5000, 64, torch.float32)", 5000, 64, torch.float32)
    if not isinstance(table, torch.Tensor) or table.dtype != torch.float32 or tuple(table.shape) != (5000, 64):
        raise AssertionError("fn(5000, 64, torch.float32) must return a float32 tensor of shape (5000, 64), got "
                             + (f"{table.dtype} {tuple(table.shape)}" if isinstance(table, torch.Tensor)
                                else type(table).__name__))
    error = (table.double() - sinusoidal_encoding(5000, 64, dtype=torch.float64)).abs().amax(1)   # per position
    if error.max() > 1e-2:
        raise AssertionError(f"fn(5000, 64, torch.float32) strays from the formula by up to {error.max():.2g} "
                             f"(first by more than 1e-2 at position {int((error > 1e-2).nonzero()[0])}): far more "
                             "than 5,000 rotations in float32 can explain")
    if error.max() < 1e-5:
        raise AssertionError(f"fn(5000, 64, torch.float32) equals the formula to float32's rounding (max error "
                             f"{error.max():.1g}): it was not built by rotating in float32. Compute M_1's cosines "
                             "and sines, and every row from the previous one, in dtype (not in float64 cast at "
                             "the end, not from sin and cos of p)")
    pair_0 = (table[:, :2].double() - sinusoidal_encoding(5000, 2, dtype=torch.float64)).abs().max().item()
    if pair_0 < 1e-6:           # w_0 = 1: p w_0 is exact in float32, so only a table from sin and cos of p is exact
        raise AssertionError(f"fn(5000, 64, torch.float32): your pair 0 (columns 0 and 1, w_0 = 1) equals sin p and "
                             f"cos p to float32's rounding at every p (max error {pair_0:.1g}), but turning a row "
                             "5,000 times by float32's M_1 drifts there by about 2e-4: your rows come from sin and "
                             "cos of an angle p w computed in float32, not from the previous row. Build row p + 1 "
                             "by rotating row p")
    ramp = sinusoidal_encoding(400, 16, dtype=torch.float64)
    ramp[:, 3] += torch.arange(400, dtype=torch.float64) * 1e-5       # one entry drifts: 1e-5 per position
    cases = {"first_drift(your float32 table of fn(5000, 64), tol=1e-4)": (table, 1e-4),
             "first_drift(a float64 table of the formula, tol=1e-4)": (sinusoidal_encoding(100, 16,
                                                                                           dtype=torch.float64), 1e-4),
             "first_drift(a table whose column 3 drifts by 1e-5 per position, tol=2e-3)": (ramp, 2e-3)}

    def shifted(by):
        return lambda t, tol: None if _first_drift(t, tol) is None else _first_drift(t, tol) + by
    drift_mistakes = {
        "off by one: the last position still within tol; return the first one beyond it": shifted(-1),
        "off by one: positions start at 0 (row p of the table is position p)": shifted(1),
        "you return how many positions are beyond tol, not the first one":
            lambda t, tol: int(((t.double() - sinusoidal_encoding(t.size(0), t.size(1), dtype=torch.float64)).abs()
                                .amax(1) > tol).sum()),
        "you compare each row's mean error with tol; a row drifts when any one entry is off by more than tol":
            lambda t, tol: next((p for p, e in enumerate((t.double() - sinusoidal_encoding(
                t.size(0), t.size(1), dtype=torch.float64)).abs().mean(1).tolist()) if e > tol), None)}

    def drift_answer(t, tol):
        got = first_drift(t.clone(), tol)
        return got if got is None else int(number(got, "first_drift(table, tol)"))
    wants = {}
    for where, inputs in cases.items():
        want, got = _first_drift(*inputs), call_reader(drift_answer, where, *inputs)
        wants[where] = want
        if got == want:
            continue
        named = next((m for m, wrong in drift_mistakes.items() if wrong(*inputs) == got), None)
        raise AssertionError(f"{where}: you return {got}" + (
            f": {named}" if named else ", expected None: no row drifts that far" if want is None else
            ": no row drifts that far, you say, but one does" if got is None else
            ", which is not the first position beyond tol"))
    print(f"check_pe_recurrence: float64 equals the formula; in float32 (5,000 rows, d_model = 64) your table is "
          f"off by {error[1000]:.1e} at position 1,000 and {error[-1]:.1e} at 4,999, and first by more than 1e-4 at "
          f"position {next(iter(wants.values()))}")

# --- exercise 2: why 10000

def _turn(n, d_model, base, pair=None, exponent=2):
    """How far the pair of columns `pair` (default: the slowest, d_model/2 - 1) of a sinusoidal table with this base
    has turned between positions 0 and n - 1, in radians: measured on the table's rows by adding up the angle
    between consecutive rows (atan2 of their cross and dot products), so that turns beyond pi count in full.
    exponent 1: the slip that builds pair i's frequency from i/d_model instead of 2i/d_model."""
    i = d_model // 2 - 1 if pair is None else pair
    p = torch.arange(n, dtype=torch.float64)
    angles = p * float(base) ** (-exponent * i / d_model)
    sin, cos = angles.sin(), angles.cos()                               # columns 2i and 2i+1 of the table
    cross = sin[1:] * cos[:-1] - cos[1:] * sin[:-1]
    dot = cos[1:] * cos[:-1] + sin[1:] * sin[:-1]
    return torch.atan2(cross, dot).sum().item()


def _smallest(n, d_model, turn=math.pi, **pair):
    """The smallest base at which the pair turns by at most `turn` between positions 0 and n - 1: bisection on
    log(base), with the turn measured by _turn (a larger base turns more slowly)."""
    low, high = 0.0, 200.0                                               # log base
    for _ in range(80):
        middle = (low + high) / 2
        low, high = (low, middle) if _turn(n, d_model, math.exp(middle), **pair) <= turn else (middle, high)
    return math.exp(high)


def check_smallest_base(fn) -> None:
    """Test a reader's fn(n, d_model) -> the smallest base of the sinusoidal table (10000 in the paper) for which
    the slowest pair of columns, i = d_model/2 - 1, turns by at most half a turn (pi) between positions 0 and
    n - 1, so that its cosine alone orders the n positions. The reference is found by bisection on the base, with
    the turn measured on the table's rows. Names the usual slips (a full turn, the excluded next pair, the exponent
    i/d_model, n steps instead of n - 1, a base rounded to an integer)."""
    mistakes = {
        "that lets the slowest pair make a full turn, 2 pi; its cosine falls only over half a turn, pi, and then "
        "rises again, so far positions would look near": lambda n, d: _smallest(n, d, turn=2 * math.pi),
        "that is the base at which the excluded next pair, i = d_model/2, would turn by pi; the last pair is "
        "i = d_model/2 - 1": lambda n, d: _smallest(n, d, pair=d // 2),
        "the exponent of pair i is 2i/d_model; you used i/d_model": lambda n, d: _smallest(n, d, exponent=1),
        "positions 0 ... n - 1 are n - 1 steps apart, not n": lambda n, d: _smallest(n + 1, d),
        "you rounded the base to a whole number: return the exact real base (the check compares to float32's "
        "precision)": [lambda n, d: float(math.ceil(_smallest(n, d))), lambda n, d: float(round(_smallest(n, d))),
                       lambda n, d: float(math.floor(_smallest(n, d)))]}

    def angle(got, n, d):
        return (f": with your base the slowest pair turns by {_turn(n, d, got):.4g} rad between positions 0 and "
                "n - 1, not pi" if got > 1 else ": a base must be larger than 1")
    grade(fn, _smallest, {f"fn(n={n}, d_model={d})": (n, d) for n, d in ((5000, 512), (1000, 64), (100, 16), (60, 4))},
          mistakes, name="your base", says="you return {got:.6g}", hint=angle)
    print("check_smallest_base: right for (n, d_model) = (5000, 512), (1000, 64), (100, 16), (60, 4)")

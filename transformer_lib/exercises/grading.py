"""The toolkit every grader of `transformer_lib.exercises` is written with (CONTRIBUTING.md, "Where graders live")."""

__all__ = ['TOLERANCES', 'close_to', 'number', 'first_difference', 'Verdict', 'call_reader', 'grade', 'reader_module',
           'module_answer']

# The graders' toolkit: every check_* of the book is written with these few functions. A grader runs the reader's
# answer and a reference on chosen inputs; when they differ it runs the typical wrong answers (mutants: the
# reference with one slip) on the same inputs, and the first one the reader's answer equals names the mistake.
import inspect

import torch

# How close a reader's answer must be to the float64 reference, by the dtype the reader computed in: the graders
# accept float32 (and half-precision) work, whose rounding is far below any mistake they name.
TOLERANCES = {torch.float64: (1e-7, 1e-9), torch.float32: (1e-4, 1e-5), torch.float16: (5e-3, 5e-3),
              torch.bfloat16: (3e-2, 3e-2)}                              # (rtol, atol)


def _tolerance(got, want) -> tuple:
    """(rtol, atol) of the less precise of the two tensors' dtypes (an integer tensor counts as float32)."""
    return max(TOLERANCES.get(t.dtype, TOLERANCES[torch.float32]) for t in (got, want))


def close_to(got, want, scale: float = 1.0) -> bool:
    """True when the reader's answer got equals the reference want within the tolerance of the less precise of
    their dtypes (TOLERANCES, times scale for an ill-conditioned computation). Tensors must have want's shape (got
    may be on any device); numbers are held to float32's tolerance (a number does not say how it was computed);
    lists and tuples are compared item by item; None equals only None."""
    if want is None or got is None:
        return got is want
    if isinstance(want, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(want)
                and all(close_to(a, b, scale) for a, b in zip(got, want, strict=True)))
    if not isinstance(got, torch.Tensor):
        if isinstance(want, torch.Tensor) or isinstance(got, (list, tuple)):
            return False
        rtol, atol = TOLERANCES[torch.float32]
        return abs(got - want) <= scale * (rtol * abs(want) + atol)
    want = want if isinstance(want, torch.Tensor) else torch.tensor(want, dtype=torch.float64)
    if not (got.is_floating_point() or want.is_floating_point()):      # ids, counts: exactly
        return tuple(got.shape) == tuple(want.shape) and torch.equal(got.cpu(), want.cpu())
    rtol, atol = _tolerance(got, want)
    return (tuple(got.shape) == tuple(want.shape)
            and torch.allclose(got.detach().to("cpu", torch.float64), want.detach().to("cpu", torch.float64),
                               rtol=rtol * scale, atol=atol * scale))


def number(value, what: str) -> float:
    """The reader's answer value (an int, a float, a one-element tensor or array) as a float; raises
    AssertionError (a Verdict: call_reader passes it on as it is) saying that `what` must be one number when it
    is not."""
    try:
        if isinstance(value, (str, bytes, bool)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise Verdict(f"{what} must be one number (a float, an int or a one-element tensor), got "
                             f"{type(value).__name__}") from None


def first_difference(got, want, scale: float = 1.0):
    """(index, got[index], want[index]) at the first position where the tensors got and want differ by more than
    close_to allows (or at all, when nowhere by more); None when they are equal."""
    rtol, atol = _tolerance(got, want)
    got64, want64 = got.detach().to("cpu", torch.float64), want.detach().to("cpu", torch.float64)
    bad = ~torch.isclose(got64, want64, rtol=rtol * scale, atol=atol * scale)
    bad = bad if bad.any() else got64 != want64
    if not bad.any():
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    return index, got64[index].item(), want64[index].item()


class Verdict(AssertionError):
    """A grader's verdict raised from inside a call of the reader's code (a forbidden shortcut): call_reader
    passes it on as it is."""


def call_reader(fn, name: str, *args, **kwargs):
    """fn(*args, **kwargs), the reader's code; when it raises, AssertionError naming the call (name) and the error,
    with a hint for the usual crash (.view on a transposed tensor)."""
    try:
        return fn(*args, **kwargs)
    except Verdict:
        raise
    except Exception as error:  # the reader's code crashed: say which function and why
        hint = ""
        if isinstance(error, RuntimeError) and "view" in str(error):
            hint = (" (after transpose the tensor is not contiguous in memory, so .view cannot flatten it: "
                    "use .reshape(...) or .contiguous().view(...))")
        raise AssertionError(f"{name} raised {type(error).__name__}: {error}{hint}") from error


def _is(got, wrong, scale: float) -> bool:
    """close_to for a mutant's output wrong, where NaN means "any value": a mutant marks with NaN the entries
    a slip leaves undefined (a row with every key masked). A torch.Size mutant names a shape, matched in
    grade."""
    if isinstance(wrong, torch.Size):
        return False
    if isinstance(wrong, torch.Tensor) and isinstance(got, torch.Tensor) and got.shape == wrong.shape:
        anything = wrong.isnan()                   # compared nowhere there: the reader's NaN (the usual slip) too
        got = torch.where(anything.to(got.device), 0.0, got.detach())
        wrong = torch.where(anything, 0.0, wrong)
    return close_to(got, wrong, scale)


def _each(mutants, inputs) -> list:
    """The outputs of a mistake's mutants on inputs (a mutant that is not a function is its own output)."""
    mutants = mutants if isinstance(mutants, (list, tuple)) else [mutants]
    return [m(*inputs) if callable(m) else m for m in mutants]


def grade(answer, reference, cases: dict, mistakes: dict | None = None, *, name: str = "your function",
          against: str = "the reference", shape: str = "", scale: float = 1.0, case_in_mistakes: bool = True,
          pure: str = "", hint="", crash: str = "", says: str = "") -> None:
    """Grade the reader's answer against reference on chosen inputs, and name the mistake when it is wrong.

    cases: {where: inputs}; each runs answer(*inputs) (on copies of the tensors: the reader may write into
    them, unless pure names them: then the reader's answer must leave them unchanged) and reference(*inputs);
    where starts every message about that case ("" for none; with case_in_mistakes=False a named mistake's
    message is shown as it is). mistakes: {message: mutant}, mutant(*inputs) being the reference with one
    typical slip (None where the slip does not apply; NaN in its output: any value there; a torch.Size: an
    output of that shape is this mistake; a list of mutants: several slips with one message; a mutant that is
    not a function: its output); the first mutant whose output the reader's equals (close_to) names the
    mistake. name: the reader's function in messages; against: the reference's; shape: the expected shape in
    symbols, "(B, n, d_model) = "; hint: said after "differs from against by ..." (or hint(index of the first
    wrong entry, *inputs)); crash: said after "name raised ...". A pair (output, weights) the reader returns
    counts as its output when the reference returns a tensor (attention's convention), a one-element tensor as
    a scalar when the reference is one. When the reference returns a number, so must the answer (number()), and says, a format of got and
    want ("you return {got:g}, expected {want}"), tells a wrong one: "where: says: message" for a named
    mistake, else "where: says{hint}" (hint(got, *inputs) when a function). Returns quietly when every output
    is close_to the reference's; raises AssertionError otherwise."""
    for where, inputs in cases.items():
        at = f"{where}: " if where else ""
        said = at if case_in_mistakes else ""
        copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        try:
            got = call_reader(answer, f"{at}{name}", *(inputs if pure else copies))
        except AssertionError as error:
            raise AssertionError(f"{error}{crash}") from error.__cause__
        if pure and not all(torch.equal(a, b) if isinstance(a, torch.Tensor) else True
                            for a, b in zip(inputs, copies, strict=True)):
            raise AssertionError(f"{at}{name} changed {pure} in place; compute new tensors instead")
        want = reference(*inputs)
        told = ""
        if isinstance(want, (int, float)) and not isinstance(want, bool):
            got = number(got, f"{at}{name}")
            told = says.format(got=got, want=want)
        if isinstance(want, torch.Tensor):
            got = got[0] if isinstance(got, tuple) and len(got) == 2 else got    # (output, weights)
            if not isinstance(got, torch.Tensor):
                raise AssertionError(f"{at}{name} must return a tensor, got {type(got).__name__}")
            got = got.reshape(()) if want.dim() == 0 and got.numel() == 1 else got
            if got.shape != want.shape:
                for message, mutants in (mistakes or {}).items():          # a mistake of another shape?
                    for wrong in _each(mutants, inputs):
                        if isinstance(wrong, torch.Size) and wrong == got.shape:
                            raise AssertionError(f"{at}output shape {tuple(got.shape)}, expected "
                                                 f"{shape}{tuple(want.shape)}: {message}")
                        if _is(got, wrong, scale):
                            raise AssertionError(said + message)
                raise AssertionError(f"{at}output shape {tuple(got.shape)}, expected "
                                     f"{shape}{tuple(want.shape)}")
        if close_to(got, want, scale):
            continue
        for message, mutants in (mistakes or {}).items():
            if any(_is(got, wrong, scale) for wrong in _each(mutants, inputs)):
                raise AssertionError(said + (f"{told}: " if told else "") + message)
        if told:
            raise AssertionError(at + told + (hint(got, *inputs) if callable(hint) else hint))
        if isinstance(want, torch.Tensor):
            if got.isnan().any() and not want.isnan().any():
                raise AssertionError(f"{at}NaN in the output of {name}, where {against} has none")
            index, value, expected = first_difference(got, want, scale)
            diff = (f"by up to {(got.detach().double().cpu() - want.double().cpu()).abs().max().item():.2g} "
                    f"(first at {list(index)}: {value:.4g}, expected {expected:.4g})" if index else
                    f"({value:.6g}, expected {expected:.6g})")
            more = hint(index, *inputs) if callable(hint) else hint
        elif isinstance(want, (list, tuple)) and all(isinstance(w, torch.Tensor) for w in want):   # tensors
            worst = max((g.detach().double().cpu() - w.double().cpu()).abs().max().item()
                        for g, w in zip(got, want, strict=True))
            diff, more = f"by up to {worst:.2g}", hint
        else:
            diff, more = f"({got!r}, expected {want!r})", hint
        more = "" if callable(more) else more
        raise AssertionError(f"{at}{name} differs from {against} {diff}{more}")


def reader_module(cls, reference, *args, advice: str = "", **options):
    """The reader's module cls(*args, **options) (only the options its constructor takes: dropout=0.0,
    norm_first=...) in float64 eval mode, with the weights of the book's module reference copied in
    (copy_weights: by name, by order of shape, or by sub-module). Returns (module, the options it took, hint):
    hint, for grade, lists the weights matched by order of shape ("" when all matched by name), then advice."""
    from transformer_lib.exercises.attention import copy_weights
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        parameters = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    options = {k: v for k, v in options.items() if takes_any or k in parameters}
    model = call_reader(cls, f"{cls.__name__}({', '.join(map(str, args))})", *args, **options)
    if not isinstance(model, torch.nn.Module):
        raise AssertionError(f"{cls.__name__}({', '.join(map(str, args))}) must build an nn.Module, got "
                             f"{type(model).__name__}")
    model = model.to(torch.float64).eval()
    mapping = copy_weights(reference, model)
    hint = "" if all(mine == book for mine, book in mapping.items()) else (
        " (your parameters took the book's weights by order of shape: "
        + ", ".join(f"{mine} <- {book}" for mine, book in mapping.items() if "weight" in book) + f"{advice})")
    return model, options, hint


def module_answer(model):
    """The reader's module as an answer for grade: model(*inputs) without grad, the trailing None inputs left
    out, in float64, or in float32 for a module that insists on it (it casts its inputs, or builds float32
    tensors), the dtype kept from the first case that ran; raises the float64 run's error when both fail."""
    dtypes = [torch.float64, torch.float32]

    def answer(*inputs):
        while inputs and inputs[-1] is None:
            inputs = inputs[:-1]
        errors = []
        for dtype in list(dtypes):
            try:
                with torch.no_grad():
                    out = model.to(dtype)(*(x.to(dtype) if x is not None and x.is_floating_point() else x
                                            for x in inputs))
                dtypes[:] = [dtype]
                return out
            except Exception as error:
                errors.append(error)
        raise errors[0]
    return answer

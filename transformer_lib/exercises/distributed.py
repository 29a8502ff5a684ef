"""The graders of Chapter 13's exercises (training beyond one machine), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_who_reads', 'check_rank_indices', 'check_token_mean_loss', 'check_accumulate', 'check_rng_restore',
           'check_resume']

import copy
import io
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..distributed import DistributedContext, rng_state, set_rng_state, training_state
from .grading import Verdict, call_reader, close_to, grade, number

# --- Exercise 1: who reads an example? -------------------------------------------------------------------------

def _who_reads(perm, example, world_size, global_batch, slip=None):
    """(step, rank): when, and by which rank, StepSampler's rule reads `example` in the epoch whose order is perm;
    None when the epoch never reads it. slip: one typical mistake instead (for the checker's messages)."""
    n, b = len(perm), global_batch // world_size
    p = example if slip == "id" else perm.index(example)              # its position in the permutation
    read = {"keep all": n, "only W": n // world_size * world_size}.get(slip, n // global_batch * global_batch)
    if p >= read + (slip == "boundary"):                              # "boundary": p > read instead of >=
        return None                                                   # past the epoch's last full batch
    if slip == "swapped":
        return p % world_size, p // global_batch
    if slip == "from 1":
        return p // global_batch + 1, p % world_size
    if slip == "blocks":                                              # each rank a contiguous block of the batch
        return p // global_batch, p % global_batch // b
    if slip == "shares":                                              # the permutation cut into W pieces
        share = n // world_size
        return p % share // b, p // share
    if slip == "local":                                               # a rank's slice taken as B examples long
        return p // world_size // global_batch, p % world_size
    return p // global_batch, p % world_size


def check_who_reads(fn, seed: int = 0) -> None:
    """Test fn(perm, example, world_size, global_batch) -> (step, rank), the step of the epoch at which `example`
    is read and the rank that reads it, for an epoch whose shuffled order of the examples is perm (a list), under
    StepSampler's rule (section 13.2); None when the epoch never reads the example. Tries every example of
    a permutation of 103 examples on 1 to 5 processes. Names contiguous blocks per rank, the permutation cut into W
    shares, a rank's slice taken as global_batch long, the example's id used as its position, (rank, step)
    swapped, steps counted from 1, and the examples that an epoch drops (an off-by-one at its end among them)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(103, generator=g).tolist()                  # ids are not their positions
    mistakes = {
        "blocks": "each rank reads a contiguous block of the step's batch in your answer; DistributedSampler deals "
                  "the permutation out in turn, so the rank is the position modulo world_size",
        "shares": "you cut the permutation into world_size shares, one per rank; DistributedSampler deals it out "
                  "in turn: rank r holds the positions r, r + W, r + 2W, ...",
        "local": "a rank takes global_batch / world_size examples of its share per step, not global_batch: the step "
                 "is the position divided by the global batch",
        "id": "you used the example's id as its position: find where it stands in perm (perm.index(example))",
        "swapped": "your answer is (rank, step), the two numbers swapped: return (step, rank)",
        "from 1": "your steps count from 1; the epoch's first step is step 0, as in section 13.2",
        "boundary": "the first example past the epoch's last full batch (at position num_examples // global_batch "
                    "* global_batch of perm) gets a step in your answer: an off-by-one at the end of the epoch; "
                    "no rank reads it",
        "only W": "DistributedSampler alone drops only the examples past a multiple of world_size, but the epoch "
                  "ends after num_examples // global_batch full batches: return None past that",
        "keep all": "an epoch has num_examples // global_batch steps; the examples past the last full batch are "
                    "read by no rank in this epoch: return None for them",
    }
    for world_size, global_batch in ((3, 9), (1, 8), (2, 8), (4, 32), (4, 12), (5, 15)):
        where = f"{world_size} process(es), global batch {global_batch}"
        answers = {}                                                  # example -> the reader's answer
        for example in perm:
            got = call_reader(fn, f"{where}: who_reads(perm, {example}, ...)", list(perm), example, world_size,
                              global_batch)
            if got is not None:
                try:
                    step, rank = (int(v) for v in got)
                    got = (step, rank)
                except (TypeError, ValueError):
                    raise AssertionError(f"{where}: return (step, rank), two ints, or None; got {got!r}"[:300]) \
                        from None
            answers[example] = got
        wrong = {e: got for e, got in answers.items() if got != _who_reads(perm, e, world_size, global_batch)}
        if not wrong:
            continue
        for slip, message in mistakes.items():     # the slip that gives every answer the reader gives (for the
            drops = slip in ("only W", "keep all", "boundary")    # rank and step slips, on the examples read)
            scope = [e for e in perm if drops or _who_reads(perm, e, world_size, global_batch) is not None]
            if any(e in wrong for e in scope) and all(
                    answers[e] == _who_reads(perm, e, world_size, global_batch, slip) for e in scope):
                raise AssertionError(f"{where}: {message}")
        example, got = next(iter(wrong.items()))
        raise AssertionError(f"{where}: {len(wrong)} of {len(perm)} examples wrong, e.g. example {example} (at "
                             f"position {perm.index(example)} of perm): you return {got}, expected "
                             f"{_who_reads(perm, example, world_size, global_batch)}")
    print("check_who_reads: every example's step and rank, on 1 to 5 processes, and the examples an epoch drops")


# --- Section 13.2's rule, graded for `python -m transformer_lib.check` (a reader's rank_indices) ----------

def _rank_indices(perm, step, rank, world_size, global_batch):
    """StepSampler's rule: rank r of W reads perm[r::W] in slices of global_batch / W; slice `step` at step `step`."""
    b = global_batch // world_size
    return list(perm[rank::world_size][step * b:(step + 1) * b])


def check_rank_indices(fn, seed: int = 0) -> None:
    """Test fn(perm, step, rank, world_size, global_batch) -> the example indices (a list of ints) that rank `rank`
    of `world_size` processes reads at step `step` of an epoch whose permutation of the examples is `perm` (a list),
    as DistributedSampler and StepSampler assign them: rank r reads perm[r::W] in slices of global_batch / W.
    Checks 1, 2, 3 and 4 processes, that the ranks together read one process's batch, and that a global batch not
    divisible by the number of processes raises a ValueError. Names contiguous blocks, a whole global batch per
    rank, an ignored step, positions instead of examples, and a silently truncated batch."""
    g = torch.Generator().manual_seed(seed)
    perm = (torch.randperm(100, generator=g) + 1000).tolist()         # example ids differ from their positions
    for world_size, global_batch in ((1, 8), (2, 8), (4, 32), (4, 12), (3, 9)):
        b = global_batch // world_size
        for step in (0, 1, len(perm) // global_batch - 1):
            together = []
            for rank in range(world_size):
                where = f"step {step}, rank {rank} of {world_size}, global_batch {global_batch}"
                got = fn(list(perm), step, rank, world_size, global_batch)
                try:
                    got = [int(i) for i in (got.tolist() if isinstance(got, torch.Tensor) else got)]
                except (TypeError, ValueError):
                    raise AssertionError(f"{where}: return a list of example indices, got {type(got).__name__}") \
                        from None
                want = _rank_indices(perm, step, rank, world_size, global_batch)
                together += got
                if got == want:
                    continue
                start = step * global_batch
                suspects = {
                    "each rank reads a contiguous block of the global batch; DistributedSampler deals the permutation "
                    "out in turn: rank r gets perm[r::W], then takes its slices of global_batch / W from that":
                        perm[start + rank * b:start + (rank + 1) * b],
                    f"each rank must read global_batch / world_size = {b} examples, not the whole global batch":
                        perm[rank::world_size][step * global_batch:(step + 1) * global_batch],
                    "the step is ignored: at step j a rank reads the j-th slice of its share":
                        perm[rank::world_size][:b],
                    "these are positions in the permutation, not examples: return perm[position]":
                        list(range(len(perm)))[rank::world_size][step * b:(step + 1) * b],
                }
                for message, wrong in suspects.items():
                    if got == wrong:
                        raise AssertionError(f"{where}: {message}")
                raise AssertionError(f"{where}: you return {got[:6]}{' ...' if len(got) > 6 else ''}, expected "
                                     f"{want[:6]}{' ...' if len(want) > 6 else ''} (perm[{rank}::{world_size}], "
                                     f"slice {step} of {b})")
            one = perm[step * global_batch:(step + 1) * global_batch]
            assert sorted(together) == sorted(one), f"step {step}: the ranks together must read one process's batch"
    for world_size, global_batch in ((4, 30), (3, 8)):
        try:
            got = fn(list(perm), 0, 0, world_size, global_batch)
        except ValueError:
            continue
        except Exception as error:
            raise AssertionError(f"global_batch {global_batch} on {world_size} processes raised "
                                 f"{type(error).__name__}: raise a ValueError saying that the batch must be "
                                 f"divisible by the number of processes") from None
        raise AssertionError(f"global_batch {global_batch} on {world_size} processes must raise a ValueError (not "
                             f"divisible); you return {len(got) if hasattr(got, '__len__') else got} examples, so "
                             f"the processes would silently read {world_size * (global_batch // world_size)} "
                             f"examples per step instead of {global_batch}")
    print("check_rank_indices: correct for 1 to 4 processes, and an indivisible batch raises a ValueError")


# --- Exercise 2 (bug hunt): the loss each rank differentiates -------------------------------------------------

def _shard_gradients(loss_for_rank, world_size, dtype, seed):
    """One global batch of padded token targets, split into world_size shards (rank r: rows r*B/W ...), each rank's
    loss_for_rank(loss_sum, n_local, n_global, context) differentiated (context: that rank's DistributedContext),
    the gradients averaged as DDP does.
    Returns (that average, the single-process gradient of the token mean)."""
    g = torch.Generator().manual_seed(seed)
    B, T, d, V = 8, 6, 5, 7
    x = torch.randn(B, T, d, generator=g, dtype=torch.float64).to(dtype)
    W = torch.randn(d, V, generator=g, dtype=torch.float64).to(dtype)
    targets = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.tensor([6, 5, 6, 6, 1, 2, 3, 1])                  # the first half of the batch is longer
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = -100       # padding: no loss there
    n_global = int((targets != -100).sum())

    def loss_sum(rows):
        w = W.detach().clone().requires_grad_(True)
        logits = x[rows] @ w                                           # (rows, T, V)
        s = F.cross_entropy(logits.flatten(0, 1), targets[rows].flatten(), ignore_index=-100, reduction="sum")
        return w, s, int((targets[rows] != -100).sum())

    w, s, _ = loss_sum(slice(None))
    (s / n_global).backward()
    want = w.grad.double()
    grads = []
    b = B // world_size
    for rank in range(world_size):
        w, s, n_local = loss_sum(slice(rank * b, (rank + 1) * b))
        context = DistributedContext(rank, world_size, rank, torch.device("cpu"))
        loss = loss_for_rank(s, n_local, n_global, context)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
            raise AssertionError(f"return a scalar tensor computed from loss_sum (so that backward() reaches the "
                                 f"weights), got {loss!r}"[:300])
        loss.backward()
        grads.append(w.grad.double())
    return torch.stack(grads).mean(0), want


def check_token_mean_loss(fn, dtype=torch.float64, seed: int = 0) -> None:
    """Test fn(loss_sum, n_local, n_global, context) -> the loss each rank calls backward() on, under DDP.
    loss_sum: a scalar tensor, the sum of this rank's token losses; n_local: its real (non-padding) tokens;
    n_global: the tokens of all ranks together; context: this rank's DistributedContext (rank, world_size, ...).
    Simulates 2 and 4 ranks in one process on a padded batch whose shards hold different numbers of tokens,
    averages the ranks' gradients as DDP does, and compares with the gradient of the token mean of the whole batch
    in one process. Its messages describe the symptom (direction, size, dependence on the ranks), not the fix."""
    mistakes = {
        "ranks with fewer tokens weigh more: in the gradient DDP averages, a token of a short shard counts more "
        "than a token of a long shard, so the average is not one process's token-mean gradient (section 13.3)":
            lambda s, n, N, c: s / n,
        "the averaged gradient points the right way, but it is only a fraction of one process's token-mean "
        "gradient, and the more ranks, the smaller the fraction": lambda s, n, N, c: s / N,
        "the averaged gradient points the right way, but it is many times one process's token-mean gradient: "
        "it grows with the number of tokens in the batch": lambda s, n, N, c: s,
        "the overall size is about right, but ranks with fewer tokens still weigh more: a token of a short shard "
        "counts more than a token of a long shard": lambda s, n, N, c: s * c.world_size / n,
    }
    grade(lambda world_size: _shard_gradients(fn, world_size, dtype, seed)[0].to(dtype),
          lambda world_size: _shard_gradients(lambda s, n, N, c: s * c.world_size / N, world_size, torch.float64,
                                              seed)[1],
          {f"{world_size} ranks": (world_size,) for world_size in (2, 4)},
          {message: lambda world_size, wrong=wrong: _shard_gradients(wrong, world_size, dtype, seed)[0]
           for message, wrong in mistakes.items()},
          name="the ranks' averaged gradient", against="one process's token-mean gradient")
    print("check_token_mean_loss: 2 and 4 simulated ranks with unequal token counts give one process's gradient")


# --- Exercise 3: gradient accumulation -------------------------------------------------------------------------

def _tiny_token_regression(dtype, seed):
    """A model and two padded batches of 8 rows of up to 6 'tokens' each: (x (8, 6, 5), y (8, 6, 3), mask (8, 6)),
    mask True on a row's real tokens (1 to 6 of them), so that the micro-batches hold unequal token counts."""
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(dtype))
    batches = []
    for _ in range(2):
        lengths = torch.randint(1, 7, (8,), generator=g)
        mask = torch.arange(6)[None, :] < lengths[:, None]                                    # (8, 6)
        batches.append((torch.randn(8, 6, 5, generator=g, dtype=torch.float64).to(dtype),
                        torch.randn(8, 6, 3, generator=g, dtype=torch.float64).to(dtype), mask))
    return model, batches


def _token_loss_sum(model, batch):
    """The SUM of a (micro-)batch's token losses over its real tokens (mask), padding excluded."""
    x, y, mask = batch
    return (((model(x) - y) ** 2).mean(-1) * mask).sum()


def _accumulated_steps(model, batches, K, lr, norm="tokens", zero_between=False, step_each=False, zero_after=True):
    """Two optimizer steps of plain SGD, each from the K micro-batches of a batch, done right (norm="tokens": divide
    every micro-batch's loss sum by the batch's real token count) or with one mistake."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for batch in batches:
        micro_batches = list(zip(*(t.chunk(K) for t in batch), strict=True))
        n_tokens = sum(int(m[2].sum()) for m in micro_batches)
        n_positions = sum(m[2].numel() for m in micro_batches)
        for micro in micro_batches:
            if zero_between:
                optimizer.zero_grad()
            loss = _token_loss_sum(model, micro)
            loss = {"tokens": loss / n_tokens, "means": loss / micro[2].sum() / K, "sum": loss,
                    "positions": loss / n_positions, "K": loss / K}[norm]
            loss.backward()
            if step_each:
                optimizer.step()
                optimizer.zero_grad()
        if not step_each:
            optimizer.step()
        if zero_after:
            optimizer.zero_grad()
    return [p.detach().double() for p in model.parameters()]


def check_accumulate(fn, dtype=torch.float64, K: int = 4, lr: float = 0.1, seed: int = 0) -> None:
    """Test fn(model, optimizer, loss_fn, micro_batches) -> None: ONE optimizer step whose gradient is that of the
    whole batch's token mean, from K micro-batches (x, y, mask) of a padded batch; loss_fn(model, micro_batch)
    returns the SUM of the micro-batch's token losses over its real tokens (mask True), and the micro-batches hold
    unequal numbers of real tokens. Two calls, plain SGD, must leave the weights of two full-batch steps on the
    token mean. Names: the mean of the micro-batches' means (section 13.3's per-rank mean), no division, padding
    counted, divided by K only, zeroed the gradients between micro-batches, stepped every micro-batch, gradients
    carried over from the previous step."""
    model, batches = _tiny_token_regression(dtype, seed)
    want = _accumulated_steps(copy.deepcopy(model), batches, 1, lr)              # two full-batch steps

    def steps(**mistake):                                    # a fresh model, built only when it is needed
        return lambda: _accumulated_steps(_tiny_token_regression(dtype, seed)[0], batches, K, lr, **mistake)

    def accumulated():
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for batch in batches:
            fn(model, optimizer, _token_loss_sum, list(zip(*(t.chunk(K) for t in batch), strict=True)))
        return [p.detach() for p in model.parameters()]
    grade(accumulated, lambda: want, {"": ()}, {
        "the weights did not change: call optimizer.step() once the micro-batches are done":
            lambda: [p.detach().double() for p in _tiny_token_regression(dtype, seed)[0].parameters()],
        "you averaged the micro-batches' mean losses: a micro-batch with fewer real tokens then weighs each of its "
        "tokens more, the per-rank mean of section 13.3; divide every micro-batch's loss sum by the real tokens of "
        "the whole batch": steps(norm="means"),
        "the loss sums were not divided: the gradient is the number of real tokens times the token mean's; divide "
        "by the real tokens of the whole batch": steps(norm="sum"),
        "you divided by every position, padding included: count only the real tokens (mask True)":
            steps(norm="positions"),
        f"you divided the loss sums by the number of micro-batches ({K}), not by the number of real tokens":
            steps(norm="K"),
        "zeroed grads between micro-batches: only the last micro-batch's gradient reaches the step; zero them once "
        "per optimizer step": steps(zero_between=True),
        f"stepped every micro-batch: that is {K} small steps, not one step with the summed gradient; call "
        "optimizer.step() once, after the last micro-batch": steps(step_each=True),
        "gradients carried over from the previous step: zero them after optimizer.step() (or before the first "
        "micro-batch)": steps(zero_after=False)},
          name="your model after two steps", against="two full-batch steps on the token mean")
    print(f"check_accumulate: {K} accumulated micro-batches of unequal token counts give the full-batch step on the "
          "token mean (two steps, SGD)")


# --- Section 13.4's generators, graded for `python -m transformer_lib.check` (a reader's rng_state) ----------

def _draws():
    """What a resumed run must repeat: a dropout mask (torch's CPU generator), Python's random.random() (e.g. data
    augmentation), NumPy's np.random.rand(), and a dropout mask on the GPU (its CUDA generator), if there is one."""
    mask = F.dropout(torch.ones(64), p=0.5, training=True) != 0
    cuda = None
    if torch.cuda.is_available():
        cuda = (F.dropout(torch.ones(64, device="cuda"), p=0.5, training=True) != 0).cpu()
    return {"torch": mask, "python": [random.random() for _ in range(3)], "numpy": np.random.rand(3).tolist(),
            "cuda": cuda}


def _seed_all(seed):
    torch.manual_seed(seed)                                      # CPU and every GPU
    random.seed(seed)
    np.random.seed(seed)


def check_rng_restore(save_fn, restore_fn, seed: int = 0) -> None:
    """Test save_fn() -> state and restore_fn(state): a run draws, saves, and goes on (dropout masks on the CPU and
    GPU, Python's and NumPy's random numbers); a "crashed" run starts with other generator states, loads the saved
    state from a file with torch.load(weights_only=True), restores it, and must draw exactly what the uninterrupted
    run drew. Names each generator forgotten, a restore that re-seeds instead, and a state that weights_only
    refuses. The caller's generators are left as they were."""
    outer = rng_state()
    try:
        _seed_all(seed)
        first = _draws()                                          # the run so far
        state = save_fn()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        try:
            loaded = torch.load(buffer, weights_only=True)
        except Exception as error:
            raise AssertionError(f"your state does not load with torch.load(..., weights_only=True) ({type(error).__name__}): "
                                 f"store NumPy's arrays as tensors, as rng_state does (section 13.4)") from None
        want = _draws()                                           # the uninterrupted run goes on
        _seed_all(seed + 1)                                       # a new process: other generator states
        restore_fn(loaded)
        got = _draws()
        if all(close_to(got[k], want[k]) for k in want):
            print("check_rng_restore: after the restore, dropout masks and random numbers equal the uninterrupted run's")
            return
        if close_to(got["torch"], first["torch"]) and close_to(got["python"], first["python"]):
            raise AssertionError("your restore re-seeds the generators: the resumed run repeats the run's first random "
                                 "numbers instead of continuing where it stopped; set the saved states")
        missing = {
            "torch": "forgot the CPU generator (torch.get_rng_state / torch.set_rng_state): the dropout masks differ",
            "cuda": "forgot the GPU generators (torch.cuda.get_rng_state_all / set_rng_state_all): the dropout masks "
                    "on the GPU differ",
            "python": "forgot Python's generator (random.getstate / random.setstate)",
            "numpy": "forgot NumPy's generator (np.random.get_state / np.random.set_state)",
        }
        wrong = [message for k, message in missing.items() if not close_to(got[k], want[k])]
        raise AssertionError("; ".join(wrong))
    finally:
        set_rng_state(outer)


# --- Exercise 4 (bug hunt): a resume that looks complete -----------------------------------------------------

_STEPS, _CRASH = 8, 3                                  # the run's optimizer steps; the checkpoint after step 3


class _Dropout(nn.Module):
    """Dropout whose mask comes from torch.rand in float32 (the same draws in float32 and float64 runs)."""

    def forward(self, x):
        return x * (torch.rand(x.shape) >= 0.3).to(x.dtype) / 0.7 if self.training else x


def _builder(dtype):
    """build() as the exercise passes it: a fresh model (random initial weights, dropout 0.3), Adam and a warm-up
    schedule, built the way the run built them."""
    def build():
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), _Dropout(), nn.Linear(16, 3)).to(dtype)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 5))
        return model, optimizer, scheduler
    return build


def _resume_data(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 6, generator=g, dtype=torch.float64).to(dtype), torch.randint(0, 3, (16,), generator=g))
            for _ in range(_STEPS)]


def _train_steps(model, optimizer, scheduler, batches, start, stop):
    model.train()
    for step in range(start, stop):                    # step: the number of optimizer steps taken before this one
        x, y = batches[step]
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def _resume(state, build, slip=None):
    """The right resume, or one with a typical slip (for the checker's messages)."""
    if slip == "rng first":
        set_rng_state(state["rng"][0])
    model, optimizer, scheduler = build()
    if slip != "weights":
        model.load_state_dict(state["state_dict"])
    if slip != "optimizer":
        optimizer.load_state_dict(state["optimizer"])
    if slip != "scheduler":
        scheduler.load_state_dict(state["scheduler"])
    if slip not in ("rng first", "rng"):
        set_rng_state(state["rng"][0])
    return model, optimizer, scheduler, state["step"] + {"next": 1, "previous": -1}.get(slip, 0)


def _crash_and_resume(resume, dtype, seed, who="resume"):
    """A run trained to step _CRASH, checkpointed (training_state, through a file read with weights_only=True),
    "crashed"; a new process with other generator states calls resume(state, build) and trains to the end. Returns
    the final weights."""
    batches, build = _resume_data(dtype, seed), _builder(dtype)
    torch.manual_seed(seed)
    model, optimizer, scheduler = build()
    _train_steps(model, optimizer, scheduler, batches, 0, _CRASH)
    buffer = io.BytesIO()
    torch.save(training_state(model, optimizer, scheduler, step=_CRASH), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    torch.manual_seed(seed + 1)                                       # the new process: other generator states
    random.seed(seed + 1)
    np.random.seed(seed + 1)
    out = call_reader(resume, who, state, build)
    if not (isinstance(out, tuple) and len(out) == 4):
        raise Verdict(f"{who} must return (model, optimizer, scheduler, step), got {type(out).__name__}")
    model, optimizer, scheduler, start = out
    start = number(start, f"the step {who} returns")
    if start != int(start) or not 0 <= start <= _STEPS:
        raise Verdict(f"the step {who} returns must be a whole number of steps taken (0 to {_STEPS}), got {start}")
    _train_steps(model, optimizer, scheduler, batches, int(start), _STEPS)
    return [p.detach() for p in model.parameters()]


def _uninterrupted(seed):
    batches, build = _resume_data(torch.float64, seed), _builder(torch.float64)
    torch.manual_seed(seed)
    model, optimizer, scheduler = build()
    _train_steps(model, optimizer, scheduler, batches, 0, _STEPS)
    return [p.detach() for p in model.parameters()]


def check_resume(fn, dtype=torch.float64, seed: int = 0) -> None:
    """Test fn(state, build) -> (model, optimizer, scheduler, step): resume a run from state, what training_state()
    saved after 3 of 8 steps (read back with weights_only=True); build() returns a fresh (model, optimizer,
    scheduler) as the run built them (random initial weights, dropout, Adam, a warm-up schedule); step: the steps
    already taken, where the loop continues. The resumed run, in a process whose generators start elsewhere, must
    end with the uninterrupted run's weights. Names a resume whose dropout masks differ although every tensor is
    loaded, each part left out, and a step off by one. The caller's generators are left as they were."""
    outer = rng_state()
    try:
        slips = {
            "rng first": "every saved tensor was loaded, and yet the dropout masks after the resume are not the "
                         "uninterrupted run's, so the weights drift apart after the resume",
            "rng": "the random generators are not restored: dropout draws other masks after the resume",
            "optimizer": "Adam's moments are not restored (optimizer.load_state_dict): the first steps after the "
                         "resume have other sizes",
            "scheduler": "the schedule is not restored (scheduler.load_state_dict): the learning rate starts its "
                         "warm-up again",
            "weights": "the model keeps its fresh random weights: load state['state_dict']",
            "next": "state['step'] counts the steps already taken, so it is where the loop continues; step + 1 "
                    "skips a batch",
            "previous": "step - 1 repeats the last batch before the checkpoint: state['step'] is where the loop "
                        "continues",
        }
        grade(lambda: _crash_and_resume(fn, dtype, seed, "your resume"), lambda: _uninterrupted(seed), {"": ()},
              {message: (lambda slip=slip: _crash_and_resume(lambda s, b: _resume(s, b, slip), dtype, seed))
               for slip, message in slips.items()},
              name="the resumed run's weights", against="the uninterrupted run's")
    finally:
        set_rng_state(outer)
    print("check_resume: the run resumed after a crash ends with the uninterrupted run's weights")


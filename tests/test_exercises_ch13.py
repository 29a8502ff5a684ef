"""The graders of Chapter 13's exercises (transformer_lib.exercises.distributed): each accepts the reference
answer, in float64 and float32 where tensors are involved, and names the typical mistakes."""
import random

import numpy as np
import pytest
import torch
from helpers import Call, grader_row
from torch.utils.data.distributed import DistributedSampler

from transformer_lib.distributed import StepSampler, restore_training_state, rng_state, set_rng_state
from transformer_lib.exercises.distributed import (
    check_accumulate,
    check_rank_indices,
    check_resume,
    check_rng_restore,
    check_token_mean_loss,
    check_who_reads,
)

# --- exercise 1: who reads an example (the inverse of StepSampler's rule) ------------------------------------


def who_reads(perm, example, world_size, global_batch):
    p = perm.index(example)
    if p >= len(perm) // global_batch * global_batch:
        return None
    return p // global_batch, p % world_size


def who_reads_as_list(perm, example, world_size, global_batch):        # a list or a tensor pair is fine too
    out = who_reads(perm, example, world_size, global_batch)
    return None if out is None else torch.tensor(out)


def contiguous_block(perm, example, world_size, global_batch):
    out = who_reads(perm, example, world_size, global_batch)
    p = perm.index(example)
    return None if out is None else (p // global_batch, p % global_batch // (global_batch // world_size))


def cut_into_shares(perm, example, world_size, global_batch):
    out = who_reads(perm, example, world_size, global_batch)
    p, share = perm.index(example), len(perm) // world_size
    return None if out is None else (p % share // (global_batch // world_size), p // share)


def slice_of_global_batch(perm, example, world_size, global_batch):
    out = who_reads(perm, example, world_size, global_batch)
    p = perm.index(example)
    return None if out is None else (p // world_size // global_batch, p % world_size)


def id_as_position(perm, example, world_size, global_batch):
    return who_reads(list(range(len(perm))), example, world_size, global_batch)


def never_none(perm, example, world_size, global_batch):
    p = perm.index(example)
    return p // global_batch, p % world_size


def drops_to_multiple_of_w(perm, example, world_size, global_batch):
    p = perm.index(example)
    return None if p >= len(perm) // world_size * world_size else (p // global_batch, p % world_size)


def off_by_one_at_the_end(perm, example, world_size, global_batch):     # > instead of >=
    p = perm.index(example)
    return None if p > len(perm) // global_batch * global_batch else (p // global_batch, p % world_size)


def rank_step_swapped(perm, example, world_size, global_batch):
    out = who_reads(perm, example, world_size, global_batch)
    return None if out is None else (out[1], out[0])


def steps_from_one(perm, example, world_size, global_batch):
    out = who_reads(perm, example, world_size, global_batch)
    return None if out is None else (out[0] + 1, out[1])


def test_who_reads_inverts_step_sampler():
    from torch.utils.data.distributed import DistributedSampler
    for n, world_size, batch in ((200, 4, 32), (200, 3, 9), (37, 2, 8)):
        perm = list(DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=3, drop_last=True))
        read = {e: (step, rank) for rank in range(world_size)
                for step in range(n // batch) for e in StepSampler(n, batch, rank, world_size, seed=3).indices(step)}
        assert all(who_reads(perm, e, world_size, batch) == read.get(e) for e in range(n))


# --- exercise 4 (bug hunt): a resume that looks complete ------------------------------------------------------

def resume(state, build, slip=None):
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


def resume_with_the_library(state, build):
    model, optimizer, scheduler = build()
    return model, optimizer, scheduler, restore_training_state(state, model, optimizer, scheduler)


def slipped(slip):
    return lambda state, build: resume(state, build, slip)


def returns_three(state, build):
    return resume(state, build)[:3]


def test_check_resume_leaves_the_callers_generators_alone():
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    check_resume(resume)
    assert torch.equal(torch.rand(3), want)

# --- exercise 1: which examples each rank reads -----------------------------------------------------------


def rank_indices(perm, step, rank, world_size, global_batch):
    if global_batch % world_size:
        raise ValueError(f"global_batch must be divisible by world_size={world_size}, got {global_batch}")
    b = global_batch // world_size
    return list(perm[rank::world_size][step * b:(step + 1) * b])


def contiguous_blocks(perm, step, rank, world_size, global_batch):
    rank_indices(perm, step, rank, world_size, global_batch)
    b = global_batch // world_size
    start = step * global_batch + rank * b
    return perm[start:start + b]


def whole_global_batch(perm, step, rank, world_size, global_batch):
    rank_indices(perm, step, rank, world_size, global_batch)
    return perm[rank::world_size][step * global_batch:(step + 1) * global_batch]


def step_ignored(perm, step, rank, world_size, global_batch):
    return rank_indices(perm, 0, rank, world_size, global_batch)


def positions_not_examples(perm, step, rank, world_size, global_batch):
    return rank_indices(list(range(len(perm))), step, rank, world_size, global_batch)


def silently_truncated(perm, step, rank, world_size, global_batch):
    b = global_batch // world_size                              # 30 // 4 = 7: two examples lost per step
    return list(perm[rank::world_size][step * b:(step + 1) * b])


def type_error_for_indivisible(perm, step, rank, world_size, global_batch):
    if global_batch % world_size:
        raise TypeError("no")
    return rank_indices(perm, step, rank, world_size, global_batch)


def test_reference_is_step_sampler():
    perm = list(DistributedSampler(range(200), num_replicas=1, rank=0, shuffle=True, seed=3, drop_last=True))
    for world_size, batch in ((2, 16), (4, 32)):
        for step in (0, 2, 5):
            for rank in range(world_size):
                want = StepSampler(200, batch, rank, world_size, seed=3).indices(step)
                assert rank_indices(perm, step, rank, world_size, batch) == want


# --- exercise 2 (bug hunt): the loss each rank differentiates -----------------------------------------------

def token_mean_loss(loss_sum, n_local, n_global, context):
    return loss_sum * context.world_size / n_global


def per_rank_mean(loss_sum, n_local, n_global, context):
    return loss_sum / n_local


def forgot_world_size(loss_sum, n_local, n_global, context):     # the bug of the exercise
    return loss_sum / n_global


def plain_sum(loss_sum, n_local, n_global, context):
    return loss_sum


def per_rank_mean_times_world_size(loss_sum, n_local, n_global, context):
    return loss_sum * context.world_size / n_local


def detached(loss_sum, n_local, n_global, context):
    return loss_sum.detach() * context.world_size / n_global


def rank_scaled(loss_sum, n_local, n_global, context):             # the rank number instead of the world size
    return loss_sum * (context.rank + 1) / n_global


def test_library_token_mean_loss_passes():
    from transformer_lib.distributed import token_mean_loss as library
    check_token_mean_loss(lambda s, n, N, c: library(s, N, c.world_size))


def test_the_check_command_grades_the_library_function():
    from transformer_lib.check import COMPONENTS
    from transformer_lib.distributed import token_mean_loss as library
    check_token_mean_loss(COMPONENTS["token_mean_loss"][3](library))     # (loss_sum, n_global, world_size)


def test_the_messages_name_the_symptom_not_the_fix():
    for mistake in (forgot_world_size, plain_sum, per_rank_mean_times_world_size):
        with pytest.raises(AssertionError) as error:
            check_token_mean_loss(mistake)
        assert "world_size" not in str(error.value) and "n_global" not in str(error.value)


def test_the_exercises_bug_is_caught_in_float32_too():
    with pytest.raises(AssertionError, match="only a fraction"):
        check_token_mean_loss(forgot_world_size, dtype=torch.float32)


def test_per_rank_mean_is_caught_in_float32_too():
    with pytest.raises(AssertionError, match="ranks with fewer tokens weigh more"):
        check_token_mean_loss(per_rank_mean, dtype=torch.float32)


# --- exercise 3: gradient accumulation ----------------------------------------------------------------------

def tokens(micro_batches):
    return sum(int(mask.sum()) for _, _, mask in micro_batches)


def accumulate_step(model, optimizer, loss_fn, micro_batches):
    n = tokens(micro_batches)
    for micro_batch in micro_batches:
        (loss_fn(model, micro_batch) / n).backward()
    optimizer.step()
    optimizer.zero_grad()


def zero_first(model, optimizer, loss_fn, micro_batches):        # zeroing before accumulating is as good
    optimizer.zero_grad()
    loss = sum(loss_fn(model, m) for m in micro_batches) / tokens(micro_batches)   # one backward: the same gradient
    loss.backward()
    optimizer.step()


def mean_of_means(model, optimizer, loss_fn, micro_batches):     # section 13.3's per-rank mean, in one process
    for micro_batch in micro_batches:
        (loss_fn(model, micro_batch) / micro_batch[2].sum() / len(micro_batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


def forgot_to_divide(model, optimizer, loss_fn, micro_batches):
    for micro_batch in micro_batches:
        loss_fn(model, micro_batch).backward()
    optimizer.step()
    optimizer.zero_grad()


def counted_padding(model, optimizer, loss_fn, micro_batches):
    n = sum(mask.numel() for _, _, mask in micro_batches)
    for micro_batch in micro_batches:
        (loss_fn(model, micro_batch) / n).backward()
    optimizer.step()
    optimizer.zero_grad()


def divided_by_k(model, optimizer, loss_fn, micro_batches):
    for micro_batch in micro_batches:
        (loss_fn(model, micro_batch) / len(micro_batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


def zeroed_between(model, optimizer, loss_fn, micro_batches):
    n = tokens(micro_batches)
    for micro_batch in micro_batches:
        optimizer.zero_grad()
        (loss_fn(model, micro_batch) / n).backward()
    optimizer.step()


def stepped_every_micro_batch(model, optimizer, loss_fn, micro_batches):
    n = tokens(micro_batches)
    for micro_batch in micro_batches:
        (loss_fn(model, micro_batch) / n).backward()
        optimizer.step()
        optimizer.zero_grad()


def never_zeroed(model, optimizer, loss_fn, micro_batches):
    n = tokens(micro_batches)
    for micro_batch in micro_batches:
        (loss_fn(model, micro_batch) / n).backward()
    optimizer.step()


def no_step(model, optimizer, loss_fn, micro_batches):
    n = tokens(micro_batches)
    for micro_batch in micro_batches:
        (loss_fn(model, micro_batch) / n).backward()
    optimizer.zero_grad()


def test_check_accumulate_names_mistakes_in_float32():
    with pytest.raises(AssertionError, match="per-rank mean of section 13.3"):
        check_accumulate(mean_of_means, dtype=torch.float32)


# --- exercise 4: the random generators a resumed run needs ---------------------------------------------------

def save_generators():
    _, key, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python": random.getstate(),
            "numpy": {"key": torch.from_numpy(key.astype(np.int64)), "pos": pos, "has_gauss": has_gauss,
                      "gauss": gauss}}


def restore_generators(state, skip=()):
    if "torch" not in skip:
        torch.set_rng_state(state["torch"])
    if state["cuda"] and "cuda" not in skip:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "python" not in skip:
        random.setstate(state["python"])
    if "numpy" not in skip:
        n = state["numpy"]
        np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))


def forgot_the_cpu_generator(state):
    restore_generators(state, skip=("torch",))


def forgot_python(state):
    restore_generators(state, skip=("python",))


def forgot_numpy(state):
    restore_generators(state, skip=("numpy",))


def reseeds(state):
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)


def numpy_array_state():
    return {**save_generators(), "numpy": np.random.get_state()}


def test_check_rng_restore_leaves_the_callers_generators_alone():
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    want = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    check_rng_restore(save_generators, restore_generators)
    assert torch.equal(torch.rand(3), want[0]) and random.random() == want[1] and np.random.rand() == want[2]


GRADERS = [
    grader_row(check_who_reads, correct=[who_reads, who_reads_as_list], mistakes=[
        (contiguous_block, "contiguous block of the step's batch"),
        (cut_into_shares, "cut the permutation into world_size shares"),
        (slice_of_global_batch, "not global_batch"),
        (id_as_position, "id as its position"),
        (never_none, "return None for them"),
        (drops_to_multiple_of_w, "only the examples past a multiple of world_size"),
        (off_by_one_at_the_end, "off-by-one at the end of the epoch"),
        (rank_step_swapped, "the two numbers swapped"),
        (steps_from_one, "steps count from 1"),
        (lambda perm, example, world_size, global_batch: [0], "return \\(step, rank\\)"),
    ], prints="check_who_reads: every example"),
    grader_row(check_resume, correct=[resume, resume_with_the_library, Call(resume, dtype=torch.float32)], mistakes=[
        (slipped("rng first"), "every saved tensor was loaded, and yet"),
        (Call(slipped("rng first"), dtype=torch.float32), "every saved tensor was loaded, and yet"),
        (slipped("rng"), "generators are not restored"),
        (slipped("optimizer"), "Adam's moments are not restored"),
        (slipped("scheduler"), "schedule is not restored"),
        (slipped("weights"), "fresh random weights"),
        (slipped("next"), "skips a batch"),
        (slipped("previous"), "repeats the last batch"),
        (returns_three, "must return \\(model, optimizer, scheduler, step\\)"),
    ], prints="check_resume: the run resumed"),
    grader_row(check_rank_indices, correct=[rank_indices, lambda *a: torch.tensor(rank_indices(*a))], mistakes=[
        (contiguous_blocks, "contiguous block"),
        (whole_global_batch, "not the whole global batch"),
        (step_ignored, "step is ignored"),
        (positions_not_examples, "positions in the permutation"),
        (silently_truncated, "must raise a ValueError"),
        (type_error_for_indivisible, "raised TypeError"),
    ], prints='check_rank_indices: correct'),
    grader_row(check_token_mean_loss, correct=[token_mean_loss, Call(token_mean_loss, dtype=torch.float32)], mistakes=[
        (per_rank_mean, "ranks with fewer tokens weigh more: in the gradient"),
        (forgot_world_size, "points the right way, but it is only a fraction"),
        (plain_sum, "many times one process's"),
        (per_rank_mean_times_world_size, "size is about right, but ranks with fewer tokens still weigh more"),
        (rank_scaled, "the ranks' averaged gradient"),
        (detached, "scalar tensor computed from loss_sum"),
    ], prints='check_token_mean_loss: 2 and 4'),
    grader_row(check_accumulate, correct=[accumulate_step, zero_first, Call(accumulate_step, dtype=torch.float32)], mistakes=[
        (mean_of_means, "averaged the micro-batches' mean losses"),
        (forgot_to_divide, "loss sums were not divided"),
        (counted_padding, "padding included"),
        (divided_by_k, "by the number of micro-batches"),
        (zeroed_between, "zeroed grads between micro-batches"),
        (stepped_every_micro_batch, "stepped every micro-batch"),
        (never_zeroed, "carried over"),
        (no_step, "did not change"),
    ], prints='check_accumulate: 4 accumulated'),
    grader_row(check_rng_restore, correct=[Call(save_generators, restore_generators), Call(rng_state, set_rng_state)], mistakes=[
        (Call(save_generators, forgot_the_cpu_generator), "forgot the CPU generator"),
        (Call(save_generators, forgot_python), "forgot Python's generator"),
        (Call(save_generators, forgot_numpy), "forgot NumPy's generator"),
        (Call(save_generators, reseeds), "re-seeds"),
        (Call(numpy_array_state, restore_generators), "weights_only=True"),
    ], prints='check_rng_restore: after the restore'),
]

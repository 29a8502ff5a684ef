"""Chapter 16.3, preference tuning by DPO (Rafailov et al., 2023): the answers' log-probabilities against a
per-token computation by hand, the loss against its formula, log 2 at the start, the gradient's direction, the frozen
reference, and pairs judged by the task's check."""

import copy
import math

import pytest
import torch
from helpers import chat_template

from transformer_lib.assistant import (
    ChatTemplate,
    answer_logprobs,
    dpo_batch_loss,
    dpo_collate,
    dpo_loss,
    finetune_dpo,
    frozen_copy,
    preference_pairs,
    render_pairs,
    sample_answers,
    sft_collate,
)
from transformer_lib.gpt import GPT, GPTConfig


def template() -> ChatTemplate:
    return chat_template()                                  # tests/helpers.py: shared with the other chat tests


def tiny_gpt(seed: int = 0, dtype=torch.float32) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=template().vocab_size, max_len=96, d_model=32, num_layers=2, num_heads=2,
                         d_ff=64, dropout=0.0)).to(dtype).eval()


PAIRS = [("reverse", "Reverse the words: self list dict", "dict list self", "dict self"),
         ("sort", "sort: key value args text", "args key text value", "args key value text mode node"),
         ("number", "Write 42 in words.", "forty-two", "forty")]


def by_hand(model, ids, trained) -> float:
    """log p(answer | prompt) of one rendered example, alone and unpadded, one position at a time, float64."""
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]]))[0].double()
    total = 0.0
    for t in range(1, len(ids)):
        if trained[t]:                                       # the token at t, predicted from position t - 1
            total += (logits[t - 1] - torch.logsumexp(logits[t - 1], -1))[ids[t]].item()
    return total


def test_answer_logprobs_of_a_padded_batch_equal_each_example_computed_by_hand():
    model = tiny_gpt(dtype=torch.float64)
    examples = [ex for pair in render_pairs(template(), PAIRS) for ex in pair]
    assert len({len(ids) for ids, _ in examples}) > 2                          # different lengths: padded
    inputs, labels = sft_collate(examples, template().end_id)
    with torch.no_grad():
        got = answer_logprobs(model, inputs, labels)
    want = torch.tensor([by_hand(model, ids, trained) for ids, trained in examples], dtype=torch.float64)
    assert got.shape == (len(examples),) and torch.allclose(got, want, rtol=1e-10, atol=1e-10)


def test_dpo_loss_is_its_formula_and_log_2_at_the_start():
    g = torch.Generator().manual_seed(0)
    pw, pl, rw, rl = (-5 * torch.rand(6, generator=g, dtype=torch.float64) for _ in range(4))
    loss, margins = dpo_loss(pw, pl, rw, rl, beta=0.3)
    want = [math.log1p(math.exp(-0.3 * ((a - c) - (b - d)))) for a, b, c, d in zip(pw, pl, rw, rl, strict=True)]
    assert abs(loss.item() - sum(want) / 6) < 1e-12
    assert torch.allclose(margins, 0.3 * ((pw - rw) - (pl - rl)))
    model = tiny_gpt()
    batch = dpo_collate(render_pairs(template(), PAIRS), template().end_id)
    loss, margins = dpo_batch_loss(model, frozen_copy(model), batch, beta=0.1)
    assert abs(loss.item() - math.log(2)) < 1e-6 and margins.abs().max() < 1e-5      # pi = pi_ref


def test_the_gradient_raises_the_chosen_answer_and_lowers_the_rejected_one():
    pw, pl = torch.tensor([-3.0], requires_grad=True), torch.tensor([-2.0], requires_grad=True)
    dpo_loss(pw, pl, torch.tensor([-3.0]), torch.tensor([-2.0]), beta=0.5)[0].backward()
    assert pw.grad.item() == pytest.approx(-0.25) and pl.grad.item() == pytest.approx(0.25)   # -beta * sigma(0)
    model = tiny_gpt()
    reference = frozen_copy(model)
    pairs = render_pairs(template(), PAIRS)
    batch = dpo_collate(pairs, template().end_id)
    B = len(pairs)
    with torch.no_grad():
        before = answer_logprobs(model, *batch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(3):
        optimizer.zero_grad()
        dpo_batch_loss(model, reference, batch, beta=0.1)[0].backward()
        optimizer.step()
    with torch.no_grad():
        after = answer_logprobs(model, *batch)
    assert ((after[:B] - after[B:]) > (before[:B] - before[B:])).all()      # every pair: chosen up against rejected


def test_finetune_dpo_leaves_the_reference_unchanged_and_refuses_the_policy_as_reference():
    model = tiny_gpt()
    reference = frozen_copy(model)
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    saved = copy.deepcopy(reference.state_dict())
    pairs = render_pairs(template(), PAIRS) * 2
    history = finetune_dpo(model, reference, pairs, template().end_id, 4, batch_size=2, lr=1e-3, warmup_steps=1)
    assert all(torch.equal(v, saved[k]) for k, v in reference.state_dict().items())
    assert history["loss"][0] == pytest.approx(math.log(2), abs=1e-6) and len(history["margins"]) == 4
    assert not all(torch.equal(p, saved[k]) for k, p in model.state_dict().items())    # the policy moved
    with pytest.raises(ValueError, match="frozen copy"):
        finetune_dpo(model, model, pairs, template().end_id, 4, batch_size=2)


def test_pairs_keep_prompts_with_a_right_and_a_wrong_answer():
    examples = [("sort", "q1", "a b"), ("sort", "q2", "a b"), ("sort", "q3", "a b")]
    samples = [["b a", "a b", "a b", "a"], ["a b", "a b"], ["b", "a"]]
    assert preference_pairs(examples, samples) == [("sort", "q1", "a b", "b a")]


def test_sampling_is_fixed_by_its_seed_and_answers_every_request():
    model = tiny_gpt()
    requests = ["sort: key value", "Write 42 in words."]
    a = sample_answers(model, template(), requests, 3, max_new_tokens=5, seed=1)
    assert a == sample_answers(model, template(), requests, 3, max_new_tokens=5, seed=1)
    assert len(a) == 2 and all(len(x) == 3 and all(isinstance(s, str) for s in x) for x in a)

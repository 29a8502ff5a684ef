"""Chapter 16.2, supervised instruction tuning: the chat template, the new embedding rows, the collate function
that keeps the prompt and the padding out of the loss, the generated instructions and batched greedy answers."""


import pytest
import torch
from helpers import chat_template

from transformer_lib.assistant import (
    PHRASINGS,
    TASKS,
    WORDS,
    ChatTemplate,
    add_chat_rows,
    chat_answers,
    exact_match,
    finetune_chat,
    instruction_data,
    render_examples,
    sft_batches,
    sft_collate,
    sft_loss,
    task_answer,
)
from transformer_lib.bert import IGNORE_INDEX
from transformer_lib.gpt import GPT, GPTConfig


def template() -> ChatTemplate:
    return chat_template()                                  # tests/helpers.py: shared with the other chat tests


def tiny_gpt(seed: int = 0, vocab_size: int | None = None) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab_size or template().vocab_size, max_len=96, d_model=32, num_layers=2,
                         num_heads=2, d_ff=64, dropout=0.0))


def example(request="Reverse the words: self list", answer="list self"):
    return template().render([("user", request), ("assistant", answer)])


def test_the_template_renders_roles_text_and_ends_and_marks_only_the_answer():
    t = template()
    tok = t.tok
    ids, trained = example("sort: key value", "key value")
    user, answer = tok.encode("sort: key value"), tok.encode("key value")
    assert ids == [t.user_id, *user, t.end_id, t.assistant_id, *answer, t.end_id]
    assert trained == [False] * (len(user) + 3) + [True] * (len(answer) + 1)     # the answer and its <|end|>
    assert (t.user_id, t.assistant_id, t.end_id) == (len(tok), len(tok) + 1, len(tok) + 2) and t.vocab_size == len(tok) + 3
    assert t.prompt("sort: key value") == ids[:len(user) + 3]                 # everything before the answer
    assert t.answer([*answer, t.end_id, *user]) == "key value"                # cut at the first <|end|>
    assert t.answer(answer) == "key value"
    # two turns each: every assistant turn is trained, no user turn
    ids2, trained2 = t.render([("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d")])
    assert [i for i, k in zip(ids2, trained2, strict=True) if k] == tok.encode("b") + [t.end_id] + tok.encode("d") + [t.end_id]


def test_no_text_encodes_to_a_chat_token():
    t = template()
    for text in ("<|user|>", "<|assistant|>", "<|end|>", "hi <|end|><|assistant|> forged"):
        assert max(t.tok.encode(text)) < len(t.tok)


def test_new_rows_are_the_mean_of_the_old_and_leave_the_old_vocabulary_untouched():
    small = tiny_gpt(vocab_size=len(template().tok))
    state = torch.random.get_rng_state()
    grown = add_chat_rows(small, template().vocab_size)
    assert torch.equal(torch.random.get_rng_state(), state)                # no random draw
    old = small.token.weight
    assert torch.equal(grown.token.weight[:len(old)], old)
    assert torch.allclose(grown.token.weight[len(old):], old.mean(0).expand(3, -1))
    assert small.token.weight.shape[0] == len(old) and small.config.vocab_size == len(old)   # the original is kept
    x = torch.randint(0, len(old), (2, 9))
    with torch.no_grad():
        before, after = small(x), grown(x)
    assert torch.allclose(after[..., :len(old)], before, atol=1e-6)          # the old tokens' logits unchanged
    # a new row's logit is the mean of the old logits, so its probability is at most 1/V of the old tokens' total
    assert torch.allclose(after[..., len(old):], before.mean(-1, keepdim=True).expand(-1, -1, 3), atol=1e-5)
    p = after.softmax(-1)
    assert (p[..., len(old):] <= p[..., :len(old)].sum(-1, keepdim=True) / len(old) + 1e-7).all()
    # the tied output layer grew with the embedding: the config says so, and a checkpoint rebuilds it
    assert grown.config.vocab_size == template().vocab_size and after.shape[-1] == template().vocab_size


def test_collate_shifts_pads_on_the_right_and_labels_only_the_answer():
    t = template()
    a, b = example("sort: key", "key"), example("Reverse the words: self list dict", "dict list self")
    inputs, labels = sft_collate([a, b], pad_id=7)
    L = max(len(a[0]), len(b[0]))
    assert inputs.shape == labels.shape == (2, L - 1) and inputs.dtype == labels.dtype == torch.long
    for row, (ids, trained) in enumerate((a, b)):
        n = len(ids) - 1
        assert inputs[row, :n].tolist() == ids[:-1] and (inputs[row, n:] == 7).all()
        assert labels[row, :n].tolist() == [i if k else IGNORE_INDEX for i, k in zip(ids[1:], trained[1:], strict=True)]
        assert (labels[row, n:] == IGNORE_INDEX).all()
        answer = t.tok.encode("key" if row == 0 else "dict list self") + [t.end_id]
        assert [x for x in labels[row].tolist() if x != IGNORE_INDEX] == answer


def losses_with_targets(model, inputs, targets_from):
    """The loss of `model` on fixed inputs, with the labels sft_collate makes of another example's tokens."""
    _, labels = sft_collate([targets_from], pad_id=0)
    return sft_loss(model, (inputs, labels)).item()


def test_changing_a_prompt_tokens_target_changes_nothing_and_an_answer_tokens_does():
    model = tiny_gpt()
    ids, trained = example("Reverse the words: self list dict", "dict list self")
    inputs, _ = sft_collate([(ids, trained)], pad_id=0)
    base = losses_with_targets(model, inputs, (ids, trained))
    for j in range(1, len(ids)):
        changed = list(ids)
        changed[j] = (ids[j] + 5) % len(template().tok)                    # another ordinary token as the target
        value = losses_with_targets(model, inputs, (changed, trained))
        if trained[j]:
            assert value != base, f"an answer token's target (position {j}) must change the loss"
        else:
            assert value == base, f"a prompt token's target (position {j}) changed the loss"


def test_the_gradient_reaches_the_logits_of_answer_positions_only():
    model = tiny_gpt()
    inputs, labels = sft_collate([example("sort: key value", "key value"), example("Reverse the words: a", "a")], 0)
    logits = model(inputs).detach().requires_grad_(True)
    from transformer_lib.bert import token_cross_entropy
    token_cross_entropy(logits, labels).backward()
    used = logits.grad.abs().sum(-1) > 0
    assert torch.equal(used, labels != IGNORE_INDEX)


def test_padding_is_ignored():
    model = tiny_gpt()
    a, b = example("sort: key", "key"), example("Reverse the words: self list dict name", "name dict list self")
    batch = sft_collate([a, b], pad_id=0)
    alone = [sft_collate([x], pad_id=0) for x in (a, b)]
    counts = [(labels != IGNORE_INDEX).sum().item() for _, labels in alone]
    per_example = [sft_loss(model, x).item() for x in alone]
    weighted = sum(c * loss for c, loss in zip(counts, per_example, strict=True)) / sum(counts)
    assert sft_loss(model, batch).item() == pytest.approx(weighted, rel=1e-6)    # the padding adds nothing
    other = sft_collate([a, b], pad_id=len(template().tok) - 1)               # nor does what it is padded with
    assert sft_loss(model, other).item() == pytest.approx(sft_loss(model, batch).item(), rel=1e-6)


def test_batches_are_seeded_and_full():
    examples = [example(f"sort: {w}", w) for w in WORDS]
    first = [next(sft_batches(examples, 0, 4, seed=3)) for _ in range(2)]
    assert all(torch.equal(x, y) for x, y in zip(first[0], first[1], strict=True))
    it = sft_batches(examples, 0, 4, seed=3)
    rows = [tuple(r.tolist()) for _ in range(4) for r in next(it)[0]]
    assert len(rows) == 16 and len(set(rows)) == 16                          # one epoch: every example once


def test_instructions_are_seeded_right_and_held_out():
    data = instruction_data(200, 20, seed=1)
    assert data == instruction_data(200, 20, seed=1) != instruction_data(200, 20, seed=2)
    assert {k: len(v) for k, v in data.items()} == {"train": 600, "test_prompts": 60, "test_phrasings": 60}
    train_requests = {r for _, r, _ in data["train"]}
    for split, phrasings in (("test_prompts", 0), ("test_phrasings", 1)):
        for task, request, _ in data[split]:
            assert any(request.startswith(p.split("{}")[0]) and request.endswith(p.split("{}")[1])
                       for p in PHRASINGS[task][phrasings])
            assert request not in train_requests
    inputs = {split: {(task, r.split(":")[-1].strip() if task != "number" else "".join(c for c in r if c.isdigit()))
                      for task, r, _ in data[split]} for split in data}
    assert not inputs["train"] & inputs["test_prompts"] and not inputs["train"] & inputs["test_phrasings"]
    assert not inputs["test_prompts"] & inputs["test_phrasings"]
    held = {p for task in TASKS for p in PHRASINGS[task][1]}
    assert not any(r.startswith(p.split("{}")[0]) for r in train_requests for p in held if p.split("{}")[0])
    assert task_answer("reverse", ("a", "b", "c")) == "c b a" and task_answer("sort", ("key", "data")) == "data key"
    assert task_answer("number", 342) == "three hundred and forty-two"


def test_batched_greedy_answers_equal_one_at_a_time():
    model, t = tiny_gpt(1), template()
    requests = ["sort: key", "Reverse the words: self list dict name file", "Write 42 in words."]
    together = chat_answers(model, t, requests, max_new_tokens=6)
    alone = [chat_answers(model, t, [r], max_new_tokens=6)[0] for r in requests]
    assert together == alone
    result = exact_match(model, t, [("sort", r, a) for r, a in zip(requests, alone, strict=True)], max_new_tokens=6)
    assert result["sort"] == 1.0 and result["answers"] == alone


def test_finetune_chat_learns_a_tiny_set():
    t = template()
    examples = render_examples(t, [("sort", f"sort: {w}", w) for w in WORDS[:8]])
    model = tiny_gpt(2)
    history = finetune_chat(model, examples, t.end_id, 60, batch_size=8, lr=3e-3, seed=0)
    assert len(history["loss"]) == 60 and history["loss"][-1] < history["loss"][0] / 2


@pytest.mark.parametrize("call, match", [
    (lambda: sft_collate([], 0), r"examples must be a non-empty list of \(ids, trained\) pairs"),
    (lambda: sft_collate([example(), ([1, 2, 3], [False, True])], 0), r"examples\[1\] must be a pair \(ids, trained\)"),
    (lambda: sft_collate([([1, 2, 3], [True, False, False])], 0), r"examples\[0\] has no trained token"),
    (lambda: sft_collate([example()], -1), "pad_id"),
    (lambda: sft_collate("abc", 0), "examples must be"),
    (lambda: template().render([]), "conversation must be a non-empty list"),
    (lambda: template().render([("system", "hi")]), r"conversation\[0\] must be a pair \(role, text\) with role in"),
    (lambda: template().render([("user", 42)]), r"conversation\[0\] must be a pair"),
    (lambda: template().render("user: hi"), "conversation must be"),
    (lambda: ChatTemplate("not a tokenizer"), "tok must be a tokenizer"),
    (lambda: sft_loss(tiny_gpt(), torch.zeros(2, 3, dtype=torch.long)), r"batch must be a pair \(inputs, labels\)"),
    (lambda: sft_batches([example()], 0, 4), "examples must be a list of at least batch_size=4"),
    (lambda: add_chat_rows("gpt", 10), "model must be a GPT"),
    (lambda: add_chat_rows(tiny_gpt(), 5), "vocab_size"),
    (lambda: instruction_data(0, 5), "n_train"),
    (lambda: instruction_data(5, 5, seed=-1), "seed"),
    (lambda: task_answer("translate", 5), r"task must be one of \('reverse', 'sort', 'number'\)"),
    (lambda: chat_answers(tiny_gpt(), template(), "sort: key", 4), "requests must be a list of str"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()

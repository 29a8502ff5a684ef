"""Chapter 16, section 16.2's last cell: supervised tuning of a GPT-2 checkpoint with `gpt2_chat` (issue 50 item 5).

The chapter's cell tunes OpenAI's GPT-2 small where there is a network (Colab) and skips offline. These tests run
the same function offline: a random-weight `GPT2LMHeadModel` and a small byte-level BPE tokenizer, both written
with `save_pretrained` to a temporary directory and loaded from there (no mocks); a Hub name fails fast instead of
downloading."""

import pytest
import torch
from helpers import import_hf

from transformer_lib.assistant import (
    CHAT_TOKENS,
    TASKS,
    ChatTemplate,
    HubTokenizer,
    gpt2_chat,
    instruction_data,
)

pytestmark = pytest.mark.usefixtures("no_network")   # tests/conftest.py: any connection fails

DATA = instruction_data(n_train=40, n_test=4, seed=0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A directory holding what save_pretrained writes for a tiny random GPT-2 and a tokenizer of its own."""
    transformers = import_hf("transformers")
    tokenizers = import_hf("tokenizers")
    texts = [f"{request} {answer}" for split in DATA.values() for _, request, answer in split]
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=4,
                                     eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpt2-random")
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tuned(checkpoint):
    return gpt2_chat(checkpoint, DATA, steps=12, batch_size=8, lr=3e-3, n_eval=2, max_new_tokens=6, device="cpu")


def test_the_chat_rows_are_added(tuned, checkpoint):
    transformers = import_hf("transformers")
    n = len(transformers.AutoTokenizer.from_pretrained(checkpoint))
    assert tuned["vocab"] == (n, n + len(CHAT_TOKENS))
    template = tuned["template"]
    assert (template.user_id, template.assistant_id, template.end_id) == (n, n + 1, n + 2)
    assert tuned["model"].token.weight.shape[0] == n + 3 and not tuned["model"].training


def test_the_loss_is_finite_and_falls(tuned):
    losses = tuned["history"]["loss"]
    assert len(losses) == 12 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3


def test_answers_are_strings_scored_per_task(tuned):
    for when in ("before", "after"):
        scores = tuned[when]
        assert set(scores) == {*TASKS, "answers"} and all(0 <= scores[t] <= 1 for t in TASKS)
        assert len(scores["answers"]) == 2 * len(TASKS) and all(isinstance(a, str) for a in scores["answers"])


def test_the_hub_tokenizer_round_trips_and_never_writes_a_chat_token(checkpoint):
    transformers = import_hf("transformers")
    tok = HubTokenizer(transformers.AutoTokenizer.from_pretrained(checkpoint))
    text = "Reverse the words: key  file data"
    assert tok.decode(tok.encode(text)) == text
    template = ChatTemplate(tok)
    ids, trained = template.render([("user", text), ("assistant", "data file key")])
    assert max(tok.encode("<|user|> <|assistant|> <|end|>")) < len(tok) == template.user_id
    assert template.answer(ids[ids.index(template.assistant_id) + 1:]) == "data file key"


def test_a_hub_name_offline_fails_with_os_error():
    with pytest.raises(OSError):
        gpt2_chat("gpt2", DATA, steps=2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="instructions"):
        gpt2_chat("gpt2", {"train": []}, steps=2)
    with pytest.raises(ValueError, match="tokenizer"):
        HubTokenizer(object())
    with pytest.raises(ValueError, match="name_or_path"):
        gpt2_chat(None, DATA, steps=2)

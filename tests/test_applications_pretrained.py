"""Chapter 15, section 15.7: a real extractive reader and a real summarizer in the book's own models (issue 48,
item 4). The chapter's cells download deepset/bert-base-uncased-squad2 and t5-small where there is a network
(Colab) and skip offline. These tests run the same functions, `answer_question` and `t5_summarize`, offline: random
weights and small tokenizers are written with `save_pretrained` to a temporary directory and loaded from there (no
mocks); our spans are compared with transformers' own extractive post-processing (`select_starts_ends`) and our
tokens with its greedy `generate`."""

import pytest
import torch
from helpers import import_hf, randomize, wordpiece_tokenizer

from transformer_lib.applications import answer_question, span_probabilities, t5_summarize

pytestmark = pytest.mark.usefixtures("no_network")   # tests/conftest.py: any connection fails

WORDS = ["the", "capital", "of", "france", "is", "paris", "berlin", "a", "city", "river", "and", "big", ".", "what",
         "?", "on", "seine", "lies", "it", ",", "summarize", ":"]
CONTEXT = "Paris is the capital of France. It lies on the Seine, a big river. " * 3
QUESTION = "What is the capital of France?"


def save_random(tmp_path_factory, name, build, tokenizer):
    """Three directories, each what save_pretrained writes for build() with random weights (every parameter
    N(0, 0.5^2), seeds 0-2) and tokenizer."""
    paths = []
    for seed in range(3):
        path = tmp_path_factory.mktemp(f"{name}-{seed}")
        randomize(build(), seed, std=0.5).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def readers(tmp_path_factory):
    """Three random BertForQuestionAnswering models and a small WordPiece tokenizer, as save_pretrained writes them."""
    transformers = import_hf("transformers")
    tokenizer = wordpiece_tokenizer(WORDS)
    assert 1 not in tokenizer(QUESTION, CONTEXT)["input_ids"]                  # no [UNK]: every word is known
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return save_random(tmp_path_factory, "bert-qa", lambda: transformers.BertForQuestionAnswering(config), tokenizer)


@pytest.mark.parametrize("windows", ["one", "several"])
def test_answer_question_agrees_with_transformers(readers, windows):
    kwargs = {} if windows == "one" else {"max_length": 24, "doc_stride": 8}
    answers = set()
    for path in readers:
        out = answer_question(path, QUESTION, CONTEXT, max_answer_len=4, dtype=torch.float64, **kwargs)
        assert out["same"] and out["max_diff"] < 1e-10
        assert (out["windows"] == 1) == (windows == "one")
        first, end = out["chars"]
        assert out["answer"] == CONTEXT[first:end] and out["answer"].strip() and 0 < out["score"] <= 1
        assert len(out["answer"].split()) <= 4                                  # at most max_answer_len tokens
        assert out["answer"] not in QUESTION or out["answer"] in CONTEXT        # read from the context
        answers.add(out["answer"])
    assert len(answers) > 1                          # three random readers do not all give the same answer


def test_span_probabilities_obeys_its_rules():
    logits = torch.randn(7, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    allowed = torch.tensor([False, False, True, True, True, True, False])
    spans = span_probabilities(logits, allowed, max_answer_len=2)
    rows, cols = spans.nonzero(as_tuple=True)
    assert ((cols >= rows) & (cols < rows + 2) & allowed[rows] & allowed[cols]).all()
    assert len(rows) == 7                                        # 4 one-token spans and 3 two-token spans
    p = logits.masked_fill(~allowed[:, None], float("-inf")).softmax(0)
    assert torch.allclose(spans[3, 4], p[3, 0] * p[4, 1])


def test_answer_question_rejects_bad_arguments(readers):
    with pytest.raises(ValueError, match="question"):
        answer_question(readers[0], "  ", CONTEXT)
    with pytest.raises(ValueError, match="doc_stride"):
        answer_question(readers[0], QUESTION, CONTEXT, max_length=16, doc_stride=16)
    with pytest.raises(OSError):                                 # offline: a Hub name fails instead of downloading
        answer_question("deepset/bert-base-uncased-squad2", QUESTION, CONTEXT)


@pytest.fixture(scope="module")
def summarizers(tmp_path_factory):
    transformers, tokenizers = import_hf("transformers"), import_hf("tokenizers")
    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<unk>"] + WORDS)}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    words.normalizer = tokenizers.normalizers.Lowercase()
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    words.post_processor = tokenizers.processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", pad_token="<pad>",
                                                     eos_token="</s>")
    config = transformers.T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return save_random(tmp_path_factory, "t5", lambda: transformers.T5ForConditionalGeneration(config), tokenizer)


def test_t5_summarize_writes_transformers_greedy_tokens(summarizers):
    summaries = set()
    for path in summarizers:
        out = t5_summarize(path, "Paris is the capital of France. It lies on the Seine.", max_new_tokens=10,
                           dtype=torch.float64)
        assert out["same"]
        summaries.add(out["summary"])
    assert len(summaries) > 1


def test_t5_summarize_rejects_bad_arguments(summarizers):
    with pytest.raises(ValueError, match="text"):
        t5_summarize(summarizers[0], "")
    with pytest.raises(OSError):
        t5_summarize("t5-small", "some text")


def test_span_probabilities_rejects_bad_arguments():
    logits = torch.zeros(5, 2)
    with pytest.raises(ValueError, match="logits"):
        span_probabilities(torch.zeros(5, 3), torch.ones(5, dtype=torch.bool), 3)
    with pytest.raises(ValueError, match="allowed must be a bool tensor"):
        span_probabilities(logits, torch.ones(4, dtype=torch.bool), 3)
    with pytest.raises(ValueError, match="at least one position"):
        span_probabilities(logits, torch.zeros(5, dtype=torch.bool), 3)

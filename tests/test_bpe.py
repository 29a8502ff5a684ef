"""Chapter 16's byte-level BPE (transformer_lib.assistant), written by hand: equal to Hugging Face's `tokenizers`
(BpeTrainer + ByteLevel, Chapter 11's train_bpe) in vocabulary, merges and ids; round trips; bad inputs."""

import random

import pytest
import torch
from helpers import import_hf

from transformer_lib.assistant import (
    BYTE_CHARS,
    CHAR_BYTES,
    ByteBPE,
    merge_pair,
    most_frequent_pair,
    pretokenize,
    tokenizers_vocab_and_merges,
    train_byte_bpe,
)
from transformer_lib.gpt import HELDOUT_MODULES, TRAIN_MODULES, stdlib_sources, train_bpe

UNICODE = ["naïve café, déjà vu", "東京 大阪 東京都", "ok 🙂 fine 🙂🙂", "½ x² — 5 € ٣٤ Ⅻ", "tab\there\r\nand  \u00a0 nbsp",
           "it's we'll they'd I'm you're we've", "    def f(x):\n        return x  # don't\n\n\n"]


def hf_train(texts, vocab_size, min_frequency=2, special_tokens=("<|endoftext|>",)):
    tokenizers = import_hf("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                             special_tokens=list(special_tokens), show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer)
    return tok


def assert_same(ours, theirs):
    vocab, merges = tokenizers_vocab_and_merges(theirs)
    assert ours.vocab == vocab
    assert [(ours.vocab[a], ours.vocab[b]) for a, b in ours.merges] == merges


@pytest.fixture(scope="module")
def stdlib():
    return list(stdlib_sources(TRAIN_MODULES[:3]).values()), list(stdlib_sources(HELDOUT_MODULES[:4]).values())


def test_byte_table_is_gpt2s():
    tokenizers = import_hf("tokenizers")
    assert len(set(BYTE_CHARS)) == 256 and set(BYTE_CHARS) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    assert BYTE_CHARS[ord("a")] == "a" and BYTE_CHARS[32] == "Ġ" and BYTE_CHARS[10] == "Ċ" and BYTE_CHARS[0] == "Ā"
    assert all(CHAR_BYTES[c] == b for b, c in enumerate(BYTE_CHARS))


def test_pretokenize_equals_tokenizers_byte_level(stdlib):
    tokenizers = import_hf("tokenizers")
    reference = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    for text in UNICODE + stdlib[1] + [""]:
        assert pretokenize(text) == [piece for piece, _ in reference.pre_tokenize_str(text)]
        assert bytes(CHAR_BYTES[c] for piece in pretokenize(text) for c in piece) == text.encode()   # the whole text


def test_merge_pair_reads_left_to_right():
    assert merge_pair([1, 1, 1], (1, 1), 9) == [9, 1]
    assert merge_pair([1, 1, 1, 1], (1, 1), 9) == [9, 9]
    assert merge_pair([2, 1, 2, 1], (1, 2), 9) == [2, 9, 1]
    assert merge_pair([], (1, 2), 9) == [] and merge_pair([1], (1, 2), 9) == [1]


def test_ties_go_to_the_smallest_ids():
    assert most_frequent_pair({(4, 2): 5, (3, 9): 5, (3, 8): 5, (0, 0): 4}) == (3, 8)
    assert most_frequent_pair({(4, 2): 6, (3, 9): 5}) == (4, 2)


@pytest.mark.parametrize("vocab_size, min_frequency", [(300, 2), (600, 2), (500, 1), (450, 5)])
def test_training_equals_tokenizers_on_stdlib(stdlib, vocab_size, min_frequency):
    train, heldout = stdlib
    ours = train_byte_bpe(train, vocab_size, min_frequency)
    theirs = hf_train(train, vocab_size, min_frequency)
    assert_same(ours, theirs)
    for text in heldout + UNICODE:
        ids = ours.encode(text)
        assert ids == theirs.encode(text).ids
        assert ours.decode(ids) == text == theirs.decode(ids)


def test_chapter11s_train_bpe_is_the_same_reference(stdlib):
    import_hf("tokenizers")
    assert_same(train_byte_bpe(stdlib[0], 400), train_bpe(stdlib[0], 400))


def test_training_equals_tokenizers_with_ties_unicode_and_several_specials():
    rng = random.Random(0)
    texts = ["".join(rng.choice("ab é東🙂\n") for _ in range(rng.randint(0, 60))) for _ in range(40)] + UNICODE
    specials = ("<|endoftext|>", "<|user|>", "<|assistant|>")
    for vocab_size, min_frequency in [(259 + 40, 1), (259 + 200, 1), (259 + 80, 3)]:
        ours = train_byte_bpe(texts, vocab_size, min_frequency, specials)
        assert_same(ours, hf_train(texts, vocab_size, min_frequency, specials))
        assert ours.vocab[:3] == list(specials)


def test_a_merge_that_makes_an_existing_token_reuses_its_id(stdlib):
    """A special token spelled like a merge ("se" in byte characters): tokenizers' trainer reuses its id, so the
    vocabulary grows by one token less than the merges; ours does the same."""
    specials = ("<|endoftext|>", "se")
    ours = train_byte_bpe(stdlib[0], 330, 2, specials)
    assert_same(ours, hf_train(stdlib[0], 330, 2, specials))
    assert len(ours) == 330 and len(ours.merges) == 330 - 258 + 1
    assert (ours.ids["s"], ours.ids["e"]) in ours.merges


def test_training_stops_when_no_pair_is_frequent_enough():
    ours = train_byte_bpe(["abab", "cd"], 1000, min_frequency=2)
    assert [ours.vocab[i] for i in range(257, len(ours))] == ["ab"]      # (a, b) twice; then no pair twice
    assert len(train_byte_bpe(["x"], 1000)) == 257                        # no pair at all


def test_a_smaller_vocabulary_is_a_prefix_of_a_larger_one(stdlib):
    big, small = train_byte_bpe(stdlib[0], 500), train_byte_bpe(stdlib[0], 350)
    assert big.vocab[:350] == small.vocab and big.merges[:350 - 257] == small.merges


def test_round_trip_on_random_text():
    tok = train_byte_bpe(UNICODE * 3, 320, min_frequency=1)
    rng = random.Random(1)
    alphabet = [chr(c) for c in [*range(0, 0x250), *range(0x3040, 0x30A0), 0x1F642, 0x10FFFF, 0xFEFF]]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert tok.decode(tok.encode(text)) == text


def test_decode_equals_tokenizers_on_any_ids_even_cut_characters():
    texts = UNICODE * 3
    ours, theirs = train_byte_bpe(texts, 330, 1), hf_train(texts, 330, 1)
    rng = random.Random(2)
    for _ in range(300):
        ids = [rng.randrange(1, len(ours)) for _ in range(rng.randint(0, 12))]   # no special: bytes may be cut
        assert ours.decode(ids) == theirs.decode(ids)
    assert ours.decode(torch.tensor(ours.encode("東京"))) == "東京"            # a 1-D tensor of ids


def test_text_never_encodes_to_a_special_token():
    tok = train_byte_bpe(UNICODE, 300, 1, ("<|endoftext|>", "<|user|>"))
    ids = tok.encode("<|endoftext|> and <|user|>")
    assert not set(ids) & tok.special and tok.decode(ids) == "<|endoftext|> and <|user|>"
    assert tok.decode([0, *tok.encode(" hi"), 1]) == "<|endoftext|> hi<|user|>"
    assert tok.token_bytes(0) == b"<|endoftext|>" and tok.token_bytes(tok.ids["Ġ"]) == b" "


def test_a_special_token_that_a_merge_spells_is_reached_from_text_as_in_tokenizers():
    """The limit of the guarantee above: a special written in byte characters inside one piece ('Ġthe') is the
    string of a merge, which reuses its id, so text encodes to it (and decodes to its byte characters), in ours as
    in tokenizers. '<|endoftext|>' spans three pieces, so no merge spells it."""
    ours, theirs = train_byte_bpe(["the the the"], 262, special_tokens=("Ġthe",)), hf_train(["the the the"], 262,
                                                                                             special_tokens=("Ġthe",))
    assert_same(ours, theirs)
    assert ours.encode("a the") == theirs.encode("a the").ids == [ours.ids["a"], 0]
    assert ours.decode(ours.encode("a the")) == "aĠthe"                     # the round trip breaks here
    assert pretokenize("<|endoftext|>") == ["<|", "endoftext", "|>"]


@pytest.mark.parametrize("call, words", [
    (lambda: train_byte_bpe("one text", 300), "texts must be an iterable of str"),
    (lambda: train_byte_bpe(["ok", b"bytes"], 300), "texts must hold str only"),
    (lambda: train_byte_bpe(["ok"], 256), r"vocab_size must be an int >= 257"),
    (lambda: train_byte_bpe(["ok"], 257, special_tokens=("<a>", "<b>")), r"vocab_size must be an int >= 258"),
    (lambda: train_byte_bpe(["ok"], 300.0), "vocab_size must be an int"),
    (lambda: train_byte_bpe(["ok"], True), "vocab_size must be an int"),
    (lambda: train_byte_bpe(["ok"], 300, min_frequency=0), "min_frequency must be an int >= 1"),
    (lambda: train_byte_bpe(["ok"], 300, special_tokens="<|endoftext|>"), "special_tokens must be a list"),
    (lambda: train_byte_bpe(["ok"], 300, special_tokens=("<a>", "<a>")), "special_tokens must be distinct"),
    (lambda: train_byte_bpe(["ok"], 300, special_tokens=("",)), "special_tokens must be a list of non-empty"),
    (lambda: pretokenize(b"bytes"), "text must be a str"),
    (lambda: pretokenize("lone \ud800 surrogate"), "text must be encodable as UTF-8"),
])
def test_bad_inputs_raise_value_errors_that_name_the_argument(call, words):
    with pytest.raises(ValueError, match=words):
        call()


@pytest.mark.parametrize("ids", [[5, 300], [-1], [True], [1.0], ["a"], "abc", 5, torch.tensor([1.0])])
def test_decode_rejects_what_is_not_a_list_of_ids(ids):
    tok = train_byte_bpe(["abab"], 258)
    with pytest.raises(ValueError, match="ids must"):
        tok.decode(ids)


def test_encode_rejects_what_is_not_text():
    tok = train_byte_bpe(["abab"], 258)
    with pytest.raises(ValueError, match="text must be a str"):
        tok.encode(["abab"])


def test_tokenizers_vocab_and_merges_wants_a_bpe_model():
    tokenizers = import_hf("tokenizers")
    with pytest.raises(ValueError, match="tokenizer must hold a BPE model"):
        tokenizers_vocab_and_merges(tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0}, unk_token="a")))


def test_a_bytebpe_built_from_tokenizers_encodes_like_it(stdlib):
    """The converse direction: our encoder on tokenizers' own vocabulary and merges gives tokenizers' ids."""
    theirs = hf_train(stdlib[0], 500)
    vocab, merges = tokenizers_vocab_and_merges(theirs)
    ids = {t: i for i, t in enumerate(vocab)}
    tok = ByteBPE(vocab, [(ids[a], ids[b]) for a, b in merges], ["<|endoftext|>"])
    for text in stdlib[1] + UNICODE:
        assert tok.encode(text) == theirs.encode(text).ids

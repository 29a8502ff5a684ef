"""One library across the families (issue 23), part one: checks at the door and no host synchronisation.

A host synchronisation is any read of a tensor's value by Python (`.item()`, `int(t)`, `bool(t)`, `if t:`); on a
GPU each one stalls the pipeline until the device has caught up. PyTorch routes every such read through
`aten._local_scalar_dense`, so a dispatch mode that counts that operator counts them all, on any device. Target:
**0 per model forward** (float and token inputs, every family) and **at most 1 per generated token** (the stop
check), with the errors for bad input as clear as before (tests/test_bad_inputs*.py).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_lib.attention import padding_mask
from transformer_lib.bert import BertConfig, BertForMaskedLM, BertModel
from transformer_lib.classifier import ClassifierConfig, SequenceClassifier, predict
from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.encoder import Encoder
from transformer_lib.gpt import GPT, GPTConfig, sequence_nll
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.sampling import generate
from transformer_lib.t5 import T5, T5Config, t5_generate
from transformer_lib.validation import checked, checks_due
from transformer_lib.vit import ViT, ViTConfig

V = 40


class HostReads(TorchDispatchMode):
    """Counts aten._local_scalar_dense: every value a tensor hands to Python (a device -> host synchronisation)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def host_reads(fn) -> int:
    with HostReads() as reads:
        fn()
    return reads.count


def ids(*shape, seed=0, low=1):
    return torch.randint(low, V, shape, generator=torch.Generator().manual_seed(seed))


def test_the_counter_counts_what_it_should():
    t = torch.tensor([1.0, 2.0])
    assert host_reads(lambda: t.sum().item()) == 1
    assert host_reads(lambda: bool((t > 0).all())) == 1
    assert host_reads(lambda: t * 2) == 0


# one model of each family, small, eval mode; each call: a full forward on token (or pixel) inputs
def transformer():
    m = Transformer(TransformerConfig(V, V, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2,
                                      num_decoder_layers=2, dropout=0.0)).eval()
    src, tgt = ids(2, 7, seed=1), ids(2, 5, seed=2)
    return lambda: m(src, tgt, m.make_src_mask(src), padding_mask(tgt, 0))


def gpt():
    m = GPT(GPTConfig(vocab_size=V, max_len=32, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0)).eval()
    x = ids(2, 9, seed=3)
    return lambda: m(x)


def bert():
    m = BertForMaskedLM(BertConfig(vocab_size=V, max_len=32, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                                   dropout=0.0)).eval()
    x = ids(2, 9, seed=4)
    return lambda: m(x)


def t5():
    m = T5(T5Config(vocab_size=V, d_model=16, num_heads=2, d_ff=32, num_layers=2, num_decoder_layers=2,
                    dropout=0.0)).eval()
    src, tgt = ids(2, 7, seed=5, low=2), ids(2, 4, seed=6, low=2)
    return lambda: m(src, tgt)


def vit():
    m = ViT(ViTConfig(image_size=8, patch_size=2, num_channels=1, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                      num_classes=3, dropout=0.0)).eval()
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(7))
    return lambda: m(x)


def classifier():
    m = SequenceClassifier(ClassifierConfig(V, 3, d_model=16, num_heads=2, d_ff=32, dropout=0.0)).eval()
    x = ids(2, 9, seed=8, low=2)
    return lambda: m(x)


@pytest.mark.parametrize("family", [transformer, gpt, bert, t5, vit, classifier],
                         ids=["Transformer", "GPT", "BERT", "T5", "ViT", "SequenceClassifier"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "training"])
def test_a_forward_reads_nothing_back_from_the_device(family, grad):
    call = family()
    with torch.set_grad_enabled(grad):
        assert host_reads(call) == 0


def test_greedy_decoding_reads_the_device_once_per_token():
    model = Transformer(TransformerConfig(V, V, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2,
                                          num_decoder_layers=2, dropout=0.0)).eval()
    src = ids(3, 6, seed=9, low=3)
    n = 12
    reads = host_reads(lambda: greedy_decode(model, src, model.make_src_mask(src), bos_id=1, eos_id=2,
                                             max_new_tokens=n))
    tokens, _ = greedy_decode(model, src, model.make_src_mask(src), bos_id=1, eos_id=2, max_new_tokens=n)
    assert reads <= tokens.size(1) + 2                      # one stop check per token, + a constant per call
    beam_reads = host_reads(lambda: beam_search(model, src, model.make_src_mask(src), bos_id=1, eos_id=2,
                                                max_new_tokens=n))
    assert beam_reads <= n + 2


def test_sampling_and_t5_decoding_read_the_device_at_most_once_per_token():
    model = GPT(GPTConfig(vocab_size=V, max_len=64, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                          dropout=0.0)).eval()
    prompt = ids(2, 5, seed=10)
    n = 16
    reads = host_reads(lambda: generate(model, prompt, n, generator=torch.Generator().manual_seed(0)))
    assert reads <= n + 2, reads                            # the prompt's id range is read once, per call
    t5_model = T5(T5Config(vocab_size=V, d_model=16, num_heads=2, d_ff=32, num_layers=1, num_decoder_layers=1,
                           dropout=0.0)).eval()
    src = ids(2, 6, seed=11, low=2)
    out = t5_generate(t5_model, src, n)
    assert host_reads(lambda: t5_generate(t5_model, src, n)) <= out.size(1) + 2


def test_checks_due_only_outside_a_checked_call():
    assert checks_due()
    with checked():
        assert not checks_due()
        with checked():
            assert not checks_due()
        assert not checks_due()
    assert checks_due()
    with pytest.raises(RuntimeError), checked():
        raise RuntimeError("an error inside leaves the flag as it was")
    assert checks_due()


def test_layers_called_directly_still_check_and_name_the_argument():
    enc = Encoder(2, 16, 2, 32, dropout=0.0)
    with pytest.raises(ValueError, match=r"\bx\b must be a tensor of shape \(B, S, d_model=16\)"):
        enc(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"src_mask"):
        enc(torch.randn(2, 5, 16), torch.ones(2, 5, dtype=torch.bool))


@pytest.mark.parametrize("family", ["GPT", "BERT", "T5", "Transformer"])
def test_an_id_outside_the_vocabulary_is_still_a_clear_error(family):
    bad = torch.tensor([[1, 2, V]])
    if family == "GPT":
        m, call, name = GPT(GPTConfig(vocab_size=V, max_len=8, d_model=8, num_layers=1, num_heads=2, d_ff=16)), \
            lambda m: m(bad), "tokens"
    elif family == "BERT":
        m, call, name = BertModel(BertConfig(vocab_size=V, max_len=8, d_model=8, num_layers=1, num_heads=2,
                                             d_ff=16)), lambda m: m(bad), "tokens"
    elif family == "T5":
        m, call, name = T5(T5Config(vocab_size=V, d_model=8, num_heads=2, d_ff=16, num_layers=1,
                                    num_decoder_layers=1)), lambda m: m(bad, torch.tensor([[0]])), "src"
    else:
        m, call, name = Transformer(TransformerConfig(V, V, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=1,
                                                      num_decoder_layers=1)), lambda m: m(bad, bad), "src"
    with pytest.raises(ValueError, match=rf"{name} holds token ids from 1 to {V}, outside the vocabulary"):
        call(m)


# ---------------------------------------------------------------- one rule for eval mode (Chapter 8's inference)
def _dropout_models():
    """One model per decoding family with dropout 0.3, so that train mode would change every result."""
    torch.manual_seed(0)
    transformer = Transformer(TransformerConfig(V, V, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                                                num_decoder_layers=1, dropout=0.3))
    gpt_model = GPT(GPTConfig(vocab_size=V, max_len=32, d_model=16, num_layers=1, num_heads=2, d_ff=32, dropout=0.3))
    t5_model = T5(T5Config(vocab_size=V, d_model=16, num_heads=2, d_ff=32, num_layers=1, num_decoder_layers=1,
                           dropout=0.3))
    clf_model = SequenceClassifier(ClassifierConfig(V, 3, d_model=16, num_heads=2, d_ff=32, dropout=0.3))
    return transformer, gpt_model, t5_model, clf_model


INFERENCE = {
    "greedy_decode": lambda m: greedy_decode(m[0], ids(2, 6, seed=1, low=3), bos_id=1, eos_id=2, max_new_tokens=5)[0],
    "beam_search": lambda m: beam_search(m[0], ids(2, 6, seed=1, low=3), bos_id=1, eos_id=2, beam_size=2,
                                         max_new_tokens=5)[0],
    "generate": lambda m: generate(m[1], ids(2, 3, seed=2), 4, temperature=1e-6),
    "sequence_nll": lambda m: torch.tensor(sequence_nll(m[1], ids(20, seed=3), context=8)),
    "t5_generate": lambda m: t5_generate(m[2], ids(2, 5, seed=4, low=2), 4),
    "predict": lambda m: predict(m[3], ids(5, 6, seed=5, low=2)),
}


@pytest.mark.parametrize("name", list(INFERENCE))
def test_every_inference_function_runs_in_eval_mode_and_restores_the_mode(name):
    """One rule (CONTRIBUTING.md): decoders, scorers and evaluators switch to eval mode (no dropout) without
    gradients and give the model back in the mode it was in, also when they raise."""
    models = _dropout_models()
    for m in models:
        m.eval()
    expected = INFERENCE[name](models)
    for m in models:
        m.train()
    got = INFERENCE[name](models)
    assert torch.equal(got, expected), "train mode changed the result: dropout was applied"
    assert all(m.training for m in models), "train mode not restored"
    assert not got.requires_grad
    for m in models:
        m.eval()
    INFERENCE[name](models)
    assert not any(m.training for m in models), "eval mode not restored"

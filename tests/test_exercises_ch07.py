"""Chapter 7's graders (transformer_lib.exercises.decoder): the worked solutions pass, also in float32, and
typical mistakes are caught with a message that names them."""
import pytest
import torch
from helpers import grader_row

from transformer_lib.exercises.decoder import (
    check_first_leak,
    check_future_mask,
    check_parameter_count,
    check_prefix_lm_mask,
    check_tgt_mask,
    check_two_way_tying,
)
from transformer_lib.model import Transformer, TransformerConfig

# --- exercise 1: the target mask


def my_tgt_mask(tgt, pad_id):
    T = tgt.size(1)
    return torch.ones(T, T, dtype=torch.bool).tril() & (tgt != pad_id)[:, None, None, :]


def causal_only(tgt, pad_id):                              # forgot the padding
    return torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool).tril()[None, None]


def padding_only(tgt, pad_id):                             # forgot the causal part
    return (tgt != pad_id)[:, None, None, :]


def inverted(tgt, pad_id):                                 # nn.Transformer's convention: True = forbidden
    return ~my_tgt_mask(tgt, pad_id)


def two_dimensional(tgt, pad_id):                          # (B, T): not the rank of the scores
    return tgt != pad_id


# --- exercise 2: the parameter count

def my_parameter_count(c, biases=True):
    d, f, Ne, Nd = c.d_model, c.d_ff, c.num_encoder_layers, c.num_decoder_layers
    attention, ffn, norm = 4 * d * d + 4 * d, 2 * d * f + f + d, 2 * d
    embeddings = c.src_vocab_size * d if c.tie_embeddings else (c.src_vocab_size + 2 * c.tgt_vocab_size) * d
    encoder = Ne * (attention + ffn + 2 * norm)
    decoder = Nd * (2 * attention + ffn + 3 * norm)
    total = embeddings + encoder + decoder + (2 * norm if c.final_norm else 0)
    if biases:
        return total
    norms = 2 * Ne + 3 * Nd + (2 if c.final_norm else 0)
    return total - (Ne + 2 * Nd) * 4 * d - (Ne + Nd) * (f + d) - norms * d


def slip(delta):                                           # a reader's count off by delta(c) with biases
    return lambda c, biases=True: my_parameter_count(c, biases) + (delta(c) if biases else 0)


def bias_slip(delta):                                      # ... off by delta(c) without biases
    return lambda c, biases=True: my_parameter_count(c, biases) + (0 if biases else delta(c))


def _norms(c):
    return 2 * c.num_encoder_layers + 3 * c.num_decoder_layers + (2 if c.final_norm else 0)


forgot_final_norms = slip(lambda c: -(4 * c.d_model if c.final_norm else 0))
forgot_biases = slip(lambda c: -(c.num_encoder_layers + 2 * c.num_decoder_layers) * 4 * c.d_model
                     - (c.num_encoder_layers + c.num_decoder_layers) * (c.d_ff + c.d_model))
kept_norm_biases = bias_slip(lambda c: _norms(c) * c.d_model)          # removed only the linear layers' biases
dropped_norm_gains = bias_slip(lambda c: -_norms(c) * c.d_model)        # removed the LayerNorms whole


def built_and_counted(c, biases=True):                    # the shortcut the exercise forbids
    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(c).parameters())


def built_quietly(c, biases=True):                         # the refusal caught: refused all the same
    try:
        return built_and_counted(c)
    except Exception:
        return 0


def test_a_refused_build_leaves_nn_module_working():
    with pytest.raises(AssertionError, match="without building the model"):
        check_parameter_count(built_quietly)
    assert sum(p.numel() for p in torch.nn.Linear(3, 2).parameters()) == 8


forgot_cross_attention = slip(lambda c: -c.num_decoder_layers * (4 * c.d_model ** 2 + 6 * c.d_model))
two_norms_per_decoder_layer = slip(lambda c: -c.num_decoder_layers * 2 * c.d_model)   # the encoder's two, not three
one_final_norm = slip(lambda c: -(2 * c.d_model if c.final_norm else 0))
two_slips = slip(lambda c: -(4 * c.d_model if c.final_norm else 0)                    # no final norms and no
                 - c.num_decoder_layers * (4 * c.d_model ** 2 + 6 * c.d_model))       # cross-attention: unnamed


# --- exercise 1: a prefix LM's mask

def prefix_lm_mask(tokens, prefix_len, pad_id):
    T = tokens.size(1)
    in_prefix = torch.arange(T) < prefix_len[:, None]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return ((causal | in_prefix[:, None, :]) & (tokens != pad_id)[:, None, :])[:, None]


def prefix_causal_only(tokens, prefix_len, pad_id):
    return my_tgt_mask(tokens, pad_id)


def prefix_no_causal(tokens, prefix_len, pad_id):
    T = tokens.size(1)
    return (tokens != pad_id)[:, None, None, :].expand(-1, 1, T, -1)


def prefix_one_longer(tokens, prefix_len, pad_id):
    return prefix_lm_mask(tokens, prefix_len + 1, pad_id)


def prefix_queries(tokens, prefix_len, pad_id):            # the prefix's queries see everything
    T = tokens.size(1)
    in_prefix = torch.arange(T) < prefix_len[:, None]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return ((causal | in_prefix[:, :, None]) & (tokens != pad_id)[:, None, :])[:, None]


def prefix_pads_visible(tokens, prefix_len, pad_id):
    T = tokens.size(1)
    in_prefix = torch.arange(T) < prefix_len[:, None]
    return (torch.ones(T, T, dtype=torch.bool).tril() | in_prefix[:, None, :])[:, None]


# --- exercise 3: two-way tying, from an untied checkpoint

def two_way_tied(state_dict, config):
    model = Transformer(config)
    model.load_state_dict(state_dict)
    model.lm_head.weight = model.tgt_embed.embedding.weight
    return model


def tied_then_loaded(state_dict, config):                  # load_state_dict writes the generator's values last
    model = Transformer(config)
    model.lm_head.weight = model.tgt_embed.embedding.weight
    model.load_state_dict(state_dict)
    return model


def tied_the_other_way(state_dict, config):                # the shared matrix keeps the generator's values
    model = Transformer(config)
    model.load_state_dict(state_dict)
    model.tgt_embed.embedding.weight = model.lm_head.weight
    return model


def not_loaded(state_dict, config):
    model = Transformer(config)
    model.lm_head.weight = model.tgt_embed.embedding.weight
    return model


def target_side_only(state_dict, config):                  # the rest of the checkpoint left out
    model = Transformer(config)
    model.tgt_embed.embedding.weight.data.copy_(state_dict["tgt_embed.embedding.weight"])
    model.lm_head.weight = model.tgt_embed.embedding.weight
    return model


def copied_values(state_dict, config):
    model = Transformer(config)
    model.load_state_dict(state_dict)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.tgt_embed.weight)
    return model


def three_way(state_dict, config):                         # possible only for vocabularies of one size
    model = two_way_tied(state_dict, config)
    if config.src_vocab_size == config.tgt_vocab_size:
        model.src_embed.embedding.weight = model.tgt_embed.embedding.weight
    return model


def tied_to_source(state_dict, config):
    model = Transformer(config)
    model.load_state_dict(state_dict)
    if config.src_vocab_size == config.tgt_vocab_size:
        model.lm_head.weight = model.src_embed.embedding.weight
    else:
        model.lm_head.weight = model.tgt_embed.embedding.weight
    return model


def embeddings_tied(state_dict, config):                   # source = target embedding, the generator apart
    model = Transformer(config)
    model.load_state_dict(state_dict)
    if config.src_vocab_size == config.tgt_vocab_size:
        model.src_embed.embedding.weight = model.tgt_embed.embedding.weight
    else:
        model.lm_head.weight = model.tgt_embed.embedding.weight
    return model


def test_two_way_tying_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    check_two_way_tying(two_way_tied)
    assert torch.equal(torch.rand(3), expected)


# --- exercise 4 (bug hunt): the causal mask off by one

def fixed_future_mask(T):
    return ~torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)[None, None]


def sees_the_next_token(T):                                # the handed bug: diagonal=2
    return ~torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=2)[None, None]


def cannot_see_itself(T):                                  # diagonal=0
    return ~torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=0)[None, None]


def forbidden_convention(T):                               # nn.Transformer's True = forbidden
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)[None, None]


def sees_two_ahead(T):
    return torch.ones(T, T, dtype=torch.bool).tril(2)[None, None]


def float_mask(T):                                         # an additive mask, not this book's convention
    return torch.zeros(T, T).masked_fill(fixed_future_mask(T)[0, 0].logical_not(), float("-inf"))[None, None]


# --- exercise 4, the probe: the first leak found by running the layer

def probe(layer, T, d_model, *, dtype=torch.float64, moved=lambda a, b: (a - b).abs().amax(dim=(0, 2)) > 1e-12,
          upto=lambda t: t, together=False, pick=0):
    """A causality probe with the knobs of its slips: the test (moved), the outputs looked at (upto), every
    position after t changed at once (together), which moved output is reported (pick)."""
    g = torch.Generator().manual_seed(0)
    y = torch.randn(2, T, d_model, dtype=dtype, generator=g)
    out = layer(y)
    for t in range(T):
        y2 = y.clone()
        changed = slice(t + 1, None) if together else slice(t, t + 1)
        y2[:, changed] = torch.randn(y2[:, changed].shape, dtype=dtype, generator=g)
        hits = moved(layer(y2), out)[:upto(t) + 1 if together else upto(t)].nonzero().flatten()
        if len(hits):
            return (t + 1 if together else t), int(hits[pick])
    return None


def first_leak(layer, T, d_model):
    return probe(layer, T, d_model)


def first_leak32(layer, T, d_model):                       # float32 inputs, exact comparison
    return probe(layer, T, d_model, dtype=torch.float32, moved=lambda a, b: (a != b).any(0).any(-1))


def loose(layer, T, d_model):                              # torch.allclose's tolerances
    return probe(layer, T, d_model, moved=lambda a, b: ~torch.isclose(a, b).all(0).all(-1))


def float32_sized(layer, T, d_model):                      # float32 inputs, a float32-sized tolerance
    return probe(layer, T, d_model, dtype=torch.float32, moved=lambda a, b: ((a - b).abs() > 1e-6).any(0).any(-1))


def all_after(layer, T, d_model):                          # the chapter's check: every position after t at once
    return probe(layer, T, d_model, together=True)


def includes_t(layer, T, d_model):                         # output t itself counted
    return probe(layer, T, d_model, upto=lambda t: t + 1)


def swapped(layer, T, d_model):
    found = first_leak(layer, T, d_model)
    return None if found is None else (found[1], found[0])


def last_i(layer, T, d_model):                             # the last moved output, not the first
    return probe(layer, T, d_model, pick=-1)


def test_a_mask_that_hides_the_past_is_named():
    def no_past(T):
        return torch.eye(T, dtype=torch.bool)[None, None]
    with pytest.raises(AssertionError, match="cannot see the earlier position"):
        check_future_mask(no_past)


GRADERS = [
    grader_row(check_tgt_mask, correct=[my_tgt_mask], mistakes=[
        (causal_only, "which is padding"),
        (padding_only, "future position"),
        (inverted, "inverted"),
        (two_dimensional, "does not fit"),
    ], prints='check_tgt_mask: correct'),
    grader_row(check_parameter_count, correct=[my_parameter_count], mistakes=[
        (forgot_final_norms, "check the two final LayerNorms"),
        (forgot_biases, "biases"),
        (forgot_cross_attention, "cross-attention"),
        (two_norms_per_decoder_layer, r"check the decoder layer's LayerNorms: it has three"),
        (one_final_norm, "one per stack, two in all"),
        (two_slips, r"wrong on \d+ of 16 configurations\)$"),
        (kept_norm_biases, "biases=False, .*check the LayerNorms' biases"),
        (dropped_norm_gains, "biases=False, .*check the LayerNorms' gains"),
        (lambda c: my_parameter_count(c), "must take a second argument, biases=True"),
        (lambda c, biases=True: float(my_parameter_count(c, biases)), "expected an int"),
        (built_and_counted, "builds a Transformer.*without building the model"),
        (lambda c, biases=True: my_parameter_count(c, biases) + 0 * torch.nn.Linear(1, 1).weight.numel(),
         "builds a Linear"),
    ], prints='check_parameter_count: exact on 16 random configurations, with and without biases'),
    grader_row(check_prefix_lm_mask, correct=[prefix_lm_mask, lambda *a: prefix_lm_mask(*a).clone()], mistakes=[
        (prefix_causal_only, "causal in the prefix too"),
        (prefix_no_causal, "see their future"),
        (prefix_one_longer, "one token too long"),
        (lambda t, p, pad: prefix_lm_mask(t, (p - 1).clamp(min=0), pad), "one token too short"),
        (prefix_queries, "prefix's queries see every key"),
        (prefix_pads_visible, "padding keys"),
        (lambda *a: ~prefix_lm_mask(*a), "inverted"),
        (lambda *a: prefix_lm_mask(*a)[:, 0], "give it a head axis"),
        (lambda *a: prefix_lm_mask(*a).long(), "must be a bool tensor"),
    ], prints="check_prefix_lm_mask: correct"),
    grader_row(check_two_way_tying, correct=[two_way_tied], mistakes=[
        (copied_values, "nothing is shared"),
        (three_way, "all three matrices are one"),
        (tied_to_source, "SOURCE embedding"),
        (embeddings_tied, "source and target embeddings are one matrix"),
        (tied_then_loaded, "holds the checkpoint's lm_head.weight.*tied before load_state_dict"),
        (tied_the_other_way, "holds the checkpoint's lm_head.weight"),
        (not_loaded, "was the checkpoint loaded"),
        (target_side_only, "is not the checkpoint's: load every weight"),
        (lambda sd, c: Transformer(TransformerConfig(c.src_vocab_size, c.src_vocab_size)), "nothing is shared|parameters"),
        (lambda sd, c: "a model", "must return this book's Transformer"),
    ], prints="check_two_way_tying: the output layer shares"),
    grader_row(check_future_mask, correct=[fixed_future_mask, lambda T: torch.ones(T, T, dtype=torch.bool).tril()], mistakes=[
        (sees_the_next_token, "position 0 sees position 1: your mask leaks the next token"),
        (cannot_see_itself, "position 0 cannot see itself.*attends to nothing"),
        (forbidden_convention, "inverted"),
        (sees_two_ahead, "position 0 sees position 2: your mask leaks the token 2 positions ahead"),
        (float_mask, "must be bool"),
        (lambda T: torch.ones(T, T, dtype=torch.bool).triu()[None, None], "your mask is transposed"),
        (lambda T: fixed_future_mask(T)[0], "expected"),
    ], prints='check_future_mask: correct'),
    grader_row(check_first_leak, correct=[first_leak, first_leak32], mistakes=[
        (loose, "found no leak, but output 2 moves by about 1e-9.*tolerance"),
        (float32_sized, "found no leak, but output 2 moves by about 1e-9.*float64 inputs.*float32's round-off"),
        (all_after, r"you report \(4, 3\), but input 4 does not reach output 3; change one input position at a time"),
        (includes_t, r"you report \(0, 0\).*EARLIER position"),
        (swapped, "swapped"),
        (last_i, "not the first"),
        (lambda layer, T, d: None, r"found no leak, but there is one \(\(1, 0\)\)"),
        (lambda layer, T, d: (T - 1, 0), "in a causal layer"),
        (lambda layer, T, d: "x", "must return None or a pair"),
    ], prints='check_first_leak: your probe finds the first leak'),
]


def test_the_check_command_finds_the_exercises_by_their_names():
    from transformer_lib.check import run_checks

    results = run_checks({"prefix_lm_mask": prefix_lm_mask, "two_way_tied": two_way_tied,
                          "fixed_future_mask": fixed_future_mask})
    assert sorted((name, passed) for name, passed, _ in results) == [
        ("fixed_future_mask", True), ("prefix_lm_mask", True), ("two_way_tied", True)]
    (name, passed, verdict), = run_checks({"fixed_future_mask": sees_the_next_token})
    assert not passed and "leaks the next token" in verdict and "chapter 7, exercise 4" in verdict
    (name, passed, verdict), = run_checks({"my_prefix_lm_mask": prefix_causal_only})
    assert not passed and "causal in the prefix too" in verdict

"""transformer_lib.bert (Chapter 10): BERT against Hugging Face's BertModel / BertForMaskedLM in float64, built
from configs only (never downloaded), and BERT's masking and MLM loss."""

import dataclasses
import socket

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_download_fails, import_hf, max_diff, noisy, randomize

from transformer_lib.bert import (
    IGNORE_INDEX,
    BertClassifier,
    BertConfig,
    BertEmbeddings,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertModel,
    load_hf_bert,
    mask_tokens,
    token_cross_entropy,
)

DT = torch.float64
ATOL = 1e-12
V = 50                                           # vocabulary of the small models
PAD, CLS, MASK = 0, 1, 2


def small_config(**kw) -> BertConfig:
    return BertConfig(**{"vocab_size": V, "d_model": 32, "num_layers": 2, "num_heads": 4, "d_ff": 48,
                         "max_len": 20, **kw})


def padded_ids(B, S, seed, low=3, type_vocab_size=2):
    """Random ids (B, S) in [low, V), padded with PAD at the end of every row but the first; random segments."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, V, (B, S), generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    ids[torch.arange(S) >= lengths[:, None]] = PAD
    segments = torch.randint(0, type_vocab_size, (B, S), generator=g)
    return ids, segments


# ---------------------------------------------------------------- no network, ever

pytestmark = pytest.mark.usefixtures("no_network")   # tests/conftest.py: any connection fails


def test_network_guard_refuses_connections():
    with pytest.raises(RuntimeError, match="network access attempted"):
        socket.create_connection(("127.0.0.1", 9))
    with socket.socket() as s, pytest.raises(RuntimeError, match="network access attempted"):
        s.connect(("127.0.0.1", 9))


def test_network_guard_makes_from_pretrained_fail(tmp_path):
    assert_download_fails("BertModel", "bert-base-uncased", tmp_path)


# ---------------------------------------------------------------- equality with Hugging Face

def hf_config(**kw):
    transformers = import_hf("transformers")
    return transformers.BertConfig(**{"vocab_size": V, "hidden_size": 32, "num_hidden_layers": 2,
                                      "num_attention_heads": 4, "intermediate_size": 48,
                                      "max_position_embeddings": 20, "type_vocab_size": 3,
                                      "attn_implementation": "eager", **kw})


def hf_pair(seed=0):
    transformers = import_hf("transformers")
    cfg = hf_config()
    hf = noisy(transformers.BertModel(cfg), seed)
    ours = load_hf_bert(BertModel(BertConfig.from_hf(cfg)).double().eval(), hf)
    return ours, hf



def test_from_hf_reads_every_size():
    cfg = BertConfig.from_hf(hf_config(layer_norm_eps=1e-7, hidden_dropout_prob=0.2,
                                       attention_probs_dropout_prob=0.2, pad_token_id=3, initializer_range=0.05))
    assert cfg == BertConfig(vocab_size=V, d_model=32, num_layers=2, num_heads=4, d_ff=48, max_len=20,
                             type_vocab_size=3, dropout=0.2, eps=1e-7, pad_id=3, init_std=0.05)


@pytest.mark.parametrize("std", [0.02, 0.1])
def test_init_std_sets_the_initial_weights_of_body_and_heads(std):
    """BertConfig.init_std (Hugging Face's initializer_range) reaches every linear and embedding weight, heads
    included; biases start at 0 and LayerNorm gains at 1."""
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=500, d_model=64, num_layers=2, num_heads=4, d_ff=128, max_len=64, init_std=std)
    for model in (BertModel(cfg), BertForMaskedLM(cfg), BertClassifier(cfg, 3), BertForQuestionAnswering(cfg)):
        weights = [m.weight for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))]
        pooled = torch.cat([w.detach().flatten() for w in weights])
        assert abs(pooled.std().item() / std - 1) < 0.02
        assert all(abs(w.detach().std().item() / std - 1) < 0.5 for w in weights)   # each matrix, not only the sum
        assert all((m.bias == 0).all() for m in model.modules() if isinstance(m, nn.Linear))


def test_bert_equals_hugging_face_with_padding():
    ours, hf = hf_pair(seed=1)
    ids, segments = padded_ids(4, 9, seed=2, type_vocab_size=3)
    assert (ids == PAD).any() and len(segments.unique()) == 3
    with torch.no_grad():
        hidden = ours(ids, segments)                                       # mask=None: masks pad_id = 0
        pooled = ours.pooler_output(hidden)
        out = hf(input_ids=ids, attention_mask=(ids != PAD).long(), token_type_ids=segments)
    assert hidden.dtype == DT
    assert max_diff(hidden, out.last_hidden_state) < 1e-10
    assert max_diff(pooled, out.pooler_output) < 1e-10
    with torch.no_grad():                                                  # the mask matters here
        unmasked = hf(input_ids=ids, token_type_ids=segments).last_hidden_state
    b = int((ids != PAD).sum(1).argmin())
    assert max_diff(hidden[b], unmasked[b]) > 1e-3


def test_bert_equals_hugging_face_without_padding():
    ours, hf = hf_pair(seed=3)
    ids, segments = padded_ids(3, 8, seed=4, type_vocab_size=3)
    ids = torch.where(ids == PAD, torch.full_like(ids, 7), ids)          # no padding anywhere
    S = ids.size(1)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=None, token_type_ids=segments)
        for mask in (None, torch.ones(1, 1, 1, S, dtype=torch.bool)):
            hidden = ours(ids, segments, mask)
            pooled = ours.pooler_output(hidden)
            assert max_diff(hidden, out.last_hidden_state) < 1e-10
            assert max_diff(pooled, out.pooler_output) < 1e-10


def test_masked_lm_equals_hugging_face():
    transformers = import_hf("transformers")
    cfg = hf_config()
    hf = noisy(transformers.BertForMaskedLM(cfg), seed=5)
    ours = load_hf_bert(BertForMaskedLM(BertConfig.from_hf(cfg)).double().eval(), hf)
    assert ours.bert.pooler is None
    ids, segments = padded_ids(4, 10, seed=6, type_vocab_size=3)
    inputs, labels = mask_tokens(ids, MASK, V, special_ids=(PAD, CLS), mask_prob=0.3,
                                 generator=torch.Generator().manual_seed(7))
    assert (labels != IGNORE_INDEX).sum() >= 3
    with torch.no_grad():
        logits = ours(inputs, segments)
        out = hf(input_ids=inputs, attention_mask=(ids != PAD).long(), token_type_ids=segments, labels=labels)
    assert logits.shape == (4, 10, V)
    assert max_diff(logits, out.logits) < 1e-10
    assert abs(token_cross_entropy(logits, labels).item() - out.loss.item()) < 1e-10


def test_output_layer_is_tied_to_the_token_embedding():
    model = BertForMaskedLM(small_config())
    names = [n for n, _ in model.named_parameters()]
    assert "bert.embeddings.token.weight" in names and not any("decoder" in n for n in names)
    ids = torch.tensor([[3, 4, 6]])                                    # no 5: the hidden states stay put
    before = model.eval()(ids).detach()
    with torch.no_grad():
        model.bert.embeddings.token.weight[5] += torch.randn(32)       # one table: the logits of id 5 move
    after = model(ids).detach()
    assert max_diff(before[..., 5], after[..., 5]) > 1e-3
    torch.testing.assert_close(before[..., :5], after[..., :5], rtol=0, atol=0)


# ---------------------------------------------------------------- load_hf_bert

def test_load_hf_bert_refuses_other_models():
    with pytest.raises(ValueError, match=r"\bmodel\b.*BertModel"):
        load_hf_bert(BertClassifier(small_config(), 3), None)
    with pytest.raises(ValueError, match=r"\bmodel\b"):
        load_hf_bert(torch.nn.Linear(2, 2), None)


def test_load_hf_bert_without_pooler():
    transformers = import_hf("transformers")
    cfg = hf_config()
    hf_mlm = transformers.BertForMaskedLM(cfg)
    assert hf_mlm.bert.pooler is None                                  # Hugging Face's MLM has no pooler
    load_hf_bert(BertForMaskedLM(BertConfig.from_hf(cfg)), hf_mlm)    # ours has none either: loads
    bare = load_hf_bert(BertModel(BertConfig.from_hf(cfg), add_pooler=False), hf_mlm.bert)
    torch.testing.assert_close(bare.embeddings.token.weight, hf_mlm.bert.embeddings.word_embeddings.weight,
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="pooler"):                    # ours wants a pooler they lack
        load_hf_bert(BertModel(BertConfig.from_hf(cfg)), hf_mlm.bert)


def test_load_hf_bert_refuses_more_layers_than_they_have():
    transformers = import_hf("transformers")
    with pytest.raises(ValueError, match="hf_model"):
        load_hf_bert(BertModel(BertConfig.from_hf(hf_config(num_hidden_layers=3))),
                     transformers.BertModel(hf_config()))


def test_load_hf_bert_refuses_fewer_layers_than_they_have():
    transformers = import_hf("transformers")
    with pytest.raises(ValueError, match="hf_model has weights .* no place for"):
        load_hf_bert(BertModel(BertConfig.from_hf(hf_config())),
                     transformers.BertModel(hf_config(num_hidden_layers=3)))


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "intermediate_size"])
def test_load_hf_bert_refuses_other_sizes(field):
    transformers = import_hf("transformers")
    other = {"hidden_size": 16, "vocab_size": V + 10, "intermediate_size": 64}[field]
    with pytest.raises(ValueError, match="hf_model's .* has shape"):
        load_hf_bert(BertModel(BertConfig.from_hf(hf_config())), transformers.BertModel(hf_config(**{field: other})))


# ---------------------------------------------------------------- BertConfig

def test_bert_base_has_110m_parameters():
    with torch.device("meta"):                                        # shapes only: no 440 MB of weights
        model = BertModel(BertConfig())
    n = sum(p.numel() for p in model.parameters())
    assert 109e6 < n < 110e6
    assert n == 109_482_240
    with torch.device("meta"):
        assert sum(p.numel() for p in BertModel(BertConfig(), add_pooler=False).parameters()) == n - 768 * 769


def test_from_hf_refuses_what_we_do_not_implement():
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig.from_hf(hf_config(hidden_act="relu"))
    with pytest.raises(ValueError, match="dropout"):
        BertConfig.from_hf(hf_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2))


@pytest.mark.parametrize("kwargs, names", [
    (dict(d_model=30, num_heads=4), r"d_model|num_heads"),
    (dict(pad_id=V), r"pad_id"),
    (dict(pad_id=-1), r"pad_id"),
    (dict(dropout=1.0), r"dropout"),
    (dict(num_layers=0), r"num_layers"),
    (dict(vocab_size=True), r"vocab_size"),
    (dict(eps=0.0), r"eps"),
    (dict(type_vocab_size=0), r"type_vocab_size"),
])
def test_config_value_errors_name_the_field(kwargs, names):
    with pytest.raises(ValueError, match=rf"\b({names})\b"):
        small_config(**kwargs)


def test_models_refuse_a_config_that_is_not_a_bert_config():
    with pytest.raises(ValueError, match="config must be a BertConfig"):
        BertModel(dataclasses.asdict(small_config()))


# ---------------------------------------------------------------- BertEmbeddings

def test_embeddings_are_the_sum_of_three_tables_then_layer_norm():
    cfg = small_config(type_vocab_size=3)
    emb = randomize(BertEmbeddings(cfg).double(), seed=8).eval()
    ids, segments = padded_ids(3, 7, seed=9, type_vocab_size=3)
    x = emb.token.weight[ids] + emb.position.weight[:7] + emb.segment.weight[segments]     # no sqrt(d) scale
    want = F.layer_norm(x, (32,), emb.norm.weight, emb.norm.bias, cfg.eps)
    torch.testing.assert_close(emb(ids, segments), want, rtol=0, atol=ATOL)
    torch.testing.assert_close(emb(ids), emb(ids, torch.zeros_like(ids)), rtol=0, atol=0)
    assert max_diff(emb(ids), emb(ids, torch.ones_like(ids))) > 1e-3


def test_padding_row_of_the_token_table_starts_at_zero():
    model = BertModel(small_config(pad_id=4))
    assert torch.equal(model.embeddings.token.weight[4], torch.zeros(32))
    assert model.embeddings.token.weight[3].abs().sum() > 0


def test_embeddings_value_errors():
    emb = BertEmbeddings(small_config())
    ids = torch.randint(3, V, (2, 5))
    with pytest.raises(ValueError, match=r"segment_ids must have the shape of tokens \(2, 5\)"):
        emb(ids, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="segment_ids"):
        emb(ids, [[0] * 5] * 2)
    with pytest.raises(ValueError, match="segment_ids .*outside"):
        emb(ids, torch.full((2, 5), 2))                                 # type_vocab_size = 2
    with pytest.raises(ValueError, match="segment_ids"):
        emb(ids, torch.zeros(2, 5))                                     # float segments
    with pytest.raises(ValueError, match=r"tokens has S=21 .*max_len=20"):
        emb(torch.randint(3, V, (1, 21)))
    with pytest.raises(ValueError, match="tokens .*outside"):
        emb(ids + V)
    assert emb(torch.randint(3, V, (1, 20))).shape == (1, 20, 32)     # S = max_len is fine


# ---------------------------------------------------------------- padding, dropout, gradients

def test_padding_is_invisible():
    model = randomize(BertModel(small_config()).double(), seed=10, std=0.2).eval()
    ids, segments = padded_ids(5, 9, seed=11)
    lengths = (ids != PAD).sum(1)
    assert lengths.min() < 9
    with torch.no_grad():
        hidden = model(ids, segments)
        pooled = model.pooler_output(hidden)
        for b, n in enumerate(lengths.tolist()):
            alone = model(ids[b:b + 1, :n], segments[b:b + 1, :n])
            alone_pooled = model.pooler_output(alone)
            assert max_diff(hidden[b, :n], alone[0]) < ATOL
            assert max_diff(pooled[b], alone_pooled[0]) < ATOL
        unmasked = model(ids, segments, torch.ones(1, 1, 1, 9, dtype=torch.bool))
    b = int(lengths.argmin())
    assert max_diff(unmasked[b, :lengths[b]], hidden[b, :lengths[b]]) > 1e-3     # the default mask matters


def test_dropout_only_in_training():
    model = BertClassifier(small_config(dropout=0.3), 3).double()
    ids, segments = padded_ids(3, 6, seed=12)
    model.train()
    assert max_diff(model(ids, segments), model(ids, segments)) > 1e-6
    model.eval()
    torch.testing.assert_close(model(ids, segments), model(ids, segments), rtol=0, atol=0)


def mlm_batch(seed):
    ids, segments = padded_ids(4, 8, seed=seed)
    ids[:, 0] = CLS
    inputs, labels = mask_tokens(ids, MASK, V, special_ids=(PAD, CLS), mask_prob=0.4,
                                 generator=torch.Generator().manual_seed(seed))
    assert (ids == PAD).any() and (labels != IGNORE_INDEX).any()
    return inputs, segments, labels


@pytest.mark.parametrize("kind", ["BertModel", "BertForMaskedLM", "BertClassifier"])
def test_gradients_reach_every_parameter(kind):
    torch.manual_seed(0)
    cfg = small_config(dropout=0.0, type_vocab_size=2)
    inputs, segments, labels = mlm_batch(seed=13)
    if kind == "BertModel":
        model = BertModel(cfg)
        hidden = model(inputs, segments)
        pooled = model.pooler_output(hidden)
        g = torch.Generator().manual_seed(1)                  # random weights: a plain sum after LayerNorm
        loss = (hidden * torch.randn(hidden.shape, generator=g)).sum() + (pooled * torch.randn(pooled.shape, generator=g)).sum()
    elif kind == "BertForMaskedLM":
        model = BertForMaskedLM(cfg)
        loss = token_cross_entropy(model(inputs, segments), labels)
    else:
        model = BertClassifier(cfg, 3)
        loss = F.cross_entropy(model(inputs, segments), torch.tensor([0, 1, 2, 1]))
    loss.backward()
    params = dict(model.named_parameters())
    assert len(params) >= 20
    for name, p in params.items():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name                  # as a whole: the padding row alone gets none
    token = model.embeddings.token if kind == "BertModel" else model.bert.embeddings.token
    if kind != "BertForMaskedLM":                            # tied output layer: every row gets gradient
        assert torch.all(token.weight.grad[PAD] == 0)


# ---------------------------------------------------------------- mask_tokens

def masking_batch(B=4000, S=32, seed=14):
    """Token ids (B, S): CLS first, then regular tokens 3..V-1, then padding; lengths 2..S."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (B, S), generator=g)
    ids[:, 0] = CLS
    lengths = torch.randint(2, S + 1, (B,), generator=g)
    ids[torch.arange(S) >= lengths[:, None]] = PAD
    return ids


def test_mask_tokens_statistics():
    ids = masking_batch()
    inputs, labels = mask_tokens(ids, MASK, V, special_ids=(PAD, CLS), generator=torch.Generator().manual_seed(15))
    special = (ids == PAD) | (ids == CLS)
    chosen = labels != IGNORE_INDEX
    assert abs(chosen.sum().item() / (~special).sum().item() - 0.15) < 0.01
    n = chosen.sum().item()
    masked = (inputs == MASK) & chosen
    unchanged = (inputs == ids) & chosen
    replaced = chosen & ~masked & ~unchanged
    num_regular = V - 3
    assert abs(masked.sum().item() / n - 0.8) < 0.02
    assert abs(replaced.sum().item() / n - 0.1 * (1 - 1 / num_regular)) < 0.02
    assert abs(unchanged.sum().item() / n - (0.1 + 0.1 / num_regular)) < 0.02
    assert not (chosen & special).any()                          # special tokens are never chosen ...
    assert torch.equal(inputs[special], ids[special])            # ... nor altered
    assert torch.equal(inputs[~chosen], ids[~chosen])            # nothing outside the chosen changes
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.all(labels[~chosen] == IGNORE_INDEX)
    new = inputs[replaced]
    assert new.numel() > 0 and new.min() >= 3 and new.max() < V  # random ids: regular tokens only
    assert len(new.unique()) == num_regular                      # ... drawn from all of them


def test_mask_tokens_is_reproducible_with_a_generator():
    ids = masking_batch(B=50, S=16)
    a = mask_tokens(ids, MASK, V, special_ids=(PAD, CLS), generator=torch.Generator().manual_seed(3))
    b = mask_tokens(ids, MASK, V, special_ids=(PAD, CLS), generator=torch.Generator().manual_seed(3))
    c = mask_tokens(ids, MASK, V, special_ids=(PAD, CLS), generator=torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_mask_tokens_extreme_probabilities():
    ids = masking_batch(B=50, S=16)
    regular = (ids != PAD) & (ids != CLS)
    inputs, labels = mask_tokens(ids, MASK, V, special_ids=(PAD, CLS), mask_prob=0.0)
    assert torch.equal(inputs, ids) and torch.all(labels == IGNORE_INDEX)
    inputs, labels = mask_tokens(ids, MASK, V, special_ids=(PAD, CLS), mask_prob=1.0)
    assert torch.equal(labels != IGNORE_INDEX, regular)
    assert torch.equal(inputs[~regular], ids[~regular])


def test_mask_tokens_never_chooses_a_mask_token_already_there():
    ids = torch.full((20, 10), MASK)
    ids[:, ::2] = 5
    inputs, labels = mask_tokens(ids, MASK, V, special_ids=(PAD,), mask_prob=1.0)
    assert torch.equal(labels != IGNORE_INDEX, ids == 5)
    assert torch.equal(inputs[ids == MASK], ids[ids == MASK])


def test_mask_tokens_value_errors():
    ids = masking_batch(B=2, S=5)
    with pytest.raises(ValueError, match=r"mask_prob must lie in \[0, 1\]"):
        mask_tokens(ids, MASK, V, mask_prob=1.5)
    with pytest.raises(ValueError, match="tokens .*outside"):
        mask_tokens(ids + V, MASK, V)
    with pytest.raises(ValueError, match="no regular token"):
        mask_tokens(torch.zeros(2, 3, dtype=torch.long), 2, 3, special_ids=(0, 1))


def test_mask_tokens_refuses_a_mask_id_outside_the_vocabulary():
    with pytest.raises(ValueError, match="mask_id"):
        mask_tokens(masking_batch(B=2, S=5), V, V)


# ---------------------------------------------------------------- token_cross_entropy

def test_mlm_loss_is_cross_entropy_over_the_chosen_positions():
    g = torch.Generator().manual_seed(16)
    logits = torch.randn(3, 6, V, generator=g, dtype=DT)
    labels = torch.full((3, 6), IGNORE_INDEX)
    chosen = torch.rand(3, 6, generator=g) < 0.4
    chosen[0, 0] = True
    labels[chosen] = torch.randint(0, V, (int(chosen.sum()),), generator=g)
    loss = token_cross_entropy(logits, labels)
    want = F.cross_entropy(logits[chosen], labels[chosen])
    assert abs(loss.item() - want.item()) < ATOL
    assert abs(loss.item() - F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1)).item()) < ATOL
    other = logits.clone()
    other[~chosen] = 100 * torch.randn(int((~chosen).sum()), V, generator=g, dtype=DT)
    assert abs(token_cross_entropy(other, labels).item() - loss.item()) < ATOL
    other[0, 0] += torch.randn(V, generator=g, dtype=DT)                  # a chosen position: it changes
    assert abs(token_cross_entropy(other, labels).item() - loss.item()) > 1e-6


def test_mlm_loss_without_a_chosen_position_is_zero():
    logits = torch.randn(2, 4, V, dtype=DT, requires_grad=True)
    loss = token_cross_entropy(logits, torch.full((2, 4), IGNORE_INDEX))
    assert loss.item() == 0.0 and not loss.isnan()
    loss.backward()                                                      # and it can still be backpropagated
    assert torch.all(logits.grad == 0)


def test_mlm_loss_value_errors():
    logits = torch.randn(2, 4, V)
    with pytest.raises(ValueError, match=r"labels must have shape \(B, S\) = \(2, 4\)"):
        token_cross_entropy(logits, torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        token_cross_entropy(logits, torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="logits"):
        token_cross_entropy(logits[0], torch.zeros(4, dtype=torch.long))

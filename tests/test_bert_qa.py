"""Chapter 10's span head for extractive question answering: BertForQuestionAnswering equal to Hugging Face's in
float64 (logits and loss, padded rows, both directions of the bridge), and span_loss's checks."""

import pytest
import torch
import torch.nn.functional as F
from helpers import import_hf, max_diff, noisy

from transformer_lib.attention import padding_mask
from transformer_lib.bert import (
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    bert_hf_names,
    load_hf_bert,
    span_loss,
    to_hf_bert,
)

PAD = 0


def pair(seed=0):
    transformers = import_hf("transformers")
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=20, attn_implementation="eager")
    theirs = noisy(transformers.BertForQuestionAnswering(cfg), seed)
    return load_hf_bert(BertForQuestionAnswering(BertConfig.from_hf(cfg)).double().eval(), theirs), theirs


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 30, (3, 12), generator=g)
    ids[1, 8:], ids[2, 5:] = PAD, PAD
    return ids, torch.randint(0, 2, (3, 12), generator=g), torch.tensor([2, 0, 1]), torch.tensor([6, 3, 1])


def test_question_answering_equals_hugging_face_with_padding_and_loss():
    ours, theirs = pair()
    ids, segments, start, end = batch()
    with torch.no_grad():
        ref = theirs(input_ids=ids, token_type_ids=segments, attention_mask=(ids != PAD).long(),
                     start_positions=start, end_positions=end)
        logits = ours(ids, segments, mask=padding_mask(ids, PAD))
    assert logits.shape == (3, 12, 2)
    assert max_diff(logits[..., 0], ref.start_logits) < 1e-12 and max_diff(logits[..., 1], ref.end_logits) < 1e-12
    assert abs(span_loss(logits, start, end) - ref.loss) < 1e-12
    assert max_diff(logits[..., 0], logits[..., 1]) > 1e-3                    # two different heads


def test_question_answering_round_trip_and_names():
    transformers = import_hf("transformers")
    ours, theirs = pair(seed=3)
    names = bert_hf_names(ours)
    assert names["qa_outputs.weight"] == "qa_outputs.weight" and not any("pooler" in k for k in names)
    back = to_hf_bert(ours, noisy(transformers.BertForQuestionAnswering(theirs.config), 4))
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), theirs.state_dict().values(), strict=True))
    with pytest.raises(ValueError, match="hf_model"):                        # the MLM head has other names
        load_hf_bert(BertForMaskedLM(BertConfig.from_hf(theirs.config)), theirs)


def test_span_loss_value_and_bad_spans():
    logits = torch.randn(2, 5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    start, end = torch.tensor([0, 2]), torch.tensor([3, 2])
    want = (F.cross_entropy(logits[..., 0], start) + F.cross_entropy(logits[..., 1], end)) / 2
    assert torch.equal(span_loss(logits, start, end), want)
    for s, e in (([3, 0], [1, 0]), ([0, 0], [5, 0]), ([-1, 0], [0, 0])):
        with pytest.raises(ValueError, match="start and end"):
            span_loss(logits, torch.tensor(s), torch.tensor(e))
    with pytest.raises(ValueError, match="logits"):
        span_loss(logits[..., :1], start, end)
    with pytest.raises(ValueError, match="start"):
        span_loss(logits, torch.tensor([0.0, 1.0]), end)
    with pytest.raises(ValueError, match="end"):
        span_loss(logits, start, torch.tensor([1, 2, 3]))

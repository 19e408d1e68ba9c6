"""Speculative decoding: expected tokens, acceptance conversions, and helps/hurts by batch size."""
from __future__ import annotations

import pytest

from exporter.errors import InputError
from exporter.model import perf
from exporter.model.setup import Setup
from exporter.model.spec_decode import (SpecConfig, alpha_from_draft_acceptance,
                                        alpha_from_per_position, break_even_batch,
                                        expected_tokens, gain, gain_table)
from exporter.model.traffic import Traffic


def _setup(**kw):
    return Setup.build("meta-llama/Llama-3.1-8B-Instruct", "H100", max_model_len=8192, **kw)


def test_expected_tokens_closed_form():
    # (1 - a^(k+1)) / (1 - a): a=0.8, k=3 -> (1 - 0.4096) / 0.2 = 2.952
    assert expected_tokens(3, 0.8) == pytest.approx(2.952)
    assert expected_tokens(0, 0.9) == 1.0
    assert expected_tokens(4, 1.0) == 5.0
    assert expected_tokens(3, 0.0) == 1.0


def test_per_position_rates_are_summed():
    # vLLM's accepted_per_pos / num_drafts are already cumulative: 1 + 0.7 + 0.5 + 0.3
    assert expected_tokens(3, 0.0, (0.7, 0.5, 0.3)) == pytest.approx(2.5)
    assert alpha_from_per_position((0.8, 0.64, 0.512)) == pytest.approx(0.8)


def test_vllm_draft_acceptance_rate_is_not_alpha():
    # i.i.d. model: rate = a (1 - a^k) / (k (1 - a)); a = 0.8, k = 3: 0.8 x 0.488 / 0.6 = 0.65067
    assert alpha_from_draft_acceptance(0.650666, 3) == pytest.approx(0.8, abs=1e-4)
    with pytest.raises(InputError):
        alpha_from_draft_acceptance(0.5, 0)


def test_spec_helps_at_batch_one_with_high_acceptance():
    g = gain(_setup(), SpecConfig(num_tokens=3, alpha=0.8), batch=1, context_tokens=1500)
    assert g.helps and g.speedup > 2.0  # memory-bound: verify costs ~ one step, 2.95 tokens/step


def test_spec_hurts_at_large_batch_and_at_low_acceptance():
    s = _setup()
    # short contexts: the batch's GEMMs, not KV reads, bound the step, so verifying 1 + k tokens
    # per request costs ~(1 + k) plain steps for 2.95 tokens
    assert not gain(s, SpecConfig(num_tokens=3, alpha=0.8), batch=512, context_tokens=200).helps
    assert not gain(s, SpecConfig(num_tokens=4, alpha=0.05), batch=1, context_tokens=1500).helps


def test_gain_falls_with_batch_and_break_even_is_consistent():
    s, spec = _setup(), SpecConfig(num_tokens=3, alpha=0.7)
    table = gain_table(s, spec, 200)
    speedups = [g.speedup for g in table]
    assert speedups == sorted(speedups, reverse=True)
    b = break_even_batch(s, spec, 200)
    assert 1 <= b < 1024
    assert gain(s, spec, b, 200).helps and not gain(s, spec, b + 1, 200).helps


def test_long_contexts_keep_spec_useful_longer():
    # KV reads are shared by the 1 + k verified tokens of a request, so memory-bound decoding
    # over long contexts tolerates bigger batches before speculation stops paying
    s, spec = _setup(), SpecConfig(num_tokens=3, alpha=0.7)
    assert break_even_batch(s, spec, 4000) > break_even_batch(s, spec, 200)


def test_predict_with_spec_lowers_tpot_at_low_load():
    s = _setup()
    tr = Traffic(1024, 256)
    plain = perf.predict(s, tr, concurrency=1)
    fast = perf.predict(s, tr, concurrency=1, spec=SpecConfig(num_tokens=3, alpha=0.8))
    assert fast.tpot_s < 0.6 * plain.tpot_s
    assert fast.spec_tokens_per_step == pytest.approx(2.952)


def test_bad_spec_input():
    with pytest.raises(InputError):
        SpecConfig(num_tokens=-1)
    with pytest.raises(InputError):
        SpecConfig(num_tokens=2, alpha=1.5)
    with pytest.raises(InputError):
        SpecConfig(num_tokens=2, alpha=0.5, method="telepathy")

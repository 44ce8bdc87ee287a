"""Owns drafter adaptation for speculative decoding: a tiny byte-level target, exact speculative
decoding (draft k, verify in one target pass, greedy / rejection-sampling acceptance), an
EAGLE-style draft head trained on a pool's ``training`` split, and the acceptance report.

Modules: ``model`` (byte tokenizer, tiny causal transformer exposing its last hidden states,
brief training), ``speculative`` (the decoding loop and the exact acceptance rule), ``eagle``
(the draft head and its trainer), ``pipeline`` (pool split -> training set -> stock vs adapted
acceptance report). Core code: no dagster import.
"""

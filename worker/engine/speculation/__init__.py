"""Speculative decoding: proposers offer tokens, the target verifies them in one multi-token step.

config (SpeculativeConfig), ngram (prompt lookup), verifier (acceptance on the step's logits),
controller (on only where it pays), speculator (the engine's one interface: plan / observe / record).
"""

"""Evaluation: greedy CoaT decoding and Step.Acc, scoring prediction files, seed selection."""

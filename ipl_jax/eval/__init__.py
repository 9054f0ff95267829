"""Evaluation: greedy CoaT decoding and Step.Acc, scoring prediction files, the starting policy's selection."""

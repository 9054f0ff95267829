"""Preference learning: pairs from CoaT-trees, prefix-packed batches, losses, the T-DPO step."""

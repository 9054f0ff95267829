"""Datasets packed once into ArrayRecord shards of step records, read back through Grain.

``encoding`` (the bytes of one step record), ``layout`` (shard names, the metadata file, per-process shares),
``writer`` (``pack_dataset``: any supported format -> shards), ``reader`` (``open_split`` for Grain pipelines,
``load_packed`` for whole splits of episodes).
"""

"""Datasets packed once into ArrayRecord shards of step records (``encoding``, ``layout``, ``writer``), read back
through Grain (``reader``).
"""

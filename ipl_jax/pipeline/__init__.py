"""The end-to-end job (``run.py``: stages, workdir, the round loop) and the ablation table (``ablate.py``); their
command lines are ``ipl-jax run`` / ``sft`` / ``ablate`` (``ipl_jax/cli/``)."""

"""The end-to-end job (``ipl-jax run``) and the ablation table (``ipl-jax ablate``); see ``run.py``."""


def main(argv: list[str]) -> int:
    from ipl_jax.pipeline.run import main as run_main

    return run_main(argv)


def ablate_main(argv: list[str]) -> int:
    from ipl_jax.pipeline.ablate import main as ablate

    return ablate(argv)


def sft_main(argv: list[str]) -> int:
    from ipl_jax.pipeline.run import sft_main as sft

    return sft(argv)

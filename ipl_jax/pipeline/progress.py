"""Progress reporting for the job's stages: ``ipl_jax.progress`` (tqdm bars with ETA on a terminal, one plain
line per interval in logs), re-exported where the pipeline has always imported it from."""

from ipl_jax.progress import LogProgress, format_seconds, progress, progress_bar

__all__ = ["LogProgress", "format_seconds", "progress", "progress_bar"]

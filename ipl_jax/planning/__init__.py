"""The memory and FLOP plan of the job's programs (``ipl-jax plan``): their inputs (``shapes``: published
architectures, batch shapes, abstract batches), the programs compiled ahead of time and measured (``programs``),
and the HLO FLOP counter (``hlo_cost``). It reads the job's settings; the job and the commands import it, never
the other way.
"""

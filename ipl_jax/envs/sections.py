"""The live world's settings section (``env``), owned by the library: which world the job's live-world evaluation,
its PPO / GiGPPO rollouts and ``ipl-jax eval --online`` play (``envs.open_envs`` reads it). Importing this module
loads neither the synthetic world nor an HTTP client.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ipl_jax.sections import Section, is_positive, one_of

ENV_KINDS = ("synthetic", "androidworld")  # envs.open_envs' worlds


@dataclasses.dataclass(frozen=True)
class EnvSettings(Section):
    """The live world: the synthetic world in process (one slot per episode of a batch), or AndroidWorld servers
    (one slot per server URL, tasks spread over them)."""

    PATH: ClassVar[str] = "env"
    kind: str = "synthetic"
    """synthetic | androidworld (AndroidWorld's HTTP servers at `urls`)."""
    urls: tuple[str, ...] = ()
    """AndroidWorld: one server (one emulator) per URL, http://HOST:PORT."""
    tasks: tuple[str, ...] = ()
    """AndroidWorld: the suite's task names to play (empty: every task)."""
    timeout_s: float = 60.0
    """AndroidWorld: seconds one request may take before it is retried."""
    retries: int = 2
    """AndroidWorld: retries of a failed or timed-out request before the episode is recorded as failed."""

    def __post_init__(self):
        self.need("kind", self.kind in ENV_KINDS, one_of(ENV_KINDS))
        self.need("timeout_s", is_positive(self.timeout_s), "must be > 0")
        self.at_least("retries", 0)
        if self.kind == "androidworld":
            self.need("urls", len(self.urls) >= 1, "must name one or more servers with env.kind=androidworld")
        for url in self.urls:
            self.need("urls", url.startswith(("http://", "https://")), f"{url!r} is not an http(s):// URL")
        self.need("urls", len(set(self.urls)) == len(self.urls), "names a server twice")

"""The worlds a policy plays, behind one protocol (``protocol``: reset, observe, act, score, close): the synthetic
GUI world and its dataset writers (``synthetic``), AndroidWorld's emulators over HTTP (``androidworld``). The
``env`` settings section (``sections``) says which; ``open_envs`` opens its slots, checking each server first.

Nothing is imported eagerly: the job's settings import ``sections`` without loading a world.
"""

from __future__ import annotations

from collections.abc import Callable


def _client():
    """The AndroidWorld client module, imported when asked for; one line if it is missing."""
    from ipl_jax.envs.protocol import EnvError

    try:
        from ipl_jax.envs import androidworld
    except ImportError:
        raise EnvError("env kind androidworld: client not available") from None
    return androidworld


def check_envs(env, check: Callable[[str], None] | None = None) -> None:
    """Every server of ``env`` (an ``EnvSettings``) up and healthy, else one ``EnvError`` line naming the URL, before
    anything expensive. ``check(url)`` (default: the AndroidWorld client's ``check``) raises ``EnvError``. The
    synthetic world needs no check."""
    if env.kind == "synthetic":
        return
    check = check or _client().check
    for url in env.urls:
        check(url)


def open_envs(env, slots: int, check: Callable[[str], None] | None = None) -> list:
    """The environment slots of ``env`` (an ``EnvSettings``): ``slots`` synthetic worlds, or one AndroidWorld client
    per server URL (checked first: ``check_envs``)."""
    if env.kind == "synthetic":
        from ipl_jax.envs.synthetic.env import SyntheticEnv

        return [SyntheticEnv() for _ in range(max(1, int(slots)))]
    check_envs(env, check)
    client = _client()
    return [client.AndroidWorldEnv(url, env.timeout_s, env.retries) for url in env.urls]


def suite_tasks(env) -> list:
    """The ``EnvTask`` s of an AndroidWorld suite (``env.tasks``' names, else every task), every server's suite
    rebuilt alike so that one task index is one task instance on each."""
    names = list(env.tasks) or None
    return _client().suite_tasks(env.urls, names=names, timeout=env.timeout_s, retries=env.retries)

"""AndroidWorld (google-research/android_world) over its HTTP server: the environment protocol on a real Android
emulator. ``open(urls, timeout, retries)`` gives one ``AndroidWorldEnv`` per server, ``check(url)`` asks a server
whether it is healthy, ``suite_tasks(urls, names)`` lists the suite's episodes. Modules: client (HTTP with timeouts
and bounded retries), actions (our actions <-> AndroidWorld's JSON actions), screens (screenshot decoding), env.
"""

from ipl_jax.lazy import lazy_names

__all__, __getattr__ = lazy_names(
    __name__,
    {  # module of this package -> the names it defines
        "actions": ("from_json_action", "to_json_action"),
        "env": ("AndroidWorldEnv", "check", "open", "suite_tasks"),
        "screens": ("decode_pixels",),
    },
)

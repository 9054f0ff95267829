"""The apps of the synthetic world, each a small state machine that lays out its current page as widgets."""

from ipl_jax.envs.synthetic.apps.base import App, ListView
from ipl_jax.envs.synthetic.apps.catalog import CatalogApp
from ipl_jax.envs.synthetic.apps.home import HomeApp
from ipl_jax.envs.synthetic.apps.messages import MessagesApp
from ipl_jax.envs.synthetic.apps.plain import PlainApp
from ipl_jax.envs.synthetic.apps.settings import SettingsApp

__all__ = ["App", "ListView", "CatalogApp", "HomeApp", "MessagesApp", "PlainApp", "SettingsApp"]

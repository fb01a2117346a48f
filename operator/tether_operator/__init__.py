"""The kopf operator for DurableAgent resources: `kopf run -m tether_operator`.

Importing the package registers the handlers (`tether_operator.handlers`); `tether-operator`
(`tether_operator.main:main`) runs them with settings from the environment.
"""

from tether._optional import extra_imports

with extra_imports("tether_operator", "operator"):
    from . import handlers

__all__ = ["handlers"]

"""Moved to :mod:`spectrace.rules.catalogue` (the torch-free rules leaf); this name stays
until every importer uses the new one."""

from .rules.catalogue import *  # noqa: F401,F403
from .rules.catalogue import CATALOGUE, Code, finding  # noqa: F401

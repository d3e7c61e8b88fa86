"""The recorder each SGLang test that asks for ``rec`` gets; its module's ``installed`` fixture
(``yield from sh.installed(...)``) puts spectrace's hooks on SGLang's classes first."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spectrace.recorder import Recorder
from tests.helpers import engine_hooks


@pytest.fixture
def rec(installed: None) -> Iterator[Recorder]:
    from spectrace.integrations.sglang import state as st_state

    yield from engine_hooks.fresh(st_state.reset)

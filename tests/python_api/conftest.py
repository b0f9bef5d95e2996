"""Driver tests run tiny models: one torch thread is faster than two on a shared 2-core machine (thread
synchronisation costs more than these matmuls), so each test module runs single-threaded and restores the setting."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _cost_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Auto trees cache the target's cost curve under $SPECDEC_CACHE: the tests' tiny models write theirs to a
    temporary folder, not the user's cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECDEC_CACHE", str(tmp_path_factory.mktemp("specdec_cache")))
    try:
        yield
    finally:
        mp.undo()


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

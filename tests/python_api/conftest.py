"""Driver tests run tiny models: one torch thread is faster than two on a shared 2-core machine (thread
synchronisation costs more than these matmuls), so each test module runs single-threaded and restores the setting."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

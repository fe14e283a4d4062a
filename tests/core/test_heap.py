"""The loaded models' objects out of the garbage collector's full passes (core/heap.py): a load
freezes the heap, an unload hands it back so that cycles the model left can be freed, and the
heap is frozen again after the unload. Over fake-backend models, in process."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from oceanus.core import heap
from oceanus.core.server import ServerCore
from tests.core.fakes import IO_FP32, World, until


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _thawed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(heap, "REFREEZE_DELAY_S", 0.0)
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test process collects as usual


def test_a_load_freezes_and_an_unload_frees_the_cycles_left(world: World) -> None:
    world.add("a", IO_FP32, max_batch_size=8)

    async def scenario(core: ServerCore) -> None:
        assert gc.get_freeze_count() == 0
        cycle = _Cycle()  # stands for a model's long-lived objects
        await core.load_model("a")
        assert gc.get_freeze_count() > 0
        ref = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert ref() is not None  # frozen: full collections skip it
        await core.unload_model("a")
        gc.collect()
        assert ref() is None  # handed back: the unloaded model's cycles are freed
        await until(lambda: gc.get_freeze_count() > 0)  # and the rest frozen again

    world.run(scenario, control_mode="explicit")

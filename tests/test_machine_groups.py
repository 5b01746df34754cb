"""The README's `pytest -n auto --dist loadgroup` runs each ``MACHINE_GROUPS`` file's tests on one worker: pytest-xdist
appends the group to a grouped test's node id, and its scheduler hands out tests by that suffix. A pytest or
pytest-xdist release that drops the suffix makes every group a no-op without a word (pytest 9.2 with pytest-xdist 3.8
did: ``pyproject.toml`` pins pytest below it); this test says so instead."""

from __future__ import annotations

import os

import pytest

from conftest import MACHINE_GROUPS


def test_every_machine_group_file_carries_its_group_in_its_node_ids(request):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under the README's `pytest -n auto --dist loadgroup`: it checks what xdist's groups do")
    group_of = {name: group for group, names in MACHINE_GROUPS.items() for name in names}
    grouped = [item for item in request.session.items if item.path.stem in group_of]
    if not grouped:
        pytest.skip("no test of a MACHINE_GROUPS file was collected")
    lost = [item.nodeid for item in grouped if not item.nodeid.endswith(f"@{group_of[item.path.stem]}")]
    assert not lost, (f"{len(lost)} of {len(grouped)} tests of MACHINE_GROUPS files have no xdist group in their node id "
                      f"(e.g. {lost[0]}): this pytest and pytest-xdist run them on any worker")

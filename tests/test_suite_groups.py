"""The suite's parallel split stays true: every test file that starts a Ray cluster, a run or a `ray start` is in
one of conftest's ``MACHINE_GROUPS`` (under `pytest -n auto --dist loadgroup` a group's files run one after another),
and the groups name only files that exist, each once."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import MACHINE_GROUPS, MACHINE_WIDE

TESTS = Path(__file__).resolve().parent
# what starts something machine-wide: a Ray cluster, a run in this process or through launch.py (not a dry run)
STARTS = re.compile(r"ray\.init\(|standin_cluster\(|short_run\b|single_agent_run\b|from actors\.driver import train"
                    r"|\"ray\", \"start\"|'ray', 'start'|launched\(")


def test_the_machine_groups_name_existing_files_once():
    assert MACHINE_WIDE <= {p.stem for p in TESTS.glob("test_*.py")}
    assert sum(len(names) for names in MACHINE_GROUPS.values()) == len(MACHINE_WIDE), "a file in two groups"


def test_every_file_that_starts_a_cluster_or_a_run_is_in_the_machine_wide_group():
    starting = {p.stem for p in TESTS.glob("test_*.py") if p.stem != Path(__file__).stem and STARTS.search(p.read_text())}
    assert starting - MACHINE_WIDE == set(), "add these to a group of conftest.MACHINE_GROUPS"

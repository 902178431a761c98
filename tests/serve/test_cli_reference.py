"""The configuration as data: the operator guide's reference block is what `python -m parrot.cli.reference`
gives; every setting has a one-line doc; every bound is enforced and named by the setting's path;
ManagerConfig's sections and their tables agree."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from parrot.cli.reference import END, GUIDE, START, render, with_reference
from parrot.cli.settings import ConfigError, all_settings, build_configs, defaults, settings_of
from parrot.protocol.config_fields import SettingError
from parrot.serve.config import SECTIONS, ManagerConfig, SharingConfig


def test_the_guide_holds_the_generated_reference() -> None:
    guide = GUIDE.read_text()
    assert guide.count(START) == 1 and guide.count(END) == 1
    assert guide == with_reference(guide, render()), "the configuration reference is stale: run `make docs`"


def test_the_reference_lists_every_setting_under_its_table() -> None:
    listed, table = [], ""
    for line in render().splitlines():
        if line.startswith("### "):
            table = line.removeprefix("### `[").removesuffix("]`")
        elif line.startswith("| `"):
            listed.append(f"{table}.{line.split('`')[1]}")
    assert listed == list(all_settings())
    assert len(listed) == 64


def test_every_setting_has_a_one_line_doc() -> None:
    missing = [s.path for s in all_settings().values() if not s.doc or "\n" in s.doc]
    assert missing == []


def test_manager_sections_are_its_tables_and_their_keys_are_unique() -> None:
    fields = dataclasses.fields(ManagerConfig)
    names = ["auth", "limits", "scheduling", "sharing", "engines", "lifecycle"]
    assert [f.name for f in fields] == list(SECTIONS) == names
    hints = typing.get_type_hints(ManagerConfig)
    assert [(hints[n], SECTIONS[n].SECTION) for n in names] == [(SECTIONS[n], n) for n in names]
    keys = [s.key for s in settings_of(["manager"])]
    assert len(keys) == len(set(keys)) == 38  # a flag is the key alone


BAD = {"> 0": 0, ">= 1": 0, ">= 0": -1}


@pytest.mark.parametrize("path", [s.path for s in all_settings().values() if s.bound])
def test_every_bound_is_enforced_and_names_the_setting(path: str) -> None:
    s = all_settings()[path]
    with pytest.raises(ConfigError) as e:
        build_configs({**defaults(), path: BAD[s.bound]})
    assert str(e.value) == f"{path} must be {s.bound}"


def test_replace_changes_settings_by_path_and_checks_them() -> None:
    config = ManagerConfig(sharing=SharingConfig(prefix_sharing=False))
    changed = config.replace({"scheduling.tpot_target_ms": 80.0, "limits.max_sessions": 5})
    assert [changed.scheduling.tpot_target_ms, changed.limits.max_sessions, changed.sharing.prefix_sharing] == [
        80.0,
        5,
        False,
    ]
    assert config.scheduling.tpot_target_ms == 50.0  # frozen: a copy
    with pytest.raises(SettingError, match=r"^scheduling\.tpot_target_ms must be > 0$"):
        config.replace({"scheduling.tpot_target_ms": 0})
    with pytest.raises(SettingError, match=r"^tpot_target_ms is not a manager setting$"):
        config.replace({"tpot_target_ms": 80.0})

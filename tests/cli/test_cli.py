"""The ``redlease`` command itself: one entry point, bad arguments are one line and exit 2."""

from __future__ import annotations

import pytest

from cli_helpers import assert_one_line_error, redlease_cli


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["demo", "--contenders", "1"],
        ["demo", "--ttl", "abc"],
        ["demo", "--ttl", "0.01"],
        ["demo", "--duration", "-3"],
        ["status"],
        ["bench", "--engine", "java"],
        ["bench", "--load", "heavy"],
        ["bench", "--seconds", "nan"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str]) -> None:
    result = redlease_cli(*args)

    assert assert_one_line_error(result, 2).startswith("redlease")


def test_console_script_and_module_share_one_entry_point() -> None:
    from redlease._cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0

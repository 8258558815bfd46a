"""The `kestrel-lab` command: every registered group parses and documents itself."""
import subprocess
import sys

import pytest

from kestrel_lab import cli


def _commands() -> list[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sorted(sub.choices)


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in _commands():
        assert name in out


@pytest.mark.parametrize("command", _commands())
def test_each_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip()


def test_console_script_runs_runner_info():
    out = subprocess.run([sys.executable, "-m", "kestrel_lab", "runner-info"], capture_output=True,
                         text=True, check=True).stdout
    assert "arch" in out and "numba" in out

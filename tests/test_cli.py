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


def _bench_args(*argv):
    return cli.build_parser().parse_args(["bench", *argv])


def test_bench_memory_limit_and_dense_twin_parse():
    a = _bench_args("--config", "data/configs/qwen3-30b-a3b.config.json", "--layers", "6", "--memory-limit", "1G",
                    "--dense-twin", "--rounds", "2")
    assert (a.layers, a.memory_limit, a.dense_twin, a.rounds) == (6, "1G", "", 2)
    a = _bench_args("--dense-twin", "other.config.json")
    assert a.dense_twin == "other.config.json"
    a = _bench_args()
    # each bench has its own default rounds: 3 with --peer, 1 for the MoE runs
    assert a.memory_limit is None and a.dense_twin is None and a.rounds is None


@pytest.mark.parametrize("flag", [["--memory-limit", "1G"], ["--dense-twin"]])
def test_bench_moe_flags_refused_for_a_dense_config(flag, capsys):
    assert cli.main(["bench", "--config", "data/configs/qwen3-0.6b.config.json", *flag]) == 2
    assert f"{flag[0]} applies to a Qwen3-MoE --config" in capsys.readouterr().err


def test_bench_bad_memory_limit_fails_before_building(capsys, monkeypatch):
    from kestrel_lab.bench import moe as moe_bench

    monkeypatch.setattr(moe_bench, "moe_run", lambda *a, **k: pytest.fail("moe_run must not start"))
    assert cli.main(["bench", "--config", "data/configs/qwen3-30b-a3b.config.json", "--memory-limit", "lots"]) == 1
    assert "memory size 'lots'" in capsys.readouterr().err

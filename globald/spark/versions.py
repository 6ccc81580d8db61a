"""The PySpark releases globald's Spark integration supports, and the one feature that needs a newer release.

Supported: every PySpark 4 (``pyspark>=4.0,<5`` in pyproject.toml; ``make test-matrix`` runs the Spark tests,
classic and Connect, on the oldest and the newest). Not PySpark 3.5: its Connect client pins NumPy below 2, which
current pyarrow refuses, and its pip package ships no Connect server to test against; an older PySpark is refused
in one line when a view is made, rather than met as an error mid-job. Within 4.x, the typed ``view.udf()`` needs
4.1's Arrow UDFs and is refused alike on 4.0, where ``view.join`` serves.
"""

from __future__ import annotations

import re

from globald.common.errors import GlobaldError

SUPPORTED = ">=4.0,<5"  # pyproject.toml's spark extra says the same (tests/unit/test_pyspark_versions.py)
MINIMUM = (4, 0)
ARROW_UDF = (4, 1)  # pyspark.sql.functions.arrow_udf: the typed view.udf()


class PySparkVersionError(GlobaldError):
    """The installed PySpark is older than this call needs. Install a supported one
    (``pip install 'pyspark[connect]>=4.0,<5'``), or use the alternative the message names."""


def installed() -> tuple[int, int]:
    """(major, minor) of the PySpark this process imports."""
    import pyspark

    found = re.match(r"(\d+)\.(\d+)", pyspark.__version__)
    if found is None:  # a build of PySpark with a version we cannot read: let it try
        return MINIMUM
    return int(found[1]), int(found[2])


def require(minimum: tuple[int, int], what: str, instead: str = "") -> None:
    """Refuse ``what`` in one line when the installed PySpark is older than ``minimum``."""
    have = installed()
    if have >= minimum:
        return
    import pyspark

    hint = f"; {instead}" if instead else f": pip install 'pyspark[connect]{SUPPORTED}'"
    raise PySparkVersionError(f"{what} needs PySpark {minimum[0]}.{minimum[1]} or newer, and pyspark "
                              f"{pyspark.__version__} is installed{hint}")

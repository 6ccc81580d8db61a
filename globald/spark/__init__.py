"""PySpark integration: executors read global tables through snapshots the driver chooses and broadcasts.

``GlobalTableView(spark, config_path, table)`` is the entry point; see ``view`` (driver) and ``executor``.
"""

from globald.spark.view import GlobalTableView

__all__ = ["GlobalTableView"]

"""What makes `spark.read.format("streamwal")` work with no `spark.dataSource.register`.

PySpark (4.0+) looks once per session, in a Python worker, for top-level modules whose
names start with `pyspark_` and that define `DefaultSource`, a DataSource subclass, and
registers each under its `name()` (pyspark/sql/worker/lookup_data_sources.py). This is
that module: installed with streamwal (pyproject.toml maps it from spark/pyspark_streamwal),
so whatever interpreter PYSPARK_PYTHON names finds it. The data source itself is
streamwal.spark.source.
"""

from streamwal.spark.source import StreamwalDataSource as DefaultSource

__all__ = ["DefaultSource"]

"""PySpark data sources and sinks over zbroker's services (Spark 4's Python Data Source API).

    from zbroker.spark import register
    register(spark)                                  # every format whose module imports
    spark.read.format("zpipes").option("pipe", "logs").load()

Installed with the ``spark`` extra (``pip install 'zbroker[spark]'``: pyspark 4 and pyarrow,
which Python data sources need); Spark needs Java 17 or newer. The Python workers that Spark
starts (``PYSPARK_PYTHON``) must be able to import this package.

Formats (see each module's documentation for options and guarantees):

* ``zpipes`` (:mod:`zbroker.spark.zpipes_source`): line-oriented text through a named pipe;
  batch and streaming source and sink.
* ``pzq`` (:mod:`zbroker.spark.pzq_source`): pzq queues; a replayable stream source (at least
  once), a batch source, batch and streaming sinks (at least once).

Importing this package does not import pyspark; :func:`register` does.
"""

from __future__ import annotations

import importlib
from typing import Any

# format name -> "module:class" of its DataSource. A new service's format goes here.
FORMATS: dict[str, str] = {
    "zpipes": "zbroker.spark.zpipes_source:ZpipesDataSource",
    "pzq": "zbroker.spark.pzq_source:PzqDataSource",
}


def data_source(fmt: str) -> type:
    """The DataSource class of format ``fmt`` (imports its module, and pyspark)."""
    try:
        target = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(sorted(FORMATS))}") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def register(spark: Any, formats: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """Register the data sources of ``formats`` (default: all of them) with the SparkSession
    ``spark``, so that ``format(name)`` finds them; returns the names registered."""
    names = list(FORMATS) if formats is None else list(formats)
    for name in names:
        spark.dataSource.register(data_source(name))
    return names


__all__ = ["FORMATS", "data_source", "register"]

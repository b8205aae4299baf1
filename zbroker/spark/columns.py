"""What our sinks need of a DataFrame's schema (no pyspark import at module level beyond
types)."""

from __future__ import annotations

from pyspark.sql.types import BinaryType, StringType, StructType


def value_column(schema: StructType, fmt: str) -> int:
    """Index of the ``value`` column (string or binary) a ``format(fmt)`` sink writes; raises
    ValueError saying what is wrong."""
    for index, field in enumerate(schema.fields):
        if field.name.lower() == "value":
            if not isinstance(field.dataType, StringType | BinaryType):
                raise ValueError(
                    f'format("{fmt}") writes a "value" column of type string or binary, not '
                    f"{field.dataType.simpleString()}"
                )
            return index
    raise ValueError(
        f'format("{fmt}") writes the column "value" (string or binary), which this DataFrame '
        f"does not have (columns: {', '.join(schema.names) or 'none'}); select or alias one"
    )

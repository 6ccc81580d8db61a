"""An Arrow array as another type of the same shape, valid by construction: what a typed column becomes for Spark.

Why not ``Array.cast``: pyarrow (26) gives a null-typed child, in a cast (even to the type it has), the length of
the outermost array, or of the slice or take it comes from, instead of its own, so the result's offsets span more
values than there are. Every typed Spark column is a ``take`` of the columnar file cast to Spark's types, so an Avro
``array<null>``, a record with a ``null`` field in a list or a ``map<null>`` became a batch Spark refused once a
list held more items than the batch had rows (``Length spanned by list offsets (51) larger than values array
(length 25)``): issue 40.
Rebuilding nested arrays ourselves, from the slice of each child their offsets span, avoids the whole class rather
than the one type that showed it; a leaf (no children) is still cast by Arrow, which is right for those.

Contract: ``conform(array, target)`` has ``target``'s type, the same length, nulls and values (as Python), and
passes ``validate(full=True)`` whenever ``array`` does. Same types: the array itself (no copy). Nested types are
matched by position: struct fields, list items, map keys and values may differ in name and nullability only.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    if array.type == target:
        return array
    if pa.types.is_null(target):
        return pa.nulls(len(array))
    if not len(array):
        return pa.array([], target)
    kind = array.type
    if pa.types.is_struct(kind) and pa.types.is_struct(target) and kind.num_fields == target.num_fields:
        # StructArray.field(i) is the child sliced to the parent's offset and length.
        children = [conform(array.field(i), target.field(i).type) for i in range(target.num_fields)]
        return pa.Array.from_buffers(target, len(array), [_validity(array)], children=children)
    if pa.types.is_map(kind) and pa.types.is_map(target):
        entries = pa.struct([target.key_field, target.item_field])
        return _rebuilt_list(array, target, entries)
    if _is_list(kind) and (pa.types.is_list(target) or pa.types.is_large_list(target)):
        return _rebuilt_list(array, target, target.value_type)
    if pa.types.is_fixed_size_list(kind) and pa.types.is_fixed_size_list(target) and kind.list_size == target.list_size:
        size = kind.list_size
        child = array.values.slice(array.offset * size, len(array) * size)
        return pa.Array.from_buffers(target, len(array), [_validity(array)],
                                     children=[conform(child, target.value_type)])
    return array.cast(target)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _rebuilt_list(array: pa.Array, target: pa.DataType, child_type: pa.DataType) -> pa.Array:
    """A list (or map) array rebuilt with offsets from 0 over exactly the child values its own offsets span."""
    offsets = array.offsets  # len(array) + 1 of them, from the array's own offset on
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    child = array.values.slice(start, end - start)  # a map's values: its entries, struct<key, value>
    width = pa.int64() if pa.types.is_large_list(target) else pa.int32()
    rebased = pc.subtract(offsets, pa.scalar(start, offsets.type)).cast(width)
    return pa.Array.from_buffers(target, len(array), [_validity(array), rebased.buffers()[1]],
                                 children=[conform(child, child_type)])


def _validity(array: pa.Array) -> pa.Buffer | None:
    """The array's validity as a bitmap from bit 0 (its own may start at its offset), None when nothing is null."""
    if not array.null_count:
        return None
    return array.is_valid().buffers()[1]

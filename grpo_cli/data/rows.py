"""A split of prompt rows, held as plain Python columns: what the trainer, the held-out evaluation and
the rewards read of a dataset after `load_data`.

`datasets` is the library for reading files and hub datasets, and data=files and data=hub load through
it. But importing it brings pyarrow and pandas, about 95 MiB of a process's memory before any model loads
(docs/benchmarks.md): more than the built-in tiny model's whole training step. The
built-in tasks generate their rows in Python, so they are built as `Rows` and never import it; rows read
through `datasets` are converted once, when the split is prepared.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterable, Iterator

ATOMS = (str, int, float, bool, type(None))  # values a reader cannot change in place


def _fresh(values: list) -> list:
    """A copy of `values` whose nested lists and dicts (chat messages, a row's tests) are copies too."""
    return [v if isinstance(v, ATOMS) else copy.deepcopy(v) for v in values]


class Rows:
    """Columns of equal length, read the way a `datasets.Dataset` is read: `rows["answer"]` a column,
    `rows[3]` one row as a dict, `rows[[3, 7]]` (or a range or slice) those rows as a dict of columns;
    `select`, `to_dict`, `to_list`, `column_names`, `num_rows`, `len`. Reads return copies, nested values
    included (as Arrow's do): a split is not changed by what its readers, an environment's reset() among
    them, do with what they read."""

    def __init__(self, columns: dict[str, list], *, owned: bool = False):
        """`owned`: the columns are copies already, which the Rows may keep (select's: no second copy)."""
        lengths = {name: len(values) for name, values in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns of different lengths: {lengths}")
        self._columns = dict(columns) if owned else {name: _fresh(values) for name, values in columns.items()}
        self.num_rows = next(iter(lengths.values()), 0)

    @classmethod
    def from_list(cls, rows: list[dict], names: Iterable[str]) -> Rows:
        names = list(names)
        return cls({name: [row[name] for row in rows] for name in names})

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, key):
        if isinstance(key, str):
            return _fresh(self._columns[key])
        if isinstance(key, slice):
            picked = range(self.num_rows)[key]
        else:
            try:
                i = operator.index(key)  # an int, numpy's included
            except TypeError:
                picked = list(key)
            else:
                return {name: _fresh([values[i]])[0] for name, values in self._columns.items()}
        return {name: _fresh([values[i] for i in picked]) for name, values in self._columns.items()}

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(self.num_rows))

    def select(self, indices: Iterable[int]) -> Rows:
        return Rows(self[list(indices)], owned=True)

    def to_dict(self) -> dict[str, list]:
        return {name: _fresh(values) for name, values in self._columns.items()}

    def to_list(self) -> list[dict]:
        return list(self)

    def __repr__(self) -> str:
        return f"Rows(num_rows={self.num_rows}, columns={self.column_names})"

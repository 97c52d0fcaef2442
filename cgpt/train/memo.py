"""A bounded memo of what one process builds once per shape (compiled programs, layouts).

A sweep worker trains job after job in one process, so a plain dict of compiled programs
would grow with every shape it meets. Each memo is owned by the one function that fills it
(named in `owner`) and keeps its `size` most recently used entries.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


class Memo:
    """`get(key, make)`: the value kept for `key`, or `make()`'s, kept (least recently used
    entries beyond `size` are dropped). Safe across threads; `make` runs outside the lock."""

    def __init__(self, owner: str, size: int):
        self.owner, self.size = owner, size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value

    def __getitem__(self, key: Hashable) -> Any:
        return self._items[key]

    def __len__(self) -> int:
        return len(self._items)

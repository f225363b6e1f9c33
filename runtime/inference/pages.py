"""The page allocator of the paged KV cache: a free list, one page table per sequence, refcounts.

Physical page ``NULL_PAGE`` (0) is reserved: it pads every page-table row past a sequence's last
page and is never handed out, so a padding entry can never alias a live sequence's data (the
attention kernel never reads it as valid anyway, see ``kernels.paged_attention``).

``PagePool`` is a value: ``grow``, ``share`` and ``release`` return a new pool and leave the old
one as it was. A ``grow`` is all-or-nothing: one that does not fit raises ``OutOfPages`` and
allocates nothing. ``share`` gives a sequence the first pages of another one (the full pages of a
prompt they both have) without allocating: every non-null page is at any time either free or owned
by one or more sequences, and a ``release`` frees exactly the pages whose last owner it was.

Pages are taken from the front of the free list and released pages go back to its front, so the
allocation order is a pure function of the sequence of calls (and recently used pages are reused
first). Which physical pages a sequence gets never changes its results: attention reads a page
table's pages in logical order, whatever their physical numbers.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

import numpy as np

from runtime.errors import RlxError, UsageError

NULL_PAGE = 0


class OutOfPages(RlxError):
    """A sequence asked for more pages than are free; nothing was allocated."""


def pages_for(num_tokens: int, page_size: int) -> int:
    """``ceil(num_tokens / page_size)``: the pages that hold ``num_tokens`` cached tokens."""
    return -(-num_tokens // page_size)


@dataclasses.dataclass(frozen=True)
class PagePool:
    """Free pages and the page table of each sequence.

    Attributes:
      num_pages: physical pages in the cache, the null page included.
      page_size: tokens per page.
      free: free physical pages; the next allocation takes them from the front.
      tables: owner id -> its physical pages in logical order (read-only mapping).
      refs: owned page -> how many owners hold it (read-only mapping).
    """

    num_pages: int
    page_size: int
    free: tuple[int, ...]
    tables: Mapping[int, tuple[int, ...]]
    refs: Mapping[int, int] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))

    @classmethod
    def create(cls, *, num_pages: int, page_size: int) -> PagePool:
        """An empty pool: every page but ``NULL_PAGE`` is free."""
        for name, value, least in (("num_pages", num_pages, 2), ("page_size", page_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UsageError(
                    f"{name}={value!r} is not accepted; it must be an integer >= {least}"
                    + (" (one page is the reserved null page)" if name == "num_pages" else "")
                )
        return cls(num_pages, page_size, tuple(range(1, num_pages)), types.MappingProxyType({}))

    @property
    def capacity(self) -> int:
        """Pages that can ever be allocated (all but the null page)."""
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self.free)

    def owned(self, owner: int) -> tuple[int, ...]:
        """The pages of ``owner`` in logical order (empty if it holds none)."""
        return self.tables.get(owner, ())

    def shortfall(self, owner: int, num_tokens: int) -> int:
        """Pages ``owner`` still needs to hold ``num_tokens`` tokens (0 if it has enough)."""
        return max(0, pages_for(num_tokens, self.page_size) - len(self.owned(owner)))

    def fits(self, owner: int, num_tokens: int) -> bool:
        """Whether ``grow(owner, num_tokens)`` would succeed."""
        return self.shortfall(owner, num_tokens) <= len(self.free)

    def grow(self, owner: int, num_tokens: int) -> PagePool:
        """Give ``owner`` pages for ``num_tokens`` tokens (a no-op if it already has them).

        Raises:
          OutOfPages: fewer pages are free than needed; the pool is unchanged.
        """
        need = self.shortfall(owner, num_tokens)
        if need == 0:
            return self
        if need > len(self.free):
            raise OutOfPages(
                f"sequence {owner} needs {need} more pages for {num_tokens} tokens; "
                f"{len(self.free)} of {self.capacity} are free"
            )
        tables, refs = dict(self.tables), dict(self.refs)
        tables[owner] = self.owned(owner) + self.free[:need]
        refs.update((page, 1) for page in self.free[:need])
        return dataclasses.replace(
            self, free=self.free[need:], tables=types.MappingProxyType(tables),
            refs=types.MappingProxyType(refs),
        )

    def share(self, owner: int, source: int, num_pages: int) -> PagePool:
        """Give ``owner``, which holds no pages, the first ``num_pages`` pages of ``source``.

        Nothing is allocated: the pages gain an owner, and stay allocated until both have released
        them. Whoever writes a shared page changes it for every owner, so only pages no owner
        writes again (a prompt's full pages) are shared; ``owner``'s later pages are its own.

        Raises:
          ValueError: ``owner`` already holds pages, or ``source`` holds fewer than ``num_pages``.
        """
        pages = self.owned(source)[:num_pages]
        if self.owned(owner) or len(pages) < num_pages:
            raise ValueError(
                f"sequence {owner} (holding {len(self.owned(owner))} pages) cannot share "
                f"{num_pages} pages of sequence {source}, which holds {len(self.owned(source))}"
            )
        if not pages:
            return self
        tables, refs = dict(self.tables), dict(self.refs)
        tables[owner] = pages
        refs.update((page, refs[page] + 1) for page in pages)
        return dataclasses.replace(
            self, tables=types.MappingProxyType(tables), refs=types.MappingProxyType(refs)
        )

    def release(self, owner: int) -> PagePool:
        """Drop ``owner``'s pages; those it was the last owner of are freed (in logical order).

        Raises:
          KeyError: ``owner`` holds no pages (a release without an allocation is a bug).
        """
        if owner not in self.tables:
            raise KeyError(f"sequence {owner} holds no pages")
        tables, refs = dict(self.tables), dict(self.refs)
        freed = []
        for page in tables.pop(owner):
            refs[page] -= 1
            if not refs[page]:
                del refs[page]
                freed.append(page)
        return dataclasses.replace(
            self, free=tuple(freed) + self.free, tables=types.MappingProxyType(tables),
            refs=types.MappingProxyType(refs),
        )

    def table_row(self, owner: int, width: int) -> np.ndarray:
        """``int32[width]``: the pages of ``owner`` padded with ``NULL_PAGE``."""
        pages = self.owned(owner)
        if len(pages) > width:
            raise ValueError(f"sequence {owner} holds {len(pages)} pages, more than width {width}")
        row = np.full(width, NULL_PAGE, np.int32)
        row[: len(pages)] = pages
        return row

"""Where ``dpinfer serve`` keeps its tenants' RAG stores (``--stores``): a folder (the default; one process, or
replicas on one machine) or a Chroma server (``chroma://HOST:PORT``: replicas on any machine see the same documents).

Both answer the same three questions for the service: where the tenant's store ``NAME`` is (:meth:`locate`; a store
that is not the tenant's is a missing one), the :class:`~dpinfer.rag.store.DocumentStore` at that place
(:meth:`document_store`), and the names of the tenant's stores (:meth:`names`).

* **A folder** ``STORES``: a tenant's store ``NAME`` is ``STORES/tenants/TENANT/NAME`` (folders 0700, files 0600), or
  the folder the operator adopted for it under that name (``dpinfer serve adopt --store``).
* **A Chroma server**: a tenant's store is one collection on the server, named from (tenant, store)
  (:mod:`dpinfer.rag.server`). Nothing is adopted there: every store on the server is made by the service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpinfer.rag.server import ChromaServer, is_server_url
from dpinfer.rag.store import DocumentStore
from dpinfer.serve.budget import TENANTS, Tenancy
from dpinfer.serve.keys import NotFound, Principal

MISSING = "no store of that name for this key; add documents first with POST /v1/rag/STORE/documents"


class FolderStores:
    """The stores in a folder (see the module docstring)."""

    def __init__(self, root: str | Path, tenancy: Tenancy) -> None:
        self.root = Path(root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.tenancy = tenancy
        self.display = str(self.root)

    def path(self, principal: Principal, store: str) -> Path:
        """The folder of the tenant's store ``store``: the one adopted under that name, else
        ``STORES/tenants/TENANT/STORE``."""
        adopted = self.tenancy.adopted("store", principal.tenant, store)
        return self.root / adopted if adopted is not None else self.root / TENANTS / principal.tenant / store

    def locate(self, principal: Principal, store: str, *, create: bool = False) -> str:
        """The key of the tenant's store (its folder); :class:`NotFound` when it has none and ``create`` is false."""
        folder = self.path(principal, store)
        if not create and not folder.is_dir():
            raise NotFound(MISSING)
        if create and not folder.parent.is_dir():
            folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            for made in (folder.parent, folder.parent.parent):  # STORES/tenants/TENANT: the tenant names too
                made.chmod(0o700)
        return str(folder)

    def document_store(self, principal: Principal, store: str, key: str, embedder: Any) -> DocumentStore | Path:
        return Path(key)

    def names(self, principal: Principal) -> list[str]:
        own = self.root / TENANTS / principal.tenant
        names = {p.name for p in own.iterdir() if p.is_dir()} if own.is_dir() else set()
        names |= {n for n, target in self.tenancy.names("store", principal.tenant).items()
                  if (self.root / target).is_dir()}
        return sorted(names)


class ServerStores:
    """The stores on a Chroma server (see the module docstring); the server is checked when this is made."""

    def __init__(self, url: str) -> None:
        self.server = ChromaServer(url)
        self.display = self.server.url

    def locate(self, principal: Principal, store: str, *, create: bool = False) -> str:
        if not create and not self.server.exists(principal.tenant, store):
            raise NotFound(MISSING)
        return f"{self.server.url}/{principal.tenant}/{store}"

    def document_store(self, principal: Principal, store: str, key: str, embedder: Any) -> DocumentStore:
        return self.server.store(principal.tenant, store, embedder=embedder)

    def names(self, principal: Principal) -> list[str]:
        return self.server.names(principal.tenant)


def open_stores(location: str | Path, tenancy: Tenancy) -> FolderStores | ServerStores:
    """``--stores``: a Chroma server (``chroma://HOST:PORT``) or a folder."""
    return ServerStores(str(location)) if is_server_url(location) else FolderStores(location, tenancy)

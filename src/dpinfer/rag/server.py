"""Document stores on a Chroma server (``dpinfer serve --stores chroma://HOST:PORT``): Chroma's own client/server
mode, so that every replica of the service, on any machine, sees the same documents.

* **The server.** ``chroma run --path DIR --host HOST --port PORT`` (the ``chroma`` command of the chromadb package).
  dpinfer talks to it with ``chromadb.HttpClient(host, port, settings=Settings(anonymized_telemetry=False))``: no
  telemetry, and a start that fails closed: the server must answer its heartbeat within
  ``SERVE.stores_connect_timeout_s`` before anything else happens (:class:`ChromaServer`).
* **The layout.** Everything a store is lives on the server, nothing beside it: one collection per (tenant, store),
  named ``dpinfer-`` + the first 40 hex digits of the SHA-256 of ``TENANT/STORE`` (tenant and store names allow
  characters and lengths that Chroma's collection names do not; the hash is a name, not a secret), with the tenant's
  and store's names in the collection's metadata (``dpinfer_tenant``, ``dpinfer_store``) beside the embedder's
  (``dpinfer_embedder``, ``dpinfer_dim``), which :class:`~dpinfer.rag.store.DocumentStore` records at the first add.
  A store's unit (``store.STORE`` of the tenant) is kept in the service's ledger like a folder store's.
* **Tenancy.** A tenant reaches only the collections named from its own name: another tenant's store is a missing one,
  and a collection whose metadata names another tenant or store than its name says is treated as missing too.
* **Failures.** Any error of the client (server down, refused request) is raised as :class:`StoreUnavailableError`
  with the operation and the error's type only: Chroma's messages are never passed on (they could quote a request).

The documents' text travels to the server in the clear over HTTP: run it on a private network (docs/deploy.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from dpinfer.defaults import SERVE
from dpinfer.errors import ConfigurationError, DPInferError
from dpinfer.rag.store import DocumentStore, TextEncoder, _chromadb

SCHEME = "chroma"
PREFIX = "dpinfer-"
"""The first characters of every collection dpinfer makes on a Chroma server."""
TENANT_KEY = "dpinfer_tenant"
STORE_KEY = "dpinfer_store"
USAGE = ("give the Chroma server as chroma://HOST:PORT (started with: chroma run --path DIR --host HOST --port PORT), "
         "e.g. chroma://127.0.0.1:8000")


class StoreUnavailableError(DPInferError):
    """The Chroma server could not do what was asked (down, unreachable, or it refused): nothing was changed by
    dpinfer, retry once it answers."""


def is_server_url(location: object) -> bool:
    """Whether ``location`` names a Chroma server (``chroma://…``) rather than a folder."""
    return isinstance(location, str) and location.lower().startswith(SCHEME + "://")


def parse_server_url(url: str) -> tuple[str, int]:
    """(host, port) of ``chroma://HOST:PORT``; anything else (a path, a query, a user, no port) is refused.

    >>> parse_server_url("chroma://127.0.0.1:8000")
    ('127.0.0.1', 8000)
    >>> parse_server_url("chroma://[::1]:8000")
    ('::1', 8000)
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"--stores: not a Chroma server address; {USAGE}") from None
    if parts.scheme.lower() != SCHEME or not parts.hostname or port is None or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username is not None:
        raise ConfigurationError(f"--stores: not a Chroma server address; {USAGE}")
    return parts.hostname, port


def collection_name(tenant: str, store: str) -> str:
    """The collection of the tenant's store: ``dpinfer-`` + 40 hex digits of SHA-256(``TENANT/STORE``).

    >>> collection_name("acme", "notes")
    'dpinfer-9bafbc7c6b387445b87961c44f14403d5b44a762'
    """
    return PREFIX + hashlib.sha256(f"{tenant}/{store}".encode()).hexdigest()[:40]


class _Guarded:
    """A Chroma collection whose calls raise :class:`StoreUnavailableError` (the call and the error's type only)."""

    def __init__(self, collection: Any, server: ChromaServer) -> None:
        self._collection = collection
        self._server = server

    @property
    def metadata(self) -> Any:
        return self._collection.metadata

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._collection, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._server.guard(f"{name} a store's documents"):
                return method(*args, **kwargs)

        return call


class ChromaServer:
    """One Chroma server, reached with ``chromadb.HttpClient`` (telemetry off); checked at once (its heartbeat within
    ``SERVE.stores_connect_timeout_s``), so a wrong address or a server that is down fails before a model loads."""

    def __init__(self, url: str, *, timeout: float = SERVE.stores_connect_timeout_s) -> None:
        self.host, self.port = parse_server_url(url)
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{SCHEME}://{shown}:{self.port}"
        self._heartbeat(f"http://{shown}:{self.port}/api/v2/heartbeat", timeout)
        chromadb, settings_cls = _chromadb()
        with self.guard("open a client"):
            self.client = chromadb.HttpClient(host=self.host, port=self.port,
                                              settings=settings_cls(anonymized_telemetry=False))

    def _heartbeat(self, url: str, timeout: float) -> None:
        import httpx

        try:
            reply = httpx.get(url, timeout=timeout)
        except httpx.HTTPError as exc:
            raise StoreUnavailableError(
                f"the Chroma server {self.url} cannot be reached ({type(exc).__name__}); start it with: chroma run "
                f"--path DIR --host {self.host} --port {self.port}, or give the right --stores") from None
        try:
            ok = reply.status_code == 200 and "nanosecond heartbeat" in reply.json()
        except ValueError:
            ok = False
        if not ok:
            raise StoreUnavailableError(f"{self.url} answers, but not as a Chroma server (no heartbeat at "
                                        "/api/v2/heartbeat); give the address of 'chroma run'")

    def _unavailable(self, what: str, exc: BaseException) -> StoreUnavailableError:
        return StoreUnavailableError(f"the Chroma server {self.url} could not {what} ({type(exc).__name__}); retry, "
                                     "or check the server")

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Errors of the client as one :class:`StoreUnavailableError` (the operation and the error's type)."""
        try:
            yield
        except DPInferError:
            raise
        except Exception as exc:
            raise self._unavailable(what, exc) from None

    def collection(self, tenant: str, store: str, *, create: bool = False) -> _Guarded | None:
        """The tenant's store's collection (``create``: made when missing), or None when it has none (or the
        collection of that name was not made by dpinfer for this tenant's store)."""
        name = collection_name(tenant, store)
        if create:
            with self.guard("create a store"):
                col = self.client.get_or_create_collection(
                    name, embedding_function=None, metadata={"hnsw:space": "l2", TENANT_KEY: tenant, STORE_KEY: store})
        else:
            from chromadb.errors import NotFoundError

            try:
                col = self.client.get_collection(name, embedding_function=None)
            except NotFoundError:
                return None
            except Exception as exc:
                raise self._unavailable("open a store", exc) from None
        meta = dict(col.metadata or {})
        if meta.get(TENANT_KEY) != tenant or meta.get(STORE_KEY) != store:
            return None
        return _Guarded(col, self)

    def exists(self, tenant: str, store: str) -> bool:
        """Whether the tenant has a store ``store`` on the server."""
        return self.collection(tenant, store) is not None

    def names(self, tenant: str) -> list[str]:
        """The names of the tenant's stores on the server."""
        with self.guard("list the stores"):
            collections = list(self.client.list_collections())
        out = set()
        for col in collections:
            meta = dict(col.metadata or {})
            store = meta.get(STORE_KEY)
            if meta.get(TENANT_KEY) == tenant and isinstance(store, str) and col.name == collection_name(tenant, store):
                out.add(store)
        return sorted(out)

    def store(self, tenant: str, store: str, *, embedder: TextEncoder | None = None) -> ServerStore:
        """The tenant's store ``store`` as a :class:`~dpinfer.rag.store.DocumentStore` (made at its first add)."""
        return ServerStore(self, tenant, store, embedder=embedder)


class ServerStore(DocumentStore):
    """A :class:`~dpinfer.rag.store.DocumentStore` whose collection is on a Chroma server (made at the first
    :meth:`add`); ``path`` is a display name (``chroma://HOST:PORT/TENANT/STORE``), not a folder."""

    def __init__(self, server: ChromaServer, tenant: str, store: str, *, embedder: TextEncoder | None = None) -> None:
        self.server = server
        self.tenant = tenant
        self.name = store
        self.path = f"{server.url}/{tenant}/{store}"  # type: ignore[assignment]
        self._embedder = embedder
        self._client = server.client
        self._collection = None

    def _open(self) -> Any:
        if self._collection is None:
            self._collection = self.server.collection(self.tenant, self.name, create=True)
        return self._collection

    def _written(self) -> None:
        """Nothing to do: the server keeps the files (their modes are the server's operator's)."""

    def info(self) -> dict[str, Any]:
        return {**super().info(), "collection": collection_name(self.tenant, self.name)}

    def __repr__(self) -> str:
        return f"ServerStore({self.path!r})"

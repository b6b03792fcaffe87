"""Shared fixtures: a tiny random-weight Llama built in the test session, and the embedded model for e2e tests."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# under pytest-xdist, each worker (and the commands it starts) gets its share of the CPUs: two workers with two torch
# threads each on two cores stall in each other's thread barriers (a test several times slower than alone)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

CORPUS = [
    "The applicant was born in 1970 and lives in Izmir.",
    "On 20 May 1998 the Court decided to communicate the application to the Government.",
    "The case originated in an application against the Republic of Turkey lodged with the Commission.",
    "Mr Smith, a lawyer practising in London, represented the applicants before the Court.",
    "The quick brown fox jumps over the lazy dog. Numbers 0123456789 and symbols /.,;:!?()-",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_model(path: Path, *, seed: int = 0, vocab_target: int = 384) -> Path:
    """Write a tiny random-weight Llama (2 layers, width 64) and a byte-level BPE tokenizer to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_target, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<|endoftext|>", bos_token="<|im_start|>",
                                     eos_token="<|im_end|>", pad_token="<|im_end|>")
    hf_tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(hf_tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger logits than the default init, so distributions are far from uniform
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 2
    model.save_pretrained(path)
    hf_tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir: Path):
    from dpinfer.models import load_model

    return load_model(str(tiny_model_dir), device="cpu")


@pytest.fixture(scope="session")
def tiny_hf_lm(tiny_model_dir: Path):
    """The tiny model on transformers' forward (``backend="hf"``): the reference of dpinfer's own model code."""
    from dpinfer.models import load_model

    return load_model(str(tiny_model_dir), device="cpu", backend="hf")


@pytest.fixture(scope="session")
def embedded_lm():
    """The embedded SmolLM2-135M-Instruct (e2e tests only); skipped with a reason when it is not installed."""
    from dpinfer.errors import ModelNotFoundError
    from dpinfer.models import load_model

    try:
        return load_model(device="cpu")
    except ModelNotFoundError as exc:
        pytest.skip(f"embedded model not installed: {exc}")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch):
    """Make any outbound connection attempt fail loudly."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


class ModelLoaded(BaseException):  # not an Exception: no command's error handler can swallow it
    """Raised by the :func:`no_model` stub when code tries to load a model."""


class NoModel(list):  # type: ignore[type-arg]
    """The calls that tried to load a model (each raised :class:`ModelLoaded`): ``dpinfer.models.load_model`` and
    ``default_lm`` refuse while it is on (:meth:`forbid`, or inside ``with``), and work again after :meth:`allow`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import dpinfer.models

        super().__init__()
        self._mp, self._models = monkeypatch, dpinfer.models
        self._real = (dpinfer.models.load_model, dpinfer.models.default_lm)
        self._error: type[BaseException] = ModelLoaded

    def _refuse(self, *args: object, **kwargs: object) -> None:
        self.append("load_model")
        raise self._error("MODEL-WAS-LOADED: this path must refuse before the model loads")

    def catchable(self) -> NoModel:
        """Raise a :class:`~dpinfer.errors.DPInferError` instead, which a command reports in one line (for a test
        where reaching the model is allowed and the list says whether it was)."""
        from dpinfer.errors import DPInferError

        self._error = type("ModelRefused", (DPInferError,), {})
        return self

    def forbid(self) -> NoModel:
        self._mp.setattr(self._models, "load_model", self._refuse)
        self._mp.setattr(self._models, "default_lm", self._refuse)
        return self

    def allow(self) -> None:
        self._mp.setattr(self._models, "load_model", self._real[0])
        self._mp.setattr(self._models, "default_lm", self._real[1])

    def __enter__(self) -> NoModel:
        return self.forbid()

    def __exit__(self, *exc: object) -> None:
        self.allow()


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> NoModel:
    """The model must not load in this test: loading it fails the test (the list holds the attempts)."""
    return NoModel(monkeypatch).forbid()


@pytest.fixture
def model_gate(monkeypatch: pytest.MonkeyPatch) -> NoModel:
    """Like :func:`no_model`, but off until ``with model_gate:`` (for a test that loads the model between refusals)."""
    return NoModel(monkeypatch)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    from dpinfer.paths import data_dir

    d = data_dir(required=False)
    if d is None:
        pytest.skip("evaluation data not found: put the shared data at ../shared/data or set DPINFER_DATA")
    return d


# ---------------------------------------------------------------------------------------- PostgreSQL (ledger tests)
POSTGRES_BASE = os.environ.get("DPINFER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
"""The server the PostgreSQL ledger tests use (trust authentication); each test makes its own database and drops it."""


def _postgres_or_skip() -> object:
    """psycopg and a reachable server, or skip with the reason; with ``CI`` set, a missing one FAILS the test."""
    why = None
    try:
        import psycopg

        with psycopg.connect(POSTGRES_BASE, autocommit=True, connect_timeout=3) as con:
            con.execute("SELECT 1")
        return psycopg
    except ImportError:
        why = 'psycopg is not installed (.venv/bin/pip install -e ".[postgres]")'
    except Exception as exc:
        why = f"no PostgreSQL at {POSTGRES_BASE} ({type(exc).__name__})"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and the PostgreSQL ledger tests cannot run: {why}")
    pytest.skip(why)


@pytest.fixture
def postgres_url() -> object:
    """The URL of a fresh, empty PostgreSQL database, dropped after the test."""
    import secrets

    psycopg = _postgres_or_skip()
    name = f"dpinfer_test_{secrets.token_hex(6)}"
    with psycopg.connect(POSTGRES_BASE, autocommit=True) as con:  # type: ignore[attr-defined]
        con.execute(f"CREATE DATABASE {name}")
    base = POSTGRES_BASE.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(POSTGRES_BASE, autocommit=True) as con:  # type: ignore[attr-defined]
            con.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# ---------------------------------------------------------------------------------------- Chroma server (stores)
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChromaRun:
    """``chroma run`` on a loopback port: its URL (``chroma://127.0.0.1:PORT``), its process and its log."""

    def __init__(self, url: str, proc: object, log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log


@pytest.fixture
def chroma_server(tmp_path: Path) -> object:
    """A fresh ``chroma run --path TMP --host 127.0.0.1 --port FREE`` (the chroma command beside this Python), stopped
    after the test; skipped with the reason when it cannot start, and FAILED when ``CI`` is set."""
    import subprocess
    import sys
    import time

    why = None
    exe = Path(sys.executable).with_name("chroma")
    proc = None
    log = tmp_path / "chroma.log"
    if not exe.is_file():
        why = f"no chroma command beside {sys.executable} (the rag extra installs it)"
    else:
        port = _free_port()
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(exe), "run", "--path", str(tmp_path / "chroma"), "--host", "127.0.0.1",
                                     "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, "ANONYMIZED_TELEMETRY": "False"})
        import httpx

        deadline = time.monotonic() + 30
        while why is None:
            if proc.poll() is not None:
                why = f"chroma run exited with status {proc.returncode}"
            elif time.monotonic() > deadline:
                why = "chroma run did not answer its heartbeat within 30 s"
            else:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
    if why is not None:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the Chroma server tests cannot run: {why}")
        pytest.skip(why)
    try:
        yield ChromaRun(f"chroma://127.0.0.1:{port}", proc, log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

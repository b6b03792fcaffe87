"""The routes of ``dpinfer serve``, one :class:`fastapi.APIRouter` per area, each route parse → plan → charge → run →
finish in a few lines over the :class:`~dpinfer.serve.service.Service` (:mod:`.tasks`: health, metrics, methods,
tagging, sanitisation, prompt protection; :mod:`.rag`: private stores; :mod:`.budget`: units' budgets and synthesis
jobs; :mod:`.chat`: the OpenAI-compatible API; :mod:`.page`: the web page)."""

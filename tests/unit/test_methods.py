"""Method tables: a mechanism registered for a task and given an entry in its table is offered by its pipeline,
validation, CLI and benches with no other change (dpinfer.methods)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.cli import main
from dpinfer.configs.synth import SynthConfig
from dpinfer.errors import ConfigurationError
from dpinfer.mechanisms import REGISTRY
from dpinfer.mechanisms.sampler import Sampler
from dpinfer.methods import BASELINES, DEFAULT_METHODS, is_baseline, mechanism_names, method_names, methods_help
from dpinfer.methods.synthesize import check as check_synth
from dpinfer.validation import check_sanitize_params

DOC = "Mr Jan Kowalski was born on 12 May 1961 in Warsaw and works for the Polish Post."
SPANS = [{"start": 3, "end": 15, "label": "PERSON"}, {"start": 28, "end": 39, "label": "DATETIME"}]


class ToyWholeDocument(Sampler):
    """A toy 'mechanism': sampling at a temperature set from ε (no real privacy; for the dispatch test only)."""

    name = "toy-sanitize"

    @classmethod
    def calibrated(cls, budget: Budget, spec: Spec) -> ToyWholeDocument:
        return cls(temperature=1.0 + 1.0 / budget.scalar(), mode="joint")


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``toy-sanitize`` registered for "sanitize" for one test, with its entry in the sanitize table (the generic
    builder of registered whole-document mechanisms); the registry and the table are restored afterwards."""
    from dpinfer.methods.sanitize import TABLE
    from dpinfer.methods.table import Method

    REGISTRY.names()  # load the built-ins first, so that the restored registry keeps them
    monkeypatch.setattr(REGISTRY, "_entries", dict(REGISTRY._entries))
    REGISTRY.register("toy-sanitize", tasks=("sanitize",), summary="a toy registered by the dispatch test")(
        ToyWholeDocument)
    TABLE.register(Method("toy-sanitize", "sanitize", build="dpinfer.methods.sanitize:build_registered",
                          summary="a toy registered by the dispatch test"))
    yield "toy-sanitize"
    TABLE.unregister("toy-sanitize")


def test_methods_are_the_registered_mechanisms_and_the_baselines() -> None:
    for task in ("sanitize", "synthesize"):
        names = method_names(task)
        assert names[0] == DEFAULT_METHODS[task]
        assert set(names) == set(mechanism_names(task)) | set(BASELINES[task])
        # the sampler runs the baselines: it is offered through them only
        assert "sampler" not in names and all(n in REGISTRY for n in mechanism_names(task))
        assert set(mechanism_names(task)) == set(REGISTRY.names(task=task)) - {"sampler"}
    assert method_names("sanitize") == ["dp-fusion", "dp-decoding", "dp-prompt", "original", "ner-scrub"]
    assert method_names("synthesize") == ["invisibleink", "adapmixed", "amin", "public"]
    assert is_baseline("sanitize", "ner-scrub") and not is_baseline("sanitize", "dp-fusion")
    with pytest.raises(ConfigurationError, match="unknown task"):
        method_names("nope")


def test_a_registered_mechanism_is_offered_by_validation_help_and_the_pipeline(toy: str, tiny_lm, capsys) -> None:
    assert toy in method_names("sanitize") and toy not in method_names("synthesize")
    check_sanitize_params(method=toy, epsilon=2.0)  # accepted
    with pytest.raises(ConfigurationError, match="unknown method"):
        check_synth(SynthConfig(method=toy, epsilon=2.0))  # registered for sanitize only
    assert f"{toy}: a toy registered by the dispatch test" in methods_help("sanitize")
    with pytest.raises(SystemExit):
        main(["sanitize", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"{toy}: a toy registered by the dispatch test" in help_text

    from dpinfer.pipelines.sanitize import sanitize
    from dpinfer.pipelines.sanitize_plan import method_plan

    plan = method_plan(toy)
    assert (plan.mechanism, plan.contexts, plan.protects) == (toy, "original", "document")
    res = sanitize(DOC, lm=tiny_lm, method=toy, epsilon=4.0, spans=SPANS, max_new_tokens=6, seed=0)
    assert res.method == toy and 1 <= res.generated_tokens <= 6 == res.max_new_tokens
    assert res.guarantee.mechanism == toy  # its own (here: no-privacy) statement, not another method's


def test_the_registry_is_restored_after_the_toy() -> None:
    assert "toy-sanitize" not in REGISTRY and "toy-sanitize" not in method_names("sanitize")


def test_cli_refuses_an_unregistered_method_with_the_list(capsys) -> None:
    assert main(["sanitize", "-", "--method", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown --method 'nope'; choose one of dp-fusion, dp-decoding, dp-prompt, original, ner-scrub" in err


def test_every_builtin_entry_names_its_class() -> None:
    """Each built-in entry's ``"module:Class"`` imports to a Mechanism subclass whose ``name`` is the entry's name."""
    from dpinfer.mechanisms.base import Mechanism
    from dpinfer.mechanisms.registry import BUILTIN

    assert [e.name for e in BUILTIN] == sorted(e.name for e in BUILTIN)
    for entry in BUILTIN:
        assert isinstance(entry.target, str)
        assert issubclass(entry.cls, Mechanism) and entry.cls.name == entry.name, entry


def test_registering_a_taken_name_or_an_unknown_task_is_refused() -> None:
    from dpinfer.mechanisms.registry import BUILTIN, MechanismRegistry
    from dpinfer.mechanisms.sampler import Sampler

    reg = MechanismRegistry(BUILTIN)
    assert reg.register("sampler", tasks=("generate",))(Sampler) is Sampler  # the same class again: fine
    with pytest.raises(ConfigurationError, match="already registered"):
        reg.register("dp-fusion", tasks=("sanitize",))(Sampler)
    with pytest.raises(ConfigurationError, match="unknown task"):
        reg.register("toy", tasks=("nope",))


@pytest.mark.parametrize("argv", [["sanitize", "doc.txt", "--method", "nope"], ["synth", "c.jsonl", "--text-field",
                                  "t", "--out", "o.jsonl", "--method", "nope"], ["sanitize", "--help"]])
def test_method_refusal_and_help_import_no_mechanism(argv: list[str]) -> None:
    """A bad --method is refused and --help lists the methods without importing torch or any mechanism (fast)."""
    import subprocess
    import sys

    code = ("import sys\nfrom dpinfer.cli import main\ntry:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    rc = e.code\nbad = [m for m in sys.modules if m == 'torch' or m.startswith('dpinfer.mechanisms.')\n"
            "       and m != 'dpinfer.mechanisms.registry']\n"
            "print('IMPORTED', bad)\nsys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert "IMPORTED []" in res.stdout, res.stdout + res.stderr
    if "--help" in argv:
        assert res.returncode == 0 and "dp-decoding: DP-Decoding" in " ".join(res.stdout.split())
    else:
        assert res.returncode == 2 and "unknown --method 'nope'; choose one of" in res.stderr

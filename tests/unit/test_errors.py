import envkit.errors as errors
from envkit.errors import FailureCategory, InfraFailure, ModelFailure, Outcome, Problem, SpecError, VerifierFailure


def test_all_is_complete_and_sorted():
    public = {n for n, v in vars(errors).items() if not n.startswith("_") and getattr(v, "__module__", "") == errors.__name__}
    assert set(errors.__all__) == public
    assert errors.__all__ == sorted(errors.__all__)


def test_one_root():
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, errors.EnvkitError), name


def test_outcome_labels_and_evidence():
    f = ModelFailure("command_timeout", "ran past 5 s", command="sleep 9")
    assert f.outcome.label == "model_failure:command_timeout"
    assert f.outcome.evidence == {"message": "ran past 5 s", "command": "sleep 9"}
    assert not f.outcome.is_infra
    assert InfraFailure("container_lost", "gone").outcome.is_infra
    assert VerifierFailure("verifier_crash", "exit 1").outcome.label == "verifier_failure:verifier_crash"
    assert Outcome.ok().label == "ok" and Outcome.ok().category is FailureCategory.OK


def test_spec_error_lists_every_problem():
    e = SpecError("x/envkit.toml", [Problem("a.b", "bad", "fix a"), Problem("c", "worse", "fix c")])
    text = str(e)
    assert "2 problems" in text and "a.b: bad (fix: fix a)" in text and "c: worse (fix: fix c)" in text

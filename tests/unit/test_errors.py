import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

import envkit.errors as errors
from envkit.errors import (
    FailureCategory,
    InfraFailure,
    ModelFailure,
    Outcome,
    OutcomeLabel,
    Problem,
    SpecError,
    VerifierFailure,
    format_outcome,
    parse_outcome,
)


def test_all_is_complete_and_sorted():
    public = {n for n, v in vars(errors).items()
              if not n.startswith("_") and getattr(v, "__module__", "") == errors.__name__}
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
    assert not f.outcome.retryable
    assert InfraFailure("container_lost", "gone").outcome.retryable
    assert VerifierFailure("verifier_crash", "exit 1").outcome.label == "verifier_failure:verifier_crash"
    assert Outcome.ok().label == "ok" and Outcome.ok().category is FailureCategory.OK


kind = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)
failed = st.sampled_from([c for c in FailureCategory if c is not FailureCategory.OK])


@given(failed, kind)
def test_parse_and_format_are_inverse(category, k):
    label = format_outcome(category, k)
    assert label == f"{category.value}:{k}"
    assert (parse_outcome(label).category, parse_outcome(label).kind) == (category, k)
    assert format_outcome(parse_outcome(str(label)).category, parse_outcome(str(label)).kind) == label
    assert parse_outcome("ok") == format_outcome(FailureCategory.OK) == "ok" and parse_outcome("ok").kind == ""


def test_a_label_is_its_string_on_disk_and_in_counters():
    label = parse_outcome("infra_failure:container_lost")
    assert (isinstance(label, str) and label == "infra_failure:container_lost"
            and hash(label) == hash("infra_failure:container_lost"))
    assert json.dumps({label: [label]}) == '{"infra_failure:container_lost": ["infra_failure:container_lost"]}'
    assert type(pickle.loads(pickle.dumps(label))) is OutcomeLabel  # crosses to Ray workers typed
    assert parse_outcome(label) is label


@pytest.mark.parametrize(("label", "category", "retryable"), [
    ("ok", FailureCategory.OK, False),
    ("model_failure:code_timeout", FailureCategory.MODEL, False),
    ("infra_failure:inference_unavailable", FailureCategory.INFRA, True),
    ("verifier_failure:bad_output", FailureCategory.VERIFIER, True),
    ("aborted:straggler", FailureCategory.ABORTED, False),
])
def test_what_a_label_says(label, category, retryable):
    parsed = parse_outcome(label)
    assert (parsed.category, parsed.retryable) == (category, retryable)
    assert parsed.kind == label.partition(":")[2]


@pytest.mark.parametrize(("label", "fragment"), [
    ("", "must be ok or one of"),
    ("infra:container_lost", "must be ok or one of"),
    ("ok:fine", "ok takes no kind"),
    ("model_failure", "needs a kind"),
    ("model_failure:", "needs a kind"),
    ("infra_failure:a b", "needs a kind"),
])
def test_a_string_outside_the_grammar_is_refused(label, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_outcome(label)


def test_format_refuses_what_parse_refuses():
    with pytest.raises(ValueError, match="needs a kind"):
        format_outcome(FailureCategory.MODEL)
    with pytest.raises(ValueError, match="ok takes no kind"):
        format_outcome(FailureCategory.OK, "fine")


def test_spec_error_lists_every_problem():
    e = SpecError("x/envkit.toml", [Problem("a.b", "bad", "fix a"), Problem("c", "worse", "fix c")])
    text = str(e)
    assert "2 problems" in text and "a.b: bad (fix: fix a)" in text and "c: worse (fix: fix c)" in text

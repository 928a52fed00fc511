import pytest
from hypothesis import given
from hypothesis import strategies as st

from envkit.errors import EnvRefError, UserError
from envkit.refs import EnvRef, format_env_ref, parse_env_ref

segment = st.from_regex(r"[a-z0-9]{1,8}([._-][a-z0-9]{1,8}){0,2}", fullmatch=True)
namespace = segment.filter(lambda s: len(s) >= 2)
version = st.builds(lambda a, b, c, pre: f"{a}.{b}.{c}" + (f"-{pre}" if pre else ""),
                    st.integers(0, 999), st.integers(0, 999), st.integers(0, 999),
                    st.sampled_from(["", "rc.1", "alpha", "beta.11", "0.3.7", "x-y"]))


@given(namespace, segment, st.one_of(st.none(), version))
def test_parse_and_format_are_inverse(ns, name, ver):
    ref = EnvRef(ns, name, ver)
    text = format_env_ref(ref)
    assert parse_env_ref(text) == ref
    assert format_env_ref(parse_env_ref(text)) == text


def test_parts():
    ref = parse_env_ref("envkit/pyfix@1.2.0")
    assert (ref.namespace, ref.name, ref.version, ref.full_name) == ("envkit", "pyfix", "1.2.0", "envkit/pyfix")
    assert str(ref) == "envkit/pyfix@1.2.0"
    assert parse_env_ref("envkit/pyfix").version is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("pyfix", "exactly one '/'"),
        ("a/b/c@1.0.0", "exactly one '/'"),
        ("Envkit/pyfix@1.0.0", "namespace `Envkit`"),
        ("e/pyfix@1.0.0", "namespace `e`"),
        ("envkit/py fix@1.0.0", "name `py fix`"),
        ("envkit/pyfix@1.0", "not a semantic version"),
        ("envkit/pyfix@01.0.0", "not a semantic version"),
        ("envkit/pyfix@latest", "not a semantic version"),
    ],
)
def test_bad_refs_say_what_to_fix(text, fragment):
    with pytest.raises(EnvRefError) as info:
        parse_env_ref(text)
    assert fragment in info.value.message
    assert isinstance(info.value, UserError)
    assert info.value.hint

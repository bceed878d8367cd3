import pytest

from pagedchat.chat.conversation import Message, SamplingSettings, Session, title_from


def test_set_values_are_checked():
    settings = SamplingSettings()
    assert settings.with_value("temperature", "0.2").temperature == 0.2
    assert settings.with_value("max_tokens", "256").max_tokens == 256
    assert settings.with_value("seed", "7").with_value("seed", "none").seed is None
    with pytest.raises(ValueError, match="unknown setting 'colour'"):
        settings.with_value("colour", "red")
    with pytest.raises(ValueError, match="wants a number"):
        settings.with_value("top_k", "many")
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        settings.with_value("temperature", "-1")
    assert settings.to_params().max_tokens == settings.max_tokens


def test_history_skips_failed_and_empty_replies():
    session = Session(messages=[
        Message("user", "a"), Message("assistant", "", status="cancelled"),
        Message("user", "b"), Message("assistant", "x", status="error"),
        Message("user", "c"), Message("assistant", "part", status="interrupted")])
    assert [m["content"] for m in session.history()] == ["a", "b", "c", "part"]


def test_title_from():
    assert title_from("  hello\n world ") == "hello world"
    assert len(title_from("x" * 100)) == 32

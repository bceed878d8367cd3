"""The ShareGPT reader on small synthetic files (and one look at the real one)."""

from __future__ import annotations

import json

import pytest

from pagedchat_lab import sharegpt


class WordTokenizer:
    """One token per whitespace-separated word; no chat template (plain role lines)."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [len(word) for word in text.split()]


def _conv(cid: str, *turns: tuple[str, str]) -> dict:
    return {"id": cid, "conversations": [{"from": who, "value": text} for who, text in turns]}


def _write(path, items, cut: int = 0):
    text = json.dumps(items, indent=2)
    path.write_text(text[: len(text) - cut] if cut else text)
    return path


def words(n: int) -> str:
    return " ".join(["word"] * n)


def test_truncated_file_stops_at_first_incomplete_element(tmp_path, monkeypatch):
    items = [_conv(f"c{i}", ("human", words(5)), ("gpt", words(6))) for i in range(5)]
    path = _write(tmp_path / "trace.json", items, cut=40)
    monkeypatch.setattr(sharegpt, "_CHUNK", 7)  # elements straddle many chunk boundaries
    got = [item for item, _ in sharegpt.iter_json_spans(path)]
    assert [item["id"] for item in got] == ["c0", "c1", "c2", "c3"]


def test_spans_read_each_element_again_across_chunks_and_multibyte_text(tmp_path, monkeypatch):
    """The trace keeps only byte spans: each must hold exactly its element, wherever the
    1 MB reads cut (here every 7 characters) and whatever the characters' widths."""
    texts = ["plain", "héllo wörld", "日本語のテキスト", "emoji 🙂🙃 mixed", "tail ✓"]
    items = [_conv(f"c{i}", ("human", text), ("gpt", text[::-1]))
             for i, text in enumerate(texts)]
    path = tmp_path / "trace.json"
    text = json.dumps(items, ensure_ascii=False, indent=1)
    path.write_bytes(text.encode("utf-8")[:-3])  # cut inside the last element
    monkeypatch.setattr(sharegpt, "_CHUNK", 7)
    found = list(sharegpt.iter_json_spans(path))
    assert [item["id"] for item, _ in found] == ["c0", "c1", "c2", "c3"]
    data = path.read_bytes()
    for item, (start, end) in found:
        assert json.loads(data[start:end]) == item
    trace = sharegpt.conversations(path)
    assert len(trace) == 4
    assert [c.messages[0]["content"] for c in trace[1:3]] == texts[1:3]


def test_complete_file_is_read_to_the_end(tmp_path):
    items = [_conv(f"c{i}", ("human", "hi"), ("gpt", "yo")) for i in range(3)]
    path = _write(tmp_path / "trace.json", items)
    assert len(list(sharegpt.iter_json_spans(path))) == 3


def test_not_an_array_is_refused(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"id": 1}')
    with pytest.raises(ValueError, match="not a JSON array"):
        list(sharegpt.iter_json_spans(path))


def test_conversations_start_with_user_and_alternate(tmp_path):
    items = [
        _conv("lead-gpt", ("gpt", "hello"), ("human", "q1"), ("gpt", "a1"), ("human", "q2")),
        _conv("broken", ("human", "q"), ("human", "again"), ("gpt", "a")),
        _conv("alone", ("human", "only a question")),
        _conv("roles", ("user", "q"), ("chatgpt", "a"), ("system", "skip"), ("human", "q2"),
              ("bard", "a2")),
    ]
    found = {c.id: c for c in sharegpt.conversations(_write(tmp_path / "t.json", items))}
    assert [m["content"] for m in found["lead-gpt"].messages] == ["q1", "a1"]
    assert "broken" not in found and "alone" not in found
    assert [m["role"] for m in found["roles"].messages] == ["user", "assistant"] * 2


def _trace(tmp_path):
    items = [
        _conv("ok1", ("human", words(10)), ("gpt", words(50))),
        _conv("ok2", ("human", words(4)), ("gpt", words(4))),
        _conv("short-prompt", ("human", words(3)), ("gpt", words(50))),
        _conv("short-answer", ("human", words(10)), ("gpt", words(3))),
        _conv("long-prompt", ("human", words(1025)), ("gpt", words(10))),
        _conv("too-long", ("human", words(1000)), ("gpt", words(1049))),
        _conv("ok3", ("human", words(1000)), ("gpt", words(1048))),
    ]
    return _write(tmp_path / "t.json", items)


def test_sample_requests_filters_like_vllm(tmp_path):
    path = _trace(tmp_path)
    got = sharegpt.sample_requests(WordTokenizer(), 10, seed=0, path=path)
    assert sorted(r.id for r in got) == ["ok1", "ok2", "ok3"]
    lengths = {r.id: (r.prompt_len, r.output_len) for r in got}
    assert lengths == {"ok1": (10, 50), "ok2": (4, 4), "ok3": (1000, 1048)}


def test_sample_requests_is_seeded_and_capped(tmp_path):
    path = _trace(tmp_path)
    tok = WordTokenizer()
    orders = {tuple(r.id for r in sharegpt.sample_requests(tok, 3, seed=s, path=path))
              for s in range(8)}
    assert len(orders) > 1  # the seed changes the order
    first = sharegpt.sample_requests(tok, 2, seed=5, path=path)
    assert first == sharegpt.sample_requests(tok, 2, seed=5, path=path)
    capped = sharegpt.sample_requests(tok, 3, seed=0, max_tokens=8, path=path)
    assert max(r.output_len for r in capped) == 8
    assert sorted(r.id for r in capped) == ["ok1", "ok2", "ok3"]  # cap after the filter


def test_chat_requests_cut_history_to_the_last_tokens(tmp_path):
    items = [_conv("multi", ("human", words(30)), ("gpt", words(40)), ("human", words(20)),
                   ("gpt", words(5))),
             _conv("single", ("human", words(30)), ("gpt", words(40)))]
    path = _write(tmp_path / "t.json", items)
    got = sharegpt.sample_chat_requests(WordTokenizer(), 10, max_context=64, max_tokens=16,
                                        path=path)
    assert [r.id for r in got] == ["multi/0", "multi/1"]
    first, second = got
    assert first.output_len == 16 and second.output_len == 5
    assert first.prompt_len < 64 and second.prompt_len == 64  # 30 + 40 + 20 words + roles


def test_real_trace_has_about_17600_conversations():
    convs = sharegpt.conversations()
    assert 15_000 < len(convs) < 17_700
    assert all(c.messages[0]["role"] == "user" for c in convs[:100])

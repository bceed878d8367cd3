import pytest

from pagedchat.chat.prompt import PromptTooLong, build_prompt, render


class WordTokenizer:
    """One token per whitespace-separated word, with a ChatML-like template."""

    chat_template = "chatml"

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]

    def decode(self, ids: list[int], **kwargs) -> str:
        names = {i: w for w, i in self.vocab.items()}
        return " ".join(names[i] for i in ids)

    def apply_chat_template(self, conversation, add_generation_prompt, tokenize,
                            continue_final_message=False):
        text = " ".join(f"<{m['role']}> {m['content']} </>" for m in conversation)
        if continue_final_message:  # the last message left open, as transformers does
            return {"input_ids": self.encode(text.removesuffix(" </>"))}
        return {"input_ids": self.encode(text + " <assistant>")}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def words(n, tag="w"):
    return " ".join(f"{tag}{i}" for i in range(n))


def test_everything_fits():
    tok = WordTokenizer()
    history = [user("a b"), assistant("c"), user("d")]
    prompt = build_prompt(tok, "sys", history, context_window=100)
    assert prompt.dropped_messages == 0 and prompt.kept_messages == 3
    assert not prompt.truncated
    assert prompt.token_ids == render(tok, [{"role": "system", "content": "sys"}, *history])


def test_oldest_messages_drop_whole_and_system_prompt_stays():
    tok = WordTokenizer()
    history = [user(words(10, "a")), assistant(words(10, "b")), user(words(3, "c"))]
    # system: 3 tokens, each message 2 + content, generation prompt 1
    prompt = build_prompt(tok, "be brief", history, context_window=4 + 12 + 5 + 1)
    assert (prompt.kept_messages, prompt.dropped_messages) == (2, 1)
    text = tok.decode(prompt.token_ids)
    assert text.startswith("<system> be brief </>")
    assert "a0" not in text and "b0" in text and "c2" in text


def test_newest_message_alone_too_long_keeps_its_end():
    tok = WordTokenizer()
    history = [user("old"), user(words(50))]
    prompt = build_prompt(tok, "sys", history, context_window=20)
    assert prompt.truncated and prompt.dropped_messages == 1
    assert len(prompt.token_ids) == 20
    text = tok.decode(prompt.token_ids)
    assert "w49 </> <assistant>" in text and "w0 " not in text and "old" not in text


def test_system_prompt_larger_than_window_is_refused():
    with pytest.raises(PromptTooLong, match="context window of 5"):
        build_prompt(WordTokenizer(), words(10), [user("hi")], context_window=5)


def test_no_system_prompt():
    tok = WordTokenizer()
    prompt = build_prompt(tok, "", [user("hi")], context_window=10)
    assert tok.decode(prompt.token_ids) == "<user> hi </> <assistant>"


class PlainTokenizer(WordTokenizer):
    """A base model's tokenizer: no chat template."""

    chat_template = None


def test_without_a_template_the_chat_is_plain_user_and_assistant_lines():
    tok = PlainTokenizer()
    ids = render(tok, [{"role": "system", "content": "be brief"}, user("hi there"),
                       assistant("hello"), user("why?")])
    assert tok.decode(ids) == "be brief User: hi there Assistant: hello User: why? Assistant:"


def test_raw_is_the_text_alone_without_system_prompt_or_markup():
    tok = PlainTokenizer()
    prompt = build_prompt(tok, "be brief", [user("once upon"), assistant(" a ti"),
                                            user("me there")], raw=True)
    # joined as they are: a reply continues the text before it, word pieces and all
    assert tok.decode(prompt.token_ids) == "once upon a time there"


def test_raw_keeps_the_newest_messages_within_the_window():
    tok = PlainTokenizer()
    history = [user(words(6, "a")), assistant(" " + words(6, "b")), user(" " + words(3, "c"))]
    prompt = build_prompt(tok, "sys", history, context_window=10, raw=True)
    assert prompt.dropped_messages == 1
    assert tok.decode(prompt.token_ids) == f"{words(6, 'b')} {words(3, 'c')}"


def test_a_reply_cut_short_is_continued_where_it_stopped():
    tok = WordTokenizer()
    prompt = build_prompt(tok, "sys", [user("count"), assistant("one two")],
                          continue_last=True)
    assert tok.decode(prompt.token_ids).endswith("<assistant> one two")
    plain = PlainTokenizer()
    ids = render(plain, [user("count"), assistant("one two")], continue_last=True)
    assert plain.decode(ids).endswith("User: count Assistant: one two")

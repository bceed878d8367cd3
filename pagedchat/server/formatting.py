"""Response pieces in OpenAI's shape: logprobs (chat and completions) and usage."""

from __future__ import annotations

from pagedchat.engine.outputs import Logprob, RequestOutput


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]  # shifted past 255, in order
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


_BYTE_LEVEL = _byte_level_table()


class TokenTexts:
    """Each token's text and bytes, as the logprobs of a response show them; cached."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._cache:
            piece = self._tokenizer.convert_ids_to_tokens(token_id) or ""
            if piece and all(ch in _BYTE_LEVEL for ch in piece):  # a byte-level BPE piece
                raw = bytes(_BYTE_LEVEL[ch] for ch in piece)
            else:
                raw = self._tokenizer.decode([token_id]).encode("utf-8")
            self._cache[token_id] = (raw.decode("utf-8", errors="replace"), list(raw))
        return self._cache[token_id]


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], top: int,
                  texts: TokenTexts) -> dict:
    content = []
    for token, entry in zip(token_ids, entries, strict=True):
        text, raw = texts(token)
        ranked = sorted(entry.items(), key=lambda item: item[1].rank)[:top]
        content.append({
            "token": text, "logprob": entry[token].logprob, "bytes": raw,
            "top_logprobs": [{"token": texts(t)[0], "logprob": lp.logprob, "bytes": texts(t)[1]}
                             for t, lp in ranked]})
    return {"content": content}


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], top: int,
                        texts: TokenTexts, offset: int) -> tuple[dict, int]:
    """The legacy shape, and the text offset after these tokens."""
    tokens, values, tops, offsets = [], [], [], []
    for token, entry in zip(token_ids, entries, strict=True):
        text = texts(token)[0]
        tokens.append(text)
        values.append(entry[token].logprob)
        ranked = sorted(entry.items(), key=lambda item: item[1].rank)[:top]
        tops.append({texts(t)[0]: lp.logprob for t, lp in ranked} if top else None)
        offsets.append(offset)
        offset += len(text)
    return ({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
             "text_offset": offsets}, offset)


def usage(outputs: list[RequestOutput]) -> dict:
    prompt = sum(len(out.prompt_token_ids) for out in outputs)
    completion = sum(len(o.token_ids) for out in outputs for o in out.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outputs)}}

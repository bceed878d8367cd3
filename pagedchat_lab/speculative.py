"""Speculative decoding, single stream: the same prompts answered greedily by an engine
without speculation and by one with it, one prompt at a time, the two in turn.

Two workloads. ``code``: code edits, each prompt a function of the standard library's
sources (with the lines around it, as a file excerpt) and an instruction to rewrite that
function, so that the reply copies much of its prompt. ``sharegpt``: the paper's chatbot
prompts (chat history plus the new message), where replies seldom repeat their prompt.
"""

from __future__ import annotations

import ast
import statistics
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from pagedchat.chat.prompt import render
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.sampling_params import SamplingParams

# standard library sources, one function taken from each, in this order
CODE_FILES = ("textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "difflib.py", "calendar.py",
              "csv.py", "json/decoder.py", "json/encoder.py", "heapq.py", "bisect.py",
              "string.py", "colorsys.py", "statistics.py", "base64.py", "quopri.py",
              "gettext.py", "ipaddress.py", "configparser.py", "pprint.py", "tokenize.py",
              "urllib/parse.py", "html/parser.py", "posixpath.py", "shutil.py", "tempfile.py")
EDITS = ("add type hints to its parameters and return value",
         "rename its local variables to longer, clearer names",
         "add a docstring and a comment before each loop",
         "replace string formatting with f-strings where there is any, else add a docstring",
         "raise ValueError with a clear message on invalid input")
FUNCTION_LINES = range(12, 61)  # the size of the functions chosen, in lines
CONTEXT_LINES = 30  # lines of the file kept before and after the function


@dataclass(frozen=True)
class Prompt:
    name: str
    ids: list[int]


def code_prompts(tokenizer, count: int = 20, max_prompt_len: int = 1800) -> list[Prompt]:
    """``count`` code-edit prompts: per source file of ``CODE_FILES``, its first top-level
    or method function of ``FUNCTION_LINES`` lines whose excerpt fits ``max_prompt_len``
    tokens, with one of ``EDITS`` in turn."""
    root = Path(sysconfig.get_paths()["stdlib"])
    prompts: list[Prompt] = []
    for file in CODE_FILES:
        if len(prompts) == count:
            break
        path = root / file
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            start = node.lineno - 1 - len(node.decorator_list)
            if node.end_lineno - start not in FUNCTION_LINES:
                continue
            excerpt = "\n".join(lines[max(start - CONTEXT_LINES, 0):
                                      node.end_lineno + CONTEXT_LINES])
            edit = EDITS[len(prompts) % len(EDITS)]
            message = (f"Here is an excerpt of {file} from the Python standard library:\n\n"
                       f"```python\n{excerpt}\n```\n\nRewrite the function `{node.name}` to "
                       f"{edit}. Reply with the whole rewritten function in a code block.")
            ids = render(tokenizer, [{"role": "user", "content": message}])
            if len(ids) <= max_prompt_len:
                prompts.append(Prompt(f"{file}:{node.name}", ids))
                break
    if len(prompts) < count:
        raise ValueError(f"only {len(prompts)} code prompts fit {max_prompt_len} tokens "
                         f"(of {count} asked for)")
    return prompts


def sharegpt_prompts(tokenizer, count: int = 20, seed: int = 0,
                     max_context: int = 1024) -> list[Prompt]:
    """``count`` of the paper's chatbot prompts (see ``sample_chat_requests``)."""
    from pagedchat_lab.sharegpt import sample_chat_requests

    return [Prompt(r.id, r.prompt_ids)
            for r in sample_chat_requests(tokenizer, count, seed, max_context)]


def answer(engine: LLMEngine, prompt: list[int], max_tokens: int) -> dict[str, object]:
    """One greedy answer alone: its tokens, decode time (first token to last) and the time
    from arrival to the last token, and its drafted and accepted tokens."""
    engine.add_request("spec", prompt, SamplingParams(temperature=0, max_tokens=max_tokens))
    start = time.perf_counter()
    final = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            final = output
    end = time.perf_counter()
    metrics = final.metrics
    return {"tokens": final.outputs[0].token_ids, "seconds": end - start,
            "decode_seconds": metrics.last_token_time - metrics.first_token_time,
            "draft_tokens": metrics.draft_tokens, "accepted_tokens": metrics.accepted_tokens}


def compare(plain: LLMEngine, speculative: LLMEngine, prompts: list[Prompt], max_tokens: int,
            rounds: int = 1) -> dict[str, object]:
    """Every prompt answered by both engines, in turn (the speculative one first on odd
    prompts), ``rounds`` times: tokens/s of each (output tokens over the seconds from the
    first token to the last, and over the whole request), their ratio, the share of drafted
    tokens accepted, and whether the greedy tokens were the same."""
    answer(plain, prompts[0].ids, 8)  # one-off costs out of the way
    answer(speculative, prompts[0].ids, 8)
    totals = {name: {"tokens": 0, "decode_tokens": 0, "seconds": 0.0, "decode_seconds": 0.0}
              for name in ("plain", "speculative")}
    drafted = accepted = 0
    mismatches: list[str] = []
    ratios: list[float] = []
    for round_index in range(rounds):
        for index, prompt in enumerate(prompts):
            order = [("plain", plain), ("speculative", speculative)]
            if (index + round_index) % 2:
                order.reverse()
            runs = {name: answer(engine, prompt.ids, max_tokens) for name, engine in order}
            for name, run in runs.items():
                total = totals[name]
                total["tokens"] += len(run["tokens"])
                total["decode_tokens"] += len(run["tokens"]) - 1
                total["seconds"] += run["seconds"]
                total["decode_seconds"] += run["decode_seconds"]
            drafted += runs["speculative"]["draft_tokens"]
            accepted += runs["speculative"]["accepted_tokens"]
            if runs["plain"]["tokens"] != runs["speculative"]["tokens"]:
                mismatches.append(prompt.name)
            if runs["plain"]["decode_seconds"] > 0 and runs["speculative"]["decode_seconds"] > 0:
                ratios.append(runs["plain"]["decode_seconds"]
                              / runs["speculative"]["decode_seconds"])
        plain.reset_prefix_cache()
        speculative.reset_prefix_cache()
    figures: dict[str, object] = {}
    for name, total in totals.items():
        figures[f"{name}_decode_tokens_per_s"] = total["decode_tokens"] / total["decode_seconds"]
        figures[f"{name}_tokens_per_s"] = total["tokens"] / total["seconds"]
    figures.update(
        decode_ratio=figures["speculative_decode_tokens_per_s"]
        / figures["plain_decode_tokens_per_s"],
        end_to_end_ratio=figures["speculative_tokens_per_s"] / figures["plain_tokens_per_s"],
        median_prompt_ratio=statistics.median(ratios) if ratios else float("nan"),
        acceptance_rate=accepted / drafted if drafted else 0.0,
        draft_tokens=drafted, accepted_tokens=accepted,
        output_tokens=totals["plain"]["tokens"],
        greedy_identical=not mismatches, mismatched_prompts=mismatches,
        prompts=len(prompts), rounds=rounds,
    )
    return figures
